"""Adapters from the package's verifiers to the kit's interfaces (implementation).

* :func:`block_adapter` — a :class:`otbound.block.verifiers.BlockVerifier` is already written as a
  walk whose decisions go through the kit's ``coin`` / ``draw``; the adapter hands them over and
  draws the correction token, so exact mode runs the verifier's own algorithm, branch by branch.
* :func:`token_law_adapter` — the token verifiers are vectorised over rows with a generator, so exact
  mode can only see their exact ``conditional_law``: the adapter emits ``draw(conditional_law)``.
  This checks the package's *laws*; :func:`token_sample_adapter` (batched, for mode="sample")
  checks the package's *sampler*.
"""

from __future__ import annotations

import numpy as np


def block_adapter(verifier, *, clip: bool = True):
    """``verify(target, draft, blocks, coin, draw) -> emitted tokens`` running ``verifier.walk``.

    ``clip``: pass ``min(1, max(0, prob))`` to ``coin``, as the package's own enumeration and sampling do (a sampled
    ``u < prob`` is the clipped coin). ``clip=False`` hands the raw value to the kit, which refuses a
    probability outside [0, 1] — SpecTr-GBV's recovered sub-block test does leave it.
    """

    def verify(target, draft, blocks, coin, draw):
        drafts = tuple(tuple(int(t) for t in row) for row in blocks)
        clipped = (lambda prob: coin(min(1.0, max(0.0, float(prob))))) if clip else coin
        prefix, law = verifier.walk(verifier.prepare(target, draft, drafts, {}), clipped, draw)
        return list(prefix) + [draw(law)]

    verify.__qualname__ = f"block_adapter({verifier.name})"
    verify.lossless = getattr(verifier, "lossless", None)  # its declaration, shown in the summary
    return verify


def block_sample_adapter(verifier):
    """Batched ``verify(target, draft, blocks (n, K, L), rng) -> (n, L + 1)`` from ``verifier.sample``."""

    def verify(target, draft, blocks, rng):
        return verifier.sample(target, draft, np.asarray(blocks), rng).tokens

    verify.__qualname__ = f"block_sample_adapter({verifier.name})"
    verify.lossless = getattr(verifier, "lossless", None)  # its declaration, shown in the summary
    return verify


def token_law_adapter(verifier):
    """``verify(p, q, drafts, coin, draw) = draw(verifier.conditional_law(p, q, drafts))``."""

    def verify(p, q, drafts, coin, draw):
        return draw(verifier.conditional_law(p, q, drafts))

    verify.__qualname__ = f"token_law_adapter({verifier.name})"
    verify.lossless = getattr(verifier, "lossless", None)  # its declaration, shown in the summary
    return verify


def token_sample_adapter(verifier):
    """Batched ``verify(p, q, drafts (n, K), rng) -> tokens (n,)`` from ``verifier.sample``."""

    def verify(p, q, drafts, rng):
        return verifier.sample(p, q, drafts, rng).tokens

    verify.__qualname__ = f"token_sample_adapter({verifier.name})"
    verify.lossless = getattr(verifier, "lossless", None)  # its declaration, shown in the summary
    return verify


def as_sampler(verify):
    """A coin/draw verifier as a black box for mode="sample": ``f(*args, rng)`` runs
    ``verify(*args, coin, draw)`` with ``coin(prob) = rng.random() < prob`` and ``draw(law)`` an
    inverse-CDF draw — the same algorithm, now sampled, e.g. to cross-check exact mode."""

    def run(*args):
        *head, rng = args

        def draw(law):
            cdf = np.cumsum(np.asarray(law, dtype=np.float64))
            return int(
                min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), np.flatnonzero(cdf < cdf[-1]).size)
            )

        return verify(*head, lambda prob: rng.random() < prob, draw)

    run.__qualname__ = f"as_sampler({getattr(verify, '__qualname__', 'verify')})"
    return run
