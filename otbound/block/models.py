"""Small explicit autoregressive models for block-level bounds and verifiers (theory.md §4).

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

    ``fn(prefix: tuple[int, ...]) -> array (V,)``. Calling the model returns a read-only float64
    array; the cache makes repeated prefixes free (the bounds and verifiers query each prefix of a
    draft tree many times).
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
    """``model`` itself if it is a :class:`BlockModel` of this vocabulary, else a checked wrapper."""
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

    Small ``concentration`` (≪ 1) gives near-deterministic laws, large gives near-uniform ones.
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
    """Zipf-shaped laws ``∝ rank^{−exponent}`` with a random token permutation at every prefix."""
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
    """The same next-token law at every prefix."""
    law = as_law(law, "law", ndim=1)
    return BlockModel(law.size, lambda prefix: law, name)


def tabulated_model(table: Mapping, vocab_size: int, *, default=None, name: str = "tabulated") -> BlockModel:
    """Explicit laws ``table[prefix]``; prefixes not in the table use ``default``.

    ``default``: None (a missing prefix is an error naming it), a law (used everywhere else), or a
    callable ``prefix -> law``.
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
    """``(1 − weight)·a(prefix) + weight·b(prefix)``: e.g. a draft at distance ``weight`` from a target."""
    if not 0.0 <= float(weight) <= 1.0:
        raise InvalidInputError(f"weight must lie in [0, 1], got {weight!r}")
    if not isinstance(a, BlockModel) or not isinstance(b, BlockModel) or a.vocab_size != b.vocab_size:
        raise InvalidInputError("mixture_model needs two BlockModels over the same vocabulary")
    w = float(weight)
    return BlockModel(a.vocab_size, lambda prefix: (1.0 - w) * a(prefix) + w * b(prefix), name)


def shifted_model(model: BlockModel, context) -> BlockModel:
    """The model continuing after ``context``: ``prefix ↦ model(context + prefix)``."""
    ctx = _as_prefix(context, model.vocab_size)
    if not ctx:
        return model
    return BlockModel(model.vocab_size, lambda prefix: model(ctx + prefix), f"{model.name}|{list(ctx)}")


def prefix_law(model: BlockModel, length: int, context=()) -> np.ndarray:
    """Joint law of the next ``length`` tokens after ``context``, shape ``(V,)*length`` (V^length memory)."""
    v = model.vocab_size
    ctx = _as_prefix(context, v)
    joint = np.ones(())
    for depth in range(int(length)):
        cond = np.stack([model(ctx + pre) for pre in np.ndindex(*(v,) * depth)]).reshape((v,) * depth + (v,))
        joint = joint[..., None] * cond
    return joint


def sequence_probability(model: BlockModel, sequence, context=()) -> float:
    """``Π_t model(context + sequence_{<t})[sequence_t]``."""
    seq = _as_prefix(sequence, model.vocab_size)
    ctx = _as_prefix(context, model.vocab_size)
    prob = 1.0
    for t, tok in enumerate(seq):
        prob *= float(model(ctx + seq[:t])[tok])
    return prob


def sample_blocks(model: BlockModel, num: int, block_len: int, rng=None, context=()) -> np.ndarray:
    """``num`` independent blocks of ``block_len`` tokens drawn autoregressively, shape ``(num, L)``.

    Vectorised by grouping the rows that share a prefix at each depth (one inverse-CDF draw per
    group), so the cost is the number of distinct prefixes, not ``num``.
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
