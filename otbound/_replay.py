"""Exact law of a randomised function by enumerating its choice tree (implementation).

A verifier written against two primitives, ``coin(prob) -> bool`` and ``draw(law) -> int``, is a
finite tree of decisions. :func:`enumerate_outcomes` re-runs the function with a scripted sequence
of answers, depth first: the first run answers every decision with its first possible outcome and
queues the alternatives (``coin``: True then False; ``draw``: the tokens of positive mass in
increasing order); every later run replays one queued prefix and goes on the same way. Each run is
one branch, its probability the product of the probabilities of its answers, so the law of the
returned value is exact up to float64 rounding of those products (~1e-16 relative) — no sampling.

The one enumerator of the package, used twice:

* by the block verifiers (:meth:`otbound.block.verifiers.BlockVerifier.conditional_law`,
  ``acceptance``, ``lossless_error``: their ``walk(inst, coin, draw)``), trusted code:
  ``checked=False`` clips each probability to [0, 1] and takes each law as given;
* by the conformance kit (:func:`otbound.conformance.enumerate_outcomes`), anyone's verifier:
  ``checked=True`` (the default) refuses a probability outside [0, 1] (beyond ``PROB_SLACK``) or a
  law that is not one (beyond ``LAW_ATOL``), renormalises laws, demands that a replayed prefix asks
  the same questions (the function must be deterministic given the answers) and caps the branches
  at ``max_branches``; a violation raises ``error`` with one clear sentence.
"""

from __future__ import annotations

import numpy as np

from otbound._validation import LAW_ATOL, InvalidInputError

#: default cap on the branches enumerated for one call (one draft tuple), checked mode
MAX_BRANCHES = 200_000
#: checked mode: cap on the coin / draw decisions of one run (a verifier that never returns keeps
#: asking; every decision queues its prefix, so an endless run costs quadratic memory until stopped)
MAX_DECISIONS = 2_000
#: a coin probability may leave [0, 1] by this much (float64 round-off of min(1, a/b)) and is clipped
PROB_SLACK = 1e-9


class _Script:
    """The two primitives for one run: replay ``path``, then first outcomes, queueing the rest.

    ``path``: ``((answer, question), ...)``, the question ``None`` in unchecked mode."""

    __slots__ = ("path", "asked", "taken", "weight", "pending", "vocab_size", "checked", "error")

    def __init__(self, path: tuple, pending: list, vocab_size: int | None, checked: bool, error):
        self.path = path
        self.asked: list = []  # the question at each position, to check replays ask the same
        self.taken: list = []
        self.weight = 1.0
        self.pending = pending
        self.vocab_size = vocab_size
        self.checked = checked
        self.error = error

    def _replayed(self, question):
        pos = len(self.taken)
        if self.checked and pos >= MAX_DECISIONS:
            raise self.error(
                f"the verifier asked more than {MAX_DECISIONS} coin/draw decisions in one run without returning "
                "(an endless loop?)"
            )
        if pos >= len(self.path):
            return None
        answer, recorded = self.path[pos]
        if self.checked and not _same_question(recorded, question):
            raise self.error(
                f"the verifier is not deterministic given coin/draw outcomes: decision {pos} asked "
                f"{_describe(question)} on one run and {_describe(recorded)} on another (use only coin and draw "
                "for randomness)"
            )
        return answer

    def coin(self, prob) -> bool:
        if self.checked:
            p = check_coin_probability(prob, self.error)
            question = ("coin", p)
        else:
            p, question = min(max(float(prob), 0.0), 1.0), None
        answer = self._replayed(question)
        if answer is None:
            answer = p > 0.0
            if 0.0 < p < 1.0:
                self.pending.append(tuple(zip(self.taken, self.asked, strict=True)) + ((False, question),))
        self.weight *= p if answer else 1.0 - p
        self.taken.append(answer)
        self.asked.append(question)
        return bool(answer)

    def draw(self, law) -> int:
        if self.checked:
            w = check_draw_law(law, self.vocab_size, self.error)
            question = ("draw", w)
        else:
            w, question = law, None
        answer = self._replayed(question)
        if answer is None:
            support = np.flatnonzero(w > 0)
            answer = int(support[0])
            prefix = tuple(zip(self.taken, self.asked, strict=True))
            self.pending.extend(prefix + ((int(j), question),) for j in support[:0:-1])
        self.weight *= float(w[answer])
        self.taken.append(answer)
        self.asked.append(question)
        return int(answer)


