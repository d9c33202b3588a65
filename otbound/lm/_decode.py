"""Model-running primitives shared by traces, block traces, speculative decoding and benchmarks.

Everything takes Hugging Face causal LMs (called through :func:`forward`) and lists of token ids;
batches are left-padded with explicit position ids so padded and unpadded rows see the same
positions (padded and unpadded logits agree to ~1e-6 in float32; the tests check it).
"""

from __future__ import annotations


def forward(model, ids, mask=None, pos=None, cache=None, keep: int = 0):
    """``model(...)`` logits, without autograd. The cache goes in as the 4th positional argument,
    which is ``past_key_values`` in transformers 4.x and ``cache`` in 5.x; it is updated in place."""
    import torch

    with torch.no_grad():
        return model(ids, mask, pos, cache, use_cache=cache is not None, logits_to_keep=keep).logits


def left_pad(seqs, device, pad_id: int = 0):
    """``(ids, mask, position_ids)`` for token lists ``seqs``, left-padded to one length."""
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
    """End-of-sequence ids: the tokenizer's eos plus the model's generation-config eos ids."""
    ids = set()
    config = getattr(model, "generation_config", None)
    for src in (getattr(tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None)):
        if src is None:
            continue
        ids.update([src] if isinstance(src, int) else list(src))
    return sorted(ids)


def sample_continuations(model, prompts, *, temperature, max_new_tokens: int, vocab_size: int,
                         stop_ids=(), generator=None):
    """Sample a continuation of each prompt (token lists) from ``model`` at ``temperature``,
    batched with a KV cache: ``x_t ~ softmax(logits[:vocab_size] / T)`` (float32 softmax, torch
    multinomial with ``generator``); ``temperature`` may be an :class:`otbound.SamplingParams`,
    whose law (float64, on the model's device; a repetition penalty reads the prompt and the
    tokens drawn so far) is then sampled. Each continuation ends at its first stop token
    (included) or after ``max_new_tokens``.

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
    settings = temperature if hasattr(temperature, "laws") else None
    context = torch.where(mask.bool(), ids, -1) if settings is not None and settings.needs_context else None
    for step in range(max_new_tokens):
        last = logits[:, -1, :vocab_size].float()
        step_logits.append(last)
        if settings is None:
            law = torch.softmax(last / temperature, dim=-1)
        else:
            law = settings.laws(last, context)
        tok = torch.multinomial(law, 1, generator=generator).squeeze(1)
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
    """KV cache of ``model`` over ``tokens`` (one sequence), as per-layer ``(keys, values)``."""
    import torch
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    forward(model, torch.as_tensor([list(tokens)], device=dev), cache=cache, keep=1)
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_prefix(model, layers, length: int, copies: int):
    """A fresh DynamicCache holding the first ``length`` positions of ``layers`` (from
    :func:`prefix_cache`), repeated ``copies`` times along the batch."""
    from transformers import DynamicCache

    cache = DynamicCache([(k[..., :length, :], v[..., :length, :]) for k, v in layers], config=model.config)
    cache.batch_repeat_interleave(copies)
    return cache
