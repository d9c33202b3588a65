"""Tests for otbound.objectives: exact E[τ] against brute-force enumeration of each verifier, the
training losses against direct computation, gradients by gradcheck (float64), input validation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from otbound import InvalidInputError, objectives
from otbound.objectives import (
    ABLATION,
    DrafterObjective,
    accepted_length_survival,
    chain_term,
    conditional_accepted_length,
    expected_accepted_length,
    first_error_focal,
    first_error_index,
    position_weighted_ce,
)

# ----------------------------------------------------------------------------------------------
# independent references: enumerate every draft block and run each verifier's rule on it
# ----------------------------------------------------------------------------------------------


def _law_fn(x):
    """prefix-tuple -> law, from per-position laws (L, V) or tree levels [(V**i, V)]; uniform after
    a full block (the bonus token's law, which E[τ] does not involve)."""
    v = x[0].shape[-1]

    def fn(prefix):
        if len(prefix) >= len(x):
            return np.full(v, 1.0 / v)
        if isinstance(x, np.ndarray):
            return x[len(prefix)]
        row = 0
        for t in prefix:
            row = row * v + t
        return x[len(prefix)][row]

    return fn


def brute_force(q, p, vocab, length):
    """(token survival, block survival, per-level bound) by enumeration of all V**L draft blocks.

    token: P(τ ≥ k | x) = Π_{m≤k} min(1, p(x_m|x_<m) / q(x_m|x_<m)) (speculative sampling).
    block: Sun et al. 2403.10444 as written in docs/theory/block-bounds.md: weights p_i, stopping probabilities
    h_i, τ = the largest i with U_i ≤ h_i (independent uniforms), so P(τ ≥ i | x) = 1 − Π_{j≥i}(1 − h_j).
    """
    qf, pf = _law_fn(q), _law_fn(p)
    tok = np.zeros(length)
    blk = np.zeros(length)
    for x in itertools.product(range(vocab), repeat=length):
        qs = [qf(x[:m])[x[m]] for m in range(length)]
        prob = math.prod(qs)
        if prob == 0:
            continue
        ps = [pf(x[:m])[x[m]] for m in range(length)]
        ratio = [a / b for a, b in zip(ps, qs)]
        tok += prob * np.cumprod([min(1.0, r) for r in ratio])
        w = [1.0]
        for r in ratio:
            w.append(min(1.0, w[-1] * r))
        h = [1.0]
        for i in range(1, length):
            d = np.maximum(w[i] * pf(x[:i]) - qf(x[:i]), 0.0).sum()
            den = d + 1.0 - w[i]
            h.append(d / den if den > 0 else 1.0)
        h.append(w[length])
        for i in range(1, length + 1):
            blk[i - 1] += prob * (1.0 - np.prod([1.0 - h[j] for j in range(i, length + 1)]))
    per_level = np.zeros(length)
    for i in range(1, length + 1):
        for x in itertools.product(range(vocab), repeat=i):
            qx = math.prod(qf(x[:m])[x[m]] for m in range(i))
            px = math.prod(pf(x[:m])[x[m]] for m in range(i))
            per_level[i - 1] += min(qx, px)
    return tok, blk, per_level


def random_law(rng, vocab, kind):
    if kind == "dirichlet":
        return rng.dirichlet(np.ones(vocab))
    if kind == "sparse":  # near-deterministic, with exact zeros
        a = rng.dirichlet(np.full(vocab, 0.2))
        a[rng.random(vocab) < 0.3] = 0.0
        if a.sum() == 0:
            a[rng.integers(vocab)] = 1.0
        return a / a.sum()
    if kind == "onehot":
        return np.eye(vocab)[rng.integers(vocab)]
    raise ValueError(kind)


def random_pair(rng, vocab, length, tree, kinds=("dirichlet", "sparse", "onehot")):
    def one():
        kind = kinds[rng.integers(len(kinds))]
        if tree:
            return [np.stack([random_law(rng, vocab, kind) for _ in range(vocab**i)]) for i in range(length)]
        return np.stack([random_law(rng, vocab, kind) for _ in range(length)])

    q, p = one(), one()
    if rng.random() < 0.15 and not tree:  # disjoint supports at one position
        k = rng.integers(length)
        half = vocab // 2
        q[k] = np.r_[rng.dirichlet(np.ones(half)), np.zeros(vocab - half)]
        p[k] = np.r_[np.zeros(half), rng.dirichlet(np.ones(vocab - half))]
    return q, p


def _t(x):
    return [torch.as_tensor(a) for a in x] if isinstance(x, list) else torch.as_tensor(x)


# ----------------------------------------------------------------------------------------------
# exact E[τ]
# ----------------------------------------------------------------------------------------------


def test_sun_et_al_test_vector():
    p = np.array([[1 / 3, 2 / 3]] * 2)
    q = np.array([[2 / 3, 1 / 3]] * 2)
    assert expected_accepted_length(p, q, "token") == pytest.approx(10 / 9, abs=1e-12)
    assert expected_accepted_length(p, q, "block") == pytest.approx(11 / 9, abs=1e-12)
    tok, blk, per_level = brute_force(q, p, 2, 2)
    assert per_level.sum() == pytest.approx(12 / 9, abs=1e-12)
    assert blk.sum() == pytest.approx(11 / 9, abs=1e-12)


@pytest.mark.parametrize("tree", [False, True])
def test_survival_matches_enumeration(tree):
    rng = np.random.default_rng(1 if tree else 0)
    cases = 0
    for _ in range(60 if tree else 150):
        vocab = int(rng.integers(2, 5))
        length = int(rng.integers(1, 4 if tree else 5))
        if vocab**length > 256:
            continue
        q, p = random_pair(rng, vocab, length, tree)
        tok, blk, per_level = brute_force(q, p, vocab, length)
        for verification, ref in (("token", tok), ("block", blk)):
            got = accepted_length_survival(_t(p), _t(q), verification)
            np.testing.assert_allclose(got.numpy(), ref, atol=1e-12, rtol=0)
        # token <= block <= per-level bound, position by position
        assert np.all(tok <= blk + 1e-12) and np.all(blk <= per_level + 1e-12)
        cases += 1
    assert cases > 30


def test_mixed_forms_and_batches_broadcast():
    """A per-position draft against a tree target equals the expanded tree on both sides; batch
    dimensions broadcast and each batch element equals its own computation."""
    rng = np.random.default_rng(2)
    vocab, length = 3, 3
    q = np.stack([rng.dirichlet(np.ones(vocab)) for _ in range(length)])
    _, p_tree = random_pair(rng, vocab, length, tree=True, kinds=("dirichlet",))
    q_tree = [np.tile(q[i], (vocab**i, 1)) for i in range(length)]
    for verification in ("token", "block"):
        a = expected_accepted_length(_t(p_tree), torch.as_tensor(q), verification)
        b = expected_accepted_length(_t(p_tree), _t(q_tree), verification)
        assert float(a) == pytest.approx(float(b), abs=1e-13)
    qb = torch.as_tensor(np.stack([rng.dirichlet(np.ones(vocab), size=length) for _ in range(4)]))
    pb = torch.as_tensor(np.stack([rng.dirichlet(np.ones(vocab), size=length) for _ in range(4)]))
    for verification in ("token", "block"):
        batch = expected_accepted_length(pb[None, :], qb[:, None], verification)
        assert batch.shape == (4, 4)
        for i, j in itertools.product(range(4), range(4)):
            assert float(batch[i, j]) == pytest.approx(
                float(expected_accepted_length(pb[j], qb[i], verification)), abs=1e-13
            )


def test_special_cases():
    rng = np.random.default_rng(3)
    vocab, length = 4, 3
    q = np.stack([rng.dirichlet(np.ones(vocab)) for _ in range(length)])
    for verification in ("token", "block"):
        # identical laws: everything accepted
        assert expected_accepted_length(q, q, verification) == pytest.approx(length, abs=1e-12)
    # disjoint supports everywhere: nothing accepted
    q0 = np.tile([0.5, 0.5, 0.0, 0.0], (length, 1))
    p0 = np.tile([0.0, 0.0, 0.25, 0.75], (length, 1))
    for verification in ("token", "block"):
        assert expected_accepted_length(p0, q0, verification) == 0.0
    # deterministic target: token = block = chain term, for per-position and tree targets
    y = rng.integers(vocab, size=length)
    onehot = np.eye(vocab)[y]
    logits = torch.as_tensor(np.log(q))
    chain = float(chain_term(logits, torch.as_tensor(y)))
    assert chain == pytest.approx(float(np.cumprod(q[np.arange(length), y]).sum()), abs=1e-13)
    for verification in ("token", "block"):
        assert expected_accepted_length(onehot, q, verification) == pytest.approx(chain, abs=1e-13)


def test_chain_term_with_target_laws_is_naive_verification():
    """With target laws, the chain term is E_y[chain(ids y)] for y ~ p (naive verification), and it
    is at most the token-level E[τ]; it is maximised by a one-hot draft, E[τ] by q = p."""
    rng = np.random.default_rng(4)
    vocab, length = 3, 3
    q = np.stack([rng.dirichlet(np.ones(vocab)) for _ in range(length)])
    p = np.stack([rng.dirichlet(np.ones(vocab)) for _ in range(length)])
    logits = torch.as_tensor(np.log(q))
    soft = float(chain_term(logits, torch.as_tensor(p)))
    ref = 0.0
    for y in itertools.product(range(vocab), repeat=length):
        ref += np.prod(p[np.arange(length), y]) * float(chain_term(logits, torch.as_tensor(y)))
    assert soft == pytest.approx(ref, abs=1e-13)
    assert soft < expected_accepted_length(p, q, "token")
    mode = np.eye(vocab)[p.argmax(-1)]
    chain_at_mode = float(chain_term(torch.as_tensor(np.log(mode + 1e-300)), torch.as_tensor(p)))
    chain_at_p = float(chain_term(torch.as_tensor(np.log(p)), torch.as_tensor(p)))
    assert chain_at_mode > chain_at_p
    assert expected_accepted_length(p, p, "token") > expected_accepted_length(p, mode, "token")


def test_subset_is_a_lower_bound_and_exact_on_the_support():
    rng = np.random.default_rng(5)
    vocab, length, m = 6, 3, 3
    for _ in range(20):
        q = np.stack([rng.dirichlet(np.full(vocab, 0.5)) for _ in range(length)])
        p = np.stack([rng.dirichlet(np.full(vocab, 0.5)) for _ in range(length)])
        top = np.argsort(-p, axis=-1)[:, :m]
        qs, ps = np.take_along_axis(q, top, -1), np.take_along_axis(p, top, -1)
        for verification in ("token", "block"):
            full = expected_accepted_length(p, q, verification)
            low = expected_accepted_length(ps, qs, verification, subset=True)
            assert low <= full + 1e-12
    # exact when the subset holds the whole target support
    p = np.tile([0.5, 0.5, 0.0, 0.0], (2, 1))
    q = np.tile([0.1, 0.2, 0.3, 0.4], (2, 1))
    for verification in ("token", "block"):
        assert expected_accepted_length(p[:, :2], q[:, :2], verification, subset=True) == pytest.approx(
            expected_accepted_length(p, q, verification), abs=1e-13
        )


def test_numpy_in_numpy_out_and_float32():
    q = np.array([[0.2, 0.8], [0.6, 0.4]])
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    val = expected_accepted_length(p, q, "block")
    assert isinstance(val, float)
    surv = accepted_length_survival(p, q, "token")
    assert isinstance(surv, np.ndarray) and surv.shape == (2,)
    v32 = expected_accepted_length(torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32))
    assert v32.dtype == torch.float32 and float(v32) == pytest.approx(val, abs=1e-6)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_conditional_accepted_length_averages_to_exact(verification):
    """Σ_x q(x) E[τ | x] over every drafted block equals the exact value with the target as a tree;
    block >= token for every block."""
    rng = np.random.default_rng(7)
    for _ in range(12):
        vocab, length = int(rng.integers(2, 4)), int(rng.integers(1, 4))
        q = random_pair(rng, vocab, length, tree=False, kinds=("dirichlet", "sparse"))[0]
        _, p_tree = random_pair(rng, vocab, length, tree=True, kinds=("dirichlet", "sparse", "onehot"))
        pf = _law_fn(p_tree)
        blocks = [
            x for x in itertools.product(range(vocab), repeat=length) if all(q[i, x[i]] > 0 for i in range(length))
        ]
        along = np.stack([np.stack([pf(x[:i]) for i in range(length)]) for x in blocks])
        weights = np.array([np.prod(q[np.arange(length), x]) for x in blocks])
        qs = np.broadcast_to(q, along.shape)
        cond = conditional_accepted_length(along, qs, np.array(blocks), verification)
        assert isinstance(cond, np.ndarray) and cond.shape == (len(blocks),)
        exact = expected_accepted_length(_t(p_tree), torch.as_tensor(q), verification)
        assert float(weights @ cond) == pytest.approx(float(exact), abs=1e-12)
        if verification == "block":
            assert np.all(cond >= conditional_accepted_length(along, qs, np.array(blocks), "token") - 1e-12)
    q = np.array([[0.5, 0.5, 0.0]] * 2)
    with pytest.raises(InvalidInputError, match="probability 0"):
        conditional_accepted_length(q, q, np.array([0, 2]))
    with pytest.raises(InvalidInputError, match="integer array of shape"):
        conditional_accepted_length(q, q, np.array([0.0, 1.0]))


