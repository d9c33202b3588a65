"""Small explicit autoregressive models for block-level bounds and verifiers.

The block setting and the bounds these models feed are in ``docs/theory/block-bounds.md``.

A *block model* maps a prefix (a tuple of token ids, any length) to the next-token law over
``V = vocab_size`` tokens. Block bounds and block verifiers read the target and the draft through
this interface only, so a real language model can be wrapped the same way (one call per prefix).

:class:`BlockModel` wraps any callable, checks every law it returns (``as_law``: finite,
non-negative, sums to 1 within ``LAW_ATOL = 1e-6``, renormalised) and caches it per prefix.
Builders for synthetic models:

* :func:`dirichlet_model` — a fresh ``Dirichlet(α·1)`` law at every prefix, reproducible from
  ``seed`` (the law at a prefix is a pure function of ``(seed, prefix)``, so the model is defined on
  contexts of any length and is the same whatever order prefixes are queried in);
* :func:`zipf_model` — Zipf-shaped laws ``∝ rank^{−s}`` over a random permutation per prefix;
* :func:`context_free_model` — one law at every prefix (the Sun et al. 2403.10444 toy);
* :func:`tabulated_model` — explicit laws per prefix with an optional fallback;
* :func:`mixture_model` — ``(1 − w)·a + w·b`` prefix by prefix (a draft close to the target);
* :func:`shifted_model` — ``model(context + prefix)``: the model seen from a later position.

Helpers: :func:`prefix_law` (joint law of the first ``ℓ`` tokens as a ``(V,)*ℓ`` array),
:func:`sequence_probability`, :func:`sample_blocks` (vectorised autoregressive sampling).

Block draft laws of block-diffusion drafters (:data:`BLOCK_DRAFT_LAWS`: one block drawn at once
from per-position marginals — their product, the argmax chain, a top-k Markov path selector), built
from a drafter's marginals or from a model's own (:func:`block_marginals`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from otbound._validation import InvalidInputError, as_law, check_positive_int
from otbound.token.draft_laws import inverse_cdf


def _as_prefix(prefix, vocab_size: int) -> tuple:
    try:
        key = tuple(int(t) for t in prefix)
    except TypeError as exc:
        raise InvalidInputError(f"a prefix must be a sequence of token ids, got {prefix!r}") from exc
    for t in key:
        if not 0 <= t < vocab_size:
            raise InvalidInputError(f"prefix {key} has token {t} outside the vocabulary 0..{vocab_size - 1}")
    return key


@dataclass(eq=False)
class BlockModel:
    """An autoregressive model ``prefix ↦ law over V tokens``, checked and cached per prefix.

    Calling the model with a prefix returns its next-token law as a read-only float64 array; the
    cache makes repeated prefixes free (the bounds and verifiers query each prefix of a draft tree
    many times).

    Parameters
    ----------
    vocab_size : int
        V ≥ 1.
    fn : callable
        ``fn(prefix: tuple[int, ...]) -> array_like (V,)``, the next-token law after ``prefix``;
        each law returned is checked (finite, non-negative, sums to 1 within ``LAW_ATOL = 1e-6``)
        and renormalised.
    name : str
        Used in error messages.

    Raises
    ------
    otbound.InvalidInputError
        If ``vocab_size`` is not a positive integer or ``fn`` is not callable; when called, if the
        prefix holds a token outside ``0..V-1`` or ``fn`` returns something that is not a law over
        V tokens.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import BlockModel
    >>> model = BlockModel(2, lambda prefix: np.array([0.5, 0.5]) if len(prefix) < 2 else np.array([1.0, 0.0]))
    >>> model(()), model((0, 1))
    (array([0.5, 0.5]), array([1., 0.]))
    >>> BlockModel(2, lambda prefix: [0.5, 0.6])(())
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: model[] does not sum to 1 (row () sums to 1.1; tolerance 1e-06)
    """

    vocab_size: int
    fn: Callable[[tuple], np.ndarray]
    name: str = "model"
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.vocab_size = check_positive_int(self.vocab_size, "vocab_size")
        if not callable(self.fn):
            raise InvalidInputError(f"a block model needs a callable prefix -> law, got {self.fn!r}")

    def __call__(self, prefix=()) -> np.ndarray:
        key = prefix if type(prefix) is tuple and prefix in self._cache else _as_prefix(prefix, self.vocab_size)
        law = self._cache.get(key)
        if law is None:
            law = as_law(self.fn(key), f"{self.name}{list(key)}", ndim=1)
            if law.size != self.vocab_size:
                raise InvalidInputError(
                    f"{self.name} returned a law over {law.size} tokens at prefix {list(key)}, "
                    f"expected vocab_size = {self.vocab_size}"
                )
            law.setflags(write=False)
            self._cache[key] = law
        return law


def as_block_model(model, vocab_size: int, name: str = "model") -> BlockModel:
    """``model`` itself if it is a :class:`BlockModel` of this vocabulary, else a checked wrapper.

    Parameters
    ----------
    model : BlockModel or callable
        A block model, or a callable ``prefix -> law`` to wrap.
    vocab_size : int
        The vocabulary the caller expects.
    name : str
        Used in error messages.

    Returns
    -------
    BlockModel

    Raises
    ------
    otbound.InvalidInputError
        If ``model`` is a block model over another vocabulary, or neither a block model nor callable.

    Examples
    --------
    >>> from otbound.block import as_block_model, context_free_model
    >>> as_block_model(lambda prefix: [0.5, 0.5], 2)(())
    array([0.5, 0.5])
    >>> as_block_model(context_free_model([0.5, 0.5]), 3)
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: model has vocab_size 2, expected 3
    """
    vocab_size = check_positive_int(vocab_size, "vocab_size")
    if isinstance(model, BlockModel):
        if model.vocab_size != vocab_size:
            raise InvalidInputError(f"{name} has vocab_size {model.vocab_size}, expected {vocab_size}")
        return model
    if not callable(model):
        raise InvalidInputError(
            f"{name} must be a callable prefix -> law (or a BlockModel), got {type(model).__name__}"
        )
    return BlockModel(vocab_size, model, name)


def _prefix_rng(seed: int, prefix: tuple) -> np.random.Generator:
    # the stream at a prefix depends on (seed, len, tokens) only: order-independent, any length
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(len(prefix),) + prefix))


def dirichlet_model(
    vocab_size: int, *, concentration: float = 1.0, seed: int = 0, name: str = "dirichlet"
) -> BlockModel:
    """A random model with an independent ``Dirichlet(concentration·1_V)`` law at every prefix.

    The law at a prefix is a pure function of ``(seed, prefix)``: the model is defined on contexts of
    any length and does not depend on the order in which prefixes are queried. Small
    ``concentration`` (≪ 1) gives near-deterministic laws, large gives near-uniform ones.

    Parameters
    ----------
    vocab_size : int
        V.
    concentration : float
        The Dirichlet parameter α > 0 (the same for every token).
    seed : int
        Seed of the per-prefix random streams.
    name : str
        Used in error messages.

    Returns
    -------
    BlockModel

    Raises
    ------
    otbound.InvalidInputError
        If ``vocab_size`` is not a positive integer or ``concentration`` is not a positive number.

    Examples
    --------
    >>> import otbound as ob
    >>> model = ob.dirichlet_model(3, seed=0)
    >>> model((0,)).round(3)
    array([0.08 , 0.119, 0.8  ])
    >>> bool((ob.dirichlet_model(3, seed=0)((0,)) == model((0,))).all())   # reproducible per prefix
    True
    """
    v = check_positive_int(vocab_size, "vocab_size")
    if not np.isfinite(concentration) or concentration <= 0:
        raise InvalidInputError(f"concentration must be a positive number, got {concentration!r}")

    def fn(prefix):
        law = _prefix_rng(seed, prefix).dirichlet(np.full(v, float(concentration)))
        # tiny concentrations underflow to exact zeros everywhere; keep the argmax as a point mass
        return law if law.sum() > 0 else np.eye(v)[_prefix_rng(seed, prefix).integers(v)]

    return BlockModel(v, fn, name)


def zipf_model(vocab_size: int, *, exponent: float = 1.0, seed: int = 0, name: str = "zipf") -> BlockModel:
    """Zipf-shaped laws ``∝ rank^{−exponent}`` with a random token permutation at every prefix.

    Parameters
    ----------
    vocab_size : int
        V.
    exponent : float
        s ≥ 0 (0: uniform).
    seed : int
        Seed of the per-prefix permutations (a pure function of ``(seed, prefix)``).
    name : str
        Used in error messages.

    Returns
    -------
    BlockModel

    Raises
    ------
    otbound.InvalidInputError
        If ``vocab_size`` is not a positive integer or ``exponent`` is negative or not finite.

    Examples
    --------
    >>> import numpy as np, otbound as ob
    >>> model = ob.zipf_model(4, exponent=1.0, seed=0)
    >>> np.sort(model(()))[::-1].round(2)                  # 1 : 1/2 : 1/3 : 1/4, normalised
    array([0.48, 0.24, 0.16, 0.12])
    """
    v = check_positive_int(vocab_size, "vocab_size")
    if not np.isfinite(exponent) or exponent < 0:
        raise InvalidInputError(f"exponent must be a non-negative number, got {exponent!r}")
    shape = np.arange(1, v + 1, dtype=np.float64) ** (-float(exponent))
    shape /= shape.sum()

    def fn(prefix):
        law = np.empty(v)
        law[_prefix_rng(seed, prefix).permutation(v)] = shape
        return law

    return BlockModel(v, fn, name)


def context_free_model(law, *, name: str = "context-free") -> BlockModel:
    """The same next-token law at every prefix (e.g. the toy of Sun et al. 2403.10444).

    Parameters
    ----------
    law : array_like, shape (V,)
        A law (checked and renormalised).
    name : str
        Used in error messages.

    Returns
    -------
    BlockModel

    Raises
    ------
    otbound.InvalidInputError
        If ``law`` is not a law.

    Examples
    --------
    >>> import otbound as ob
    >>> ob.context_free_model([0.25, 0.75])((1, 0))
    array([0.25, 0.75])
    """
    law = as_law(law, "law", ndim=1)
    return BlockModel(law.size, lambda prefix: law, name)


def tabulated_model(table: Mapping, vocab_size: int, *, default=None, name: str = "tabulated") -> BlockModel:
    """Explicit laws ``table[prefix]``; prefixes not in the table use ``default``.

    Parameters
    ----------
    table : mapping
        ``prefix (sequence of ints) -> law (V,)``.
    vocab_size : int
        V.
    default : None, array_like or callable
        None (a missing prefix is an error naming it), a law (used at every other prefix), or a
        callable ``prefix -> law``.
    name : str
        Used in error messages.

    Returns
    -------
    BlockModel

    Raises
    ------
    otbound.InvalidInputError
        If a key holds a token outside the vocabulary or a value is not a law; when called, at a
        prefix missing from the table without a default.

    Examples
    --------
    >>> import otbound as ob
    >>> model = ob.tabulated_model({(): [0.5, 0.5], (0,): [1, 0]}, 2, default=[0.2, 0.8])
    >>> model((0,)), model((1,))
    (array([1., 0.]), array([0.2, 0.8]))
    >>> ob.tabulated_model({(): [0.5, 0.5]}, 2)((1,))
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: tabulated has no law for prefix [1] and no default
    """
    v = check_positive_int(vocab_size, "vocab_size")
    laws = {_as_prefix(k, v): as_law(val, f"table[{k}]", ndim=1) for k, val in table.items()}
    fallback = as_law(default, "default", ndim=1) if default is not None and not callable(default) else default

    def fn(prefix):
        law = laws.get(prefix)
        if law is not None:
            return law
        if fallback is None:
            raise InvalidInputError(f"{name} has no law for prefix {list(prefix)} and no default")
        return fallback(prefix) if callable(fallback) else fallback

    return BlockModel(v, fn, name)


def mixture_model(a, b, weight: float, *, name: str = "mixture") -> BlockModel:
    """``(1 − weight)·a(prefix) + weight·b(prefix)``: e.g. a draft at distance ``weight`` from a target.

    Parameters
    ----------
    a, b : BlockModel
        Two models over the same vocabulary.
    weight : float
        w ∈ [0, 1], the weight of ``b``.
    name : str
        Used in error messages.

    Returns
    -------
    BlockModel

    Raises
    ------
    otbound.InvalidInputError
        If ``weight`` lies outside [0, 1] or ``a``, ``b`` are not block models over one vocabulary.

    Examples
    --------
    >>> import otbound as ob
    >>> a, b = ob.context_free_model([0.25, 0.75]), ob.context_free_model([1.0, 0.0])
    >>> ob.mixture_model(a, b, 0.5)(())
    array([0.625, 0.375])
    """
    if not 0.0 <= float(weight) <= 1.0:
        raise InvalidInputError(f"weight must lie in [0, 1], got {weight!r}")
    if not isinstance(a, BlockModel) or not isinstance(b, BlockModel) or a.vocab_size != b.vocab_size:
        raise InvalidInputError("mixture_model needs two BlockModels over the same vocabulary")
    w = float(weight)
    return BlockModel(a.vocab_size, lambda prefix: (1.0 - w) * a(prefix) + w * b(prefix), name)


def shifted_model(model: BlockModel, context) -> BlockModel:
    """The model continuing after ``context``: ``prefix ↦ model(context + prefix)``.

    Parameters
    ----------
    model : BlockModel
    context : sequence of int
        Token ids already generated.

    Returns
    -------
    BlockModel
        ``model`` itself for an empty context.

    Raises
    ------
    otbound.InvalidInputError
        If ``context`` holds a token outside the vocabulary.

    Examples
    --------
    >>> import otbound as ob
    >>> model = ob.tabulated_model({(): [0.5, 0.5], (0,): [1, 0]}, 2, default=[0.2, 0.8])
    >>> ob.shifted_model(model, (0,))(())
    array([1., 0.])
    """
    ctx = _as_prefix(context, model.vocab_size)
    if not ctx:
        return model
    return BlockModel(model.vocab_size, lambda prefix: model(ctx + prefix), f"{model.name}|{list(ctx)}")


def prefix_law(model: BlockModel, length: int, context=()) -> np.ndarray:
    """Joint law of the next ``length`` tokens after ``context``: ``P(x_{1:ℓ}) = Π_t model(x_{<t})[x_t]``.

    Parameters
    ----------
    model : BlockModel
    length : int
        ℓ ≥ 0 (the array holds V^ℓ entries).
    context : sequence of int
        Tokens before the block.

    Returns
    -------
    numpy.ndarray, shape (V,)*length
        Float64, sums to 1.

    Raises
    ------
    otbound.InvalidInputError
        If ``context`` holds a token outside the vocabulary.

    Examples
    --------
    >>> import otbound as ob
    >>> ob.prefix_law(ob.context_free_model([0.25, 0.75]), 2)
    array([[0.0625, 0.1875],
           [0.1875, 0.5625]])
    """
    v = model.vocab_size
    ctx = _as_prefix(context, v)
    joint = np.ones(())
    for depth in range(int(length)):
        cond = np.stack([model(ctx + pre) for pre in np.ndindex(*(v,) * depth)]).reshape((v,) * depth + (v,))
        joint = joint[..., None] * cond
    return joint


def sequence_probability(model: BlockModel, sequence, context=()) -> float:
    """Probability of ``sequence`` after ``context``: ``Π_t model(context + sequence_{<t})[sequence_t]``.

    Parameters
    ----------
    model : BlockModel
    sequence, context : sequence of int
        Token ids.

    Returns
    -------
    float

    Raises
    ------
    otbound.InvalidInputError
        If a token lies outside the vocabulary.

    Examples
    --------
    >>> import otbound as ob
    >>> ob.sequence_probability(ob.context_free_model([0.25, 0.75]), [1, 1])
    0.5625
    """
    seq = _as_prefix(sequence, model.vocab_size)
    ctx = _as_prefix(context, model.vocab_size)
    prob = 1.0
    for t, tok in enumerate(seq):
        prob *= float(model(ctx + seq[:t])[tok])
    return prob


def sample_blocks(model: BlockModel, num: int, block_len: int, rng=None, context=()) -> np.ndarray:
    """``num`` independent blocks of ``block_len`` tokens drawn autoregressively from ``model``.

    Vectorised by grouping the rows that share a prefix at each depth (one inverse-CDF draw per
    group), so the model is called once per distinct prefix, not once per row.

    Parameters
    ----------
    model : BlockModel
    num : int
        Number of blocks.
    block_len : int
        L, tokens per block.
    rng : numpy.random.Generator, int or None
        Randomness (a seed is accepted).
    context : sequence of int
        Tokens before the blocks.

    Returns
    -------
    numpy.ndarray of int64, shape (num, block_len)

    Raises
    ------
    otbound.InvalidInputError
        If ``context`` holds a token outside the vocabulary.

    Examples
    --------
    >>> import otbound as ob
    >>> ob.sample_blocks(ob.context_free_model([0.25, 0.75]), 4, 3, rng=0)
    array([[1, 1, 0],
           [0, 1, 1],
           [1, 1, 1],
           [1, 1, 0]])
    """
    rng = np.random.default_rng(rng)
    ctx = _as_prefix(context, model.vocab_size)
    n, length = int(num), int(block_len)
    out = np.zeros((n, length), dtype=np.int64)
    u = rng.random((n, length))
    for depth in range(length):
        if depth == 0:
            groups = [(np.arange(n), ())]
        else:
            keys, inverse = np.unique(out[:, :depth], axis=0, return_inverse=True)
            inverse = inverse.reshape(-1)
            order = np.argsort(inverse, kind="stable")
            bounds = np.searchsorted(inverse[order], np.arange(keys.shape[0] + 1))
            groups = [(order[bounds[g] : bounds[g + 1]], tuple(int(t) for t in keys[g])) for g in range(keys.shape[0])]
        for rows, pre in groups:
            out[rows, depth] = inverse_cdf(model(ctx + pre), u[rows, depth])
    return out


def block_marginals(model: BlockModel, block_len: int, context=()) -> tuple[np.ndarray, np.ndarray]:
    """Per-position marginals and neighbour transitions of ``model``'s law of the next ``block_len`` tokens.

    ``marginals[i, x] = P(X_{i+1} = x)`` and ``transitions[i, a, b] = P(X_{i+2} = b | X_{i+1} = a)``
    (a row of zero-probability ``a`` is left uniform): what a block-diffusion drafter trained by
    per-position cross-entropy (pairwise for the transitions) on ``model``'s samples converges to.
    Enumerates the ``V^L`` blocks (:func:`prefix_law`).

    Parameters
    ----------
    model : BlockModel
    block_len : int
        L.
    context : sequence of int
        Tokens before the block.

    Returns
    -------
    tuple of numpy.ndarray
        ``marginals`` float64 ``(L, V)``, ``transitions`` float64 ``(L − 1, V, V)``.

    Raises
    ------
    otbound.InvalidInputError
        If ``block_len`` is not a positive integer or the context holds a token outside the vocabulary.

    Examples
    --------
    >>> import otbound.block as ob
    >>> model = ob.tabulated_model({(): [0.5, 0.5], (0,): [1, 0], (1,): [0, 1]}, 2)
    >>> m, t = ob.block_marginals(model, 2)
    >>> m.tolist(), t[0].tolist()            # marginals (1/2, 1/2) twice; the second token copies the first
    ([[0.5, 0.5], [0.5, 0.5]], [[1.0, 0.0], [0.0, 1.0]])
    """
    length = check_positive_int(block_len, "block_len")
    joint = prefix_law(model, length, context)
    v = model.vocab_size
    axes = tuple(range(length))
    marginals = np.stack([joint.sum(axis=tuple(a for a in axes if a != i)) for i in range(length)])
    transitions = np.empty((length - 1, v, v))
    for i in range(length - 1):
        pair = joint.sum(axis=tuple(a for a in axes if a not in (i, i + 1)))
        row = pair.sum(axis=1, keepdims=True)
        transitions[i] = np.where(row > 0, pair / np.where(row > 0, row, 1.0), 1.0 / v)
    return marginals, transitions


def _check_marginals(marginals, transitions, need_transitions: bool):
    m = np.asarray(marginals, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise InvalidInputError(f"marginals must be an (L, V) array of per-position laws, got shape {m.shape}")
    m = np.stack([as_law(row, f"marginals[{i}]", ndim=1) for i, row in enumerate(m)])
    if transitions is None:
        if need_transitions:
            raise InvalidInputError("this block draft law needs transitions (L − 1, V, V) (block_marginals gives them)")
        return m, None
    t = np.asarray(transitions, dtype=np.float64)
    length, v = m.shape
    if t.shape != (length - 1, v, v):
        raise InvalidInputError(f"transitions must have shape {(length - 1, v, v)}, got {t.shape}")
    t = np.stack([as_law(t[i], f"transitions[{i}]", ndim=2) for i in range(length - 1)]) if length > 1 else t
    return m, t


class BlockDraftLaw:
    """A law of one draft block drawn at once from a block drafter's per-position outputs.

    A block-diffusion drafter (DFlash, parallel heads) emits in one pass a law ``m_i`` over the
    token at every position ``i = 1..L`` of the block (the *marginals*; with a pairwise head also
    neighbour transitions). The laws below turn these into the law of the drafted block, as an
    autoregressive :class:`BlockModel` over ``L`` positions (``law_model``), so the block bounds
    (:func:`otbound.block_bound`, K = 1) and verifiers read it like any draft. Registry:
    :data:`BLOCK_DRAFT_LAWS`.

    Attributes
    ----------
    name : str
    reference : str
    deterministic : bool
        Whether the law is a point mass (one fixed block).

    Examples
    --------
    >>> import otbound.block as ob
    >>> sorted(ob.BLOCK_DRAFT_LAWS)
    ['argmax_chain', 'marginal_product', 'topk_markov']
    """

    name: str = ""
    reference: str = ""
    deterministic: bool = False
    needs_transitions: bool = False

    def law_model(self, marginals, transitions=None) -> BlockModel:
        """The block law as a :class:`BlockModel` (``prefix ↦ law of the next position``, defined for
        prefixes of length ``0..L − 1``).

        Parameters
        ----------
        marginals : array_like
            ``(L, V)``: the drafter's law at every position.
        transitions : array_like, optional
            ``(L − 1, V, V)``: ``transitions[i, a]`` the law of position ``i + 2`` given token ``a``
            at position ``i + 1`` (needed by ``topk_markov``).

        Returns
        -------
        BlockModel

        Raises
        ------
        otbound.InvalidInputError
            Marginals or transitions that are not laws of the right shapes; when called, a prefix of
            length ``L`` or more.

        Examples
        --------
        >>> import otbound.block as ob
        >>> q = ob.BLOCK_DRAFT_LAWS["argmax_chain"].law_model([[0.2, 0.8], [0.6, 0.4]])
        >>> q(()), q((1,))
        (array([0., 1.]), array([1., 0.]))
        """
        m, t = _check_marginals(marginals, transitions, self.needs_transitions)
        length = m.shape[0]
        law = self._law

        def fn(prefix):
            if len(prefix) >= length:
                raise InvalidInputError(f"the {self.name} block law has {length} positions; asked after {list(prefix)}")
            return law(m, t, prefix)

        return BlockModel(m.shape[1], fn, self.name)

    def _law(self, m: np.ndarray, t, prefix: tuple) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


class MarginalProduct(BlockDraftLaw):
    """Every position drawn independently from its marginal: ``q(x_{1:L}) = Π_i m_i(x_i)``.

    Lossless under any lossless verifier, but incoherent: neighbouring tokens are drawn without
    regard to each other (z-lab/dflash pull request 169 measures 1.16 accepted tokens per step
    against 2.96 for the argmax proposal of the same head at block 5).

    Examples
    --------
    >>> import otbound.block as ob
    >>> q = ob.BLOCK_DRAFT_LAWS["marginal_product"].law_model([[0.2, 0.8], [0.6, 0.4]])
    >>> q((0,)), q((1,))                      # the same law whatever came before
    (array([0.6, 0.4]), array([0.6, 0.4]))
    """

    name = "marginal_product"
    reference = "independent per-position sampling of a block drafter (DFlash; Whalen et al. 2606.11552)"

    def _law(self, m, t, prefix):
        return m[len(prefix)]


class ArgmaxChain(BlockDraftLaw):
    """The block of per-position argmaxes (ties to the lower token id): one fixed block, a point mass.

    Its bound is the target's mass along the block, ``Σ_ℓ p(x*_{1:ℓ})`` (a static tree of
    branching ``(1, …, 1)``, :func:`otbound.block.static_tree_bound`).

    Examples
    --------
    >>> import otbound.block as ob
    >>> ob.BLOCK_DRAFT_LAWS["argmax_chain"].deterministic
    True
    """

    name = "argmax_chain"
    reference = "argmax proposal of a block drafter (z-lab/dflash pull request 169)"
    deterministic = True

    def _law(self, m, t, prefix):
        out = np.zeros(m.shape[1])
        out[int(np.argmax(m[len(prefix)]))] = 1.0
        return out


class TopKMarkov(BlockDraftLaw):
    """A top-k path selector: a Markov chain over each position's ``k`` most probable tokens.

    Position ``i`` keeps the ``k`` tokens of largest ``m_i`` (ties to the lower id); the first
    token is drawn from ``m_1`` restricted to its candidates, every later one from the neighbour
    transition ``transitions[i − 1, x_{i−1}]`` restricted to position ``i``'s candidates
    (renormalised; where that row has no mass on them, from ``m_i`` restricted). A truncated
    first-order Markov law: coherent between neighbours, unlike the product, and random, unlike
    the argmax chain (the candidate selector of DFlash 2; SGLang #35371).

    Parameters
    ----------
    top_k : int
        k ≥ 1 (``k = 1`` is the argmax chain).

    Examples
    --------
    >>> import numpy as np, otbound.block as ob
    >>> m = np.array([[0.5, 0.3, 0.2], [0.1, 0.5, 0.4]])
    >>> t = np.array([[[0.0, 0.9, 0.1], [0.5, 0.0, 0.5], [0.3, 0.3, 0.4]]])
    >>> q = ob.TopKMarkov(2).law_model(m, t)
    >>> q(()).round(3), q((0,)).round(3), q((1,)).round(3)   # candidates {0, 1}, then {1, 2}
    (array([0.625, 0.375, 0.   ]), array([0. , 0.9, 0.1]), array([0., 0., 1.]))
    """

    name = "topk_markov"
    reference = "top-k path selector over a block drafter's candidates (DFlash 2; SGLang #35371)"
    needs_transitions = True

    def __init__(self, top_k: int = 2):
        self.top_k = check_positive_int(top_k, "top_k")

    def _law(self, m, t, prefix):
        i = len(prefix)
        keep = np.zeros(m.shape[1], dtype=bool)
        keep[np.lexsort((np.arange(m.shape[1]), -m[i]))[: self.top_k]] = True
        keep &= m[i] > 0
        base = m[i] if i == 0 else t[i - 1, prefix[-1]]
        w = np.where(keep, base, 0.0)
        if w.sum() <= 0:
            w = np.where(keep, m[i], 0.0)
        return w / w.sum()


#: the block draft laws of block-diffusion drafters, name → law object (``TopKMarkov(k)`` for other k)
BLOCK_DRAFT_LAWS: dict[str, BlockDraftLaw] = {law.name: law for law in (MarginalProduct(), ArgmaxChain(), TopKMarkov())}
