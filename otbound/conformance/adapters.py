"""Adapters: real verifiers, unmodified, in the kit's exact-mode signatures.

* :func:`transformers_speculative_sampling` — the installed ``transformers``' assisted-generation
  verifier ``transformers.generation.utils._speculative_sampling`` (Leviathan et al. 2211.17192,
  algorithm 1), run unmodified under :func:`~otbound.conformance.route_randomness` as a block
  verifier with one draft block (K = 1). The test suite checks it exactly at L = 1, 2, 3, so a
  ``transformers`` release that breaks its losslessness fails CI.
* the package's own verifiers: :func:`~otbound.conformance.block_adapter`,
  :func:`~otbound.conformance.token_law_adapter` and their sample-mode twins, re-exported here.

Recipes for engines that are not installed here (vLLM, SGLang, EAGLE) are in the user guide
(``docs/guide/conformance.md``): which calls to route and what to pass.
"""

from __future__ import annotations

import numpy as np

from otbound.conformance._adapters import (
    as_sampler,
    block_adapter,
    block_sample_adapter,
    token_law_adapter,
    token_sample_adapter,
)
from otbound.conformance._routing import route_randomness
from otbound.conformance._tree import ConformanceError

DTYPES = ("float64", "float32")


def _logits(laws: np.ndarray, dtype):
    """log of a stack of laws (rows (n, V)) as a (1, n, V) tensor; log 0 = −inf (softmax gives 0 back)."""
    import torch

    with np.errstate(divide="ignore"):
        return torch.tensor(np.log(laws), dtype=getattr(torch, dtype))[None]


#: the leading parameters of transformers' ``_speculative_sampling`` the adapter passes, in order
SIGNATURE = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits")


def _check_signature(fn) -> None:
    """A clear error when the function's leading parameters are not :data:`SIGNATURE` (a
    transformers release that changed them), instead of a wrong call."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    names = tuple(p.name for p in params[: len(SIGNATURE)])
    rest = [p for p in params[len(SIGNATURE) :] if p.default is inspect.Parameter.empty and p.kind not in
            (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]  # fmt: skip
    if names != SIGNATURE or rest:
        raise ConformanceError(
            f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', fn)}{inspect.signature(fn)} does not start "
            f"with {SIGNATURE} (other parameters optional): the installed transformers changed it; adapt the call"
        )


def transformers_speculative_sampling(fn=None, *, dtype: str = "float64"):
    """``verify(target, draft, blocks, coin, draw)`` running transformers' ``_speculative_sampling``.

    The block ``x = blocks[0]`` (one draft block, K = 1, of ``L`` tokens) is handed to the function
    as transformers' assisted generation does: ``candidate_input_ids`` (1, L) = ``x``,
    ``candidate_logits`` (1, L, V) = ``log draft(x_<i)``, ``new_logits`` (1, L + 1, V) =
    ``log target(x_<i)`` (``softmax`` of a log-law is the law), ``candidate_length = L``. Its
    ``torch.rand_like`` uniforms and its ``torch.multinomial`` residual / bonus draw are routed to
    ``coin`` / ``draw``, so exact mode enumerates the function's own branches. The emitted tokens are
    the function's ``valid_tokens``.

    Parameters
    ----------
    fn : callable, optional
        The function to run (default: ``transformers.generation.utils._speculative_sampling`` of
        the installed version), with its signature ``fn(candidate_input_ids, candidate_logits,
        candidate_length, new_logits) -> (valid_tokens (1, n + 1), n_matches)``.
    dtype : {"float64", "float32"}
        The logits' dtype. Generation computes in float32 (``new_logits.to(torch.float32)``); float64
        checks the algorithm to float64 round-off, float32 checks it at the precision it runs at
        (check with ``precision="float32"``).

    Returns
    -------
    callable
        An exact-mode block verifier for :func:`~otbound.conformance.check_block_verifier`.

    Raises
    ------
    ConformanceError
        At construction, when the function's parameters do not start with :data:`SIGNATURE` (or
        it has other required ones); when called with ``K != 1`` blocks (the function verifies one
        candidate sequence).

    Examples
    --------
    >>> import otbound.conformance as oc
    >>> from otbound.conformance.adapters import transformers_speculative_sampling
    >>> res = oc.check_block_verifier(transformers_speculative_sampling(), vocab_size=2, num_drafts=1,
    ...                               block_len=2, instances=4)
    >>> res.passed, res.lossless_error < 1e-12
    (True, True)
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if fn is None:
        from transformers.generation.utils import _speculative_sampling as fn
    _check_signature(fn)

    def verify(target, draft, blocks, coin, draw):
        import torch

        if len(blocks) != 1:
            raise ConformanceError(
                f"transformers' _speculative_sampling verifies one draft block (num_drafts = 1), got {len(blocks)}"
            )
        x = tuple(int(t) for t in blocks[0])
        length = len(x)
        q = np.stack([draft(x[:i]) for i in range(length)])  # (L, V)
        p = np.stack([target(x[:i]) for i in range(length + 1)])  # (L + 1, V)
        ids = torch.tensor([x], dtype=torch.long)  # (1, L)
        with route_randomness(coin, draw):
            tokens, _ = fn(ids, _logits(q, dtype), length, _logits(p, dtype))  # (1, n + 1)
        return [int(t) for t in tokens[0].tolist()]

    verify.__qualname__ = f"transformers_speculative_sampling({getattr(fn, '__module__', '')}.{fn.__name__})"
    return verify


__all__ = [
    "as_sampler",
    "block_adapter",
    "block_sample_adapter",
    "token_law_adapter",
    "token_sample_adapter",
    "transformers_speculative_sampling",
]
