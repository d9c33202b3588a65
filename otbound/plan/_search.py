"""Tree-shape search under a node budget: a dynamic program over per-node acceptance.

Sequoia (Chen et al. 2402.12374, §3.1) searches the tree that maximises the expected number of
accepted tokens under a node budget by a dynamic program over a measured per-rank acceptance
vector ``r_1, r_2, ...`` (``r_i``: probability that the ``i``-th child is the accepted one). Here a
node with ``m`` drafted children accepts one of them with probability ``a(m)`` — the verifier's
exact acceptance with ``m`` drafts of its law, averaged over the traces' positions (``a(m) =
r_1 + ... + r_m`` in Sequoia's terms), or the optimum ``α*`` of the draft law for the bound — and
the tree is uniform per depth (branching ``b_d`` at every node of depth ``d − 1``, so that each
drafted child, exchangeable under the draft law, carries the same subtree). With ``g_d(n)`` the
largest expected accepted count of a subtree of depth at most ``D − d`` with at most ``n`` nodes
below its root::

    g_D(n) = 0,    g_d(n) = max(0, max_{1 ≤ b ≤ min(n, M)} a(b) · (1 + g_{d+1}(⌊(n − b) / b⌋)))

(the ``b`` children share the remaining ``n − b`` nodes equally). ``E[τ]`` of the whole tree under
positional independence is ``Σ_ℓ Π_{d ≤ ℓ} a(b_d)``.
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError

#: largest dynamic-programme table of :func:`best_tree`, ``(max_depth + 1) × (budget + 1)`` cells
#: (a Python loop visits each cell once per allowed branching: about a second per million cells)
MAX_SEARCH_CELLS = 4_000_000


def check_search_size(budget: int, max_depth: int) -> None:
    """Refuse a tree search whose table exceeds :data:`MAX_SEARCH_CELLS` cells, before allocating it.

    Examples
    --------
    >>> check_search_size(32, 6)
    >>> try:
    ...     check_search_size(10**9, 5)
    ... except InvalidInputError as err:
    ...     print(str(err)[:74])
    node budget 1000000000 at depth 5: the tree search needs 6000000006 table
    """
    cells = (int(max_depth) + 1) * (int(budget) + 1)
    if cells > MAX_SEARCH_CELLS:
        raise InvalidInputError(
            f"node budget {budget} at depth {max_depth}: the tree search needs {cells} table cells "
            f"(about {cells * 16 / 1e9:.1f} GB and a Python loop over each), above the limit of "
            f"{MAX_SEARCH_CELLS} cells; give budgets below {MAX_SEARCH_CELLS // (int(max_depth) + 1)}")


def tree_nodes_of(branching) -> int:
    """Nodes of the uniform tree ``branching`` (the root excluded): ``Σ_ℓ Π_{d ≤ ℓ} b_d``.

    Examples
    --------
    >>> tree_nodes_of((2, 1, 1)), tree_nodes_of((3, 2))
    (6, 9)
    """
    total, width = 0, 1
    for b in branching:
        width *= int(b)
        total += width
    return total


def best_tree(acceptance: dict, budget: int, max_depth: int) -> tuple[tuple, float]:
    """The uniform-per-depth tree of at most ``budget`` nodes and depth at most ``max_depth`` that
    maximises ``Σ_ℓ Π_{d ≤ ℓ} a(b_d)`` (module docstring).

    Parameters
    ----------
    acceptance : dict
        ``{m: a(m)}``, acceptance with ``m`` drafted children, ``m ≥ 1`` (the branchings allowed).
    budget : int
        Node budget (≥ 1).
    max_depth : int
        Largest depth (≥ 1).

    Returns
    -------
    (branching, value)
        The branching ``(b_1, ..., b_L)`` and its ``E[τ]`` under positional independence.

    Raises
    ------
    InvalidInputError
        A budget below one node, a depth below 1, a search table above :data:`MAX_SEARCH_CELLS`
        cells, or no acceptance given.

    Examples
    --------
    With one draft accepted with probability 0.8 and two with 0.9, five nodes:

    >>> branching, value = best_tree({1: 0.8, 2: 0.9}, budget=5, max_depth=5)
    >>> branching, round(value, 4)
    ((1, 1, 1, 1, 1), 2.6893)
    >>> best_tree({1: 0.5, 2: 0.9}, budget=4, max_depth=2)[0]
    (2, 1)
    """
    budget, max_depth = int(budget), int(max_depth)
    if budget < 1:
        raise InvalidInputError(f"node budget must be at least one node, got {budget}")
    if max_depth < 1:
        raise InvalidInputError(f"max_depth must be ≥ 1, got {max_depth}")
    check_search_size(budget, max_depth)
    ms = sorted(int(m) for m in acceptance if int(m) >= 1)
    if not ms:
        raise InvalidInputError("no acceptance measured to search trees over")
    a = {m: float(acceptance[m]) for m in ms}
    g = np.zeros((max_depth + 1, budget + 1))
    choice = np.zeros((max_depth + 1, budget + 1), dtype=np.int64)
    for d in range(max_depth - 1, -1, -1):
        for n in range(1, budget + 1):
            best, arg = 0.0, 0
            for m in ms:
                if m > n:
                    break
                val = a[m] * (1.0 + g[d + 1, (n - m) // m])
                if val > best + 1e-15:
                    best, arg = val, m
            g[d, n], choice[d, n] = best, arg
    branching, n = [], budget
    for d in range(max_depth):
        m = int(choice[d, n])
        if m == 0:
            break
        branching.append(m)
        n = (n - m) // m
    return tuple(branching), float(g[0, budget])
