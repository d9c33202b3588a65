"""Result objects of the conformance kit and their JSON / Markdown / one-screen renderings."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from otbound._io import write_text_atomic


@dataclass
class InstanceReport:
    """One instance. ``acceptance``: α = P(Y ∈ x̄) (token) or E[τ] (block, bonus excluded);
    ``optimal``: α* of the draft law (token) or U_causal (block); ``joint_bound``: U_joint (block).
    lossless_error: ``max |output law − target law|`` (block level: of the continued law over
    ``V^{L+1}``); total_variation: ``½ Σ |output law − target law|``, the distortion's size.
    Sample mode: both are Monte Carlo estimates (with sampling noise); ``acceptance`` is the mean over
    ``samples`` runs, ``p_value`` the G-test's, ``power`` its power against a distortion of the
    stated total-variation size.
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

    @property
    def efficiency(self) -> float:
        """acceptance / optimal; 1 when both are 0 (nothing can be accepted and nothing is)."""
        if self.optimal > 0:
            return self.acceptance / self.optimal
        return 1.0 if self.acceptance <= 0 else float("inf")


@dataclass
class Counterexample:
    """The smallest failing instance found (after shrinking, in exact mode).

    target / draft: the laws p, q (token level) or ``{prefix: law}`` tables (block level).
    output_law / target_law: the law of the emitted token (token level) or of the emitted sequence
    continued by the target to ``L + 1`` tokens, ``{sequence: probability}`` (block level).
    drafts: up to :data:`MAX_ROWS` draft tuples with their probability and the verifier's law
    given them. worst: the token / sequence of largest ``|output − target|``.
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
        return np.array([r.efficiency for r in self.instances])

    @property
    def power(self) -> float | None:
        """Sample mode: the smallest per-instance power (lower bound, see :mod:`._stats`)."""
        vals = [r.power for r in self.instances if r.power is not None]
        return min(vals) if vals else None

    # -- renderings ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(passed=self.passed, lossless_error=self.lossless_error, power=self.power)
        for r, row in zip(self.instances, d["instances"], strict=True):
            row["efficiency"] = r.efficiency
        return _jsonable(d)

    def _what(self) -> tuple[str, str]:
        bound = "α*" if self.level == "token" else "U_causal"
        shape = f"V = {self.vocab_size}, K = {self.num_drafts}"
        if self.level == "block":
            shape += f", L = {self.block_len}"
        else:
            shape += f", {self.sampling}"
        return bound, shape

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
        if self.mode == "exact":
            lines.append(
                f"max lossless error {self.lossless_error:.3g} (tolerance {self.tolerance:g}, exact enumeration)"
            )
        else:
            lines.append(
                f"G-test at level {self.level_alpha:.2g} per instance; power ≥ {self.power:.4f} against any "
                f"{self.distortion:g} total-variation distortion; largest empirical error {self.lossless_error:.3g}"
            )
        eff = self.efficiency
        lines.append(
            f"efficiency {acc}/{bound}: mean {np.nanmean(eff):.4f}, min {np.nanmin(eff):.4f}, max {np.nanmax(eff):.4f}"
        )
        lines.append("")
        lines.append(f"{'instance':<46} {'error':>9} {acc:>8} {bound:>8} {'eff':>7}  ok")
        for r in self.instances[:24]:
            lines.append(
                f"{r.label[:46]:<46} {r.lossless_error:>9.2e} {r.acceptance:>8.4f} {r.optimal:>8.4f} "
                f"{r.efficiency:>7.4f}  {'yes' if r.passed else 'NO'}"
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
        if self.mode == "exact":
            out.append(
                f"Max lossless error {self.lossless_error:.3g} "
                f"(tolerance {self.tolerance:g}; exact law by enumeration)."
            )
        else:
            out.append(
                f"G-test per instance at level {self.level_alpha:.2g}; power ≥ {self.power:.4f} against any distortion "
                f"of total-variation size {self.distortion:g}."
            )
        out += [
            "",
            f"| instance | lossless error | {acc} | {bound} | efficiency | passed |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.instances:
            out.append(
                f"| {r.label} | {r.lossless_error:.3g} | {r.acceptance:.6f} | {r.optimal:.6f} | {r.efficiency:.4f} "
                f"| {'yes' if r.passed else 'NO'} |"
            )
        if self.counterexample is not None:
            out += ["", "## Counterexample", "", "```"] + _counterexample_lines(self.counterexample) + ["```"]
        return "\n".join(out) + "\n"

    def write(self, out) -> Path:
        """Write ``report.json`` and ``report.md`` into directory ``out`` (atomic: temp file + rename)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "report.json", json.dumps(self.to_dict(), indent=1) + "\n")
        write_text_atomic(out / "report.md", self.to_markdown())
        return out


def _fmt(x) -> str:
    return np.array2string(np.asarray(x, dtype=float), precision=6, suppress_small=False, separator=", ")


def _counterexample_lines(c: Counterexample) -> list[str]:
    shape = f"V = {c.vocab_size}, K = {c.num_drafts}" + (f", L = {c.block_len}" if c.block_len else f", {c.sampling}")
    lines = [f"counterexample ({shape}; from instance '{c.label}'): lossless error {c.lossless_error:.6g}"]
    if c.level == "token":
        lines += [f"  p (target) = {_fmt(c.target)}", f"  q (draft)  = {_fmt(c.draft)}"]
        lines += [f"  output law = {_fmt(c.output_law)}", f"  target law = {_fmt(c.target_law)}"]
        lines.append(f"  worst token {c.worst}")
        for tup, prob, law in c.drafts[:8]:
            lines.append(f"  drafts {tup}: Q = {prob:.6g}, verifier's law = {_fmt(law)}")
    else:
        for name, table in (("target", c.target), ("draft", c.draft)):
            for pre, law in list(table.items())[:8]:
                lines.append(f"  {name}{list(pre)} = {_fmt(law)}")
        seq, out, tgt = c.worst
        lines.append(f"  worst sequence {list(seq)}: verifier {out:.6g} vs target {tgt:.6g}")
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
