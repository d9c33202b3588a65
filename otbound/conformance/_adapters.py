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

from otbound._replay import check_coin_probability, check_draw_law
from otbound.conformance._tree import VIOLATIONS, ConformanceError, raise_recorded


def block_adapter(verifier, *, clip: bool = True):
    """``verify(target, draft, blocks, coin, draw) -> emitted tokens`` running ``verifier.walk``.

    ``clip``: pass ``min(1, max(0, prob))`` to ``coin``, as the package's own enumeration and sampling do (a sampled
    ``u < prob`` is the clipped coin). ``clip=False`` hands the raw value to the kit, which refuses a
    probability outside [0, 1] — SpecTr-GBV's recovered sub-block test does leave it.

    Parameters
    ----------
    verifier : otbound.block.verifiers.BlockVerifier
        E.g. ``otbound.BLOCK_VERIFIERS["block"]``.
    clip : bool
        Clip the coins' probabilities into [0, 1] before the kit sees them.

    Returns
    -------
    callable
        ``verify(target, draft, blocks, coin, draw) -> list of token ids`` (the accepted prefix, then
        the correction or bonus token), with ``lossless`` set to the verifier's declaration, for
        :func:`otbound.conformance.check_block_verifier` in exact mode.

    Examples
    --------
    >>> from otbound import BLOCK_VERIFIERS
    >>> from otbound.conformance import block_adapter, check_block_verifier
    >>> verify = block_adapter(BLOCK_VERIFIERS["block"])
    >>> verify.__qualname__, verify.lossless
    ('block_adapter(block)', True)
    >>> res = check_block_verifier(verify, vocab_size=2, num_drafts=2, block_len=2, instances=2)
    >>> res.passed, res.lossless_error < 1e-10
    (True, True)
    """

    def verify(target, draft, blocks, coin, draw):
        drafts = tuple(tuple(int(t) for t in row) for row in blocks)
        clipped = (lambda prob: coin(min(1.0, max(0.0, float(prob))))) if clip else coin
        prefix, law = verifier.walk(verifier.prepare(target, draft, drafts, {}), clipped, draw)
        return list(prefix) + [draw(law)]

    return _declaring(verify, "block_adapter", verifier)


def block_sample_adapter(verifier):
    """Batched ``verify(target, draft, blocks (n, K, L), rng) -> (n, L + 1)`` from ``verifier.sample``.

    Parameters
    ----------
    verifier : otbound.block.verifiers.BlockVerifier

    Returns
    -------
    callable
        ``verify(target, draft, blocks, rng) -> int array (n, L + 1)``, the emitted tokens of each
        row padded with −1, for :func:`otbound.conformance.check_block_verifier` with
        ``mode="sample", batch=True``; ``lossless`` is the verifier's declaration.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import BLOCK_VERIFIERS
    >>> from otbound.conformance import block_instances, block_sample_adapter
    >>> verify = block_sample_adapter(BLOCK_VERIFIERS["block"])
    >>> target, draft = block_instances(2, 2, 1, 0)[0].models()
    >>> blocks = np.zeros((5, 2, 2), dtype=np.int64)  # 5 rows of K = 2 blocks of L = 2 tokens
    >>> out = verify(target, draft, blocks, np.random.default_rng(0))
    >>> out.shape, bool(((out == -1) | (out == 0) | (out == 1)).all())
    ((5, 3), True)
    """

    def verify(target, draft, blocks, rng):
        return verifier.sample(target, draft, np.asarray(blocks), rng).tokens

    return _declaring(verify, "block_sample_adapter", verifier)


def token_law_adapter(verifier):
    """``verify(p, q, drafts, coin, draw) = draw(verifier.conditional_law(p, q, drafts))``.

    Exact mode then checks the verifier's exact conditional law ``P(Y = · | x̄)``, not its sampler
    (:func:`token_sample_adapter` checks that).

    Parameters
    ----------
    verifier : otbound.Verifier
        A token-level verifier, e.g. ``otbound.VERIFIERS["rrs"]``.

    Returns
    -------
    callable
        ``verify(p, q, drafts, coin, draw) -> token id`` with ``lossless`` set to the verifier's
        declaration, for :func:`otbound.conformance.check_token_verifier` in exact mode.

    Examples
    --------
    >>> from otbound import VERIFIERS
    >>> from otbound.conformance import check_token_verifier, token_law_adapter
    >>> verify = token_law_adapter(VERIFIERS["rrs"])
    >>> res = check_token_verifier(verify, vocab_size=3, num_drafts=2, instances=4)
    >>> res.name, res.passed, res.declared_lossless
    ('token_law_adapter(rrs)', True, True)
    """

    def verify(p, q, drafts, coin, draw):
        return draw(verifier.conditional_law(p, q, drafts))

    return _declaring(verify, "token_law_adapter", verifier)


