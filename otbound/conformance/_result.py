"""Result objects of the conformance kit and their JSON / Markdown / one-screen renderings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from otbound._io import atomic_path, json_text


@dataclass
class InstanceReport:
    """One instance. ``acceptance``: α = P(Y ∈ x̄) (token) or E[τ] (block, bonus excluded);
    ``optimal``: α* of the draft law (token) or U_causal (block); ``joint_bound``: U_joint (block).
    lossless_error: ``max |output law − target law|`` (block level: of the continued law over
    ``V^{L+1}``); total_variation: ``½ Σ |output law − target law|``, the distortion's size.
    Sample mode: both are Monte Carlo estimates (with sampling noise); ``acceptance`` is the mean over
    ``samples`` runs, ``p_value`` the G-test's, ``power`` its power against a distortion of the
    stated total-variation size.

    Parameters
    ----------
    label : str
        The instance's label.
    vocab_size, num_drafts : int
        V and K.
    lossless_error : float
        ``max |output law − target law|``.
    acceptance, optimal : float
        α and α* (token level), or E[τ] and U_causal (block level).
    passed : bool
        Whether the instance is lossless (exact: error ≤ tolerance; sample: no G-test rejection).
    block_len : int, optional
        L (block level).
    joint_bound : float, optional
        U_joint (block level).
    total_variation : float, optional
        ``½ Σ |output law − target law|``.
    samples : int, optional
        Sample mode: runs drawn.
    p_value, power : float, optional
        Sample mode: the G-test's p-value and power.
    acceptance_se : float, optional
        Sample mode: standard error of ``acceptance``.

    Examples
    --------
    >>> from otbound.conformance import check_token_verifier
    >>> from otbound.conformance.examples import rrs
    >>> report = check_token_verifier(rrs, vocab_size=3, num_drafts=2, instances=1).instances[0]
    >>> report.label, report.passed, report.lossless_error < 1e-10
    ('repeated drafts (q peaked where p is small)', True, True)
    >>> round(report.acceptance, 4), round(report.optimal, 4), round(report.efficiency, 4)
    (0.4933, 0.5267, 0.9367)
    """

    label: str
    vocab_size: int
    num_drafts: int
    lossless_error: float
    acceptance: float
    optimal: float
    passed: bool
    block_len: int | None = None
    joint_bound: float | None = None
    total_variation: float | None = None
    samples: int | None = None
    p_value: float | None = None
    power: float | None = None
    acceptance_se: float | None = None

    @property
    def efficiency(self) -> float | None:
        """acceptance / optimal, or None when the bound is below :data:`MIN_BOUND` (a ratio of two
        numbers near 0 — e.g. E[τ] = 1.5e-9 against U_causal = 2.5e-9 — measures nothing)."""
        if self.optimal < MIN_BOUND:
            return None
        return self.acceptance / self.optimal

    @property
    def efficiency_interval(self) -> tuple[float, float] | None:
        """Sample mode: a 95% interval of the efficiency (acceptance ± 1.96 standard errors, over the
        exact bound); None in exact mode or when :attr:`efficiency` is None."""
        if self.acceptance_se is None or self.efficiency is None:
            return None
        half = Z95 * self.acceptance_se / self.optimal
        return self.efficiency - half, self.efficiency + half


@dataclass
class Counterexample:
    """The smallest failing instance found (after shrinking, in exact mode).

    target / draft: the laws p, q (token level) or ``{prefix: law}`` tables (block level).
    output_law / target_law: the law of the emitted token (token level) or of the emitted sequence
    continued by the target to ``L + 1`` tokens, ``{sequence: probability}`` (block level).
    drafts: up to :data:`MAX_ROWS` draft tuples with their probability and the verifier's law
    given them. worst: the token / sequence of largest ``|output − target|``.

    Parameters
    ----------
    level : str
        "token" or "block".
    vocab_size, num_drafts : int
        V and K of the (shrunk) instance.
    sampling : str
        The draft law.
    lossless_error : float
        ``max |output law − target law|`` on it.
    target, draft : numpy.ndarray or dict
        The laws (token level) or ``{prefix: law}`` tables (block level).
    output_law, target_law : numpy.ndarray or dict
        The verifier's output law and the target's.
    worst : int or tuple
        The token (token level) or ``(sequence, output, target)`` (block level) of largest error.
    block_len : int, optional
        L (block level).
    drafts : list
        ``(draft tuple, probability, verifier's law)`` rows.
    label : str
        The label of the instance it was shrunk from.

    Examples
    --------
    A verifier that skips repeated drafts (lossy, the counterexample shrunk to V = 3, K = 2):

    >>> from otbound.conformance import check_token_verifier
    >>> from otbound.conformance.examples import rrs_skip_repeats
    >>> cex = check_token_verifier(rrs_skip_repeats, vocab_size=3, num_drafts=2, instances=9).counterexample
    >>> cex.level, cex.vocab_size, cex.num_drafts, round(cex.lossless_error, 4), cex.worst
    ('token', 3, 2, 0.0833, 1)
    >>> cex.target.tolist()
    [0.0, 0.5, 0.5]
    """

    level: str
    vocab_size: int
    num_drafts: int
    sampling: str
    lossless_error: float
    target: object
    draft: object
    output_law: object
    target_law: object
    worst: object
    block_len: int | None = None
    drafts: list = field(default_factory=list)
    label: str = ""


#: draft tuples listed in a counterexample
MAX_ROWS = 20
#: instances whose bound (α* or U_causal) is below this are left out of efficiency summaries
MIN_BOUND = 1e-6
#: efficiencies above this are shown as "> 10" (a lossy verifier far above a small bound)
MAX_SHOWN_EFFICIENCY = 10.0
#: two-sided 95% normal quantile of the sample-mode efficiency intervals
Z95 = 1.959963984540054
#: exact-mode tolerance (absolute, on max |output law − target law|) per precision: float64 sums of
#: exact laws (~1e-15 round-off), and float32 (≈ 8 float32 ulps of 1, ``8 × 2^-23 = 9.5e-7``: the
#: rounding of a softmax, a ratio and a renormalisation in float32, as engines compute; measured on
#: transformers' verifier in float32: at most 3.5e-8 absolute, V ≤ 3, L ≤ 3)
TOLERANCES = {"float64": 1e-10, "float32": 1e-6}
#: failing instances shrunk (the largest errors first); the smallest result is the counterexample
SHRINK_CANDIDATES = 3


def smallest(c: Counterexample) -> tuple:
    """Order counterexamples: fewest tokens, then drafts, then block length, then largest error."""
    return (c.vocab_size, c.num_drafts, c.block_len or 0, -c.lossless_error)


@dataclass
class ConformanceResult:
    """Verdict of :func:`check_token_verifier` / :func:`check_block_verifier`.

    lossless_error: max over instances (exact mode: ``max |output law − target law|``; sample mode:
    the largest Monte Carlo estimate of it, which carries sampling noise). passed: every instance
    lossless (exact: error ≤ ``tolerance``; sample: no G-test rejection at ``level``).
    counterexample: None when passed. declared_lossless: the verifier's own ``lossless`` flag where it
    has one (the package's verifiers through the adapters), else None; the summary says whether the
    check agrees with it.

    Parameters
    ----------
    level, mode : str
        "token" / "block" and "exact" / "sample".
    vocab_size, num_drafts : int
        V and K.
    sampling : str
        The draft law.
    tolerance : float or None
        Exact mode's tolerance on the lossless error (None in sample mode).
    instances : list of InstanceReport
        One report per instance.
    counterexample : Counterexample or None
        The smallest failing instance, None when every instance passed.
    block_len : int, optional
        L (block level).
    name : str
        The verifier's name in the reports.
    level_alpha, distortion, target_power : float, optional
        Sample mode: the per-instance G-test level, the distortion size and the power aimed at.
    declared_lossless : bool, optional
        The verifier's own ``lossless`` flag.
    precision : str
        "float64" or "float32" (exact mode's default tolerance).

    Examples
    --------
    >>> import os
    >>> import tempfile
    >>> from otbound.conformance import check_token_verifier
    >>> from otbound.conformance.examples import rrs
    >>> res = check_token_verifier(rrs, vocab_size=3, num_drafts=2, instances=3)
    >>> res.passed, res.lossless_error < 1e-10, res.counterexample is None
    (True, True, True)
    >>> res.efficiency.round(4).tolist()
    [0.9367, 1.0, 1.0]
    >>> print(res.summary().splitlines()[0])
    rrs: PASS: lossless  (token level, V = 3, K = 2, with_replacement, exact mode, 3 instances)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     sorted(os.listdir(res.write(d)))
    ['report.json', 'report.md']
    """

    level: str
    mode: str
    vocab_size: int
    num_drafts: int
    sampling: str
    tolerance: float
    instances: list[InstanceReport]
    counterexample: Counterexample | None
    block_len: int | None = None
    name: str = "verifier"
    level_alpha: float | None = None
    distortion: float | None = None
    target_power: float | None = None
    declared_lossless: bool | None = None
    precision: str = "float64"

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.instances)

    @property
    def lossless_error(self) -> float:
        return max(r.lossless_error for r in self.instances)

    @property
    def acceptance(self) -> np.ndarray:
        return np.array([r.acceptance for r in self.instances])

    @property
    def optimal(self) -> np.ndarray:
        return np.array([r.optimal for r in self.instances])

    @property
    def efficiency(self) -> np.ndarray:
        """Per-instance efficiency; NaN where the bound is below :data:`MIN_BOUND` (not measured)."""
        return np.array([np.nan if r.efficiency is None else r.efficiency for r in self.instances])

    @property
    def within_float32_rounding(self) -> bool:
        """Exact mode, failed, yet every error is at most the float32 tolerance: a float32 verifier's
        rounding, not a defect of its algorithm (``precision="float32"`` accepts it)."""
        return (
            self.mode == "exact"
            and not self.passed
            and self.tolerance < TOLERANCES["float32"]
            and self.lossless_error <= TOLERANCES["float32"]
        )

    def efficiency_lines(self) -> list[str]:
        """The efficiency summary: mean / min / max over instances whose bound is ≥ :data:`MIN_BOUND`
        (the others listed), with a 95% interval in sample mode; "not meaningful" for a lossy verifier
        (its acceptance is not bounded by a lossless bound)."""
        bound = "α*" if self.level == "token" else "U_causal"
        acc = "α" if self.level == "token" else "E[τ]"
        kept = [r for r in self.instances if r.efficiency is not None]
        skipped = [r.label for r in self.instances if r.efficiency is None]
        if not self.passed:
            line = (
                f"efficiency {acc}/{bound}: not meaningful (the verifier is not lossless; {bound} bounds lossless "
                "verifiers only)"
            )
        elif not kept:
            line = f"efficiency {acc}/{bound}: no instance with {bound} ≥ {MIN_BOUND:g}"
        else:
            eff = np.array([r.efficiency for r in kept])
            line = f"efficiency {acc}/{bound}: mean {_f(eff.mean())}, min {_f(eff.min())}, max {_f(eff.max())}"
            if self.mode == "sample":
                ses = np.array([r.acceptance_se / r.optimal for r in kept])
                half = Z95 * float(np.sqrt(np.sum(ses**2))) / len(kept)
                line += f" (mean ± {_f(half)} at 95%; per-instance intervals in the table)"
            line += f" over {len(kept)} instances"
        lines = [line]
        if skipped:
            lines.append(f"  not averaged ({bound} < {MIN_BOUND:g}): " + "; ".join(skipped))
        return lines

    @property
    def power(self) -> float | None:
        """Sample mode: the smallest per-instance power (lower bound, see :mod:`._stats`)."""
        vals = [r.power for r in self.instances if r.power is not None]
        return min(vals) if vals else None

    # -- renderings ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(passed=self.passed, lossless_error=self.lossless_error, power=self.power)
        d["within_float32_rounding"] = self.within_float32_rounding
        for r, row in zip(self.instances, d["instances"], strict=True):
            row["efficiency"] = r.efficiency
            row["efficiency_interval"] = r.efficiency_interval
        return _jsonable(d)

    def _what(self) -> tuple[str, str]:
        bound = "α*" if self.level == "token" else "U_causal"
        shape = f"V = {self.vocab_size}, K = {self.num_drafts}"
        if self.level == "block":
            shape += f", L = {self.block_len}"
        else:
            shape += f", {self.sampling}"
        return bound, shape

    def _verdict_lines(self) -> list[str]:
        if self.mode == "exact":
            lines = [
                f"max lossless error {_e(self.lossless_error)} (tolerance {self.tolerance:g}, "
                f"precision {self.precision}, exact enumeration)"
            ]
            if self.within_float32_rounding:
                lines.append(
                    f"  every error is within float32 rounding of the laws (≤ {TOLERANCES['float32']:g} = 8 float32 "
                    "ulps of 1; float32 carries about 7 digits, eps 1.2e-7): a verifier computing in float32 shows "
                    "this much; check it at its precision with "
                    f"precision='float32' (tolerance={TOLERANCES['float32']:g}) or set tolerance= "
                    "(CLI: --precision float32 / --tolerance)"
                )
            return lines
        lines = [
            f"G-test at level {self.level_alpha:.2g} per instance (an instance passes iff p-value ≥ "
            f"{self.level_alpha:.2g}); power ≥ {self.power:.4f} against any {self.distortion:g} total-variation "
            f"distortion; largest empirical error {_e(self.lossless_error)}"
        ]
        if self.passed and self.target_power is not None and self.power < self.target_power:
            lines.append(
                f"  power below {self.target_power:g}: this pass rules out only distortions much larger than "
                f"{self.distortion:g} (leave samples= unset for the size reaching the power)"
            )
        return lines

    def summary(self) -> str:
        """The one-screen verdict the CLI prints."""
        bound, shape = self._what()
        acc = "α" if self.level == "token" else "E[τ]"
        head = "PASS: lossless" if self.passed else "FAIL: NOT lossless"
        lines = [
            f"{self.name}: {head}  ({self.level} level, {shape}, {self.mode} mode, {len(self.instances)} instances)"
        ]
        if self.declared_lossless is not None:
            agree = "agrees" if self.declared_lossless == self.passed else "DISAGREES"
            lines.append(f"declared lossless: {'yes' if self.declared_lossless else 'no'} ({agree} with this check)")
        lines += self._verdict_lines()
        lines += self.efficiency_lines()
        lines.append("")
        eff_w = 19 if self.mode == "sample" else 11
        lines.append(f"{'instance':<46} {'error':>9} {acc:>8} {bound:>8} {'eff':>{eff_w}}  ok")
        for r in self.instances[:24]:
            lines.append(
                f"{r.label[:46]:<46} {_e(r.lossless_error):>9} {_f(r.acceptance):>8} {_f(r.optimal):>8} "
                f"{_eff(r):>{eff_w}}  {'yes' if r.passed else 'NO'}"
            )
        if len(self.instances) > 24:
            lines.append(f"... {len(self.instances) - 24} more in the report")
        if self.counterexample is not None:
            lines.append("")
            lines.extend(_counterexample_lines(self.counterexample))
        return "\n".join(lines)

    def to_markdown(self) -> str:
        bound, shape = self._what()
        acc = "α" if self.level == "token" else "E[τ]"
        out = [
            f"# Conformance report: {self.name}",
            "",
            f"**{'PASS' if self.passed else 'FAIL'}** — {self.level} level, {shape}, {self.mode} mode.",
            "",
        ]
        out += self._verdict_lines() + [""] + self.efficiency_lines()
        out += [
            "",
            f"| instance | lossless error | {acc} | {bound} | efficiency | passed |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.instances:
            out.append(
                f"| {r.label} | {_e(r.lossless_error)} | {_f(r.acceptance, 6)} | {_f(r.optimal, 6)} | {_eff(r)} "
                f"| {'yes' if r.passed else 'NO'} |"
            )
        if self.counterexample is not None:
            out += ["", "## Counterexample", "", "```"] + _counterexample_lines(self.counterexample) + ["```"]
        return "\n".join(out) + "\n"

    def write(self, out) -> Path:
        """Write ``report.json`` (strict JSON) and ``report.md`` into directory ``out``, as a pair: both
        complete under temporary names before either replaces its predecessor."""
        out = Path(out)
        texts = {"report.json": json_text(self.to_dict(), indent=1) + "\n", "report.md": self.to_markdown()}
        with atomic_path(out / "report.json") as tmp_json, atomic_path(out / "report.md") as tmp_md:
            tmp_json.write_text(texts["report.json"], encoding="utf-8")
            tmp_md.write_text(texts["report.md"], encoding="utf-8")
        return out


def _f(x, digits: int = 4) -> str:
    """A finite number with ``digits`` decimals, never "-0.0000" (a round-off below zero prints 0);
    "—" for None / NaN / inf."""
    if x is None or not np.isfinite(x):
        return "—"
    return f"{round(float(x), digits) + 0.0:.{digits}f}"


def _e(x) -> str:
    """An error in scientific notation ("—" if not finite; never "-0.00e+00")."""
    return "—" if x is None or not np.isfinite(x) else f"{float(x) + 0.0:.2e}"


def _eff(r: InstanceReport) -> str:
    """The efficiency cell: "—" when the bound is below MIN_BOUND, an interval in sample mode."""
    if r.efficiency is None:
        return "— (bound≈0)"
    if r.efficiency > MAX_SHOWN_EFFICIENCY:  # only a lossy verifier exceeds its bound this far
        return f"> {MAX_SHOWN_EFFICIENCY:g}"
    iv = r.efficiency_interval
    if iv is None:
        return _f(r.efficiency)
    return f"{_f(r.efficiency)} [{_f(iv[0], 3)},{_f(iv[1], 3)}]"


def _fmt(x) -> str:
    return np.array2string(np.asarray(x, dtype=float), precision=6, suppress_small=False, separator=", ")


def _counterexample_lines(c: Counterexample) -> list[str]:
    shape = f"V = {c.vocab_size}, K = {c.num_drafts}" + (f", L = {c.block_len}" if c.block_len else f", {c.sampling}")
    lines = [f"counterexample ({shape}; from instance '{c.label}'): lossless error {c.lossless_error:.6g}"]
    if c.level == "token":
        lines += [f"  p (target) = {_fmt(c.target)}", f"  q (draft)  = {_fmt(c.draft)}"]
        lines += [f"  output law = {_fmt(c.output_law)}", f"  target law = {_fmt(c.target_law)}"]
        out, tgt = float(np.asarray(c.output_law)[c.worst]), float(np.asarray(c.target_law)[c.worst])
        lines.append(f"  worst token {c.worst}: verifier {out:.10g} vs target {tgt:.10g} (difference {out - tgt:+.3g})")
        for tup, prob, law in c.drafts[:8]:
            lines.append(f"  drafts {tup}: Q = {prob:.6g}, verifier's law = {_fmt(law)}")
    else:
        for name, table in (("target", c.target), ("draft", c.draft)):
            for pre, law in list(table.items())[:8]:
                lines.append(f"  {name}{list(pre)} = {_fmt(law)}")
        seq, out, tgt = c.worst
        lines.append(
            f"  worst sequence {list(seq)}: verifier {out:.10g} vs target {tgt:.10g} (difference {out - tgt:+.3g})"
        )
        for tup, prob, law in c.drafts[:6]:
            emitted = ", ".join(f"{list(s)}: {w:.4g}" for s, w in list(law.items())[:6])
            lines.append(f"  drafts {tup}: Q = {prob:.4g}, emitted {{{emitted}}}")
    return lines


def _jsonable(x):
    if isinstance(x, dict):
        return {(",".join(map(str, k)) if isinstance(k, tuple) else str(k)): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    return x
