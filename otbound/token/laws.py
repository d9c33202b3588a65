"""The three draft laws as objects (theory.md §2): everything that depends on the law dispatches
through :data:`DRAFT_LAWS`, keyed by the public ``sampling="..."`` names.

Each :class:`DraftLaw` carries how K drafts are drawn from q (``sample``), the joint law of the
ordered tuple (``joint``), Q(H) (``subset_mass``), P(y ∈ x̄) (``inclusion``), its α* routine
(``optimal_acceptance``, :mod:`otbound.token.bounds`), the law coupled in the lower relaxation and
the check of a draft tuple. Formulas and citations: :mod:`otbound.token.draft_laws`.
"""

from __future__ import annotations

import itertools

import numpy as np

from otbound._validation import InvalidInputError, check_sampling
from otbound.token.draft_laws import _sample_without_replacement, greedy_split, inverse_cdf


class DraftLaw:
    """One draft law: how K drafts are drawn from the draft model's law q.

    Methods take a checked 1-D float64 law ``q`` (or a batch ``Q`` of rows) and a checked K; the
    public functions of :mod:`otbound.token.draft_laws` (and the bounds and verifiers) validate, then
    dispatch here.
    """

    name: str

    def sample(self, q: np.ndarray, k: int, n: int, rng) -> np.ndarray:
        """``n`` draft tuples, int64 ``(n, K)``."""
        raise NotImplementedError

    def joint(self, q: np.ndarray, k: int) -> np.ndarray:
        """Q(x̄) over ordered tuples, ``(V,)*K``."""
        raise NotImplementedError

    def subset_mass(self, q: np.ndarray, mask: np.ndarray, k: int) -> float:
        """Q(H) for the boolean mask H."""
        raise NotImplementedError

    def inclusion(self, q: np.ndarray, k: int) -> np.ndarray:
        """P(y ∈ x̄) for every token y."""
        raise NotImplementedError

    def optimal_acceptance(self, P: np.ndarray, Q: np.ndarray, k: int, want_sets: bool):
        """``(α* per row, binding sets or None)`` on a checked batch (:mod:`otbound.token.bounds`)."""
        raise NotImplementedError

    def coupling_law(self, q: np.ndarray, k: int) -> np.ndarray:
        """The law of the one random draft coupled with p in the lower relaxation 1 − TV (q itself,
        except for the greedy law, whose only random draft follows q')."""
        return q

    def check_drafts(self, q: np.ndarray, drafts: np.ndarray, k: int) -> None:
        """Raise :class:`InvalidInputError` naming the first draft tuple (rows of ``drafts``, token
        ids already checked in range) that this law cannot produce."""
        zero = q[drafts] <= 0
        if zero.any():
            r, c = np.argwhere(zero)[0]
            raise InvalidInputError(f"drafts[{r}, {c}] = {drafts[r, c]} has q = 0: it cannot be drafted")

    def __repr__(self) -> str:
        return f"<draft law {self.name!r}>"


class WithReplacement(DraftLaw):
    """x_k ~ q i.i.d.; Q(H) = q(H)^K."""

    name = "with_replacement"

    def sample(self, q, k, n, rng):
        return inverse_cdf(q, rng.random((n, k)))

    def joint(self, q, k):
        joint = q
        for _ in range(k - 1):
            joint = np.multiply.outer(joint, q)
        return joint

    def subset_mass(self, q, mask, k):
        return float(q[mask].sum() ** k)

    def inclusion(self, q, k):
        return 1.0 - (1.0 - q) ** k

    def optimal_acceptance(self, P, Q, k, want_sets):
        from otbound.token.bounds import _with_replacement  # the bounds build on this module

        return _with_replacement(P, Q, k, want_sets)


