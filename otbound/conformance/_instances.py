"""Test instances of the conformance kit: a fixed adversarial family, random ones, and shrinking.

Token level: a target law ``p`` and a draft law ``q`` over ``V`` tokens. Block level: a target and a
draft model over ``V`` tokens, tabulated at every prefix of length ``0..L`` (the law at length ``L``
is the bonus law), so an instance is finite, printable and can be shrunk.

Adversarial family (both levels, where the vocabulary allows): drafts that repeat a token (q peaked
on a token the target under-weights), zeros in q where p has mass and zeros in p where q has mass,
disjoint supports, near-deterministic laws (mass 1 − 1e-9), identical laws, ties in the ratio p/q,
and at the token level the skipped-repeat RRS example (p = (.1, .4, .5), q = (.6, .2, .2)).
Random instances: Dirichlet laws with concentrations cycling through 0.2, 1, 5, a random zero in a
fifth of them.

Shrinking (:func:`shrink_token`, :func:`shrink_block`): deterministic and greedy — try every smaller
K (smallest first), every smaller block length, and the removal of every token (its entry dropped
from every law, the laws renormalised, prefixes through it dropped); keep the first change that still
fails and repeat until none does. The result is a failing instance at which no single smaller K, L or
vocabulary fails.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from otbound import InvalidInputError, draft_law, tabulated_model
from otbound._validation import check_positive_int

CONCENTRATIONS = (0.2, 1.0, 5.0)
#: the most instances one check builds
MAX_INSTANCES = 10_000
#: random draws tried per requested instance before giving up (a q valid for K drafts is rare)
MAX_TRIES = 1_000
#: mass left off the top token in the near-deterministic instances
NEAR = 1e-9


@dataclass(frozen=True)
class TokenInstance:
    """A target law ``p`` and a draft law ``q`` (1-D float64 arrays of the same length).

    Parameters
    ----------
    label : str
        What the instance tests (shown in reports).
    p, q : numpy.ndarray
        Target and draft laws (V,), each summing to 1.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.conformance import TokenInstance
    >>> inst = TokenInstance("mine", np.array([0.1, 0.4, 0.5]), np.array([0.6, 0.2, 0.2]))
    >>> inst.vocab_size
    3
    """

    label: str
    p: np.ndarray
    q: np.ndarray

    @property
    def vocab_size(self) -> int:
        return int(self.p.size)


@dataclass(frozen=True)
class BlockInstance:
    """Target and draft laws tabulated at every prefix (tuple of token ids) of length ``0..block_len``.

    Parameters
    ----------
    label : str
        What the instance tests (shown in reports).
    vocab_size : int
        V.
    block_len : int
        L: the draft blocks' length (the target's law at length L is the bonus law).
    target, draft : dict
        ``{prefix tuple: law (V,)}`` for every prefix of length ``0..L``.

    Examples
    --------
    >>> from otbound.conformance import block_instances
    >>> inst = block_instances(2, 2, 1, 0)[0]  # V = 2, L = 2: prefixes (), (0,), (1,), (0, 0), ...
    >>> inst.label, len(inst.target)
    ('random models', 7)
    >>> target, draft = inst.models()
    >>> [round(float(x), 4) for x in target((0, 1))]
    [0.6797, 0.3203]
    """

    label: str
    vocab_size: int
    block_len: int
    target: dict
    draft: dict

    def models(self):
        """``(target, draft)`` as :class:`otbound.BlockModel` (a prefix outside the table is an error)."""
        v = self.vocab_size
        return tabulated_model(self.target, v, name="target"), tabulated_model(self.draft, v, name="draft")


def check_instance_count(count) -> int:
    """``count`` as an int in ``1..MAX_INSTANCES``, else :class:`~otbound.InvalidInputError`."""
    n = check_positive_int(count, "instances")
    if n > MAX_INSTANCES:
        raise InvalidInputError(f"instances must be at most {MAX_INSTANCES}, got {n}")
    return n


def _norm(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


def _valid_q(q: np.ndarray, k: int, sampling: str) -> bool:
    try:
        draft_law(sampling).check_num_drafts(k, q)
    except ValueError:
        return False
    return True


# -- token level -------------------------------------------------------------------------------


def _adversarial_token(v: int) -> list[TokenInstance]:
    ramp = _norm(np.arange(1, v + 1))
    uni = np.full(v, 1.0 / v)
    out = [
        TokenInstance("repeated drafts (q peaked where p is small)", ramp, _norm([8.0] + [1.0] * (v - 1))),
        TokenInstance("zero in q where p has mass", uni, _norm([0.0] + [1.0] * (v - 1))),
        TokenInstance("zero in p where q has mass", _norm([0.0] + [1.0] * (v - 1)), ramp[::-1].copy()),
        TokenInstance("identical laws", ramp, ramp.copy()),
        TokenInstance("ties in p/q", _norm([2.0, 2.0] + [1.0] * (v - 2)), uni),
        TokenInstance("point-mass target", np.eye(v)[v - 1], ramp),
    ]
    if v >= 2:
        half = (v + 1) // 2
        out.append(
            TokenInstance(
                "disjoint supports", _norm([1.0] * half + [0.0] * (v - half)), _norm([0.0] * half + [1.0] * (v - half))
            )
        )
        near_p = np.full(v, NEAR / (v - 1))
        near_p[0] = 1.0 - NEAR
        out.append(TokenInstance("near-deterministic laws", near_p, near_p[::-1].copy()))
    if v >= 3:
        pad = np.zeros(v - 3)
        out.append(
            TokenInstance(
                "skipped-repeat RRS example",
                np.concatenate([[0.1, 0.4, 0.5], pad]),
                _norm(np.concatenate([[0.6, 0.2, 0.2], np.full(v - 3, 0.05)])),
            )
        )
    return out


def token_instances(vocab_size: int, num_drafts: int, sampling: str, count: int, seed: int) -> list[TokenInstance]:
    """The adversarial family (as far as ``count`` allows), then random instances up to ``count``.

    Instances whose q cannot produce K drafts under ``sampling`` (too small a support without
    replacement / greedy) are left out.

    Parameters
    ----------
    vocab_size : int
        V.
    num_drafts : int
        K.
    sampling : str
        The draft law: a name of :data:`otbound.DRAFT_LAWS` (an unknown name is an InvalidInputError).
    count : int
        Instances wanted.
    seed : int
        Seed of the random Dirichlet instances.

    Returns
    -------
    list of TokenInstance

    Raises
    ------
    otbound.InvalidInputError
        When no random instance gives K drafts under ``sampling`` after many draws.

    Examples
    --------
    >>> from otbound.conformance import token_instances
    >>> insts = token_instances(3, 2, "with_replacement", 10, seed=0)
    >>> [t.label for t in insts[:3]]
    ['repeated drafts (q peaked where p is small)', 'zero in q where p has mass', 'zero in p where q has mass']
    >>> insts[-1].label
    'random (Dirichlet 0.2, #1)'
    >>> len(token_instances(3, 3, "without_replacement", 4, seed=0))  # q needs 3 tokens of positive mass
    4
    """
    out = [t for t in _adversarial_token(vocab_size) if _valid_q(t.q, num_drafts, sampling)][:count]
    rng = np.random.default_rng(seed)
    i = 0
    while len(out) < count:
        if i > MAX_TRIES * count:
            raise InvalidInputError(
                f"no random instance over {vocab_size} tokens gives {num_drafts} {sampling} drafts after {i} draws"
            )
        conc = CONCENTRATIONS[i % len(CONCENTRATIONS)]
        p, q = rng.dirichlet(np.full(vocab_size, conc)), rng.dirichlet(np.full(vocab_size, conc))
        if i % 5 == 4 and vocab_size > 1:  # a random zero in p or q
            law = p if rng.random() < 0.5 else q
            law[rng.integers(vocab_size)] = 0.0
        i += 1
        if p.sum() <= 0 or q.sum() <= 0:  # tiny concentrations can underflow to all zeros
            continue
        p, q = _norm(p), _norm(q)
        if _valid_q(q, num_drafts, sampling):
            out.append(TokenInstance(f"random (Dirichlet {conc:g}, #{i})", p, q))
    return out


def drop_token(inst: TokenInstance, t: int) -> TokenInstance | None:
    """The instance without token ``t`` (both laws renormalised); None if a law loses all its mass."""
    keep = np.arange(inst.vocab_size) != t
    p, q = inst.p[keep], inst.q[keep]
    if p.sum() <= 0 or q.sum() <= 0:
        return None
    return TokenInstance(inst.label, p / p.sum(), q / q.sum())


def shrink_token(inst: TokenInstance, num_drafts: int, sampling: str, fails) -> tuple[TokenInstance, int]:
    """Greedy shrink of a failing ``(inst, K)``; ``fails(inst, K) -> bool``. Returns the smallest found."""
    k = num_drafts
    while True:
        smaller = [(inst, kk) for kk in range(1, k)]
        smaller += [
            (d, k) for t in range(inst.vocab_size) if inst.vocab_size > 1 and (d := drop_token(inst, t)) is not None
        ]
        for cand, kk in smaller:
            if _valid_q(cand.q, kk, sampling) and fails(cand, kk):
                inst, k = cand, kk
                break
        else:
            return inst, k


# -- block level -------------------------------------------------------------------------------


def _tabulate(fn, v: int, length: int) -> dict:
    return {pre: _norm(fn(pre)) for depth in range(length + 1) for pre in itertools.product(range(v), repeat=depth)}


def _dirichlet(seed: int, conc: float, v: int):
    def fn(pre):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(len(pre),) + pre))
        law = rng.dirichlet(np.full(v, conc))
        return law if law.sum() > 0 else np.eye(v)[0]

    return fn


def _with_zero(fn, v: int, seed: int):
    def out(pre):
        law = np.array(fn(pre))
        law[np.random.default_rng(np.random.SeedSequence(seed, spawn_key=pre)).integers(v)] = 0.0
        return law if law.sum() > 0 else np.full(v, 1.0 / v)

    return out


def _adversarial_block(v: int, length: int) -> list[tuple[str, object, object]]:
    ramp = _norm(np.arange(1, v + 1))
    out = [
        ("random models", _dirichlet(1, 1.0, v), _dirichlet(2, 1.0, v)),
        ("draft with zeros", _dirichlet(3, 1.0, v), _with_zero(_dirichlet(4, 1.0, v), v, 5)),
        ("target with zeros", _with_zero(_dirichlet(6, 1.0, v), v, 7), _dirichlet(8, 1.0, v)),
        ("context-free, reversed laws", lambda pre: ramp, lambda pre: ramp[::-1]),
        ("identical models", _dirichlet(9, 1.0, v), _dirichlet(9, 1.0, v)),
    ]
    if v >= 2:
        half = (v + 1) // 2
        lo, hi = _norm([1.0] * half + [0.0] * (v - half)), _norm([0.0] * half + [1.0] * (v - half))
        out.append(
            (
                "disjoint supports at the root",
                lambda pre: lo if not pre else ramp,
                lambda pre: hi if not pre else ramp[::-1],
            )
        )
        near = np.full(v, NEAR / (v - 1))
        near[0] = 1.0 - NEAR
        out.append(("near-deterministic models", lambda pre: near, lambda pre: np.roll(near, len(pre) + 1)))
    out.append(("sharp random models", _dirichlet(10, 0.1, v), _dirichlet(11, 0.1, v)))
    return out


def block_instances(vocab_size: int, block_len: int, count: int, seed: int) -> list[BlockInstance]:
    """The adversarial block family (as far as ``count`` allows), then random Dirichlet models.

    Parameters
    ----------
    vocab_size : int
        V.
    block_len : int
        L: the models are tabulated at every prefix of length ``0..L``.
    count : int
        Instances wanted.
    seed : int
        Seed of the random models after the adversarial family.

    Returns
    -------
    list of BlockInstance

    Examples
    --------
    >>> from otbound.conformance import block_instances
    >>> [b.label for b in block_instances(2, 2, 3, seed=0)]
    ['random models', 'draft with zeros', 'target with zeros']
    """
    v, length = vocab_size, block_len
    specs = _adversarial_block(v, length)[:count]
    i = 0
    while len(specs) < count:
        conc = CONCENTRATIONS[i % len(CONCENTRATIONS)]
        specs.append(
            (
                f"random (Dirichlet {conc:g}, #{i})",
                _dirichlet(seed * 1000 + 2 * i, conc, v),
                _dirichlet(seed * 1000 + 2 * i + 1, conc, v),
            )
        )
        i += 1
    return [BlockInstance(label, v, length, _tabulate(t, v, length), _tabulate(d, v, length)) for label, t, d in specs]


def _drop_block_token(inst: BlockInstance, t: int) -> BlockInstance | None:
    keep = np.arange(inst.vocab_size) != t
    relabel = {old: new for new, old in enumerate(np.flatnonzero(keep).tolist())}
    tables = []
    for table in (inst.target, inst.draft):
        new = {}
        for pre, law in table.items():
            if t in pre:
                continue
            law = law[keep]
            if law.sum() <= 0:
                return None
            new[tuple(relabel[x] for x in pre)] = law / law.sum()
        tables.append(new)
    return BlockInstance(inst.label, inst.vocab_size - 1, inst.block_len, *tables)


def _shorten(inst: BlockInstance, length: int) -> BlockInstance:
    cut = [{pre: law for pre, law in table.items() if len(pre) <= length} for table in (inst.target, inst.draft)]
    return BlockInstance(inst.label, inst.vocab_size, length, *cut)


def shrink_block(inst: BlockInstance, num_drafts: int, fails) -> tuple[BlockInstance, int]:
    """Greedy shrink of a failing block ``(inst, K)``: smaller K, then shorter blocks, then fewer tokens."""
    k = num_drafts
    while True:
        smaller = [(inst, kk) for kk in range(1, k)]
        smaller += [(_shorten(inst, ll), k) for ll in range(1, inst.block_len)]
        if inst.vocab_size > 1:
            smaller += [(d, k) for t in range(inst.vocab_size) if (d := _drop_block_token(inst, t)) is not None]
        for cand, kk in smaller:
            if fails(cand, kk):
                inst, k = cand, kk
                break
        else:
            return inst, k
