"""UniVer (Weng, Hu, Yairi, "UniVer: A Unified Perspective for Multi-step and Multi-draft Speculative
Decoding", arXiv 2605.04543): tree verification as a conditional OT problem.

**Provenance.** The paper's text (arXiv HTML/PDF) could not be read from this project (only its
abstract and secondary summaries). The algorithm below is taken from two independent public
reimplementations that agree with each other formula for formula: an EAGLE-based reproduction
(``univer_tree.py``/``utils.evaluate_posterior2``, with a worked "root example" in its tests that
``tests/test_univer.py`` reproduces: marginals ``(0.4, 8/15)``, conditional probabilities
``(0.4, 8/9)``) and a Triton kernel in an SGLang fork (``_univer_verify_kernel``, docstring "UniVer
verification (arXiv 2605.04543)"); they differ only in the order siblings are tested (sampled child
last / first), which changes no marginal and no ``E[τ]``. It matches the public statements about the
paper: prefix acceptance probabilities as scaling factors of the local plans, a top-down mass
allocation and a post-order decision phase, lossless.

**Draft tree** (``num_drafts`` = the branching ``m``; the paper's setting per the reproduction).
Every node ``v`` at depth ``< L`` has ``m`` children: the ``m − 1`` most probable tokens of the draft
law ``q_v`` (ties to the lower token id) and one token ``c`` sampled from the residual
``r_v = norm(q_v`` without them``)``. A tree is passed as its ``m^L`` root-to-leaf paths, row ``i``
taking child ``i``'s base-``m`` digit at each depth (most significant first); children are ordered
deterministic by rank, then the sampled one.

**Allocation (top-down).** Each node carries a prefix acceptance probability ``p̃_v`` (``p̃ = 1`` at
the root). At an expanded node, with target law ``p_v``, the local plan couples the sampled child
``c ~ r_v`` with the *scaled* target ``(p̃_v p_v(·), 1 − p̃_v on "¬v")`` (single-draft maximal
coupling; ``r_v(¬v) = 0``)::

    P(c)   = min{1, p̃_v p_v(c) / r_v(c)},     Z_v = (1 − p̃_v) + Σ_x (p̃_v p_v(x) − r_v(x))_+,
    P(d)   = (p̃_v p_v(d) − r_v(d))_+ (1 − P(c)) / Z_v = p̃_v p_v(d) (1 − P(c)) / Z_v  (deterministic d),
    P(¬v)  = (1 − p̃_v)(1 − P(c)) / Z_v,
    P(stop at v) = Σ_{x not a child} (p̃_v p_v(x) − r_v(x))_+ (1 − P(c)) / Z_v,

which sum to 1. In the order the decision phase tests them, child ``u_j`` gets
``p̃_{u_j} = P(u_j) / (1 − Σ_{i<j} P(u_i))`` and ``v``'s own fallback
``f_v = P(stop at v) / (P(stop at v) + P(¬v))``.

**Decision (post-order).** Visit the nodes in post-order (children in order, then the node), one
fresh ``η ~ U(0, 1)`` each; the first node that fires ends the iteration: a leaf fires on
``η < p̃_v`` (accept the path, bonus from ``p(·|path)``), an interior node on ``η < f_v`` (accept the
path to ``v``, correction from ``norm((p̃_v p_v − r_v)_+)`` with the children removed). The root has
``f = 1``.

**Why lossless** (our derivation, not the paper's text): averaged over ``c``, the local plan emits
each token ``x`` with mass ``p̃_v p_v(x)`` and ``¬v`` with ``1 − p̃_v`` (maximal coupling); a child's
subtree accepts, averaged over its own draws, with probability ``p̃_u``, and sibling subtrees are
independent, so the sequential tests realise the allocated masses. With ``m = 1`` (one sampled child,
a chain) this is exactly block verification (Sun et al. 2403.10444; tested law for law). At
``L = 1`` it attains the optimum for its draft law, ``Σ_{d det} p(d) + Σ_{x not det} min{p(x), r(x)}``
(tested). For ``L ≥ 2`` its ``E[τ]`` never exceeds U_causal of its own tree law (:meth:`UniVer.own_law_bounds`)
but can be strictly below it (measured: up to 0.067 tokens at V = 3, m = 2, L = 3,
``experiments/univer_table.py``): the paper's optimality is within its conditional framework.

Requires at least ``m`` tokens of positive draft probability at every expanded node (else the group
would be smaller than ``m``: :class:`~otbound.InvalidInputError`).

In ``BLOCK_VERIFIERS`` as ``univer`` with its own drafting scheme (``sampling = "univer_tree"``):
``num_drafts`` is the branching ``m``, so a tuple has ``m^L`` paths, not K blocks. The drafting hooks
of :class:`~otbound.block.verifiers.BlockVerifier` (``draft_tuple_law``, ``draw_drafts``,
``num_rows``, ``node_drafts``, ``own_law_bounds``) give its tree law to every consumer: exact
enumeration, :func:`~otbound.block.verifiers.generate`, the depth-by-depth LM decoder, the
conformance kit, and the bounds it is compared with — U_causal / U_joint of its *own* tree law, never
those of K i.i.d. blocks.
"""

