"""Model-running primitives shared by traces, block traces, speculative decoding and benchmarks.

Everything takes Hugging Face causal LMs (called through :func:`forward`) and lists of token ids;
batches are left-padded with explicit position ids so padded and unpadded rows see the same
positions (padded and unpadded logits agree to ~1e-6 in float32; the tests check it).
"""

from __future__ import annotations


def require_transformers(pair, what: str) -> None:
    """Refuse a pair run by another backend where ``what`` needs transformers models (their KV caches
    copied across a batch of drafts, as block traces, draft trees and the decoders use them).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from otbound.lm._decode import require_transformers
    >>> require_transformers(SimpleNamespace(backend="transformers"), "greedy_decode")   # silent
    >>> require_transformers(SimpleNamespace(backend="llama.cpp"), "greedy_decode")
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: greedy_decode needs the transformers backend ...
    """
    backend = getattr(pair, "backend", "transformers")
    if backend != "transformers":
        from otbound._validation import InvalidInputError

        raise InvalidInputError(f"{what} needs the transformers backend (it copies the models' KV caches across a "
                                f"batch of drafts); this pair runs on {backend}: load it with backend='transformers'")


def forward(model, ids, mask=None, pos=None, cache=None, keep: int = 0):
    """The logits of one forward of a causal LM, without autograd: the call every decoder of
    :mod:`otbound.lm` makes.

    ``model(ids, mask, pos, cache, use_cache=cache is not None, logits_to_keep=keep).logits`` under
    ``torch.no_grad()``. The cache goes in as the 4th positional argument, which is
    ``past_key_values`` in transformers 4.x and ``cache`` in 5.x (one call for both); it is updated
    in place with the new positions.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM (e.g. ``pair.target`` of a :class:`ModelPair`).
    ids : torch.Tensor
        int64 ``(batch, n)``, the new tokens (after the cached ones, if any).
    mask : torch.Tensor, optional
        int64 ``(batch, cached + n)``, 1 on real tokens, 0 on padding (:func:`left_pad`).
    pos : torch.Tensor, optional
        int64 ``(batch, n)``, the position ids of the new tokens.
    cache : transformers.DynamicCache, optional
        The KV cache of the earlier positions, extended in place.
    keep : int
        Keep the logits of the last ``keep`` positions only (0: all).

    Returns
    -------
    torch.Tensor
        Logits ``(batch, n or keep, vocab)`` in the model's dtype, on its device (the model's vocab
        may be padded beyond the tokenizer's: slice ``[..., :pair.vocab_size]``).

    Examples
    --------
    >>> import torch
    >>> from transformers import DynamicCache
    >>> from otbound.lm import forward, tiny_pair
    >>> pair = tiny_pair()
    >>> full = forward(pair.target, torch.tensor([[1, 2, 3]]))
    >>> full.shape, forward(pair.target, torch.tensor([[1, 2, 3]]), keep=1).shape
    (torch.Size([1, 3, 12]), torch.Size([1, 1, 12]))
    >>> cache = DynamicCache(config=pair.target.config)
    >>> _ = forward(pair.target, torch.tensor([[1, 2]]), cache=cache)
    >>> step = forward(pair.target, torch.tensor([[3]]), cache=cache)   # the third token, from the cache
    >>> bool(torch.allclose(step[0, -1], full[0, -1], atol=1e-5))
    True
    """
    import torch

    with torch.no_grad():
        return model(ids, mask, pos, cache, use_cache=cache is not None, logits_to_keep=keep).logits


