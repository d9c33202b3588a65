"""The kit's view of the package's choice-tree enumerator (:mod:`otbound._replay`): its error class
and :func:`enumerate_outcomes` in checked mode (implementation).

The enumerator re-runs a function of ``coin(prob) -> bool`` and ``draw(law) -> int`` once per
branch of its decision tree, depth first, so the law of the returned value is exact up to float64
rounding (~1e-16 relative) — no sampling. Here every probability, law and replay is checked: the
function must be deterministic given the answers; a mismatch, an invalid probability or law, more
than ``max_branches`` branches or more than 2,000 decisions in one run (a verifier that never
returns) raise :class:`ConformanceError` with one clear sentence.
"""

from __future__ import annotations

import contextlib

from otbound import InvalidInputError
from otbound._replay import MAX_BRANCHES
from otbound._replay import enumerate_outcomes as _enumerate

#: routing violations raised inside a verifier, kept here so that a verifier swallowing the error
#: (``except Exception``) still gets no verdict: the kit raises the first after the verifier returns
VIOLATIONS: list = []


def raise_recorded() -> None:
    """Raise the first routing violation recorded since the last call (and forget them all)."""
    if VIOLATIONS:
        first = VIOLATIONS[0]
        VIOLATIONS.clear()
        raise ConformanceError(f"{first} (the verifier caught this error and went on; no verdict is given)")


@contextlib.contextmanager
def violations_reraised():
    """A block that forgets earlier routing violations and, when it ends without an exception,
    raises the first violation recorded inside it: a verifier run in the block that caught the
    kit's error and went on gets no result.

    Examples
    --------
    >>> import otbound.conformance as oc
    >>> def swallows(coin, draw):
    ...     with oc.route_randomness(coin, draw) as rng:
    ...         try:
    ...             rng.standard_normal()  # not routable: a violation, caught here
    ...         except Exception:
    ...             pass
    ...     return 0
    >>> with oc.violations_reraised():
    ...     oc.enumerate_outcomes(swallows)
    Traceback (most recent call last):
        ...
    otbound.conformance._tree.ConformanceError: rng.standard_normal cannot be routed to coin / draw ...
    """
    VIOLATIONS.clear()
    yield
    raise_recorded()


def violation(message: str) -> ConformanceError:
    """A :class:`ConformanceError` of ``message``, recorded in :data:`VIOLATIONS`."""
    VIOLATIONS.append(message)
    return ConformanceError(message)


class ConformanceError(InvalidInputError):
    """The verifier under test broke the kit's contract (bad probability or law, nondeterminism,
    too many branches, an output that is not a token sequence).

    A subclass of :class:`otbound.InvalidInputError` (so a ``ValueError``); the command line
    reports it in one line and exits 2.

    Examples
    --------
    >>> from otbound.conformance import ConformanceError, enumerate_outcomes
    >>> try:
    ...     enumerate_outcomes(lambda coin, draw: coin(1.5))
    ... except ConformanceError as err:
    ...     print(err)
    coin() got probability 1.5, outside [0, 1]
    """


def enumerate_outcomes(run, *, max_branches: int = MAX_BRANCHES, vocab_size: int | None = None) -> list:
    """Every branch of ``run(coin, draw)`` as ``(probability, value)``, probabilities summing to 1.

    ``vocab_size``: when given, every law passed to ``draw`` must have this length. Branches of
    probability 0 are never taken (a coin of probability 0 or 1 does not branch). Contract
    violations raise :class:`ConformanceError`.

    Examples
    --------
    >>> import numpy as np
    >>> def verify(coin, draw):  # one coin, then a token from one of two laws
    ...     return draw(np.array([0.5, 0.5]) if coin(0.2) else np.array([1.0, 0.0]))
    >>> law = {}
    >>> for prob, y in enumerate_outcomes(verify, vocab_size=2):
    ...     law[y] = law.get(y, 0.0) + prob
    >>> {y: round(pr, 12) for y, pr in sorted(law.items())}
    {0: 0.9, 1: 0.1}
    """
    def checked_run(coin, draw):
        VIOLATIONS.clear()  # what an earlier call left (an error that propagated) is not this run's
        value = run(coin, draw)
        raise_recorded()  # a routing error the verifier swallowed: no branch, no verdict
        return value

    return _enumerate(checked_run, max_branches=max_branches, vocab_size=vocab_size, checked=True,
                      error=ConformanceError)