from __future__ import annotations

import itertools

import numpy as np

from otbound._validation import InvalidInputError, check_num_drafts, check_positive_int
from otbound.block._plain import causal_lp_tuples, joint_ot_tuples
from otbound.block._tree import build_tree
from otbound.block.verifiers._base import MAX_EXACT_TUPLES, BlockVerifier, DraftLawBounds, _models
from otbound.token.draft_laws import inverse_cdf
from otbound.token.verifiers import residual


def _split(q, m: int, where: str):
    """``(deterministic children, residual law)`` of draft law ``q``: its top ``m − 1`` tokens (ties
    to the lower id) and ``norm(q`` without them``)``."""
    q = np.asarray(q, dtype=np.float64)
    if np.count_nonzero(q > 0) < m:
        raise InvalidInputError(
            f"UniVer with branching {m} needs at least {m} draft tokens of positive probability at "
            f"{where}; the draft law there has {np.count_nonzero(q > 0)}"
        )
    det = tuple(int(t) for t in np.argsort(-q, kind="stable")[: m - 1])
    r = q.copy()
    r[list(det)] = 0.0
    return det, r / r.sum()


def _group(draft, prefix: tuple, m: int, cache: dict):
    """:func:`_split` of the draft law at ``prefix`` (cached)."""
    key = ("univer-group", prefix, m)
    if key not in cache:
        cache[key] = _split(draft(prefix), m, f"prefix {list(prefix)}")
    return cache[key]


def _level(children: dict, d: int) -> list:
    """The expanded nodes at depth ``d`` of a tree ``{prefix: children}``."""
    return [pre for pre in children if len(pre) == d]


def _paths(children: dict, m: int, length: int) -> tuple:
    """The ``m^L`` root-to-leaf paths of a tree given as ``{prefix: children}``."""
    rows = []
    for digits in itertools.product(range(m), repeat=length):
        pre = ()
        for j in digits:
            pre += (children[pre][j],)
        rows.append(pre)
    return tuple(rows)