def left_pad(seqs, device, pad_id: int = 0):
    """A batch of token lists of different lengths, left-padded to one length, with its attention
    mask and position ids: what :func:`forward` takes for a batch.

    Row ``i`` is ``[pad_id] * (width − len(seqs[i])) + seqs[i]``; the mask is 1 on its tokens; the
    position ids count its tokens from 0 (0 on the padding), so a padded row sees the positions it
    would see alone (its logits agree with the unpadded forward's to ~1e-6 in float32).

    Parameters
    ----------
    seqs : sequence of sequence of int
        The token ids, one list per row (none empty).
    device : str or torch.device
        Where the tensors go.
    pad_id : int
        The padding token id (masked out, so any id in the vocabulary).

    Returns
    -------
    ids, mask, position_ids : torch.Tensor
        int64 ``(len(seqs), width)`` each, ``width = max(len(s))``.

    Examples
    --------
    >>> from otbound.lm import left_pad
    >>> ids, mask, pos = left_pad([[5, 6, 7], [8]], "cpu")
    >>> ids.tolist(), mask.tolist(), pos.tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]], [[0, 1, 2], [0, 0, 0]])
    """
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.as_tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def stop_token_ids(tokenizer, model) -> list[int]:
    """The ids that end a continuation: the tokenizer's ``eos_token_id`` and the model's
    ``generation_config.eos_token_id`` (an id or a list), as ``transformers``' ``generate`` stops
    on them. Every decoder of :mod:`otbound.lm` stops at the first of them (included).

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase or None
        The pair's tokenizer (``pair.tokenizer``).
    model : transformers.PreTrainedModel or None
        The model whose generation config counts (``pair.target``).

    Returns
    -------
    list of int
        Sorted, without repeats; empty when neither names one.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from otbound.lm import stop_token_ids, tiny_pair
    >>> tokenizer = SimpleNamespace(eos_token_id=151645)
    >>> model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[151645, 151643]))
    >>> stop_token_ids(tokenizer, model)
    [151643, 151645]
    >>> pair = tiny_pair()   # no tokenizer, a random model: nothing stops it
    >>> stop_token_ids(pair.tokenizer, pair.target)
    []
    """
    ids = set()
    config = getattr(model, "generation_config", None)
    for src in (getattr(tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None)):
        if src is None:
            continue
        ids.update([src] if isinstance(src, int) else list(src))
    return sorted(ids)


def draw_tokens(last, temperature, context=None, generator=None):
    """One token per row drawn from the law of ``last`` (logits ``(batch, V)``, torch) under the
    sampling settings ``temperature`` — an :class:`otbound.SamplingParams`, or a float T for
    ``SamplingParams(T)`` — sampled by ``torch.multinomial`` with ``generator``. The law is
    :meth:`otbound.SamplingParams.laws` (float64, on ``last``'s device; a repetition penalty reads
    ``context``, int64 ``(batch, n)`` with ``-1`` padding): the law a stored trace defines from
    the same logits, so every token is drawn from exactly the law that is measured.

    The one sampling step of every backend's continuation sampler, so that equal logits and an
    equal generator state give equal tokens whichever backend computed the logits.

    Examples
    --------
    >>> import torch
    >>> from otbound.lm._decode import draw_tokens
    >>> last = torch.tensor([[0.0, 50.0, 0.0], [60.0, 0.0, 0.0]])
    >>> draw_tokens(last, 1.0, generator=torch.Generator().manual_seed(0)).tolist()
    [1, 0]
    """
    import torch

    law = as_settings(temperature).laws(last, context)  # (batch, V) float64
    return torch.multinomial(law, 1, generator=generator).squeeze(1)


def as_settings(temperature):
    """``temperature`` as :class:`otbound.SamplingParams` (a float T: ``SamplingParams(T)``).

    Examples
    --------
    >>> from otbound.lm._decode import as_settings
    >>> as_settings(0.7).describe(), as_settings(as_settings(0.5)).describe()
    ('T=0.7', 'T=0.5')
    """
    from otbound.token import SamplingParams

    return temperature if isinstance(temperature, SamplingParams) else SamplingParams(float(temperature))


def sample_continuations(model, prompts, *, temperature, max_new_tokens: int, vocab_size: int,
                         stop_ids=(), generator=None):
    """Sample a continuation of each prompt (token lists) from ``model`` at ``temperature``,
    batched with a KV cache: ``x_t`` drawn by :func:`draw_tokens` from the law of
    ``logits[:vocab_size]`` under ``temperature`` (a float T or an :class:`otbound.SamplingParams`;
    a repetition penalty reads the prompt and the tokens drawn so far). Each continuation ends at
    its first stop token (included) or after ``max_new_tokens``.

    Returns ``(continuations, logits)``: token lists, and per prompt the float32 logits
    ``(len(continuation), vocab_size)`` each token was drawn from (the model's logits given the
    prompt and the earlier continuation tokens), on the model's device.
    """
    import torch
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    ids, mask, pos = left_pad(prompts, dev)
    stop = torch.as_tensor(list(stop_ids), dtype=torch.long, device=dev)
    cache = DynamicCache(config=model.config)
    logits = forward(model, ids, mask, pos, cache, keep=1)
    nxt = pos[:, -1:] + 1
    done = torch.zeros(len(prompts), dtype=torch.bool, device=dev)
    steps, step_logits = [], []
    settings = as_settings(temperature)
    context = torch.where(mask.bool(), ids, -1) if settings.needs_context else None
    for step in range(max_new_tokens):
        last = logits[:, -1, :vocab_size].float()
        step_logits.append(last)
        tok = draw_tokens(last, settings, context, generator)
        if context is not None:
            context = torch.cat([context, torch.where(done, -1, tok)[:, None]], dim=1)
        steps.append(torch.where(done, -1, tok))
        done |= torch.isin(tok, stop)
        if step + 1 == max_new_tokens or bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = forward(model, tok[:, None], mask, nxt, cache)
        nxt = nxt + 1
    table = torch.stack(steps, dim=1).cpu().numpy()
    conts = [[int(t) for t in row if t >= 0] for row in table]
    stacked = torch.stack(step_logits, dim=1)
    return conts, [stacked[i, : len(c)] for i, c in enumerate(conts)]


