"""Drafter invariance as a checkable property (implementation).

A drafting-and-verification *procedure* ``procedure(p, q, num_drafts, rng) -> (drafts, token)``
draws its drafts from q and emits a token, all its randomness from the numpy generator ``rng``. It is
*drafter-invariant* when, given the same randomness, the emitted token does not depend on q: two
drafters sharing a seed produce the same output (Daliri et al., arXiv 2408.07978; Gumbel-max list
sampling, Rowan et al., arXiv 2506.05632). Losslessness does not imply it: SpecInfer's RRS is
lossless and its output follows the drafts, hence q.

:func:`check_drafter_invariance` runs the procedure on each instance's p with the instance's q and
with a second draft law q' (the next instance's q, cyclically: a different law over the same
tokens), on the same seeded stream ``np.random.default_rng([seed, instance, run])``, for ``runs``
streams per instance, and reports the streams whose tokens differ, with the first as the
counterexample. The check is exact for what it finds (a differing pair is a proof of dependence on
q); a procedure passing it agreed on every stream tried.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from otbound._io import write_text_atomic
from otbound._validation import InvalidInputError, check_positive_int
from otbound.conformance._instances import token_instances
from otbound.conformance._tree import ConformanceError


@dataclass(frozen=True)
class InvarianceCounterexample:
    """Two draft laws, one stream, two outputs.

    Attributes
    ----------
    p, q, q_other : numpy.ndarray
        The target law and the two draft laws (V,).
    stream : tuple of int
        The seed of the shared stream, ``np.random.default_rng(list(stream))``.
    drafts, drafts_other : tuple of int
        The drafts each run produced.
    token, token_other : int
        The tokens each run emitted (different).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.conformance import check_drafter_invariance
    >>> from otbound.conformance.examples import specinfer_procedure
    >>> c = check_drafter_invariance(specinfer_procedure, instances=2, runs=8).counterexample
    >>> _, token = specinfer_procedure(c.p, c.q, 2, np.random.default_rng(list(c.stream)))
    >>> token == c.token != c.token_other   # it reproduces
    True
    """

    p: np.ndarray
    q: np.ndarray
    q_other: np.ndarray
    stream: tuple
    drafts: tuple
    drafts_other: tuple
    token: int
    token_other: int


@dataclass(frozen=True)
class InvarianceResult:
    """Output of :func:`check_drafter_invariance`.

    Attributes
    ----------
    name : str
        The procedure's name.
    num_drafts : int
        K.
    runs : int
        Shared streams tried (over all instances).
    differing : int
        Streams whose two outputs differ.
    counterexample : InvarianceCounterexample or None
        The first differing stream.
    passed : bool
        ``differing == 0`` (a property).

    Examples
    --------
    >>> from otbound.conformance import check_drafter_invariance
    >>> from otbound.conformance.examples import gls_procedure
    >>> res = check_drafter_invariance(gls_procedure, instances=2, runs=8)
    >>> res.passed, res.runs, res.summary().endswith("(K = 2)")
    (True, 16, True)
    """

    name: str
    num_drafts: int
    runs: int
    differing: int
    counterexample: InvarianceCounterexample | None

    @property
    def passed(self) -> bool:
        return self.differing == 0

    def summary(self) -> str:
        """A few lines: the verdict, and the counterexample if any."""
        head = (f"{self.name}: drafter-invariant on all {self.runs} shared streams (K = {self.num_drafts})"
                if self.passed else
                f"{self.name}: NOT drafter-invariant: {self.differing} of {self.runs} shared streams give "
                f"different tokens under two draft laws (K = {self.num_drafts})")  # fmt: skip
        c = self.counterexample
        if c is None:
            return head
        return "\n".join([
            head,
            f"  p = {np.round(c.p, 4).tolist()}",
            f"  q = {np.round(c.q, 4).tolist()}: drafts {list(c.drafts)}, token {c.token}",
            f"  q' = {np.round(c.q_other, 4).tolist()}: drafts {list(c.drafts_other)}, token {c.token_other}",
            f"  stream: np.random.default_rng({list(c.stream)})",
        ])  # fmt: skip

    def to_dict(self) -> dict:
        c = self.counterexample
        return {
            "property": "drafter_invariance",
            "name": self.name,
            "num_drafts": self.num_drafts,
            "runs": self.runs,
            "differing": self.differing,
            "passed": self.passed,
            "counterexample": None if c is None else {
                "p": c.p.tolist(), "q": c.q.tolist(), "q_other": c.q_other.tolist(), "stream": list(c.stream),
                "drafts": list(c.drafts), "drafts_other": list(c.drafts_other),
                "token": c.token, "token_other": c.token_other,
            },
        }  # fmt: skip

    def write(self, out) -> Path:
        """Write ``report.json`` and ``report.md`` into directory ``out`` (atomically)."""
        import json

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "report.json", json.dumps(self.to_dict(), indent=1) + "\n")
        write_text_atomic(out / "report.md", "# Drafter invariance\n\n```\n" + self.summary() + "\n```\n")
        return out


def _call(procedure, p, q, k, rng):
    out = procedure(p, q, k, rng)
    try:
        drafts, token = out
        drafts = tuple(int(x) for x in np.asarray(drafts).ravel())
        token = int(token)
    except (TypeError, ValueError):
        raise ConformanceError(
            f"a procedure returns (drafts, token), got {type(out).__name__}: {out!r}"[:300]
        ) from None
    if not 0 <= token < p.size:
        raise ConformanceError(f"the procedure emitted token {token}, not a token id in [0, {p.size})")
    return drafts, token


def check_drafter_invariance(procedure, *, vocab_size: int = 3, num_drafts: int = 2, instances: int = 12,
                             runs: int = 64, seed: int = 0, name: str | None = None) -> InvarianceResult:
    """Check that a procedure's output does not depend on the draft law given its randomness
    (module docstring).

    Parameters
    ----------
    procedure : callable
        ``procedure(p, q, num_drafts, rng) -> (drafts, token)``: draws K drafts from q and emits a
        token, every random choice from the numpy generator ``rng``.
    vocab_size : int
        V (default 3).
    num_drafts : int
        K.
    instances : int
        Target laws (and their draft laws) from :func:`otbound.conformance.token_instances`.
    runs : int
        Shared streams per instance.
    seed : int
        Seed of the instances and of the streams.
    name : str, optional
        Shown in the report (default: the procedure's ``__qualname__``).

    Returns
    -------
    InvarianceResult

    Raises
    ------
    otbound.InvalidInputError
        A bad count or V < 2.
    ConformanceError
        The procedure does not return ``(drafts, token)`` with a token id in ``[0, V)``.

    References
    ----------
    Daliri, Musco, Suresh, arXiv 2408.07978 (drafter-invariant speculative decoding); Rowan, Phan,
    Khisti, arXiv 2506.05632 (Gumbel-max list sampling).

    Examples
    --------
    >>> from otbound.conformance import check_drafter_invariance
    >>> from otbound.conformance.examples import gls_procedure, specinfer_procedure
    >>> check_drafter_invariance(gls_procedure, num_drafts=2, instances=4, runs=16).passed
    True
    >>> res = check_drafter_invariance(specinfer_procedure, num_drafts=2, instances=4, runs=16)
    >>> res.passed, res.counterexample.token != res.counterexample.token_other
    (False, True)
    """
    v = check_positive_int(vocab_size, "vocab_size")
    if v < 2:
        raise InvalidInputError(f"drafter invariance needs two draft laws over at least 2 tokens, got V = {v}")
    k = check_positive_int(num_drafts, "num_drafts")
    n_inst = check_positive_int(instances, "instances")
    runs = check_positive_int(runs, "runs")
    insts = token_instances(v, k, "with_replacement", max(n_inst, 2), seed)
    name = name or getattr(procedure, "__qualname__", repr(procedure))
    differing, first, total = 0, None, 0
    for i in range(n_inst):
        p, q = insts[i].p, insts[i].q
        q_other = insts[(i + 1) % len(insts)].q
        if np.array_equal(q, q_other):
            q_other = np.roll(q, 1)
        if np.array_equal(q, q_other):  # uniform q: move mass onto token 0
            q_other = np.full(v, 0.25 / (v - 1))
            q_other[0] = 0.75
        for r in range(runs):
            stream = (seed, i, r)
            d1, t1 = _call(procedure, p, q, k, np.random.default_rng(list(stream)))
            d2, t2 = _call(procedure, p, q_other, k, np.random.default_rng(list(stream)))
            total += 1
            if t1 != t2:
                differing += 1
                if first is None:
                    first = InvarianceCounterexample(p, q, q_other, stream, d1, d2, t1, t2)
    return InvarianceResult(name, k, total, differing, first)
