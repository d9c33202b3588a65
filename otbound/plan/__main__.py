"""``python -m otbound.plan``: plan the drafting scheme of a pair (docs/guide/planner.md).

Sources (one of): a report's run folder (``RUN``, its ``traces/``), ``--collect`` (sample the
traces of ``--pair`` here, into ``<out>/traces``), ``--synthetic`` (a synthetic pair, seconds).
Cost model (one of, except with ``--synthetic``): ``--device DEV`` (the pair's forward times
measured there, stored in ``<out>/cost.json`` with the machine, its load while measuring and its
SHA-256), ``--draft-cost`` and ``--target-cost`` (``n:seconds,...`` curves measured elsewhere),
``--cost FILE`` (a stored ``cost.json``, refused when edited; not together with the curves).
Verification time is measured here on the traces' laws.

Bad input (an empty or mixed run folder, a budget below one node or too large to search, a depth
beyond the traces, a cost curve with non-positive times, a negative seed, an output path that is a
file, no candidate, ...) exits 2 with one line and writes nothing; so does a failed write (a full
disk). Ctrl-C exits 130 with one line. ``plan.json``, ``plan.md``, ``plan.png`` (and ``cost.json``)
are written together, only when the whole plan succeeded: a failing rerun leaves the previous
plan in place. One run per output folder (a second one is refused, naming the holder).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from pathlib import Path

from otbound import plan as pl
from otbound._cli import OneLineParser, exit_error
from otbound._integrity import FolderLockedError, output_lock
from otbound._validation import InvalidInputError
from otbound.plan import CostCurve
from otbound.plan._search import check_search_size
from otbound.plan._temperature import check_temperatures, write_temperature_plans
from otbound.token.draft_laws import DRAFT_LAWS, SAMPLINGS

#: largest forward size (new tokens) --cost-sizes may ask for
MAX_COST_SIZE = 1 << 16

PROG = "python -m otbound.plan"


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?", help="a report's run folder (with traces/)")
    ap.add_argument("--synthetic", action="store_true", help="plan on a synthetic pair (seconds)")
    ap.add_argument("--collect", action="store_true", help="collect traces of --pair into <out>/traces first")
    ap.add_argument("--pair", default="qwen2.5-coder", help="pair for --collect / --device (default: the traces')")
    ap.add_argument("--datasets", nargs="+", default=["humaneval", "mtbench"])
    ap.add_argument("--num-prompts", type=int, default=8, help="prompts per dataset for --collect")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=None, help="the traces' temperature to plan for")
    ap.add_argument("--dataset", default=None, help="only this dataset's traces")
    ap.add_argument("--laws", nargs="+", default=list(SAMPLINGS), choices=list(DRAFT_LAWS), metavar="LAW",
                    help=f"draft laws, of {list(DRAFT_LAWS)} (default {list(SAMPLINGS)})")
    ap.add_argument("--verifiers", nargs="+", default=None, help="lossless verifiers (default: the fast exact ones)")
    ap.add_argument("--max-drafts", type=int, default=3, help="largest branching / number of chains")
    ap.add_argument("--max-depth", type=int, default=5, help="deepest shape")
    ap.add_argument("--budgets", type=int, nargs="+", default=None, help="node budgets of the tree search")
    ap.add_argument("--device", default=None, help="measure the pair's forward costs on this device")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--cost-sizes", type=int, nargs="+", default=None,
                    help="new-token counts at which --device measures the forward time (default: powers of two "
                         "up to the largest forward a candidate makes, the largest budget or chain plus the root)")
    ap.add_argument("--cost-repeats", type=int, default=5, help="timed forwards per size (median)")
    ap.add_argument("--cost-context", type=int, default=128, help="KV-cache length of the cost measurement")
    ap.add_argument("--draft-cost", default=None, help="draft forward seconds 'n:s,n:s,...' (n new tokens)")
    ap.add_argument("--target-cost", default=None, help="target forward seconds 'n:s,n:s,...'")
    ap.add_argument("--cost", default=None, help="a cost.json written by an earlier --device run")
    ap.add_argument("--draft-temperatures", type=float, nargs="+", default=None, metavar="TAU",
                    help="also plan the sampled laws with the drafter at these temperatures (relative to the "
                    "traces'), writing temperatures.json with the best over all")
    ap.add_argument("--mc-samples", type=int, default=16)
    ap.add_argument("--remeasure", action="store_true",
                    help="measure every acceptance here, not reusing the run folder's stored measurements (measure/)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="plan", help="output folder (default ./plan)")
    ap.add_argument("--quiet", action="store_true")
    return ap


def default_cost_sizes(args) -> list[int]:
    """Powers of two up to the largest target forward of any candidate: ``N + 1`` tokens for the
    largest node budget or chain shape (``--max-drafts × --max-depth``)."""
    largest = max(max(args.budgets or pl.DEFAULT_BUDGETS), args.max_drafts * args.max_depth) + 1
    sizes = [1]
    while sizes[-1] < largest:
        sizes.append(2 * sizes[-1])
    return sizes


def _given_costs(args):
    """The cost curves given on the command line or in --cost, validated before any work."""

    if (args.draft_cost is None) != (args.target_cost is None):
        raise InvalidInputError("give both --draft-cost and --target-cost (or neither)")
    if args.cost is not None and args.draft_cost is not None:
        raise InvalidInputError("give either --cost FILE or --draft-cost/--target-cost, not both")
    if args.draft_cost is not None:
        return CostCurve.parse(args.draft_cost, "given (--draft-cost)"), CostCurve.parse(args.target_cost,
                                                                                          "given (--target-cost)"), {}
    if args.cost is not None:
        return pl.load_cost(args.cost)
    return None


def _check_args(args):
    if sum([bool(args.run), args.synthetic, args.collect]) != 1:
        raise InvalidInputError("give exactly one source: a run folder, --collect or --synthetic")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--out {out} is a file, not a folder")
    budgets = args.budgets
    if budgets is not None and min(budgets) < 1:
        raise InvalidInputError(f"every node budget must be at least one node, got {budgets}")
    if args.max_depth < 1:
        raise InvalidInputError(f"--max-depth must be ≥ 1, got {args.max_depth}")
    for n in budgets or ():
        check_search_size(n, args.max_depth)
    if (args.cost_sizes is not None and min(args.cost_sizes) < 1) or args.cost_repeats < 1 or args.cost_context < 1:
        raise InvalidInputError("--cost-sizes, --cost-repeats and --cost-context must be ≥ 1")
    if args.cost_sizes is not None and max(args.cost_sizes) > MAX_COST_SIZE:
        raise InvalidInputError(f"--cost-sizes {max(args.cost_sizes)}: a forward of more than {MAX_COST_SIZE} new "
                                "tokens is not measured")
    for flag, value, least in (("--seed", args.seed, 0), ("--mc-samples", args.mc_samples, 1),
                               ("--num-prompts", args.num_prompts, 1), ("--max-new-tokens", args.max_new_tokens, 1)):
        if value < least:
            raise InvalidInputError(f"{flag} must be ≥ {least}, got {value}")
    if args.max_drafts < 1:
        raise InvalidInputError(f"--max-drafts must be ≥ 1, got {args.max_drafts}")
    given = _given_costs(args)
    if not args.synthetic and given is None and args.device is None:
        raise InvalidInputError("a cost model is needed: --device DEV (measured on the pair), "
                                "--draft-cost/--target-cost curves or --cost FILE")
    return given


def run(args) -> dict:
    """Do what the arguments say; returns the written paths."""

    t0 = time.perf_counter()
    given = _check_args(args)
    if args.draft_temperatures:  # refused before any work
        check_temperatures(args.draft_temperatures, args.laws)
    verifiers = args.verifiers or pl.DEFAULT_VERIFIERS
    out = Path(args.out)
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr))
    cost_dict = None
    if args.synthetic:
        laws = pl.synthetic_laws(seed=args.seed)
        if args.max_depth > len(laws[0][0]):
            raise InvalidInputError(f"--max-depth {args.max_depth} is deeper than the traces allow "
                                    f"(synthetic traces: {len(laws[0][0])} positions)")
        table = pl.synthetic_table(max_drafts=args.max_drafts, verifiers=verifiers, laws=args.laws, seed=args.seed)
        cost = pl.synthetic_cost_model(table, laws)
        pair = None
        records = None
    else:
        pair = None
        if args.collect:
            from otbound.lm import collect_traces, load_pair, load_prompts

            if args.max_depth > args.max_new_tokens:
                raise InvalidInputError(f"--max-depth {args.max_depth} is deeper than the traces allow "
                                        f"(--max-new-tokens {args.max_new_tokens})")
            pair = load_pair(args.pair, device=args.device or "auto", dtype=args.dtype)
            prompts = [p for d in args.datasets for p in load_prompts(d, args.num_prompts)]
            temp = 1.0 if args.temperature is None else args.temperature
            collect_traces(pair, prompts, out / "traces", temperatures=[temp], max_new_tokens=args.max_new_tokens,
                           seed=args.seed, progress=not args.quiet)
            folder = out
        else:
            folder = Path(args.run)
        records = pl.load_run_traces(folder, temperature=args.temperature, dataset=args.dataset)
        longest = max(r.positions for r in records)
        if args.max_depth > longest:
            raise InvalidInputError(f"--max-depth {args.max_depth} is deeper than the traces allow "
                                    f"(longest trace: {longest} positions)")
        if given is None:  # measure the forward costs on the pair, on --device
            if pair is None:
                from otbound.lm import load_pair

                backend = records[0].meta.get("backend", "transformers")  # the kernels the traces ran on
                name = (records[0].meta.get("pair") or args.pair).removesuffix(f" [{backend}]")
                pair = load_pair(name, device=args.device, dtype=args.dtype, backend=backend)
            sizes = sorted(set(args.cost_sizes or default_cost_sizes(args)) | {1})
            say(f"otbound.plan: measuring forward costs on {pair.device} ...")
            kw = dict(vocab_size=pair.vocab_size, device=pair.device, sizes=sizes, repeats=args.cost_repeats,
                      context=args.cost_context)
            with warnings.catch_warnings():  # said below in one line each
                warnings.simplefilter("ignore", pl.UnstableTimingWarning)
                draft = pl.measure_forward_costs(pair.draft, source=f"measured ({pair.name} draft, {pair.device})",
                                                 **kw)
                target = pl.measure_forward_costs(pair.target,
                                                  source=f"measured ({pair.name} target, {pair.device})", **kw)
            for curve in (draft, target):
                if curve.timing.get("unstable"):
                    print(f"{PROG}: warning: forward times of {curve.source} are unstable: "
                          f"{curve.timing['unstable']}", file=sys.stderr)
            machine = pl.machine_description(pair.device)
        else:
            draft, target, machine = given
            machine = machine or pl.machine_description("cpu")
        say(f"otbound.plan: measuring acceptance on {len(records)} traces ...")
        stored = None if args.remeasure or args.collect else Path(args.run) / "measure"
        table = pl.table_from_records(records, max_drafts=args.max_drafts, verifiers=verifiers, laws=args.laws,
                                      mc_samples=args.mc_samples, seed=args.seed, progress=not args.quiet,
                                      cache_dir=stored if stored is not None and stored.is_dir() else None)
        cost = pl.CostModel(draft, target, machine=machine)
        r0 = records[0]
        ps, qs = r0.laws_at(slice(0, min(5, r0.positions)))
        cost.verify = pl.measure_verify_costs({n: table.drafts_measured(n) for n in table.acceptance},
                                              list(zip(ps, qs)))
        cost_dict = cost.as_dict()
    plan = pl.make_plan(table, cost, laws=[s for s in args.laws if s in table.optimal], max_depth=args.max_depth,
                        budgets=args.budgets or pl.DEFAULT_BUDGETS)
    plan.config.update(seconds=round(time.perf_counter() - t0, 1), command=" ".join([PROG] + sys.argv[1:]))
    best = plan.best()
    paths = pl.write_plan(plan, out, extra={"cost.json": cost_dict} if cost_dict is not None and given is None
                          else None)
    if args.draft_temperatures:
        sampled = [s for s in args.laws if DRAFT_LAWS[s].temperature]
        tp = pl.plan_draft_temperatures(laws if args.synthetic else [(r.p, r.q) for r in records], cost,
                                        args.draft_temperatures, max_drafts=args.max_drafts, laws=sampled,
                                        verifiers=[v for v in verifiers if v in table.acceptance],
                                        mc_samples=args.mc_samples, seed=args.seed, source=table.source,
                                        max_depth=args.max_depth, budgets=args.budgets or pl.DEFAULT_BUDGETS)
        paths["temperatures"] = write_temperature_plans(tp, out)
    say(f"otbound.plan: best {best.draft_law} {pl.shape_label(best.shape)} with {best.verifier}: "
        f"mean acceptance length {best.mean_acceptance_length:.3f} "
        f"(bound {best.bound_mean_acceptance_length:.3f}), predicted speed-up {best.predicted_speedup:.3f}; "
        f"{len(plan.candidates)} candidates -> {paths['json']} ({time.perf_counter() - t0:.1f} s)")
    return paths


def _locked_run(args) -> dict:
    """:func:`run` holding the output folder's lock; a folder this run created is removed again
    if the run fails before writing into it."""
    _check_args(args)  # before the lock: bad flags leave no folder behind
    out = Path(args.out)
    created = not out.exists()
    try:
        with output_lock(out):
            return run(args)
    finally:
        if created and out.is_dir() and not any(out.iterdir()):
            with contextlib.suppress(OSError):
                out.rmdir()


def main(argv=None) -> dict:
    """Run the command line: every failure a user can cause (bad flags, a locked folder, a failed
    write) ends in one line on stderr and exit status 2; Ctrl-C in one line and status 130. The
    previous plan in ``--out`` is replaced only by a finished one."""
    args = parser().parse_args(argv)
    try:
        return _locked_run(args)
    except (InvalidInputError, FolderLockedError) as exc:
        exit_error(exc, PROG)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was written (a previous plan in {args.out} is unchanged)",
              file=sys.stderr)
        raise SystemExit(130) from None
    except OSError as exc:  # e.g. a full disk: the previous plan, if any, is still in place
        exit_error(f"{exc.strerror or exc} ({exc.filename or args.out}); a previous plan in {args.out} is unchanged",
                   PROG)
    except RuntimeError as exc:  # a model that cannot be loaded
        from otbound.lm import HashMismatchError, ModelUnavailableError

        if not isinstance(exc, (ModelUnavailableError, HashMismatchError)):
            raise
        exit_error(str(exc).splitlines()[0], PROG)


if __name__ == "__main__":
    main()
