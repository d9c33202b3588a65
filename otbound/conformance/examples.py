"""Bring-your-own-verifier examples, written against the kit's two primitives ``coin`` and ``draw``.

:func:`rrs` is SpecInfer's recursive rejection sampling (Miao et al. 2305.09781) for drafts i.i.d.
from q, the way one would write it in a serving engine — every random decision is a ``coin`` or a
``draw``, so :func:`otbound.conformance.check_token_verifier` can enumerate it exactly::

    python -m otbound.conformance otbound.conformance.examples:rrs --level token --num-drafts 2

:data:`block_verification` is the package's block verification (Sun et al. 2403.10444) through
:func:`otbound.conformance.block_adapter`::

    python -m otbound.conformance otbound.conformance.examples:block_verification --level block --num-drafts 1
"""

from __future__ import annotations

import numpy as np

from otbound.block_verifiers import BLOCK_VERIFIERS
from otbound.conformance._adapters import block_adapter


def _residual(a, b):
    """``norm((a − b)_+)``; ``a`` when that is empty (a branch of probability 0)."""
    d = np.maximum(a - b, 0.0)
    s = d.sum()
    return d / s if s > 0 else a


def rrs(p, q, drafts, coin, draw):
    """SpecInfer RRS: try x_1..x_K in turn, accept x_i w.p. min(1, p_i(x_i)/q(x_i)), else
    p_{i+1} = norm((p_i − q)_+); if all are rejected, emit a draw from p_{K+1}."""
    cur = np.asarray(p, dtype=np.float64)
    for x in drafts:
        if coin(min(1.0, cur[x] / q[x])):
            return int(x)
        cur = _residual(cur, q)
    return draw(cur)



#: Sun et al.'s block verification (2403.10444) from the package, adapted to the kit's interface
block_verification = block_adapter(BLOCK_VERIFIERS["block"])
