"""Block draft laws of block-diffusion drafters: their U_causal / U_joint against an independent LP
written here in cvxpy (HiGHS), their best verifier, and the laws themselves."""

import itertools

import cvxpy as cp
import numpy as np
import pytest

from otbound import InvalidInputError
from otbound.block import (
    BLOCK_DRAFT_LAWS,
    BLOCK_VERIFIERS,
    TopKMarkov,
    block_draft_law_bounds,
    block_marginals,
    dirichlet_model,
    sequence_probability,
    static_tree_bound,
    tabulated_model,
    zipf_model,
)


def _block_law(model, v, length):
    return {x: sequence_probability(model, x) for x in itertools.product(range(v), repeat=length)}


def _cond(target, w, start):
    """p(w[start:] | w[:start])."""
    out = 1.0
    for i in range(start, len(w)):
        out *= float(target(w[:i])[w[i]])
    return out


def _causal_lp_cvxpy(target, law, v, length):
    """U_causal written directly: r[x, n, y] = P(draft x, first n draft tokens accepted, then y emitted);
    lossless iff for every w of length L + 1, Σ_n E(w_{1:n+1}) p(w_{n+2:} | w_{1:n+1}) = p(w), where E(s) is
    the probability of emitting exactly s."""
    drafts = [x for x, pr in law.items() if pr > 0]
    r = cp.Variable((len(drafts), (length + 1) * v), nonneg=True)
    cons = [cp.sum(r, axis=1) == np.array([law[x] for x in drafts])]
    for w in itertools.product(range(v), repeat=length + 1):
        terms = []
        for n in range(length + 1):
            for i, x in enumerate(drafts):
                if x[:n] == w[:n]:
                    terms.append(r[i, n * v + w[n]] * _cond(target, w, n + 1))
        cons.append(cp.sum(cp.hstack(terms)) == _cond(target, w, 0))
    gain = np.repeat(np.arange(length + 1), v).astype(float)
    prob = cp.Problem(cp.Maximize(cp.sum(r @ gain)), cons)
    prob.solve(solver="HIGHS")
    assert prob.status == "optimal"
    return prob.value


def _joint_lp_cvxpy(target, law, v, length):
    """U_joint for one draft block: max over couplings of (X ~ q, Y ~ p) of E[LCP(X, Y)]."""
    blocks = list(itertools.product(range(v), repeat=length))
    q = np.array([law[x] for x in blocks])
    p = np.array([sequence_probability(target, y) for y in blocks])
    lcp = np.array([[next((i for i in range(length) if x[i] != y[i]), length) for y in blocks] for x in blocks])
    pi = cp.Variable((len(blocks), len(blocks)), nonneg=True)
    prob = cp.Problem(cp.Maximize(cp.sum(cp.multiply(pi, lcp))), [cp.sum(pi, axis=1) == q, cp.sum(pi, axis=0) == p])
    prob.solve(solver="HIGHS")
    return prob.value


def _drafter(v, length, seed):
    """A drafter's marginals and transitions: those of another random model (what per-position CE learns)."""
    return block_marginals(dirichlet_model(v, concentration=0.8, seed=seed), length)


LAWS = [BLOCK_DRAFT_LAWS["marginal_product"], BLOCK_DRAFT_LAWS["argmax_chain"], BLOCK_DRAFT_LAWS["topk_markov"],
        TopKMarkov(3)]


