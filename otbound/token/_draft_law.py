"""The draft law as one object: the :class:`DraftLaw` base class, the registry :data:`DRAFT_LAWS` and
the one lookup :func:`draft_law` that turns a ``sampling="..."`` name into its object.

A draft law owns everything that differs between laws: how its K drafts are drawn
(:meth:`DraftLaw.sample`), its tuple law (:meth:`DraftLaw.support`, :meth:`DraftLaw.joint`), Q(H)
(:meth:`DraftLaw.subset_mass`), P(y ∈ x̄) (:meth:`DraftLaw.inclusion`), its α* for the batched
engine (:meth:`DraftLaw.optimal_acceptance`), whether its drafts are distinct, and its label and
figure style. A law that states only :meth:`~DraftLaw.sample` and :meth:`~DraftLaw.support` (its
tuple law as a list of tuples and their probabilities, short enough to enumerate) gets the rest
from the support: the joint law, Q(H) and P(y ∈ x̄) as sums over it, and α* by the acceptance
max-flow LP over it (HiGHS), certified by its dual's binding set H*: the value returned is
``1 + p(H*) − Q(H*)`` summed in float64, within 1e-9 of the LP's flow (checked).

The laws themselves live in :mod:`otbound.token.draft_laws` (the four of the literature) and one
module each beside it (:mod:`otbound.token._systematic`); that module registers them, in order.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse

from otbound._solvers import solve_lp
from otbound._validation import InvalidInputError, check_num_drafts

#: the registered draft laws by their ``sampling`` name, in registration order (filled by
#: :mod:`otbound.token.draft_laws` when the token layer is imported)
DRAFT_LAWS: dict[str, DraftLaw] = {}

#: how far the certified value ``1 + p(H*) − Q(H*)`` of a support LP may lie above its flow
SUPPORT_LP_ATOL = 1e-9


class DraftLaw:
    """One draft law: how K drafts x̄ = (x_1..x_K) are drawn from the draft model's law q.

    Methods take a checked 1-D float64 law ``q`` (or a checked :class:`otbound.token.LawBatch`) and
    a checked K; the public functions (:func:`otbound.sample_drafts`, :func:`otbound.optimal_acceptance`,
    ...) resolve the name once (:func:`draft_law`), validate, then dispatch here. The instances are
    :data:`otbound.DRAFT_LAWS`: with replacement Q(H) = q(H)^K; without replacement Q(H) by
    exponential clocks; greedy Q(H) = 1[G ⊆ H] · q'(H ∖ G); deterministic Q(H) = 1[G ⊆ H];
    systematic Q(H) = Σ over its ≤ V + K tuples (:mod:`otbound.token.draft_laws`).

    A new law is one module with a subclass (its ``name``, ``label``, ``sample`` and ``support`` at
    least) and one entry in the registration tuple of :mod:`otbound.token.draft_laws`
    (docs/guide/bounds.md, "Adding a draft law").

    Attributes
    ----------
    name : str
        The law's ``sampling`` name (a key of :data:`DRAFT_LAWS`).
    label : str
        Its name in words, for tables and figure legends.
    short : str
        Its short name in column headers (``α*(wr)``).
    color, style : str
        Its colour and matplotlib line style and marker in every figure where laws share a panel.
    distinct : bool
        Whether its K drafts are distinct tokens (then K may not exceed the support of q).
    temperature : bool
        Whether the draft temperature is swept for it (:func:`otbound.draft_temperature_curve`).
    default : bool
        Whether measurements, reports and plans include it when no law is named
        (:data:`otbound.SAMPLINGS`).
    sorted_rows : bool
        Whether its α* kernel reads the rows sorted by ratio (:attr:`otbound.token.LawBatch.sorted`;
        a measurement sorts a batch first when one of its laws does).
    method : str
        How its α* is computed (:attr:`otbound.TokenBound.method`): ``"prefix"`` for the sorted-rows
        kernel, ``"support-lp"`` for the LP over an enumerated support.

    References
    ----------
    Sun et al., "SpecTr", arXiv 2310.15141; Jeon et al., arXiv 2402.14160; Hu et al.,
    arXiv 2502.18779.

    Examples
    --------
    >>> import numpy as np
    >>> import otbound as ob
    >>> law = ob.draft_law("greedy")
    >>> law, law.distinct, law.label
    (<draft law 'greedy'>, True, 'greedy')
    >>> q = np.array([0.2, 0.3, 0.5])
    >>> round(law.subset_mass(q, np.array([False, True, True]), 2), 6)
    0.6
    >>> law.inclusion(q, 2).round(4).tolist()
    [0.4, 0.6, 1.0]
    """

    name: str
    label: str
    short: str
    color: str = "#000000"
    style: str = "-o"
    distinct: bool = False
    temperature: bool = False
    default: bool = True
    method: str = "support-lp"
    sorted_rows: bool = False

    def check_num_drafts(self, num_drafts, q: np.ndarray | None = None) -> int:
        """``num_drafts`` as K, checked in ``1..MAX_NUM_DRAFTS`` and, for a law of distinct drafts,
        within the support of q (every row's, for a batch)."""
        k = check_num_drafts(num_drafts)
        if q is not None and self.distinct:
            self.check_support(k, int(np.min(np.count_nonzero(q > 0, axis=-1))))
        return k

    def check_support(self, k: int, support: int) -> None:
        """Raise :class:`InvalidInputError` if this law drafts distinct tokens and K exceeds ``support``
        (the fewest tokens with q > 0 over the rows)."""
        if self.distinct and k > support:
            raise InvalidInputError(
                f"num_drafts={k} exceeds the support of q ({support} tokens with q > 0): "
                f"the {self.name} law needs K distinct tokens of positive draft mass"
            )

    def sample(self, q: np.ndarray, k: int, n: int, rng) -> np.ndarray:
        """``n`` draft tuples, int64 ``(n, K)``."""
        raise NotImplementedError

    def max_tuples(self, v: int, k: int) -> int:
        """The most tuples its law can have at vocabulary V (what enumerating it may cost)."""
        return v**k

    def support(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The tuple law as ``(tuples, probabilities)``: int64 ``(m, K)`` ordered tuples, each once,
        and float64 ``(m,)`` probabilities > 0 summing to 1 (for laws with a short support)."""
        raise NotImplementedError(f"the {self.name} law does not enumerate its support")

    def joint(self, q: np.ndarray, k: int) -> np.ndarray:
        """Q(x̄) over ordered tuples, ``(V,)*K``."""
        tuples, probs = self.support(q, k)
        joint = np.zeros((q.size,) * k)
        joint[tuple(tuples.T)] = probs
        return joint

    def subset_mass(self, q: np.ndarray, mask: np.ndarray, k: int) -> float:
        """Q(H) for the boolean mask H."""
        tuples, probs = self.support(q, k)
        return float(probs[mask[tuples].all(axis=1)].sum())

    def inclusion(self, q: np.ndarray, k: int) -> np.ndarray:
        """P(y ∈ x̄) for every token y."""
        tuples, probs = self.support(q, k)
        out = np.zeros(q.size)
        rows, cols = _members(tuples)
        np.add.at(out, cols, probs[rows])
        return np.minimum(out, 1.0)

    def optimal_acceptance(self, batch, k: int, want_sets: bool = False):
        """``(α* per row, binding sets or None)`` on a checked :class:`otbound.token.LawBatch`:
        (B,) float64 and (B, V) bool torch tensors on its device (module docstring: by the LP over
        the support, row by row)."""
        import torch

        P, Q = batch.numpy_rows()  # (B, V) each
        values = np.empty(P.shape[0])  # (B,)
        sets = np.zeros(P.shape, dtype=bool) if want_sets else None  # (B, V)
        for i in range(P.shape[0]):
            values[i], h = support_optimum(P[i], *self.support(Q[i], k))
            if want_sets:
                sets[i] = h
        device = batch.p.device
        return (torch.from_numpy(values).to(device),
                None if sets is None else torch.from_numpy(sets).to(device))

    def single_call(self, p, q, num_drafts):
        """α* of the laws as the caller gave them by a path that checks them on its way (a single
        call without binding sets), or None where they take :class:`otbound.token.LawBatch` (the
        laws with replacement, greedy and deterministic have such paths in the token kernel:
        ``with_replacement_as_given``, ``top_law_as_given``)."""
        return None

    def coupling_law(self, q: np.ndarray, k: int) -> np.ndarray:
        """The law of the one random draft coupled with p in the lower relaxation 1 − TV (q itself,
        except for the greedy law, whose only random draft follows q', and the deterministic law)."""
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


def register(law: DraftLaw) -> DraftLaw:
    """Add ``law`` to :data:`DRAFT_LAWS` under its name (a name registered twice is an error)."""
    if law.name in DRAFT_LAWS:
        raise ValueError(f"a draft law named {law.name!r} is already registered")
    DRAFT_LAWS[law.name] = law
    return law


def draft_law(sampling) -> DraftLaw:
    """The :class:`DraftLaw` named ``sampling`` (or ``sampling`` itself if it is one); an
    :class:`InvalidInputError` naming the known laws for anything else.

    Parameters
    ----------
    sampling : str or DraftLaw
        A key of :data:`otbound.DRAFT_LAWS` (``"with_replacement"``, ``"without_replacement"``,
        ``"greedy"``, ``"deterministic"``, ``"systematic"``) or a law object.

    Returns
    -------
    DraftLaw
        The law object the bounds, samplers, measurements and verifiers dispatch through.

    Raises
    ------
    InvalidInputError
        ``sampling`` is not the name of a draft law.

    References
    ----------
    Sun et al., "SpecTr", arXiv 2310.15141; Jeon et al., arXiv 2402.14160; Hu et al.,
    arXiv 2502.18779 (the laws).

    Examples
    --------
    >>> import otbound as ob
    >>> ob.draft_law("without_replacement")
    <draft law 'without_replacement'>
    >>> ob.draft_law("with_replacement") is ob.DRAFT_LAWS["with_replacement"]
    True
    >>> ob.draft_law("top_k")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: unknown sampling 'top_k'; expected one of ('with_replacement', ...)
    """
    if isinstance(sampling, DraftLaw):
        return sampling
    law = DRAFT_LAWS.get(sampling) if isinstance(sampling, str) else None
    if law is None:
        raise InvalidInputError(f"unknown sampling {sampling!r}; expected one of {tuple(DRAFT_LAWS)}")
    return law


def _cdf(q: np.ndarray) -> tuple[np.ndarray, int]:
    """``(cumsum(q), last token with q > 0)``: what :func:`_draw` needs, computed once per law."""
    return np.cumsum(q), int(np.flatnonzero(q > 0)[-1])


def _draw(cdf: tuple[np.ndarray, int], u: np.ndarray) -> np.ndarray:
    """Tokens at uniforms ``u`` by inverse CDF (never past the last token of positive mass)."""
    cum, last = cdf
    return np.minimum(np.searchsorted(cum, u * cum[-1], side="right"), last).astype(np.int64)


def inverse_cdf(q: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Tokens of law ``q`` at uniforms ``u`` (inverse CDF; shared by the token and block samplers)."""
    return _draw(_cdf(q), u)


def _members(tuples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(tuple index, token)`` for every distinct token of every tuple (a token drafted twice in one
    tuple counts once: Y is accepted if it equals any draft)."""
    srt = np.sort(tuples, axis=1)  # (m, K)
    first = np.ones(srt.shape, dtype=bool)
    first[:, 1:] = srt[:, 1:] != srt[:, :-1]
    rows = np.broadcast_to(np.arange(srt.shape[0])[:, None], srt.shape)
    return rows[first], srt[first]


def support_optimum(p: np.ndarray, tuples: np.ndarray, probs: np.ndarray) -> tuple[float, np.ndarray]:
    """``(α*, H*)`` for target law ``p`` and the tuple law ``(tuples, probs)``: the acceptance
    max-flow LP over the (tuple, token ∈ tuple) pairs (Sun et al. 2310.15141 §3) by HiGHS; H* the
    tokens whose capacity the LP's dual prices at 1 (the min cut; the LP is a bipartite flow, so its
    dual vertices are 0/1); the value ``1 + min(0, p(H*) − Q(H*))`` summed in float64 (Hu et al.
    2502.18779, Theorem 3.1), checked within :data:`SUPPORT_LP_ATOL` of the flow.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.token._draft_law import support_optimum
    >>> value, h = support_optimum(np.array([0.5, 0.5]), np.array([[0, 0], [0, 1]]), np.array([0.8, 0.2]))
    >>> round(value, 12), h.tolist()
    (0.7, [True, False])
    """
    rows, cols = _members(tuples)
    m, v, n = probs.size, p.size, rows.size
    a_ub = scipy.sparse.vstack([
        scipy.sparse.csr_matrix((np.ones(n), (rows, np.arange(n))), shape=(m, n)),
        scipy.sparse.csr_matrix((np.ones(n), (cols, np.arange(n))), shape=(v, n)),
    ]).tocsr()
    res = solve_lp(-np.ones(n), a_ub, np.concatenate([probs, p]), None, None, (0, None), "acceptance LP")
    price = -res.ineqlin.marginals[m:]  # (V,) the tokens' dual prices, 0 or 1 at a vertex
    h = price > 0.5
    inside = h[tuples].all(axis=1)  # (m,) the tuples lying in H*
    value = 1.0 + min(0.0, float(p[h].sum()) - float(probs[inside].sum()))
    flow = float(res.x.sum())
    if not value - SUPPORT_LP_ATOL <= flow <= value + SUPPORT_LP_ATOL:
        raise RuntimeError(f"the acceptance LP's flow {flow!r} and its cut's value {value!r} disagree")
    return min(max(value, 0.0), 1.0), h & (value < 1.0)