class UniVer(BlockVerifier):
    """UniVer on its own draft tree (m = K branches per node, m^L paths), as reimplemented publicly
    (module docstring); bounded by U_causal of its own tree law, not of K i.i.d. blocks.

    References
    ----------
    Weng, Hu, Yairi, arXiv 2605.04543.

    Examples
    --------
    On Sun et al.'s toy (2403.10444: p = (1/3, 2/3), q = (2/3, 1/3) at every prefix; V = m = L = 2)
    its tree holds all four blocks: E[τ] = 2, the U_causal of its own tree law, above the 131/81 of
    K = 2 i.i.d. blocks, which does not bound it:

    >>> import otbound as ob
    >>> t, d = ob.context_free_model([1 / 3, 2 / 3]), ob.context_free_model([2 / 3, 1 / 3])
    >>> uv, kw = ob.BLOCK_VERIFIERS['univer'], dict(vocab_size=2, num_drafts=2, block_len=2)
    >>> round(uv.acceptance(t, d, **kw), 9), round(uv.own_law_bounds(t, d, **kw).causal, 9)
    (2.0, 2.0)
    >>> round(81 * ob.block_bound(t, d, kind="causal", **kw).value, 6)
    131.0
    """
    name = "univer"
    reference = "UniVer (Weng, Hu, Yairi 2605.04543), as reimplemented publicly (see module docstring)"
    lossless = True
    sampling = "univer_tree"

    # -- drafting scheme -------------------------------------------------------------------------
    def draft_tuple_law(self, draft, num_drafts: int, block_len: int):
        """Every UniVer tree with its probability (product of the sampled children's residual laws)."""
        m, length = num_drafts, block_len
        cache: dict = {}
        trees = [(1.0, {})]  # (probability, {prefix: children}) expanded level by level
        for d in range(length):
            grown = []
            for prob, children in trees:
                frontier = [()] if d == 0 else [pre + (t,) for pre in _level(children, d - 1) for t in children[pre]]
                options = []
                for pre in frontier:
                    det, r = _group(draft, pre, m, cache)
                    options.append([(pre, det + (int(c),), float(r[c])) for c in np.flatnonzero(r > 0)])
                for combo in itertools.product(*options):
                    ch, pr = dict(children), prob
                    for pre, kids, pc in combo:
                        ch[pre] = kids
                        pr *= pc
                    grown.append((pr, ch))
                if len(grown) > MAX_EXACT_TUPLES:
                    raise InvalidInputError(
                        f"exact enumeration needs more than {MAX_EXACT_TUPLES} UniVer trees "
                        "(otbound.block.verifiers._base.MAX_EXACT_TUPLES); estimate with sample() instead"
                    )
            trees = grown
        for prob, children in trees:
            yield prob, _paths(children, m, length)

    def draw_drafts(self, draft, num: int, num_drafts: int, block_len: int, rng) -> np.ndarray:
        """``num`` UniVer trees as ``(num, m^L, L)`` path arrays (one inverse-CDF draw per prefix group)."""
        rng = np.random.default_rng(rng)
        m, length, n = int(num_drafts), int(block_len), int(num)
        cache: dict = {}
        nodes = np.zeros((n, 1, 0), dtype=np.int64)  # prefixes of the current level, per tree
        for d in range(length):
            flat = nodes.reshape(n * m**d, d)
            kids = np.empty((flat.shape[0], m), dtype=np.int64)
            if d == 0:
                keys, inverse = flat[:1], np.zeros(n, dtype=np.int64)
            else:
                keys, inverse = np.unique(flat, axis=0, return_inverse=True)
                inverse = inverse.reshape(-1)
            u = rng.random(flat.shape[0])
            for g, key in enumerate(keys):
                rows = np.flatnonzero(inverse == g)
                det, r = _group(draft, tuple(int(t) for t in key), m, cache)
                kids[rows, : m - 1] = det
                kids[rows, m - 1] = inverse_cdf(r, u[rows])
            nxt = np.concatenate([np.repeat(flat, m, axis=0), kids.reshape(-1, 1)], axis=1)
            nodes = nxt.reshape(n, -1, d + 1)
        return nodes

    def num_rows(self, num_drafts: int, block_len: int) -> int:
        """``m^L`` paths (``m`` = ``num_drafts``)."""
        return num_drafts**block_len

    def node_drafts(self, law, num_rows: int, num_drafts: int, rng) -> np.ndarray:
        """The ``m`` children of a node (top ``m − 1`` tokens of ``law``, one residual sample), each
        repeated over its ``num_rows / m`` consecutive rows (the path order of the module docstring)."""
        m = int(num_drafts)
        det, r = _split(law, m, "a drafted node")
        c = int(inverse_cdf(r, np.random.default_rng(rng).random(1))[0])
        return np.repeat(np.array(det + (c,), dtype=np.int64), num_rows // m)

    # -- verification ----------------------------------------------------------------------------
    def prepare(self, target, draft, drafts, cache):
        length = len(drafts[0])
        k = len(drafts)
        m = round(k ** (1.0 / length))
        if m < 1 or m**length != k:
            raise InvalidInputError(f"UniVer drafts must be the m^L paths of a tree; got {k} paths of length {length}")
        children = {}
        for d in range(length):
            span = m ** (length - d)
            for start in range(0, k, span):
                pre = drafts[start][:d]
                kids = tuple(drafts[start + j * span // m][d] for j in range(m))
                det, r = _group(draft, pre, m, cache)
                sub = span // m
                ok = kids[: m - 1] == det and r[kids[-1]] > 0 and all(
                    drafts[start + j * sub + i][: d + 1] == pre + (kids[j],) for j in range(m) for i in range(sub)
                )
                if not ok:
                    raise InvalidInputError(
                        f"drafts are not a UniVer tree at prefix {list(pre)}: children {list(kids)}, expected the "
                        f"top-{m - 1} draft tokens {list(det)} then one token of the residual draft law"
                    )
                children[pre] = kids
        sched = []  # post-order [(threshold, accepted prefix, law of the next token)]

        def visit(pre, pt):
            if len(pre) == length:
                sched.append((pt, pre, target(pre)))
                return
            kids = children[pre]
            _, r = _group(draft, pre, m, cache)
            p_here = np.asarray(target(pre), dtype=np.float64)
            c = kids[-1]
            acc_c = min(1.0, pt * p_here[c] / r[c])
            pos = np.maximum(pt * p_here - r, 0.0)
            z = (1.0 - pt) + pos.sum()  # not (1 + S) − p̃: that loses S when S ≪ 1
            scale = (1.0 - acc_c) / z if z > 0 else 0.0
            marg = [pos[t] * scale for t in kids[:-1]] + [acc_c]
            not_v = (1.0 - pt) * scale
            stop_pos = pos.copy()
            stop_pos[list(kids)] = 0.0
            stop = stop_pos.sum() * scale
            for j, t in enumerate(kids):
                rem = stop + not_v + sum(marg[j:])  # = 1 − Σ_{i<j} P(u_i), summed without cancellation
                visit(pre + (t,), min(1.0, marg[j] / rem) if rem > 0 else 0.0)
            # f = 1 when nothing is left: the node is then reached with probability 0
            sched.append((stop / (stop + not_v) if stop + not_v > 0 else 1.0, pre, residual(stop_pos, 0.0, p_here)))

        visit((), 1.0)
        return sched

    def walk(self, inst, coin, draw):
        for thr, prefix, law in inst[:-1]:
            if coin(thr):
                return prefix, law
        return (), inst[-1][2]  # the root: f = 1

    # -- bounds of its own draft law ------------------------------------------------------------
    def own_law_bounds(self, target, draft, *, vocab_size, num_drafts, block_len) -> DraftLawBounds:
        """U_causal and U_joint for UniVer's tree law (the causal LP of docs/theory/block-bounds.md and the block OT,
        both over every tree; :func:`otbound.block._plain.causal_lp_tuples`)."""
        target, draft = _models(target, draft, vocab_size)
        m = check_num_drafts(num_drafts)
        length = check_positive_int(block_len, "block_len")
        tree = build_tree(target, draft, length)
        v = target.vocab_size
        law = list(self.draft_tuple_law(draft, m, length))
        tuples = np.array([[int(np.ravel_multi_index(row, (v,) * length)) for row in paths] for _, paths in law])
        probs = np.array([p for p, _ in law])
        joint, _ = joint_ot_tuples(tree, tuples, probs)
        return DraftLawBounds(causal_lp_tuples(tree, tuples, probs), joint)