def teacher_forced_logits(model, prompts, continuations, *, vocab_size: int) -> list:
    """Logits (float32 torch, on the model's device) of every continuation token given its prefix:
    row ``t`` of item ``i`` is the model's logit vector for ``continuations[i][t]`` after
    ``prompts[i] + continuations[i][:t]``. One batched forward, logits kept only where needed."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, continuations)]
    dev = next(model.parameters()).device
    ids, mask, pos = left_pad(seqs, dev)
    keep = max(len(c) for c in continuations) + 1
    logits = forward(model, ids, mask, pos, keep=keep)
    return [logits[i, keep - 1 - len(c): keep - 1, :vocab_size].float() for i, c in enumerate(continuations)]


def prefix_cache(model, tokens):
    """The KV cache of ``model`` over one token sequence, as per-layer ``(keys, values)`` tensors:
    computed once, then reused at any prefix length by :func:`cache_prefix`.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM.
    tokens : sequence of int
        The sequence.

    Returns
    -------
    list of tuple of torch.Tensor
        Per layer ``(keys, values)``, each ``(1, kv_heads, len(tokens), head_dim)``.

    Examples
    --------
    >>> from otbound.lm import prefix_cache, tiny_pair
    >>> pair = tiny_pair()
    >>> layers = prefix_cache(pair.target, [1, 2, 3, 4])
    >>> len(layers), tuple(layers[0][0].shape)
    (2, (1, 2, 4, 8))
    """
    import torch
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    forward(model, torch.as_tensor([list(tokens)], device=dev), cache=cache, keep=1)
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_prefix(model, layers, length: int, copies: int):
    """A fresh ``transformers.DynamicCache`` holding the first ``length`` positions of ``layers``
    (from :func:`prefix_cache`), repeated ``copies`` times along the batch: ``copies`` continuations
    of one prefix scored in one :func:`forward` (the drafts of a tree, say) without recomputing it.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The model the layers come from (its config builds the cache).
    layers : list of tuple of torch.Tensor
        :func:`prefix_cache` of a sequence.
    length : int
        How many of its positions to keep (the prefix ``tokens[:length]``).
    copies : int
        The batch size of the cache.

    Returns
    -------
    transformers.DynamicCache
        A new cache (``layers`` are not modified by the forwards that extend it).

    Examples
    --------
    >>> import torch
    >>> from otbound.lm import cache_prefix, forward, prefix_cache, tiny_pair
    >>> pair = tiny_pair()
    >>> layers = prefix_cache(pair.target, [1, 2, 3, 4])
    >>> cache = cache_prefix(pair.target, layers, 2, copies=3)   # the prefix [1, 2], three times
    >>> nxt = torch.tensor([[3], [5], [7]])                        # three continuations of it
    >>> mask, pos = torch.ones(3, 3, dtype=torch.long), torch.full((3, 1), 2)
    >>> logits = forward(pair.target, nxt, mask, pos, cache)
    >>> ref = forward(pair.target, torch.tensor([[1, 2, 5]]))[0, -1]   # no cache: the whole sequence
    >>> logits.shape, bool(torch.allclose(logits[1, -1], ref, atol=1e-5))
    (torch.Size([3, 1, 12]), True)
    """
    from transformers import DynamicCache

    cache = DynamicCache([(k[..., :length, :], v[..., :length, :]) for k, v in layers], config=model.config)
    cache.batch_repeat_interleave(copies)
    return cache
