"""llama.cpp's multi-draft example (``examples/speculative/speculative.cpp``), one position, ported line
for line so that the conformance kit can enumerate its output law.

What the example does at temperature > 0 (llama-cpp-python 0.3.36's vendored tree):

* **Drafting** — each draft sequence runs the draft's sampler chain (``common_sampler_sample``),
  then reads the candidates *sorted by probability* (``common_sampler_get_candidates(smpl, true)``)
  and drafts ``cur_p->data[0].id`` (a split sequence ``s`` takes ``cur_p->data[s].id`` when its
  probability exceeds ``--draft-p-split``): the draft's most likely tokens, not the token the sampler
  drew. At one position the K sequences draft the top-K of the draft's post-sampling law ``q``.
* **Verification** — while sequences are active, one is picked uniformly at random; its drafted
  token ``x`` is accepted when a uniform ``r ≤ p_tgt(x) / p_dft(x)`` (``p_tgt`` from the current
  target list, ``p_dft`` from that sequence's stored draft list); on a rejection the target list
  becomes the residual, formed by sorting **both candidate lists by token id** and subtracting them
  **entry by entry** (``dist_tgt[i].p = max(0, dist_tgt[i].p − dist_dft[i].p)``, entries past the
  draft list's end kept), then normalised. When every sequence is rejected, a token is drawn from
  the residual (a residual that vanishes, as disjoint lists can make it, is 0/0 in the example).

Two defects follow. (1) A deterministic draft verified by the rule of sampled drafts: with one
sequence the output law is ``a·δ_x + (1 − a)·(p − q)₊/Z`` with ``x = argmax q`` and
``a = min(1, p(x)/q(x))``, which is ``p`` only in degenerate cases — lossy at every vocabulary and
every sampling setting. (2) The entry-by-entry residual is ``(p − q)₊`` only when both candidate
lists hold the same tokens: under top-k / top-p / min-p truncation with different kept sets it
subtracts one token's draft probability from another token's target probability, lossy even with
drafts sampled from ``q``. :func:`llama_speculative_verify` reproduces the example;
checked with drafts drawn
from ``q`` (the kit's ``"with_replacement"`` draft law) it shows (2) on its own.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np

from otbound._validation import InvalidInputError
from otbound.conformance import enumerate_outcomes
from otbound.engine._client import EngineError
from otbound.engine._laws import Sampling, TinyLaws
from otbound.engine._lossless import detectable_tv, histogram_test
from otbound.lm import BuildError


def _candidates(law: np.ndarray) -> list[tuple[int, float]]:
    """The candidate list llama.cpp keeps after its sampler chain: the tokens of positive probability."""
    return [(int(i), float(law[i])) for i in np.flatnonzero(law > 0)]


def _residual_by_id(tgt: list, dft: list) -> list:
    """``speculative.cpp``'s residual: both lists sorted by id, subtracted entry by entry, normalised, then
    sorted by probability (descending)."""
    tgt = sorted(tgt, key=lambda e: e[0])
    dft = sorted(dft, key=lambda e: e[0])
    out = [(tid, max(0.0, tp - dft[i][1]) if i < len(dft) else max(0.0, tp)) for i, (tid, tp) in enumerate(tgt)]
    total = sum(p for _, p in out)
    out = [(tid, p / total) for tid, p in out] if total > 0 else out
    return sorted(out, key=lambda e: -e[1])


def llama_speculative_verify(p, q, drafts, coin, draw):
    """One position of ``llama-speculative``'s stochastic verification (module docstring).

    ``p``, ``q``: the target's and the draft's post-sampling laws (V,); ``drafts``: the tokens the
    sequences drafted at this position (the top-K of ``q`` in the example: the kit's ``"greedy"``
    draft law); ``coin`` / ``draw``: the conformance kit's primitives. Returns the emitted token.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.conformance import check_token_verifier
    >>> from otbound.engine._multidraft import llama_speculative_verify
    >>> res = check_token_verifier(llama_speculative_verify, vocab_size=3, num_drafts=1, sampling="greedy",
    ...                            instances=4)
    >>> res.passed, res.lossless_error > 0.05
    (False, True)

    With drafts sampled from ``q`` and the same candidates in both lists its residual is ``(p − q)₊``
    (SpecInfer's recursive rejection sampling); with different candidates (a zero in ``q`` where ``p``
    has mass, as top-k truncation makes) it is not:

    >>> full = [(np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.4, 0.3, 0.2, 0.1]))]
    >>> check_token_verifier(llama_speculative_verify, vocab_size=4, num_drafts=2, instances=full).passed
    True
    >>> cut = [(np.array([0.5, 0.5]), np.array([0.0, 1.0]))]
    >>> res = check_token_verifier(llama_speculative_verify, vocab_size=2, num_drafts=1, instances=cut)
    >>> res.passed, res.counterexample.output_law.tolist()
    (False, [0.0, 1.0])
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    V = p.size
    dist_tgt = sorted(_candidates(p), key=lambda e: -e[1])
    dist_dft = _candidates(q)
    active = list(range(len(drafts)))
    while active:
        pick = np.zeros(V)
        pick[: len(active)] = 1.0 / len(active)
        s = active[int(draw(pick))]          # u_int_dist over the active sequences
        x = int(drafts[s])
        p_tgt = next((pr for t, pr in dist_tgt if t == x), 0.0)
        p_dft = next((pr for t, pr in dist_dft if t == x), 0.0)
        ratio = p_tgt / p_dft if p_dft > 0 else np.inf
        if coin(min(1.0, ratio)):           # r <= p_tgt / p_dft with r ~ U[0, 1)
            return x
        dist_tgt = _residual_by_id(dist_tgt, dist_dft)
        active.remove(s)
    law = np.zeros(V)
    for t, pr in dist_tgt:
        law[t] += pr
    if law.sum() == 0:
        # the residual vanished (disjoint lists paired entry by entry): speculative.cpp divides 0 by 0,
        # and libstdc++'s discrete_distribution over NaN weights returns index 0, the smallest id
        return min(t for t, _ in dist_tgt)
    return int(draw(law / law.sum()))