def enumerate_outcomes(
    run, *, max_branches: int | None = MAX_BRANCHES, vocab_size: int | None = None, checked: bool = True,
    error: type[Exception] = InvalidInputError,
) -> list:
    """Every branch of ``run(coin, draw)`` as ``(probability, value)``, probabilities summing to 1.

    Parameters
    ----------
    run : callable
        ``run(coin, draw) -> value``, deterministic given the answers of ``coin`` and ``draw``.
    max_branches : int or None
        Refuse (``error``) a tree with more branches; None: no cap.
    vocab_size : int or None
        Checked mode: every law passed to ``draw`` must have this length.
    checked : bool
        Check every probability, law and replay (see the module docstring).
    error : type
        The exception raised when ``run`` breaks the contract.

    Returns
    -------
    list of (float, object)
        Branches of probability 0 are never taken (a coin of probability 0 or 1 does not branch).

    Examples
    --------
    >>> def two_coins(coin, draw):
    ...     return coin(0.5) + coin(0.25)
    >>> sorted(enumerate_outcomes(two_coins))
    [(0.125, 1), (0.125, 2), (0.375, 0), (0.375, 1)]
    """
    out, pending = [], [()]
    while pending:
        if max_branches is not None and len(out) >= max_branches:
            raise error(
                f"the verifier's choice tree has more than {max_branches} branches for one draft tuple; "
                "use a smaller vocabulary / K / block length, raise max_branches, or use mode='sample'"
            )
        script = _Script(pending.pop(), pending, vocab_size, checked, error)
        value = run(script.coin, script.draw)
        if len(script.taken) < len(script.path):
            raise error(
                "the verifier is not deterministic given coin/draw outcomes: a replayed run asked fewer "
                "questions than the run it replays"
            )
        if script.weight > 0.0:
            out.append((script.weight, value))
    return out


def check_coin_probability(prob, error) -> float:
    """``prob`` as a probability (within ``PROB_SLACK`` of [0, 1], clipped), else ``error``: the
    check of every ``coin`` in checked mode and of :func:`otbound.conformance.as_sampler`."""
    try:
        p = float(prob)
    except (TypeError, ValueError):
        raise error(f"coin() needs a probability, got {prob!r}") from None
    if not np.isfinite(p) or p < -PROB_SLACK or p > 1.0 + PROB_SLACK:
        raise error(f"coin() got probability {p!r}, outside [0, 1]")
    return min(1.0, max(0.0, p))


def check_draw_law(law, vocab_size, error) -> np.ndarray:
    """``law`` as a 1-D law (non-negative, finite, summing to 1 within ``LAW_ATOL``, of
    ``vocab_size`` entries if given), renormalised, else ``error``: the check of every ``draw`` in
    checked mode and of :func:`otbound.conformance.as_sampler`."""
    try:
        w = np.asarray(law, dtype=np.float64)
    except (TypeError, ValueError):
        raise error(f"draw() needs a law (a 1-D array of probabilities), got {type(law).__name__}") from None
    if w.ndim != 1 or w.size == 0:
        raise error(f"draw() needs a 1-D law, got shape {w.shape}")
    if vocab_size is not None and w.size != vocab_size:
        raise error(f"draw() got a law over {w.size} tokens, expected vocab_size = {vocab_size}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise error("draw() got a law with a negative, NaN or infinite entry")
    s = float(w.sum())
    if abs(s - 1.0) > LAW_ATOL:
        raise error(f"draw() got a law summing to {s:.9g}, not 1 (tolerance {LAW_ATOL:g})")
    return w / s


def _same_question(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "coin":
        return a[1] == b[1]
    return a[1].shape == b[1].shape and np.array_equal(a[1], b[1])


def _describe(question) -> str:
    kind, arg = question
    return f"coin({arg:.6g})" if kind == "coin" else f"draw(law over {arg.size} tokens)"