def token_sample_adapter(verifier):
    """Batched ``verify(p, q, drafts (n, K), rng) -> tokens (n,)`` from ``verifier.sample``.

    Parameters
    ----------
    verifier : otbound.Verifier

    Returns
    -------
    callable
        ``verify(p, q, drafts, rng) -> int array (n,)``, for
        :func:`otbound.conformance.check_token_verifier` with ``mode="sample", batch=True``;
        ``lossless`` is the verifier's declaration.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound import VERIFIERS
    >>> from otbound.conformance import token_sample_adapter
    >>> verify = token_sample_adapter(VERIFIERS["rrs"])
    >>> p, q = np.array([0.2, 0.3, 0.5]), np.array([0.5, 0.25, 0.25])
    >>> drafts = np.array([[0, 1], [2, 2], [1, 0]])  # (n, K) = (3, 2)
    >>> verify(p, q, drafts, np.random.default_rng(0)).shape
    (3,)
    """

    def verify(p, q, drafts, rng):
        return verifier.sample(p, q, drafts, rng).tokens

    return _declaring(verify, "token_sample_adapter", verifier)


def _declaring(verify, adapter: str, verifier):
    """``verify`` named ``adapter(verifier.name)`` in the reports and carrying the verifier's
    ``lossless`` declaration (shown in the summary)."""
    verify.__qualname__ = f"{adapter}({verifier.name})"
    verify.lossless = getattr(verifier, "lossless", None)
    return verify


def as_sampler(verify):
    """A coin/draw verifier as a black box for mode="sample": ``f(*args, rng)`` runs
    ``verify(*args, coin, draw)`` with ``coin(prob) = rng.random() < prob`` and ``draw(law)`` an
    inverse-CDF draw — the same algorithm, now sampled, e.g. to cross-check exact mode. Every
    probability and law is checked as exact mode checks them (a probability outside [0, 1] or not
    a number, a law with a negative or non-finite entry or not summing to 1 raise
    :class:`~otbound.conformance.ConformanceError`), and a routing error the verifier caught is
    raised when it returns.

    Parameters
    ----------
    verify : callable
        A verifier written against ``coin`` / ``draw`` (its last two arguments).

    Returns
    -------
    callable
        ``run(*args, rng)``: ``verify`` with those two arguments replaced by a numpy Generator.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.conformance import as_sampler
    >>> from otbound.conformance.examples import rrs
    >>> run = as_sampler(rrs)
    >>> run.__qualname__
    'as_sampler(rrs)'
    >>> p, q = np.array([0.2, 0.3, 0.5]), np.array([0.5, 0.25, 0.25])
    >>> run(p, q, np.array([0, 1]), np.random.default_rng(0)) in (0, 1, 2)
    True
    >>> as_sampler(lambda p, q, drafts, coin, draw: draw(2 * p))(p, q, [0], np.random.default_rng(0))
    Traceback (most recent call last):
        ...
    otbound.conformance._tree.ConformanceError: draw() got a law summing to 2, not 1 (tolerance 1e-06)
    """
    def run(*args):
        *head, rng = args

        def coin(prob):
            return rng.random() < check_coin_probability(prob, ConformanceError)

        def draw(law):
            cdf = np.cumsum(check_draw_law(law, None, ConformanceError))
            return int(
                min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), np.flatnonzero(cdf < cdf[-1]).size)
            )

        VIOLATIONS.clear()
        out = verify(*head, coin, draw)
        raise_recorded()  # a routing error the verifier caught: no sample, no verdict
        return out

    run.__qualname__ = f"as_sampler({getattr(verify, '__qualname__', 'verify')})"
    return run
