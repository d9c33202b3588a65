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

import contextlib
import dataclasses
import sys
import time
import warnings
from pathlib import Path

from otbound import plan as pl
from otbound._integrity import FolderLockedError, output_lock
from otbound._validation import InvalidInputError
from otbound.cli._common import (
    OneLineParser,
    default_law_names,
    draft_law_names,
    exit_error,
    interrupted,
    parse_options,
)
from otbound.plan import CostCurve, check_search_size, check_temperatures, write_temperature_plans

#: largest forward size (new tokens) --cost-sizes may ask for
MAX_COST_SIZE = 1 << 16

PROG = "python -m otbound.plan"

_SEQUENCES = ("datasets", "laws", "verifiers", "budgets", "cost_sizes", "draft_temperatures")


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """The options of ``python -m otbound.plan`` (one field per flag, named as its ``dest``),
    validated when made (:func:`check_options`, an :class:`~otbound.InvalidInputError` on the first
    failure) before any work and before the output folder is touched. Sequences are stored as
    tuples.

    Examples
    --------
    >>> from otbound.cli.plan import PlanOptions
    >>> PlanOptions(synthetic=True).laws == ("with_replacement", "without_replacement", "greedy", "deterministic")
    True
    >>> PlanOptions(synthetic=True, max_depth=0)
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: --max-depth must be ≥ 1, got 0
    """

    run: str | None = None
    synthetic: bool = False
    collect: bool = False
    pair: str = "qwen2.5-coder"
    datasets: tuple[str, ...] = ("humaneval", "mtbench")
    num_prompts: int = 8
    max_new_tokens: int = 32
    temperature: float | None = None
    dataset: str | None = None
    laws: tuple[str, ...] = dataclasses.field(default_factory=default_law_names)
    verifiers: tuple[str, ...] | None = None
    max_drafts: int = 3
    max_depth: int = 5
    budgets: tuple[int, ...] | None = None
    device: str | None = None
    dtype: str = "auto"
    cost_sizes: tuple[int, ...] | None = None
    cost_repeats: int = 5
    cost_context: int = 128
    draft_cost: str | None = None
    target_cost: str | None = None
    cost: str | None = None
    draft_temperatures: tuple[float, ...] | None = None
    mc_samples: int = 16
    remeasure: bool = False
    seed: int = 0
    out: str = "plan"
    quiet: bool = False

    def __post_init__(self):
        for name in _SEQUENCES:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, (value,) if isinstance(value, (str, int, float)) else tuple(value))
        check_options(self)


def parser() -> OneLineParser:
    """The flags of ``python -m otbound.plan``."""
    laws = list(default_law_names())
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
    ap.add_argument("--laws", nargs="+", default=laws, metavar="LAW",
                    help=f"draft laws, of {list(draft_law_names())} (default {laws})")
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


def default_cost_sizes(o: PlanOptions) -> list[int]:
    """Powers of two up to the largest target forward of any candidate: ``N + 1`` tokens for the
    largest node budget or chain shape (``--max-drafts × --max-depth``)."""
    largest = max(max(o.budgets or pl.DEFAULT_BUDGETS), o.max_drafts * o.max_depth) + 1
    sizes = [1]
    while sizes[-1] < largest:
        sizes.append(2 * sizes[-1])
    return sizes


def given_costs(o: PlanOptions):
    """The cost curves given on the command line or in --cost (``(draft, target, machine)``), else
    None; validated before any work."""
    if (o.draft_cost is None) != (o.target_cost is None):
        raise InvalidInputError("give both --draft-cost and --target-cost (or neither)")
    if o.cost is not None and o.draft_cost is not None:
        raise InvalidInputError("give either --cost FILE or --draft-cost/--target-cost, not both")
    if o.draft_cost is not None:
        return CostCurve.parse(o.draft_cost, "given (--draft-cost)"), CostCurve.parse(o.target_cost,
                                                                                      "given (--target-cost)"), {}
    if o.cost is not None:
        return pl.load_cost(o.cost)
    return None