# ----------------------------------------------------------------------------------------------
# gradients (float64 gradcheck on small generic cases: no ties inside the min)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verification", ["token", "block"])
@torch.enable_grad()  # otbound.lm.load_pair switches autograd off process-wide (bug, see note)
def test_gradcheck_exact(verification):
    gen = torch.Generator().manual_seed(0)
    zq = torch.randn(2, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    zp = torch.randn(2, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)

    def f(a, b):
        return expected_accepted_length(torch.softmax(b, -1), torch.softmax(a, -1), verification)

    assert torch.autograd.gradcheck(f, (zq, zp), eps=1e-6, atol=1e-8)
    # tree-form target and sub-probability (subset) laws, differentiated in the raw probabilities
    levels = [torch.softmax(torch.randn(3**i, 3, dtype=torch.float64, generator=gen), -1) for i in range(3)]
    zd = torch.randn(3, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a: expected_accepted_length(levels, torch.softmax(a, -1), verification), (zd,), eps=1e-6, atol=1e-8
    )
    raw = (0.8 * torch.softmax(torch.randn(3, 4, dtype=torch.float64, generator=gen), -1)).requires_grad_()
    tgt = 0.9 * torch.softmax(torch.randn(3, 4, dtype=torch.float64, generator=gen), -1)
    assert torch.autograd.gradcheck(
        lambda a: expected_accepted_length(tgt, a, verification, subset=True), (raw,), eps=1e-6, atol=1e-8
    )


@torch.enable_grad()
def test_gradcheck_losses():
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(3, 4, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.randint(0, 5, (3, 4), generator=gen)
    ids[0] = z.detach()[0].argmax(-1)  # a block with no error ...
    ids[1, 0] = z.detach()[1, 0].argmax()  # ... and one whose first error is later
    probs = torch.softmax(torch.randn(3, 4, 5, dtype=torch.float64, generator=gen), -1)
    for target in (ids, probs):
        for fn in (
            lambda a, target=target: position_weighted_ce(a, target, gamma=0.7),
            lambda a, target=target: first_error_focal(a, target),
            lambda a, target=target: first_error_focal(a, target, focal_gamma=2.0),
            lambda a, target=target: chain_term(a, target),
        ):
            assert torch.autograd.gradcheck(fn, (z,), eps=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------------------------
# losses: values
# ----------------------------------------------------------------------------------------------


def test_position_weighted_ce_values():
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(5, 4, 7, dtype=torch.float64, generator=gen)
    ids = torch.randint(0, 7, (5, 4), generator=gen)
    ce = torch.nn.functional.cross_entropy(z.reshape(-1, 7), ids.reshape(-1), reduction="none").reshape(5, 4)
    torch.testing.assert_close(position_weighted_ce(z, ids), ce.mean(-1))
    w = torch.exp(-0.5 * torch.arange(1, 5, dtype=torch.float64))
    torch.testing.assert_close(position_weighted_ce(z, ids, gamma=0.5), (ce * w).sum(-1) / w.sum())
    # soft labels: one-hot laws reproduce ids; general laws give -Σ p log q
    onehot = torch.nn.functional.one_hot(ids, 7).double()
    torch.testing.assert_close(position_weighted_ce(z, onehot, gamma=0.5), position_weighted_ce(z, ids, gamma=0.5))
    probs = torch.softmax(torch.randn(5, 4, 7, dtype=torch.float64, generator=gen), -1)
    ref = -(probs * torch.log_softmax(z, -1)).sum(-1).mean(-1)
    torch.testing.assert_close(position_weighted_ce(z, probs), ref)


def test_first_error_focal_values():
    # V = 3, L = 4; drafter argmax = [0, 1, 2, 0]
    z = torch.tensor([[3.0, 0, 0], [0, 3, 0], [0, 0, 3], [3, 0, 0]], dtype=torch.float64)
    logq = torch.log_softmax(z, -1)
    cases = {
        (0, 1, 2, 0): None,  # full match: term 0
        (0, 2, 2, 0): 1,  # first error at position 2 (0-based 1)
        (1, 2, 0, 1): 0,
        (0, 1, 2, 2): 3,
    }
    for y, k in cases.items():
        ids = torch.tensor(y)
        first, has_err = first_error_index(z, ids)
        assert bool(has_err) == (k is not None)
        got = float(first_error_focal(z, ids))
        if k is None:
            assert got == 0.0
        else:
            assert int(first) == k
            assert got == pytest.approx(-float(logq[k, y[k]]), abs=1e-14)
            qy = math.exp(float(logq[k, y[k]]))
            assert float(first_error_focal(z, ids, focal_gamma=2.0)) == pytest.approx(
                (1 - qy) ** 2 * -float(logq[k, y[k]]), abs=1e-14
            )
    # with target laws the labels are the laws' argmax and the CE is soft
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.2, 0.2, 0.6], [1.0, 0, 0]], dtype=torch.float64)
    assert float(first_error_focal(z, probs)) == pytest.approx(-float((probs[1] * logq[1]).sum()), abs=1e-14)