@pytest.mark.parametrize("v, length", [(2, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("law", LAWS, ids=lambda law: f"{law.name}{getattr(law, 'top_k', '')}")
def test_bounds_match_an_independent_lp(law, v, length):
    for seed in (0, 1):
        target = dirichlet_model(v, concentration=0.8, seed=10 + seed)
        m, t = _drafter(v, length, seed)
        b = block_draft_law_bounds(target, law, m, t)
        q = _block_law(law.law_model(m, t), v, length)
        assert abs(sum(q.values()) - 1) < 1e-12
        assert abs(b.causal - _causal_lp_cvxpy(target, q, v, length)) < 1e-7
        assert abs(b.joint - _joint_lp_cvxpy(target, q, v, length)) < 1e-7
        # the best verifier attains U_causal; token verification does not beat it
        assert b.verifier == "block" and abs(b.verifier_acceptance - b.causal) < 1e-9
        assert b.token_acceptance <= b.causal + 1e-9 <= b.joint + 2e-9


def test_the_block_verifier_is_lossless_on_each_law():
    target = zipf_model(3, exponent=1.0, seed=2)
    m, t = _drafter(3, 2, 5)
    for law in LAWS:
        draft = law.law_model(m, t)
        err = BLOCK_VERIFIERS["block"].lossless_error(target, draft, vocab_size=3, num_drafts=1, block_len=2)
        assert err < 1e-12, law.name


def test_the_laws_are_what_they_say():
    m, t = _drafter(3, 3, 7)
    prod = _block_law(BLOCK_DRAFT_LAWS["marginal_product"].law_model(m), 3, 3)
    for x, pr in prod.items():
        assert abs(pr - m[0, x[0]] * m[1, x[1]] * m[2, x[2]]) < 1e-15
    chain = _block_law(BLOCK_DRAFT_LAWS["argmax_chain"].law_model(m), 3, 3)
    star = tuple(int(np.argmax(row)) for row in m)
    assert chain[star] == 1.0
    markov = _block_law(TopKMarkov(2).law_model(m, t), 3, 3)
    cands = [set(np.argsort(-row, kind="stable")[:2].tolist()) for row in m]
    for x, pr in markov.items():
        if not all(x[i] in cands[i] for i in range(3)):
            assert pr == 0.0
            continue
        first = m[0, x[0]] / sum(m[0, a] for a in cands[0])
        rest = [t[i - 1, x[i - 1], x[i]] / sum(t[i - 1, x[i - 1], a] for a in cands[i]) for i in (1, 2)]
        assert abs(pr - first * rest[0] * rest[1]) < 1e-14
    # with k = V and a first-order Markov model, the Markov law is the model's own block law
    markov_model = tabulated_model({(): [0.2, 0.5, 0.3]}, 3,
                                   default=lambda pre: np.roll([0.7, 0.2, 0.1], pre[-1]))
    mm, tt = block_marginals(markov_model, 3)
    own = _block_law(TopKMarkov(3).law_model(mm, tt), 3, 3)
    assert max(abs(own[x] - pr) for x, pr in _block_law(markov_model, 3, 3).items()) < 1e-14
    assert abs(block_draft_law_bounds(markov_model, TopKMarkov(3), mm, tt).causal - 3.0) < 1e-8


def test_marginals_of_a_model_by_enumeration():
    model = dirichlet_model(3, seed=3)
    m, t = block_marginals(model, 3)
    law = _block_law(model, 3, 3)
    for i in range(3):
        for a in range(3):
            assert abs(m[i, a] - sum(pr for x, pr in law.items() if x[i] == a)) < 1e-14
    for i in range(2):
        for a, b in itertools.product(range(3), repeat=2):
            pair = sum(pr for x, pr in law.items() if x[i] == a and x[i + 1] == b)
            assert abs(t[i, a, b] - pair / m[i, a]) < 1e-13


def test_incoherence_of_the_product_and_the_argmax_chain_bound():
    # a copying target: the first token is a fair coin, the rest copy it. A drafter with the exact
    # marginals drafts an incoherent block half the time: U_causal = 1 + 1/2 (L = 2)
    copy = tabulated_model({(): [0.5, 0.5]}, 2, default=lambda pre: np.eye(2)[pre[0]])
    m, t = block_marginals(copy, 2)
    assert abs(block_draft_law_bounds(copy, "marginal_product", m).causal - 1.5) < 1e-9
    assert abs(block_draft_law_bounds(copy, "topk_markov", m, t).causal - 2.0) < 1e-9
    # the argmax chain's bound is the target's mass along its block: a static tree of branching (1, 1)
    target = dirichlet_model(3, seed=8)
    m, _ = _drafter(3, 2, 9)
    b = block_draft_law_bounds(target, "argmax_chain", m)
    st = static_tree_bound(target, BLOCK_DRAFT_LAWS["argmax_chain"].law_model(m), (1, 1))
    assert abs(b.causal - st.value) < 1e-9


def test_bad_input_is_refused():
    target = dirichlet_model(2, seed=0)
    with pytest.raises(InvalidInputError, match="unknown block draft law"):
        block_draft_law_bounds(target, "diffusion", [[0.5, 0.5]])
    with pytest.raises(InvalidInputError, match="transitions"):
        block_draft_law_bounds(target, "topk_markov", [[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(InvalidInputError, match="shape"):
        TopKMarkov(2).law_model([[0.5, 0.5], [0.5, 0.5]], np.ones((2, 2, 2)) / 2)
    with pytest.raises(InvalidInputError, match="marginals"):
        BLOCK_DRAFT_LAWS["marginal_product"].law_model([0.5, 0.5])
    with pytest.raises(InvalidInputError, match="sum to 1"):
        BLOCK_DRAFT_LAWS["marginal_product"].law_model([[0.5, 0.6]])
    with pytest.raises(InvalidInputError, match="top_k"):
        TopKMarkov(0)
    with pytest.raises(InvalidInputError, match="positions"):
        BLOCK_DRAFT_LAWS["argmax_chain"].law_model([[0.5, 0.5]])((0,))
    with pytest.raises(InvalidInputError, match="vocab_size"):
        block_draft_law_bounds(dirichlet_model(3, seed=0), "marginal_product", [[0.5, 0.5]])
