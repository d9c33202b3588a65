"""The whole audit: servers started and stopped, every configuration measured, results written.

Local mode (``--synthetic`` or ``--pair``) builds llama.cpp (:func:`otbound.lm._llama_cpp.llama_cpp_build`),
and for the whole run keeps two servers without speculation: the target alone (its post-sampling
laws, the speed without speculation and the control of the losslessness test) and the draft alone
(draft-simple's choices and the draft's laws). Each configuration gets its own speculative server
(llama.cpp reads the drafting flags at start-up only), stopped before the next one starts.

URL mode (``--url``) audits a server someone else runs, with the configuration it serves: the
target's laws come from the same server with ``n_predict = 1`` (no draft is made for a single
token), the acceptance from its ``/metrics``; the prediction and the best alternative need the
draft's laws (``--pair`` starts a local draft server for them).
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from otbound._integrity import content_key, file_sha256, output_lock
from otbound._io import json_text, progress_bar
from otbound._validation import InvalidInputError
from otbound.engine._audit import SpecConfig, check_inputs, run_configuration
from otbound.engine._client import _request, get_json, health
from otbound.engine._laws import Sampling, ServerLaws, TinyLaws
from otbound.engine._lossless import enumerate_cells, lossless_test
from otbound.engine._report import write_outputs
from otbound.engine._server import EngineError, LlamaServer
from otbound.lm import OFFLINE_MODELS, PAIRS, llama_cpp_build, load_prompts, write_tiny_gguf_pair

#: the format of engine.json
ENGINE_FORMAT = "otbound-engine-audit/1"
#: the synthetic audit's configurations: (spec type, n_max, p_min)
SYNTHETIC_CONFIGS = (("draft-simple", 2, 0.0), ("draft-simple", 4, 0.0), ("draft-simple", 4, 0.6),
                     ("ngram-simple", 4, 0.0))
#: the real pair's configurations
REAL_CONFIGS = (("draft-simple", 2, 0.0), ("draft-simple", 4, 0.0), ("draft-simple", 8, 0.0),
                ("draft-simple", 4, 0.75), ("ngram-simple", 4, 0.0))


def synthetic_prompts(vocab_ids, num: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.choice(np.asarray(vocab_ids), size=(num, length)).tolist()


def _tokenize(url: str, text: str) -> list[int]:
    status, raw = _request(url.rstrip("/") + "/tokenize", {"content": text, "add_special": False})
    if status != 200:
        raise EngineError(f"POST {url}/tokenize answered {status}")
    return [int(t) for t in json.loads(raw)["tokens"]]


def _server_info(url: str) -> dict:
    try:
        props = get_json(url, "/props")
    except EngineError:
        return {}
    return {"build_info": props.get("build_info"), "model_path": props.get("model_path")}


def _pair_files(pair: str, progress: bool):
    if pair not in PAIRS:
        raise InvalidInputError(f"unknown pair {pair!r}; registered pairs: {', '.join(sorted(PAIRS))}")
    # the reassembled, SHA-256-checked GGUF files (the language-model layer's, never converted)
    from otbound.lm import ensure_gguf

    draft_name, target_name = PAIRS[pair]
    return (ensure_gguf(OFFLINE_MODELS[target_name], progress=progress),
            ensure_gguf(OFFLINE_MODELS[draft_name], progress=progress))


def _bar(total: int, desc: str, progress: bool):
    return progress_bar(total, desc, progress, unit="request")


def run_audit(out, *, synthetic: bool = False, url: str | None = None, pair: str | None = None,
              configs=None, samplings=None, num_prompts: int = 4, seeds_per_prompt: int = 3, n_predict: int = 32,
              lossless_samples: int = 1500, lossless_depth: int = 3, n_probs: int = 20,
              prompt_source: str = "humaneval", seed: int = 0, progress: bool = True,
              startup_timeout: float = 180.0, speed_without_speculation: bool = True, server_hook=None) -> dict:
    """Run the audit and write ``engine.json``, ``engine.md`` and ``engine.png`` into ``out``.

    Parameters
    ----------
    out : str or Path
        The output folder (locked for the run; files written atomically).
    synthetic : bool
        The tiny GGUF pair (:func:`otbound.lm._tiny_gguf.write_tiny_gguf_pair`) on a local llama-server.
    url : str, optional
        A running llama.cpp server to audit as it is configured.
    pair : str, optional
        A registered pair (``otbound.lm.PAIRS``): local servers (or, with ``url``, the draft's laws).
    configs : sequence of (spec type, n_max, p_min), optional
        Local mode only (default :data:`SYNTHETIC_CONFIGS` / :data:`REAL_CONFIGS`).
    samplings : sequence of Sampling, optional
        Default: ``topk4`` (synthetic) or llama.cpp's default chain at T 0.7 and 1.0 and Qwen's settings.
    num_prompts, seeds_per_prompt, n_predict : int
        The acceptance run: prompts × seeds requests of ``n_predict`` tokens.
    lossless_samples, lossless_depth : int
        Continuations per losslessness test and their length (tokens). ``lossless_samples=0`` skips
        the losslessness test and its control (each configuration's ``lossless`` is then ``None``):
        the verification rule the test checks does not depend on the drafting flags, so a grid may
        run it once per sampling setting.
    n_probs : int
        Tokens of each law asked for (the rest of the law is one cell).
    speed_without_speculation : bool
        Also send the acceptance run's requests to the target alone, for tokens/s without speculation
        (``tokens_per_second_without_speculation``; absent when ``False``).
    server_hook : callable, optional
        Called with each speculative :class:`LlamaServer` once it is healthy (tests use it).

    Returns
    -------
    dict
        The content of ``engine.json``.

    Raises
    ------
    otbound.InvalidInputError
        Bad settings, an unknown pair; nothing is written.
    EngineError
        A server that does not start, is not reachable, or dies during the audit (no ``engine.json`` is left).

    Examples
    --------
    >>> import tempfile
    >>> from otbound import InvalidInputError
    >>> from otbound.engine import run_audit
    >>> try:
    ...     run_audit(tempfile.mkdtemp(), synthetic=True, n_predict=1)
    ... except InvalidInputError as err:
    ...     print(err)
    need n_predict >= 2 and seeds >= 1, got 1 and 3
    """
    modes = sum([bool(synthetic), url is not None])
    if modes != 1 and not (pair and url is None and not synthetic):
        raise InvalidInputError("choose one of --synthetic, --pair NAME or --url URL")
    check_inputs([[0]], n_predict, seeds_per_prompt)
    if lossless_samples < 0 or n_probs < 1 or num_prompts < 1:
        raise InvalidInputError(f"need lossless samples >= 0 and positive n_probs and prompts, got "
                                f"{lossless_samples}, {n_probs} and {num_prompts}")
    if lossless_depth < 3:
        # llama-server drafts at most n_predict − 2 tokens after the first: a continuation of two
        # tokens is never speculated, and its test would say nothing about speculation
        raise InvalidInputError(f"--lossless-depth must be at least 3 (continuations of fewer tokens are never "
                                f"speculated by llama-server), got {lossless_depth}")
    out = Path(out)
    if samplings is None:
        samplings = ([Sampling.named("topk4")] if synthetic else
                     [Sampling.named("default", 0.7), Sampling.named("default", 1.0), Sampling.named("qwen")])
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    # the outputs are written only at the end, beside the old ones and replaced together
    # (_report.write_outputs): a failing rerun leaves an earlier finished audit as it was
    with output_lock(out), contextlib.ExitStack() as stack:
        record = {"format": ENGINE_FORMAT, "started": started,
                  "machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                              "processor": platform.processor()},
                  "settings": {"num_prompts": num_prompts, "seeds_per_prompt": seeds_per_prompt,
                               "n_predict": n_predict, "lossless_samples": lossless_samples,
                               "lossless_depth": lossless_depth, "n_probs": n_probs, "seed": seed,
                               "prompt_source": None if synthetic else str(prompt_source),
                               "speed_without_speculation": bool(speed_without_speculation),
                               "samplings": [{"name": s.name, "params": s.params} for s in samplings]}}
        laws_check = None
        if url is not None:
            if not health(url):
                raise EngineError(f"nothing healthy is listening at {url} (GET /health failed)")
            info = _server_info(url)
            # llama-server reads its drafting flags at start-up and does not report them (its /props
            # shows the per-request defaults): the caller declares them, else they are "as served"
            if configs and len(list(configs)) > 1:
                raise InvalidInputError("a --url server runs one configuration: declare at most one --config")
            config_list = list(configs) if configs else [("as-served", 0, 0.0)]
            record["engine"] = {"name": "llama.cpp-compatible server", "url": url, **info}
            draft_url = None
            if pair is not None:
                build = _build(progress)
                target_path, draft_path = _pair_files(pair, progress)
                draft_srv = stack.enter_context(LlamaServer(build.binary("llama-server"), draft_path,
                                                            startup_timeout=startup_timeout))
                draft_url = draft_srv.url
            laws = ServerLaws(url, draft_url)
            prediction_laws = laws if draft_url is not None else None
            prompts = _prompts(url, synthetic=False, num=num_prompts, source=prompt_source, seed=seed, vocab=None)
            spec_servers = {config_list[0]: None}
            off_url = None
        else:
            build = _build(progress)
            if synthetic:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="otbound-tiny-gguf-"))
                tiny = write_tiny_gguf_pair(tmp, seed=seed)
                target_path, draft_path = tiny.target, tiny.draft
                model_info = {"pair": "tiny-gguf", "seed": seed, "vocab_size": tiny.config.vocab_size}
            else:
                target_path, draft_path = _pair_files(pair, progress)
                model_info = {"pair": pair}
            model_info.update({"target_sha256": file_sha256(target_path), "draft_sha256": file_sha256(draft_path),
                               "target": Path(target_path).name, "draft": Path(draft_path).name})
            binary = build.binary("llama-server")
            ctx = 1024 if synthetic else 4096
            off = stack.enter_context(LlamaServer(binary, target_path, ctx_size=ctx, startup_timeout=startup_timeout))
            dft = stack.enter_context(LlamaServer(binary, draft_path, ctx_size=ctx, startup_timeout=startup_timeout))
            off_url = off.url
            laws = ServerLaws(off.url, dft.url)
            prediction_laws = laws
            record["engine"] = {"name": "llama.cpp llama-server", **build.describe(), "binary": str(binary),
                                "sha256": file_sha256(binary), "models": model_info,
                                "build_info": _server_info(off.url).get("build_info")}
            config_list = list(configs or (SYNTHETIC_CONFIGS if synthetic else REAL_CONFIGS))
            prompts = _prompts(off.url, synthetic=synthetic, num=num_prompts, source=prompt_source, seed=seed,
                               vocab=tiny.text_ids() if synthetic else None)
            spec_servers = {c: (binary, target_path, draft_path, ctx) for c in config_list}
        check_inputs(prompts, n_predict, seeds_per_prompt)
        record["prompts"] = prompts
        results, controls = [], {}
        for sampling in samplings:
            cells = (enumerate_cells(laws, prompts[0], sampling, lossless_depth, n_probs)
                     if lossless_samples else None)
            if off_url is not None and lossless_samples:
                controls[sampling.name] = lossless_test(off_url, laws, prompts[0], sampling, depth=lossless_depth,
                                                        samples=lossless_samples, n=n_probs, cells=cells,
                                                        label=f"control {sampling.name} seed={seed}")
            for spec_type, n_max, p_min in config_list:
                config = SpecConfig(spec_type, int(n_max), float(p_min), sampling)
                if progress:
                    print(f"otbound: {config.label()}", file=sys.stderr)
                with _spec_server(spec_servers[(spec_type, n_max, p_min)], url, config, startup_timeout,
                                  server_hook) as (spec_url, alive):
                    total = num_prompts * seeds_per_prompt + lossless_samples
                    with _bar(total, config.label(), progress) as bar:
                        res = run_configuration(spec_url, off_url, config, prompts, laws=prediction_laws,
                                                n_predict=n_predict,
                                                seeds_per_prompt=seeds_per_prompt, n_probs=n_probs, progress=bar,
                                                speed_without_speculation=speed_without_speculation,
                                                check_alive=alive)
                        res["lossless"] = (lossless_test(spec_url, laws, prompts[0], sampling, depth=lossless_depth,
                                                         samples=lossless_samples, n=n_probs, cells=cells,
                                                         label=f"lossless {config.label()} seed={seed}", progress=bar)
                                           if lossless_samples else None)
                    alive()
                results.append(res)
        if synthetic:
            laws_check = _check_laws(laws, TinyLaws(tiny), samplings)
        record["laws"] = laws.describe()
        record["laws_check"] = laws_check
        record["configurations"] = results
        record["controls"] = controls
        record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        record = json.loads(json_text(record, default=_jsonable))  # strict JSON: what the file will hold
        record["sha256"] = content_key(record)
        write_outputs(out, record)
    return record


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON: {type(x)}")


def _build(progress: bool):
    return llama_cpp_build(progress=progress)


def _prompts(url, *, synthetic: bool, num: int, source: str, seed: int, vocab):
    if synthetic:
        return synthetic_prompts(vocab, num, 8, seed)
    return [list(p.token_ids) if p.token_ids else _tokenize(url, p.text) for p in load_prompts(source, num)]


@contextlib.contextmanager
def _spec_server(spec, url, config: SpecConfig, startup_timeout: float, hook):
    """``(url, alive)`` of the speculative server of ``config``: a local one started for it, or ``url``."""
    if spec is None:
        def alive():
            if not health(url):
                raise EngineError(f"the server at {url} stopped answering during the audit")
        yield url, alive
        return
    binary, target, draft, ctx = spec
    server = LlamaServer(binary, target, draft=draft if config.spec_type == "draft-simple" else None,
                         spec_type=config.spec_type, draft_max=config.draft_max, draft_min=config.draft_min,
                         p_min=config.p_min, ctx_size=ctx, startup_timeout=startup_timeout)
    with server:
        if hook is not None:
            hook(server)

        def alive():
            if not server.alive():
                code = server.proc.returncode if server.proc is not None else None
                raise EngineError(f"llama-server ({config.label()}) died during the audit (exit status {code})")
        try:
            yield server.url, alive
        except EngineError as err:
            if not server.alive():
                raise EngineError(f"llama-server ({config.label()}) died during the audit: {err}") from None
            raise


def _check_laws(laws: ServerLaws, tiny_laws: TinyLaws, samplings, limit: int = 300) -> dict:
    """The engine's laws against the independent numpy forward's at the contexts the audit asked about
    (synthetic pair only): largest total variation of the target's laws, largest difference of the
    draft's top-10 probability, and how often the drafted token agrees."""
    by_params = {json.dumps(s.params, sort_keys=True): s for s in samplings}
    tvs, worst_d, agree, n_t, n_d, support_differs = [], 0.0, 0, 0, 0, 0
    for (role, context, text, n), (ids, probs) in list(laws._cache.items()):
        params = json.loads(text)
        served = json.dumps({k: v for k, v in params.items() if k != "ignore_eos"}, sort_keys=True)
        if role == "draft" and params.get("samplers") == ["top_k"] and n_d < limit:
            tok, p = tiny_laws.draft_choice(list(context))
            agree += int(tok == int(ids[0]))
            worst_d = max(worst_d, abs(p - float(probs[0])))
            n_d += 1
        elif role == "target" and served in by_params and n_t < limit:
            a_ids, a_p = tiny_laws.target(list(context), by_params[served], n)
            va, vb = dict(zip(a_ids.tolist(), a_p.tolist())), dict(zip(ids.tolist(), probs.tolist()))
            tvs.append(0.5 * sum(abs(va.get(t, 0.0) - vb.get(t, 0.0)) for t in set(va) | set(vb)))
            support_differs += int(set(va) != set(vb))
            n_t += 1
    tvs = np.array(tvs) if tvs else np.array([np.nan])
    return {"source": tiny_laws.name, "target_laws_checked": n_t, "max_tv_target_laws": float(tvs.max()),
            "median_tv_target_laws": float(np.median(tvs)), "p95_tv_target_laws": float(np.quantile(tvs, 0.95)),
            "target_supports_differing": support_differs,
            "draft_choices_checked": n_d, "draft_choices_agreeing": agree, "max_abs_diff_draft_top_prob": worst_d,
            "note": "llama.cpp computes in float32 (f16 KV cache); the numpy forward in float64"}
