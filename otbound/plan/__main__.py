"""``python -m otbound.plan``: plan the drafting scheme of a pair (docs/guide/planner.md).

Sources (one of): a report's run folder (``RUN``, its ``traces/``), ``--collect`` (sample the
traces of ``--pair`` here, into ``<out>/traces``), ``--synthetic`` (a synthetic pair, seconds).
Cost model (one of, except with ``--synthetic``): ``--device DEV`` (the pair's forward times
measured there, stored in ``<out>/cost.json`` with the machine), ``--draft-cost`` and
``--target-cost`` (``n:seconds,...`` curves measured elsewhere), ``--cost FILE`` (a stored
``cost.json``). Verification time is measured here on the traces' laws.

Bad input (an empty or mixed run folder, a budget below one node, a depth beyond the traces, a
cost curve with non-positive times, ...) exits 2 with one line and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from otbound import plan as pl
from otbound._validation import SAMPLINGS, InvalidInputError
from otbound.plan import CostCurve

PROG = "python -m otbound.plan"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?", help="a report's run folder (with traces/)")
    ap.add_argument("--synthetic", action="store_true", help="plan on a synthetic pair (seconds)")
    ap.add_argument("--collect", action="store_true", help="collect traces of --pair into <out>/traces first")
    ap.add_argument("--pair", default="qwen2.5-coder", help="pair for --collect / --device (default: the traces')")
    ap.add_argument("--datasets", nargs="+", default=["humaneval", "mtbench"])
    ap.add_argument("--num-prompts", type=int, default=8, help="prompts per dataset for --collect")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=None, help="the traces' temperature to plan for")
    ap.add_argument("--dataset", default=None, help="only this dataset's traces")
    ap.add_argument("--laws", nargs="+", default=list(SAMPLINGS), help=f"draft laws (default {list(SAMPLINGS)})")
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
    if args.draft_cost is not None:
        return CostCurve.parse(args.draft_cost, "given (--draft-cost)"), CostCurve.parse(args.target_cost,
                                                                                          "given (--target-cost)"), {}
    if args.cost is not None:
        try:
            stored = json.loads(Path(args.cost).read_text())
            curves = [CostCurve(stored[k]["sizes"], stored[k]["seconds"], stored[k].get("source", "stored"))
                      for k in ("draft", "target")]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidInputError(f"--cost {args.cost}: not a readable cost.json ({exc})") from None
        return curves[0], curves[1], stored.get("machine", {})
    return None


def _check_args(args):
    if sum([bool(args.run), args.synthetic, args.collect]) != 1:
        raise InvalidInputError("give exactly one source: a run folder, --collect or --synthetic")
    budgets = args.budgets
    if budgets is not None and min(budgets) < 1:
        raise InvalidInputError(f"every node budget must be at least one node, got {budgets}")
    if args.max_depth < 1:
        raise InvalidInputError(f"--max-depth must be ≥ 1, got {args.max_depth}")
    if (args.cost_sizes is not None and min(args.cost_sizes) < 1) or args.cost_repeats < 1 or args.cost_context < 1:
        raise InvalidInputError("--cost-sizes, --cost-repeats and --cost-context must be ≥ 1")
    if args.max_drafts < 1:
        raise InvalidInputError(f"--max-drafts must be ≥ 1, got {args.max_drafts}")
    unknown = [s for s in args.laws if s not in SAMPLINGS]
    if unknown:
        raise InvalidInputError(f"unknown draft law(s) {unknown}; expected names in {list(SAMPLINGS)}")
    given = _given_costs(args)
    if not args.synthetic and given is None and args.device is None:
        raise InvalidInputError("a cost model is needed: --device DEV (measured on the pair), "
                                "--draft-cost/--target-cost curves or --cost FILE")
    return given


def run(args) -> dict:
    """Do what the arguments say; returns the written paths."""

    t0 = time.perf_counter()
    given = _check_args(args)
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
            draft = pl.measure_forward_costs(pair.draft, source=f"measured ({pair.name} draft, {pair.device})", **kw)
            target = pl.measure_forward_costs(pair.target, source=f"measured ({pair.name} target, {pair.device})", **kw)
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
    paths = pl.write_plan(plan, out)
    if cost_dict is not None and given is None:
        from otbound._io import write_text_atomic

        write_text_atomic(out / "cost.json", json.dumps(cost_dict, indent=1))
        paths["cost"] = out / "cost.json"
    best = plan.best()
    say(f"otbound.plan: best {best.draft_law} {pl.shape_label(best.shape)} with {best.verifier}: "
        f"mean acceptance length {best.mean_acceptance_length:.3f} "
        f"(bound {best.bound_mean_acceptance_length:.3f}), predicted speed-up {best.predicted_speedup:.3f}; "
        f"{len(plan.candidates)} candidates -> {paths['json']} ({time.perf_counter() - t0:.1f} s)")
    return paths


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except InvalidInputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as exc:  # a model that cannot be loaded
        from otbound.lm import HashMismatchError, ModelUnavailableError

        if not isinstance(exc, (ModelUnavailableError, HashMismatchError)):
            raise
        print(f"{PROG}: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
