"""Argument checks and the sample-mode plan shared by the token and block checks (implementation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otbound import InvalidInputError
from otbound._validation import check_num_drafts, check_positive_int
from otbound.conformance._result import SHRINK_CANDIDATES, TOLERANCES, ConformanceResult, smallest
from otbound.conformance._stats import power, samples_for_power
from otbound.conformance._tree import ConformanceError

MODES = ("exact", "sample")


@dataclass(frozen=True)
class SamplePlan:
    """Sample mode settings: family-wise ``level`` split over the instances (Bonferroni), the
    distortion (total variation) the test must detect with probability ≥ ``target_power``, and an
    optional fixed sample size (None: the smallest size reaching ``target_power``)."""

    level: float
    distortion: float
    target_power: float
    samples: int | None
    num_instances: int

    @property
    def per_instance_level(self) -> float:
        return self.level / self.num_instances

    def size_and_power(self, df: int) -> tuple[int, float]:
        lvl = self.per_instance_level
        n = self.samples if self.samples is not None else samples_for_power(df, self.distortion, lvl, self.target_power)
        return n, power(n, df, self.distortion, lvl)


def exact_counterexample(reports, insts, k: int, shrink, counterexample):
    """The counterexample of an exact run, or None if every instance passed.

    The :data:`SHRINK_CANDIDATES` failing instances of largest error are shrunk with
    ``shrink(inst, k) -> (inst, k)`` (or taken as they are when ``shrink`` is None); the smallest
    ``counterexample(inst, k)`` (fewest tokens, drafts, block length; then largest error) is returned.
    """
    failing = sorted((i for i, r in enumerate(reports) if not r.passed), key=lambda i: -reports[i].lossless_error)
    if not failing:
        return None
    candidates = [(insts[i], k) for i in failing[: SHRINK_CANDIDATES if shrink else 1]]
    if shrink is not None:
        candidates = [shrink(t, k) for t, _ in candidates]
    return min((counterexample(t, kk) for t, kk in candidates), key=smallest)


@dataclass(frozen=True)
class CheckArgs:
    """The arguments the token and block checks share, checked (:func:`check_args`): the verifier's
    name in the reports and its ``lossless`` declaration, V, K, the mode, the exact-mode tolerance
    and precision, the sample-mode options of :func:`sample_plan`."""

    label: str
    declared: bool | None
    vocab_size: int
    num_drafts: int
    mode: str
    tolerance: float | None
    precision: str
    plan_options: dict


def check_args(verify, name, vocab_size, num_drafts, mode, *, tolerance, precision, batch, level, distortion, power,
               samples) -> CheckArgs:
    """The shared arguments of both checks, refused as :func:`check_callable`, :func:`check_vocab`,
    :func:`check_mode` and :func:`check_options` refuse them."""
    label = check_callable(verify, name)
    declared = getattr(verify, "lossless", None)  # the package's verifiers declare it (adapters)
    v = check_vocab(vocab_size)
    k = check_num_drafts(num_drafts)
    mode = check_mode(mode)
    tolerance, precision = check_options(
        mode, tolerance=tolerance, precision=precision, batch=batch, level=level, distortion=distortion, power=power,
        samples=samples,
    )  # fmt: skip
    plan_options = dict(level=level, distortion=distortion, target_power=power, samples=samples)
    return CheckArgs(label, declared, v, k, mode, tolerance, precision, plan_options)


def run_check(args: CheckArgs, level: str, sampling: str, insts, seed, *, exact_report, exact_error, shrink,
              counterexample, sample_report, sample_counterexample, **fields):
    """Both modes of a check over ``insts``, for the token and the block level alike: the
    :class:`~otbound.conformance.ConformanceResult` of ``level`` for ``args`` and ``sampling`` (the
    level's own ``fields`` added).

    Exact mode: ``exact_report(inst)`` per instance; the failing ones, shrunk by
    ``shrink(inst, k, fails)`` (None: taken as they are; ``fails(inst, k)`` is
    ``exact_error(inst, k) > tolerance``), give the smallest ``counterexample(inst, k)``
    (:func:`exact_counterexample`). Sample mode: the plan of ``args.plan_options`` (:func:`sample_plan`)
    and one generator seeded by ``seed`` drawn by ``sample_report(inst, plan, rng) -> (report, output
    law)`` instance after instance; ``sample_counterexample(inst, report, output law)`` of the failure
    with the smallest p-value (:func:`most_significant_failure`).
    """

    def result(tolerance, reports, cex, **mode_fields):
        return ConformanceResult(
            level, args.mode, args.vocab_size, args.num_drafts, sampling, tolerance, reports, cex, name=args.label,
            declared_lossless=args.declared, precision=args.precision, **fields, **mode_fields,
        )  # fmt: skip

    if args.mode == "exact":
        reports = [exact_report(t) for t in insts]

        def fails(t, kk):
            return exact_error(t, kk) > args.tolerance

        cex = exact_counterexample(
            reports, insts, args.num_drafts, None if shrink is None else (lambda t, kk: shrink(t, kk, fails)),
            counterexample,
        )  # fmt: skip
        return result(float(args.tolerance), reports, cex)
    plan = sample_plan(**args.plan_options, num_instances=len(insts))
    rng = np.random.default_rng(seed)
    reports, laws = [], []
    for t in insts:
        rep, law = sample_report(t, plan, rng)
        reports.append(rep)
        laws.append(law)
    i = most_significant_failure(reports)
    cex = None if i is None else sample_counterexample(insts[i], reports[i], laws[i])
    return result(None, reports, cex, level_alpha=plan.per_instance_level, distortion=plan.distortion,
                  target_power=plan.target_power)


def most_significant_failure(reports) -> int | None:
    """Index of the failing instance with the smallest p-value (sample mode), or None."""
    failing = [(r.p_value, i) for i, r in enumerate(reports) if not r.passed]
    return min(failing)[1] if failing else None


def check_vocab(vocab_size) -> int:
    """A vocabulary of at least two tokens (one token admits no distortion to detect)."""
    v = check_positive_int(vocab_size, "vocab_size")
    if v < 2:
        raise InvalidInputError(f"vocab_size must be at least 2, got {v}")
    return v


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise InvalidInputError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def check_fraction(value, name: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a number in (0, 1), got {value!r}") from None
    if not 0.0 < x < 1.0:
        raise InvalidInputError(f"{name} must lie in (0, 1), got {value!r}")
    return x


#: sample-mode defaults: family-wise level, distortion to detect, power
SAMPLE_DEFAULTS = {"level": 1e-3, "distortion": 0.01, "power": 0.99}


def check_options(mode: str, *, tolerance, precision, batch, level, distortion, power, samples):
    """``(tolerance, precision)`` (tolerance None in sample mode) after refusing options that do not
    apply to ``mode`` (a silently ignored option is a misread one): ``tolerance`` / ``precision``
    are exact-mode options, ``batch``, ``level``, ``distortion``, ``power``, ``samples`` sample-mode
    ones. Exact mode: ``tolerance`` defaults to :data:`~otbound.conformance._result.TOLERANCES`
    [``precision``] (float64: 1e-10, float32: 1e-6); giving both is refused."""
    if precision not in TOLERANCES:
        raise InvalidInputError(f"precision must be one of {tuple(TOLERANCES)}, got {precision!r}")
    if mode == "sample":
        given = [n for n, v in (("tolerance", tolerance), ("precision", None if precision == "float64" else 1))
                 if v is not None]  # fmt: skip
        if given:
            raise InvalidInputError(
                f"{' and '.join(given)} apply to mode='exact' only (sample mode is a G-test at level=)"
            )
        return None, precision
    given = [n for n, v in (("batch", batch or None), ("level", level), ("distortion", distortion), ("power", power),
                            ("samples", samples)) if v is not None]  # fmt: skip
    if given:
        raise InvalidInputError(f"{', '.join(given)} apply to mode='sample' only")
    if tolerance is None:
        return TOLERANCES[precision], precision
    if precision != "float64":
        raise InvalidInputError("give tolerance= or precision=, not both")
    try:
        tol = float(tolerance)
    except (TypeError, ValueError):
        raise InvalidInputError(f"tolerance must be a number, got {tolerance!r}") from None
    if not (np.isfinite(tol) and tol >= 0):
        raise InvalidInputError(f"tolerance must be finite and non-negative, got {tolerance!r}")
    return tol, precision


def sample_plan(level, distortion, target_power, samples, num_instances: int) -> SamplePlan:
    level = SAMPLE_DEFAULTS["level"] if level is None else level
    distortion = SAMPLE_DEFAULTS["distortion"] if distortion is None else distortion
    target_power = SAMPLE_DEFAULTS["power"] if target_power is None else target_power
    return SamplePlan(
        level=check_fraction(level, "level"),
        distortion=check_fraction(distortion, "distortion"),
        target_power=check_fraction(target_power, "power"),
        samples=None if samples is None else check_positive_int(samples, "samples"),
        num_instances=num_instances,
    )


def check_callable(verify, name: str | None = None) -> str:
    """The name of ``verify`` for reports (``name`` if given), after checking it is callable."""
    if not callable(verify):
        raise InvalidInputError(f"verify must be a callable, got {type(verify).__name__}")
    if name is not None:
        return str(name)
    return getattr(verify, "__qualname__", None) or getattr(verify, "__name__", None) or repr(verify)


def as_token_id(y, vocab_size: int, what: str) -> int:
    """``y`` as a token id in ``[0, vocab_size)``, else :class:`ConformanceError`."""
    if isinstance(y, (bool, np.bool_)) or not isinstance(y, (int, np.integer)):
        raise ConformanceError(f"the verifier returned {y!r} as {what}; expected an integer token id")
    if not 0 <= int(y) < vocab_size:
        raise ConformanceError(
            f"the verifier returned token {int(y)} as {what}, outside the vocabulary 0..{vocab_size - 1}"
        )
    return int(y)


def frozen(a: np.ndarray) -> np.ndarray:
    """A read-only copy, handed to the verifier under test (a write raises instead of corrupting the check)."""
    a = np.array(a)
    a.setflags(write=False)
    return a
