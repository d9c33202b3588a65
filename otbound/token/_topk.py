"""Deterministic drafting: the K largest entries of each row (ties to the lower index) behind the
batched kernel's α*_det = p(top-K(q)) (``optimal_acceptance(..., "deterministic")``; the selection
is the kernel's :func:`otbound.token._kernel.greedy_split_rows`, shared with the greedy law).

What serving engines do by default (vLLM drafts by argmax and verifies with a one-hot q; EAGLE,
Medusa and SGLang expand static top-k trees): the draft tuple is

    x̄ = G = (the K tokens of largest q, by decreasing q; ties to the lower index),

so its law is the point mass Q = δ_G and Q(H) = 1[G ⊆ H]. The optimum by the same dual as the
random laws (Hu et al. 2502.18779 Theorem 3.1)::

    α*_det = 1 + min_H [p(H) − 1[G ⊆ H]] = p(G),

attained at H* = G (any H ⊉ G gives 1 + p(H) ≥ 1; any H ⊇ G gives p(H) ≥ p(G)). The law itself
is :class:`otbound.token.draft_laws.Deterministic`; lossless verifiers reach it
(:mod:`otbound.token.verifiers._deterministic`): every emitted token is a draw of p, accepted iff
it lies in G. K must not exceed the support of q (the K drafts are distinct
tokens of positive draft mass; a truncated draft law with fewer survivors is an error naming it).
"""