def check_options(o: PlanOptions) -> None:
    """Every check that needs no traces (an :class:`~otbound.InvalidInputError` on the first failure):
    one source, an output folder, budgets the search can hold, positive counts, known draft laws,
    a cost model; the draft temperatures."""
    if sum([bool(o.run), o.synthetic, o.collect]) != 1:
        raise InvalidInputError("give exactly one source: a run folder, --collect or --synthetic")
    out = Path(o.out)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--out {out} is a file, not a folder")
    budgets = o.budgets
    if budgets is not None and min(budgets) < 1:
        raise InvalidInputError(f"every node budget must be at least one node, got {list(budgets)}")
    if o.max_depth < 1:
        raise InvalidInputError(f"--max-depth must be ≥ 1, got {o.max_depth}")
    for n in budgets or ():
        check_search_size(n, o.max_depth)
    if (o.cost_sizes is not None and min(o.cost_sizes) < 1) or o.cost_repeats < 1 or o.cost_context < 1:
        raise InvalidInputError("--cost-sizes, --cost-repeats and --cost-context must be ≥ 1")
    if o.cost_sizes is not None and max(o.cost_sizes) > MAX_COST_SIZE:
        raise InvalidInputError(f"--cost-sizes {max(o.cost_sizes)}: a forward of more than {MAX_COST_SIZE} new "
                                "tokens is not measured")
    for flag, value, least in (("--seed", o.seed, 0), ("--mc-samples", o.mc_samples, 1),
                               ("--num-prompts", o.num_prompts, 1), ("--max-new-tokens", o.max_new_tokens, 1)):
        if value < least:
            raise InvalidInputError(f"{flag} must be ≥ {least}, got {value}")
    if o.max_drafts < 1:
        raise InvalidInputError(f"--max-drafts must be ≥ 1, got {o.max_drafts}")
    known = draft_law_names()
    unknown = [s for s in o.laws if s not in known]
    if unknown:
        raise InvalidInputError(f"unknown draft law(s) {unknown}; expected names in {list(known)}")
    given = given_costs(o)
    if not o.synthetic and given is None and o.device is None:
        raise InvalidInputError("a cost model is needed: --device DEV (measured on the pair), "
                                "--draft-cost/--target-cost curves or --cost FILE")
    if o.draft_temperatures:
        check_temperatures(o.draft_temperatures, o.laws)