def test_drafter_objective_composition():
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(6, 3, 5, dtype=torch.float64, generator=gen)
    probs = torch.softmax(torch.randn(6, 3, 5, dtype=torch.float64, generator=gen), -1)
    ids = torch.multinomial(probs.reshape(-1, 5), 1, generator=gen).reshape(6, 3)
    obj = DrafterObjective("all", ce_weight=0.5, gamma=0.3, focal=2.0, chain=3.0, exact=4.0, verification="token")
    t = obj(z, ids, probs)
    exact = expected_accepted_length(probs, torch.softmax(z, -1), "token").mean()
    ref = (
        0.5 * position_weighted_ce(z, ids, 0.3).mean()
        + 2.0 * first_error_focal(z, ids).mean()
        - 3.0 * chain_term(z, ids).mean() / 3
        - 4.0 * exact / 3
    )
    torch.testing.assert_close(t.total, ref)
    torch.testing.assert_close(t.exact, exact)
    # exact_ids: the exact term is the top-m lower bound computed from gathered laws
    top = probs.topk(2, -1).indices
    sub = DrafterObjective("sub", ce_weight=0.0, exact=1.0)(z, None, probs, exact_ids=top)
    ref_sub = expected_accepted_length(
        probs.gather(-1, top), torch.softmax(z, -1).gather(-1, top), "block", subset=True
    )
    torch.testing.assert_close(sub.exact, ref_sub.mean())
    assert float(sub.exact) <= float(expected_accepted_length(probs, torch.softmax(z, -1), "block").mean()) + 1e-12
    # subset: sub-probability target rows; soft labels are the renormalised rows
    part = probs * 0.9
    soft = DrafterObjective("soft", gamma=0.3, chain=1.0, exact=1.0)(z, None, part, subset=True)
    torch.testing.assert_close(soft.ce, position_weighted_ce(z, probs, 0.3).mean())
    torch.testing.assert_close(soft.chain, chain_term(z, probs).mean())
    torch.testing.assert_close(
        soft.exact, expected_accepted_length(part, torch.softmax(z, -1), "block", subset=True).mean()
    )
    names = [o.name for o in ABLATION]
    assert names[0] == "baseline CE" and len(set(names)) == len(names)


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "q, p, kwargs, match",
    [
        (np.ones((2, 2)) / 2, np.ones((3, 2)) / 2, {}, "2 positions but target_probs has 3"),
        (np.ones((2, 2)) / 2, np.ones((2, 3)) / 3, {}, "different vocabulary sizes"),
        (np.ones(2) / 2, np.ones(2) / 2, {}, "at least 2 dimensions"),
        (np.array([[0.5, 0.5], [1.2, -0.2]]), np.ones((2, 2)) / 2, {}, "negative entry"),
        (np.array([[0.5, np.nan], [0.5, 0.5]]), np.ones((2, 2)) / 2, {}, "NaN"),
        (np.array([[0.5, 0.6], [0.5, 0.5]]), np.ones((2, 2)) / 2, {}, "does not sum to 1"),
        (np.array([[0.5, 0.6], [0.5, 0.5]]), np.ones((2, 2)) / 2, {"subset": True}, "more than 1"),
        (np.ones((2, 2)) / 2, np.ones((2, 2)) / 2, {"verification": "tree"}, "unknown verification"),
        (np.ones((2, 2, 2)) / 2, np.ones((3, 2, 2)) / 2, {}, "do not broadcast"),
        (np.ones((2, 0)), np.ones((2, 0)), {}, "empty vocabulary"),
        (np.ones((40, 8)) / 8, np.ones((40, 8)) / 8, {}, "MAX_PATHS"),
    ],
)
def test_invalid_inputs(q, p, kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        expected_accepted_length(p, q, **kwargs)


def test_invalid_tree_and_loss_inputs():
    q = np.ones((2, 2)) / 2
    with pytest.raises(InvalidInputError, match=r"shape \(\.\.\., 2, 2\)"):
        expected_accepted_length([np.ones((1, 2)) / 2, np.ones((3, 2)) / 2], q)
    with pytest.raises(InvalidInputError, match="empty list"):
        expected_accepted_length([], q)
    with pytest.raises(InvalidInputError, match="float32 or float64"):
        expected_accepted_length(q, torch.ones(2, 2, dtype=torch.float16) / 2)
    z = torch.zeros(2, 3)
    with pytest.raises(InvalidInputError, match=r"\[0, V=3\)"):
        position_weighted_ce(z, torch.tensor([0, 3]))
    with pytest.raises(InvalidInputError, match="L=2"):
        chain_term(z, torch.tensor([0, 1, 2]))
    with pytest.raises(InvalidInputError, match="end in"):
        first_error_focal(z, torch.ones(2, 4) / 4)
    with pytest.raises(InvalidInputError, match="float torch tensor"):
        position_weighted_ce(np.zeros((2, 3)), torch.tensor([0, 1]))
    with pytest.raises(InvalidInputError, match="does not sum to 1"):
        position_weighted_ce(z, torch.ones(2, 3) / 2)
    # float32 tolerance scales with sqrt(V); float64 is LAW_ATOL
    assert objectives.law_tolerance(torch.float64, 10**5) == 1e-6
    assert objectives.law_tolerance(torch.float32, 4) == pytest.approx(32 * 2 * torch.finfo(torch.float32).eps)


# ----------------------------------------------------------------------------------------------
# against the block-level module (docs/theory/block-bounds.md): causal bound and block verifier, K = 1
# ----------------------------------------------------------------------------------------------


def test_block_value_equals_causal_bound_and_block_verifier():
    import otbound

    rng = np.random.default_rng(6)
    for tree in (False, True):
        for _ in range(6):
            vocab, length = int(rng.integers(2, 4)), int(rng.integers(1, 4))
            q, p = random_pair(rng, vocab, length, tree, kinds=("dirichlet", "sparse"))
            qf, pf = _law_fn(q), _law_fn(p)
            ours = expected_accepted_length(_t(p), _t(q), "block")
            bound = otbound.block_bound(pf, qf, vocab_size=vocab, num_drafts=1, block_len=length, kind="causal")
            verifier = otbound.BLOCK_VERIFIERS["block"].acceptance(
                pf, qf, vocab_size=vocab, num_drafts=1, block_len=length
            )
            assert float(ours) == pytest.approx(bound.value, abs=1e-8)  # the LP at HiGHS tolerances 1e-10
            assert float(ours) == pytest.approx(verifier, abs=1e-9)