class WithoutReplacement(DraftLaw):
    """Sequential draws renormalised after removing drawn tokens; Q(H) by exponential clocks."""

    name = "without_replacement"

    def sample(self, q, k, n, rng):
        return _sample_without_replacement(q, k, n, rng)

    def joint(self, q, k):
        v = q.size
        joint = np.zeros((v,) * k)
        support = np.flatnonzero(q > 0)
        for tup in itertools.permutations(support.tolist(), k):
            prob, left = 1.0, np.ones(v, dtype=bool)
            for x in tup:
                # the mass still undrawn is summed directly, never as 1 − drawn: no cancellation when
                # the drawn tokens hold almost all of q
                prob *= q[x] / q[left].sum()
                left[x] = False
            joint[tup] = prob
        return joint

    def subset_mass(self, q, mask, k):
        from otbound.token._wor import wor_prefix_mass

        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return 0.0
        return float(wor_prefix_mass(q, idx, k)[-1])

    def inclusion(self, q, k):
        from otbound.token._wor import wor_exclusion_mass

        return 1.0 - wor_exclusion_mass(q, k)

    def optimal_acceptance(self, P, Q, k, want_sets):
        from otbound.token.bounds import _without_replacement

        return _without_replacement(P, Q, k, want_sets)

    def check_drafts(self, q, drafts, k):
        super().check_drafts(q, drafts, k)
        if k > 1:
            s = np.sort(drafts, axis=1)
            rep = (s[:, 1:] == s[:, :-1]).any(axis=1)
            if rep.any():
                r = int(np.flatnonzero(rep)[0])
                raise InvalidInputError(
                    f"drafts row {r} = {drafts[r].tolist()} repeats a token; without replacement drafts are distinct"
                )


class Greedy(DraftLaw):
    """G = the K−1 most likely tokens of q, then x_K ~ q' = q|_{V∖G} / (1 − q(G));
    Q(H) = 1[G ⊆ H] · q'(H ∖ G)."""

    name = "greedy"

    def sample(self, q, k, n, rng):
        g, qp = greedy_split(q, k)
        out = np.empty((n, k), dtype=np.int64)
        out[:, : k - 1] = g
        out[:, k - 1] = inverse_cdf(qp, rng.random(n))
        return out

    def joint(self, q, k):
        g, qp = greedy_split(q, k)
        joint = np.zeros((q.size,) * k)
        joint[tuple(g) + (slice(None),)] = qp
        return joint

    def subset_mass(self, q, mask, k):
        g, qp = greedy_split(q, k)
        return float(qp[mask].sum()) if mask[g].all() else 0.0

    def inclusion(self, q, k):
        g, qp = greedy_split(q, k)
        out = qp.copy()
        out[g] = 1.0
        return out

    def optimal_acceptance(self, P, Q, k, want_sets):
        from otbound.token.bounds import _greedy

        return _greedy(P, Q, k, want_sets)

    def coupling_law(self, q, k):
        return greedy_split(q, k)[1]

    def check_drafts(self, q, drafts, k):
        g, qp = greedy_split(q, k)
        wrong = (drafts[:, : k - 1] != g).any(axis=1) | (qp[drafts[:, -1]] <= 0)
        if wrong.any():
            r = int(np.flatnonzero(wrong)[0])
            raise InvalidInputError(
                f"drafts row {r} = {drafts[r].tolist()} is not a greedy-law tuple: expected the top-(K-1) "
                f"tokens {g.tolist()} of q first, then a token outside them with q > 0"
            )


#: the draft laws by their ``sampling`` name (the keys are :data:`otbound.SAMPLINGS`)
DRAFT_LAWS: dict[str, DraftLaw] = {law.name: law for law in (WithReplacement(), WithoutReplacement(), Greedy())}

from otbound.token._deterministic import Deterministic  # noqa: E402  (it builds on DraftLaw above)

DRAFT_LAWS[Deterministic.name] = Deterministic()


def draft_law(sampling: str) -> DraftLaw:
    """The :class:`DraftLaw` named ``sampling``; an :class:`InvalidInputError` for any other name."""
    return DRAFT_LAWS[check_sampling(sampling)]