def run(o: PlanOptions) -> dict:
    """Plan as ``o`` says and write the plan into ``o.out``; returns the written paths."""

    t0 = time.perf_counter()
    given = given_costs(o)
    verifiers = list(o.verifiers) if o.verifiers else pl.DEFAULT_VERIFIERS
    law_names = list(o.laws)
    budgets = list(o.budgets) if o.budgets else pl.DEFAULT_BUDGETS
    out = Path(o.out)
    say = (lambda *a: None) if o.quiet else (lambda *a: print(*a, file=sys.stderr))
    cost_dict = None
    if o.synthetic:
        laws = pl.synthetic_laws(seed=o.seed)
        if o.max_depth > len(laws[0][0]):
            raise InvalidInputError(f"--max-depth {o.max_depth} is deeper than the traces allow "
                                    f"(synthetic traces: {len(laws[0][0])} positions)")
        table = pl.synthetic_table(max_drafts=o.max_drafts, verifiers=verifiers, laws=law_names, seed=o.seed)
        cost = pl.synthetic_cost_model(table, laws)
        pair = None
        records = None
    else:
        pair = None
        if o.collect:
            from otbound.lm import collect_traces, load_pair, load_prompts

            if o.max_depth > o.max_new_tokens:
                raise InvalidInputError(f"--max-depth {o.max_depth} is deeper than the traces allow "
                                        f"(--max-new-tokens {o.max_new_tokens})")
            pair = load_pair(o.pair, device=o.device or "auto", dtype=o.dtype)
            prompts = [p for d in o.datasets for p in load_prompts(d, o.num_prompts)]
            temp = 1.0 if o.temperature is None else o.temperature
            collect_traces(pair, prompts, out / "traces", temperatures=[temp], max_new_tokens=o.max_new_tokens,
                           seed=o.seed, progress=not o.quiet)
            folder = out
        else:
            folder = Path(o.run)
        records = pl.load_run_traces(folder, temperature=o.temperature, dataset=o.dataset)
        longest = max(r.positions for r in records)
        if o.max_depth > longest:
            raise InvalidInputError(f"--max-depth {o.max_depth} is deeper than the traces allow "
                                    f"(longest trace: {longest} positions)")
        if given is None:  # measure the forward costs on the pair, on --device
            if pair is None:
                from otbound.lm import load_pair

                backend = records[0].meta.get("backend", "transformers")  # the kernels the traces ran on
                name = (records[0].meta.get("pair") or o.pair).removesuffix(f" [{backend}]")
                pair = load_pair(name, device=o.device, dtype=o.dtype, backend=backend)
            sizes = sorted(set(o.cost_sizes or default_cost_sizes(o)) | {1})
            say(f"otbound.plan: measuring forward costs on {pair.device} ...")
            kw = dict(vocab_size=pair.vocab_size, device=pair.device, sizes=sizes, repeats=o.cost_repeats,
                      context=o.cost_context)
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
        stored = None if o.remeasure or o.collect else Path(o.run) / "measure"
        table = pl.table_from_records(records, max_drafts=o.max_drafts, verifiers=verifiers, laws=law_names,
                                      mc_samples=o.mc_samples, seed=o.seed, progress=not o.quiet,
                                      cache_dir=stored if stored is not None and stored.is_dir() else None)
        cost = pl.CostModel(draft, target, machine=machine)
        r0 = records[0]
        ps, qs = r0.laws_at(slice(0, min(5, r0.positions)))
        cost.verify = pl.measure_verify_costs({n: table.drafts_measured(n) for n in table.acceptance},
                                              list(zip(ps, qs)))
        cost_dict = cost.as_dict()
    plan = pl.make_plan(table, cost, laws=[s for s in law_names if s in table.optimal], max_depth=o.max_depth,
                        budgets=budgets)
    plan.config.update(seconds=round(time.perf_counter() - t0, 1), command=" ".join([PROG] + sys.argv[1:]))
    best = plan.best()
    paths = pl.write_plan(plan, out, extra={"cost.json": cost_dict} if cost_dict is not None and given is None
                          else None)
    if o.draft_temperatures:
        sampled = [s for s in law_names if s in ("with_replacement", "without_replacement")]
        tp = pl.plan_draft_temperatures(laws if o.synthetic else [(r.p, r.q) for r in records], cost,
                                        list(o.draft_temperatures), max_drafts=o.max_drafts, laws=sampled,
                                        verifiers=[v for v in verifiers if v in table.acceptance],
                                        mc_samples=o.mc_samples, seed=o.seed, source=table.source,
                                        max_depth=o.max_depth, budgets=budgets)
        paths["temperatures"] = write_temperature_plans(tp, out)
    say(f"otbound.plan: best {best.draft_law} {pl.shape_label(best.shape)} with {best.verifier}: "
        f"mean acceptance length {best.mean_acceptance_length:.3f} "
        f"(bound {best.bound_mean_acceptance_length:.3f}), predicted speed-up {best.predicted_speedup:.3f}; "
        f"{len(plan.candidates)} candidates -> {paths['json']} ({time.perf_counter() - t0:.1f} s)")
    return paths


def locked_run(o: PlanOptions) -> dict:
    """:func:`run` holding the output folder's lock; a folder this run created is removed again
    if the run fails before writing into it (``o`` was checked when made: bad flags leave no
    folder behind)."""
    out = Path(o.out)
    created = not out.exists()
    try:
        with output_lock(out):
            return run(o)
    finally:
        if created and out.is_dir() and not any(out.iterdir()):
            with contextlib.suppress(OSError):
                out.rmdir()


def main(argv=None) -> dict:
    """Run the command line: every failure a user can cause (bad flags, a locked folder, a failed
    write) ends in one line on stderr and exit status 2; Ctrl-C in one line and status 130. The
    previous plan in ``--out`` is replaced only by a finished one."""
    options = parse_options(parser(), argv, PlanOptions)
    try:
        return locked_run(options)
    except (InvalidInputError, FolderLockedError) as exc:
        exit_error(exc, PROG)
    except KeyboardInterrupt:
        interrupted(f"{PROG}: interrupted; nothing was written (a previous plan in {options.out} is unchanged)")
    except OSError as exc:  # e.g. a full disk: the previous plan, if any, is still in place
        exit_error(f"{exc.strerror or exc} ({exc.filename or options.out}); a previous plan in {options.out} "
                   "is unchanged", PROG)
    except RuntimeError as exc:  # a model that cannot be loaded
        from otbound.lm import HashMismatchError, ModelUnavailableError

        if not isinstance(exc, (ModelUnavailableError, HashMismatchError)):
            raise
        exit_error(str(exc).splitlines()[0], PROG)