def top_k_law(law, k: int) -> np.ndarray:
    """``law`` restricted to its ``k`` most likely tokens and renormalised (llama.cpp's top-k then softmax).

    Examples
    --------
    >>> from otbound.engine._multidraft import top_k_law
    >>> top_k_law([0.1, 0.5, 0.4], 2).tolist()
    [0.0, 0.5555555555555556, 0.4444444444444444]
    """
    law = np.asarray(law, dtype=np.float64)
    keep = np.argsort(-law, kind="stable")[: int(k)]
    out = np.zeros_like(law)
    out[keep] = law[keep]
    return out / out.sum()


def output_law(verify, p, q, drafts) -> np.ndarray:
    """The exact output law of ``verify`` at fixed ``drafts`` (the kit's enumeration of its coins and draws)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    law = np.zeros(p.size)
    for prob, y in enumerate_outcomes(lambda coin, draw: verify(p, q, np.asarray(drafts), coin, draw),
                                      vocab_size=p.size):
        law[y] += prob
    return law


# -- the shipped binary, run --------------------------------------------------------------------------------

#: the one-line change that lets ``llama-speculative`` run several draft sequences: it shares the prompt's
#: KV cells between sequences, which needs llama.cpp's unified KV cache, and its argument parser does not
#: offer ``-kvu`` (a server option)
KVU_PATCH = ("    // max number of parallel drafting sequences (i.e. tree branches)\n",
             "    params.kv_unified = true; // otbound: several draft sequences need the unified KV cache\n\n"
             "    // max number of parallel drafting sequences (i.e. tree branches)\n")
_ACCEPTED = re.compile(r"draft token \d+ of sequence \d+ \((\d+), '")
_SAMPLED = re.compile(r"the sampled target token \((\d+), '")
_FAILED = ("failed to find a memory slot", "failed to initialize batch", "failed to decode")


def build_llama_speculative_kvu(build, folder) -> Path:
    """``llama-speculative`` with ``KVU_PATCH`` (``params.kv_unified = true``), compiled from the build's
    vendored source and linked against its shared libraries (one C++ file: seconds); returns the
    executable's path in ``folder``.

    Raises
    ------
    BuildError
        The source has changed (the patch does not apply) or the compiler failed.

    Examples
    --------
    >>> from otbound.engine._multidraft import KVU_PATCH
    >>> print(KVU_PATCH[1].splitlines()[0].split(";")[0].strip())
    params.kv_unified = true
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    src_root = build.source
    text = (src_root / "examples" / "speculative" / "speculative.cpp").read_text()
    if text.count(KVU_PATCH[0]) != 1:
        raise BuildError("examples/speculative/speculative.cpp changed: the unified-KV patch does not apply")
    src = folder / "speculative_kvu.cpp"
    src.write_text(text.replace(KVU_PATCH[0], KVU_PATCH[1]))
    exe = folder / "llama-speculative-kvu"
    lib = str(build.bin_dir)
    cmd = [os.environ.get("CXX", "g++"), "-O2", "-std=c++17", "-DGGML_BACKEND_SHARED", "-DGGML_SHARED",
           "-DGGML_USE_CPU", "-DLLAMA_SHARED", *(f"-I{src_root / d}" for d in ("include", "common", "ggml/include",
                                                                                 "vendor")),
           str(src), "-o", str(exe), f"-L{lib}", "-lllama-common", "-lllama", "-lggml", "-lggml-base",
           f"-Wl,-rpath,{lib}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not exe.is_file():
        raise BuildError(f"compiling the patched llama-speculative failed: {proc.stderr.strip()[-400:]}")
    return exe


#: a shared object preloaded into the example: at exit it flushes llama.cpp's logger, which the example
#: leaves unflushed (its asynchronous logger loses the end of the log, sometimes all of it)
FLUSH_SHIM = """struct common_log;
common_log * common_log_main();
void common_log_flush(common_log * log);
__attribute__((destructor)) static void otbound_flush_log() { common_log_flush(common_log_main()); }
"""


def build_log_flush_shim(build, folder) -> Path:
    """``FLUSH_SHIM`` (a destructor calling ``common_log_flush``) compiled against the build's
    ``libllama-common`` into ``folder``; its path.

    Examples
    --------
    >>> from otbound.engine._multidraft import FLUSH_SHIM
    >>> "common_log_flush(common_log_main())" in FLUSH_SHIM
    True
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    src, lib = folder / "flush_log.cpp", folder / "libotbound_flush_log.so"
    src.write_text(FLUSH_SHIM)
    cmd = [os.environ.get("CXX", "g++"), "-O2", "-shared", "-fPIC", str(src), "-o", str(lib), f"-L{build.bin_dir}",
           "-lllama-common", f"-Wl,-rpath,{build.bin_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not lib.is_file():
        raise BuildError(f"compiling the log-flushing shim failed: {proc.stderr.strip()[-400:]}")
    return lib


def run_llama_speculative(binary, target, draft, prompt: str, *, num_seqs: int, p_split: float, n_max: int,
                          sampling: dict, seed: int, n_predict: int, flush_shim=None, timeout: float = 120.0) -> dict:
    """One run of ``llama-speculative`` (stochastic verification, one thread, verbose log); its emitted tokens.

    Returns ``{"tokens", "failed_decodes", "returncode", "command"}``: the tokens in the order the example
    emits them, read from its debug log (an accepted draft token, then the token each iteration samples),
    and the number of llama_decode failures it logged (it goes on after a failed decode). Without
    ``flush_shim`` (:func:`build_log_flush_shim`, preloaded) the end of the log may be missing.

    Raises
    ------
    InvalidInputError
        A binary that does not exist, or a sampling setting the runner does not pass on.

    Examples
    --------
    >>> from otbound import InvalidInputError
    >>> from otbound.engine import run_llama_speculative
    >>> try:
    ...     run_llama_speculative("llama-speculative", "t.gguf", "d.gguf", "Hi", num_seqs=2, p_split=0.1,
    ...                           n_max=3, sampling={"typical_p": 0.9}, seed=1, n_predict=4)
    ... except InvalidInputError as err:
    ...     print(str(err).split(";")[0])
    llama-speculative's runner sets temperature, top_k, top_p, min_p only
    """
    flags = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p"}
    unknown = set(sampling) - set(flags)
    if unknown:
        raise InvalidInputError(f"llama-speculative's runner sets {', '.join(flags)} only; got {sorted(unknown)}")
    for path, what in ((binary, "llama-speculative binary"), (target, "target model"), (draft, "draft model")):
        if not Path(path).is_file():
            raise InvalidInputError(f"the {what} {path} does not exist")
    cmd = [str(binary), "-m", str(target), "-md", str(draft), "-p", prompt, "-n", str(int(n_predict)),
           "-np", str(int(num_seqs)), "--draft-p-split", repr(float(p_split)), "--spec-draft-n-max", str(int(n_max)),
           "--seed", str(int(seed)), "-t", "1", "-td", "1", "-c", "512", "--ignore-eos", "-v"]
    for key, value in sampling.items():
        cmd += [flags[key], repr(value)]
    env = dict(os.environ)
    if flush_shim is not None:
        env["LD_PRELOAD"] = str(flush_shim)
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    log = (proc.stdout + proc.stderr).decode(errors="replace")
    tokens = []
    for line in log.splitlines():
        m = _ACCEPTED.search(line) if "accepted" in line else _SAMPLED.search(line)
        if m:
            tokens.append(int(m.group(1)))
    return {"tokens": tokens, "failed_decodes": sum(log.count(s) for s in _FAILED), "returncode": proc.returncode,
            "command": cmd}


def speculative_output_test(binary, pair, prompt: str, prompt_ids, *, num_seqs: int, p_split: float, n_max: int,
                            sampling: dict, samples: int, flush_shim=None, seed: int = 0, progress=None) -> dict:
    """``samples`` runs of the shipped example on a tiny GGUF pair (:class:`otbound.lm.TinyGGUFPair`): the
    law of its first two emitted tokens G-tested against the target's exact law and against the law of
    the line-for-line port of its verification (``otbound.engine._multidraft``) at the same drafts.

    The first token is sampled from the target before any draft; the second is the first verified
    position, whose drafts are the top ``m`` tokens of the draft's law at the served settings (``m``:
    1, plus one per candidate above ``p_split`` up to ``num_seqs``). Both laws are computed by an
    independent float64 forward of the pair's weights and llama.cpp's sampler formulas
    (:class:`otbound.engine.TinyLaws`); end of text is ignored on both sides.

    Returns
    -------
    dict
        ``vs_target`` and ``vs_port`` (G-tests, as in :func:`otbound.engine.lossless_test`),
        ``port_vs_target_tv`` (the exact distance of the port's law from the target's),
        ``detectable_tv``, the runs' failed decodes and exit statuses, every run's two tokens
        (``sequences``) and the last command.

    Examples
    --------
    >>> import tempfile
    >>> from otbound import InvalidInputError
    >>> from otbound.engine import speculative_output_test
    >>> from otbound.lm import write_tiny_gguf_pair
    >>> pair = write_tiny_gguf_pair(tempfile.mkdtemp())
    >>> try:
    ...     speculative_output_test("no-such-binary", pair, "Hi", [72, 105], num_seqs=1, p_split=0.1, n_max=2,
    ...                             sampling={"temperature": 1.0, "top_k": 2, "top_p": 1.0, "min_p": 0.0},
    ...                             samples=10)
    ... except InvalidInputError as err:
    ...     print(err)
    the llama-speculative binary no-such-binary does not exist
    """
    if not Path(binary).is_file():
        raise InvalidInputError(f"the llama-speculative binary {binary} does not exist")
    laws = TinyLaws(pair)
    s = Sampling("llama-speculative", dict(sampling))
    V = pair.config.vocab_size
    prompt_ids = [int(t) for t in prompt_ids]
    cells, target_probs, port_probs = [], [], []
    first_ids, first_p = laws.target(prompt_ids, s, V)
    for a, pa in zip(first_ids.tolist(), first_p.tolist()):
        ctx = prompt_ids + [a]
        p = _full(*laws.target(ctx, s, V), V)
        q = _full(*laws.draft(ctx, s, V), V)
        order = np.argsort(-q, kind="stable")
        m = 1
        while m < num_seqs and m < 8 and q[order[m]] > p_split:
            m += 1
        port = port_output_law(p, q, order[:m])
        for b in range(V):
            if p[b] > 0 or port[b] > 0:
                cells.append((a, b))
                target_probs.append(pa * p[b])
                port_probs.append(pa * port[b])
    runs, failed, bad_rc = [], 0, 0
    for r in range(int(samples)):
        out = run_llama_speculative(binary, pair.target, pair.draft, prompt, num_seqs=num_seqs, p_split=p_split,
                                    n_max=n_max, sampling=sampling, seed=seed * 1_000_003 + r + 1, n_predict=4,
                                    flush_shim=flush_shim)
        failed += out["failed_decodes"] > 0
        bad_rc += out["returncode"] != 0
        if len(out["tokens"]) < 2:
            raise EngineError(f"llama-speculative emitted {len(out['tokens'])} tokens, expected at least 2 "
                              f"(exit status {out['returncode']})")
        runs.append(tuple(out["tokens"][:2]))
        if progress is not None:
            progress.update(1)
    target_probs, port_probs = np.array(target_probs), np.array(port_probs)
    vs_target = histogram_test(runs, cells, target_probs / target_probs.sum(), 0.0)
    vs_port = histogram_test(runs, cells, port_probs / port_probs.sum(), 0.0)
    exact_tv = 0.5 * float(np.abs(target_probs - port_probs).sum())
    return {"num_seqs": num_seqs, "p_split": p_split, "n_max": n_max, "sampling": dict(sampling),
            "samples": int(samples), "runs_with_failed_decodes": int(failed), "nonzero_exit": int(bad_rc),
            "port_vs_target_tv": exact_tv, "vs_target": vs_target, "vs_port": vs_port,
            "detectable_tv": detectable_tv(int(samples), vs_target["df"]), "sequences": [list(x) for x in runs],
            "command": out["command"] if samples else None}


def port_output_law(p, q, drafts) -> np.ndarray:
    """The output law of :func:`llama_speculative_verify` at fixed ``drafts`` (distinct tokens), in closed
    form: the sequences are verified in a uniformly random order (one of the ``m!`` orders), each
    accepted with probability ``min(1, p_cur(x)/q(x))``, ``p_cur`` replaced on a rejection by the
    example's residual (:func:`_residual_by_id`), and the residual sampled when every sequence is
    rejected. The same law as :func:`output_law` of the port, without enumerating its draws (fast at
    full vocabulary).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.engine._multidraft import llama_speculative_verify, output_law, port_output_law
    >>> p, q = np.array([0.2, 0.5, 0.3]), np.array([0.6, 0.1, 0.3])
    >>> bool(np.allclose(port_output_law(p, q, [0, 2]), output_law(llama_speculative_verify, p, q, [0, 2])))
    True
    """
    import itertools
    import math

    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    drafts = [int(x) for x in drafts]
    out = np.zeros(p.size)
    weight = 1.0 / math.factorial(len(drafts))
    dft = _candidates(q)
    for order in itertools.permutations(drafts):
        mass, tgt = weight, sorted(_candidates(p), key=lambda e: -e[1])
        for x in order:
            p_tgt = next((pr for t, pr in tgt if t == x), 0.0)
            a = min(1.0, p_tgt / q[x]) if q[x] > 0 else 1.0
            out[x] += mass * a
            mass *= 1.0 - a
            if mass == 0.0:
                break
            tgt = _residual_by_id(tgt, dft)
        if mass > 0.0:
            law = np.zeros(p.size)
            for t, pr in tgt:
                law[t] += pr
            if law.sum() == 0:
                out[min(t for t, _ in tgt)] += mass
            else:
                out += mass * law / law.sum()
    return out


def _full(ids, probs, V: int) -> np.ndarray:
    out = np.zeros(V)
    out[np.asarray(ids, dtype=np.int64)] = probs
    return out / out.sum()
