"""Greedy decoding with and without speculative verification (Leviathan et al. 2211.17192 at
T → 0): the draft proposes ``block_length`` tokens greedily, the target scores them in one
forward, the longest prefix matching the target's argmax is kept and the target's own argmax
token is appended. The output is, by construction, the target's greedy output; with exact
arithmetic the two are identical (in fp32 they agree on the offline pair; bf16's batched vs
single-token rounding can flip near-ties).
"""

from __future__ import annotations

from dataclasses import dataclass

from otbound._validation import InvalidInputError
from otbound.lm._decode import forward, require_transformers, stop_token_ids


@dataclass
class GreedyRun:
    """tokens: generated ids. target_calls: target forwards after the prompt. accepted: draft
    tokens kept in total, so ``accepted / target_calls`` is E[τ] (block efficiency minus 1).

    Examples
    --------
    >>> from otbound.lm import GreedyRun
    >>> GreedyRun(tokens=[2, 8, 3], target_calls=2, accepted=1).mean_accepted
    0.5
    """

    tokens: list
    target_calls: int
    accepted: int = 0

    @property
    def mean_accepted(self) -> float:
        return self.accepted / max(self.target_calls, 1)


class _Cached:
    """A model with a KV cache over a prefix of ``seq``: ``logits(seq, extra)`` feeds the
    uncached tail of ``seq`` plus ``extra`` and returns the last ``len(extra) + 1`` rows."""

    def __init__(self, model, vocab):
        from transformers import DynamicCache

        self.model, self.vocab, self.cache, self.length = model, vocab, DynamicCache(config=model.config), 0

    def logits(self, seq, extra=()):
        import torch

        dev = next(self.model.parameters()).device
        feed = list(seq[self.length:]) + list(extra)
        out = forward(self.model, torch.as_tensor([feed], device=dev), cache=self.cache, keep=len(extra) + 1)
        self.length += len(feed)
        return out[0, :, : self.vocab]

    def rollback(self, length):
        if length < self.length:
            self.cache.crop(length - self.length)
            self.length = length


def greedy_decode(pair, prompt_ids, max_new_tokens: int, *, block_length: int = 0) -> GreedyRun:
    """Greedy continuation of ``prompt_ids`` by the target; ``block_length > 0`` drafts that many
    tokens per target call with the draft (speculative), ``0`` is plain target-only decoding.
    Stops after an end-of-sequence token (kept) or ``max_new_tokens``.

    Parameters
    ----------
    pair : otbound.lm.ModelPair
    prompt_ids : sequence of int
    max_new_tokens : int
    block_length : int
        Draft tokens per target call; 0 decodes with the target alone.

    Returns
    -------
    GreedyRun

    Raises
    ------
    otbound.InvalidInputError
        If ``block_length`` is not a non-negative integer.

    Examples
    --------
    The speculative decoder emits the target's own greedy output, in fewer target calls:

    >>> from otbound.lm import greedy_decode, tiny_pair, tiny_prompts
    >>> pair = tiny_pair()
    >>> prompt = tiny_prompts(pair, 1)[0]
    >>> plain = greedy_decode(pair, prompt, 8)
    >>> spec = greedy_decode(pair, prompt, 8, block_length=3)
    >>> spec.tokens == plain.tokens, plain.target_calls, spec.target_calls, spec.accepted
    (True, 8, 3, 7)
    """
    require_transformers(pair, "greedy_decode")
    if isinstance(block_length, bool) or not isinstance(block_length, int) or block_length < 0:
        raise InvalidInputError(f"block_length must be a non-negative integer, got {block_length!r}")
    stops = set(stop_token_ids(pair.tokenizer, pair.target))
    seq = list(prompt_ids)
    start = len(seq)
    target = _Cached(pair.target, pair.vocab_size)
    draft = _Cached(pair.draft, pair.vocab_size) if block_length else None
    run = GreedyRun([], 0)
    while len(seq) - start < max_new_tokens and not (len(seq) > start and seq[-1] in stops):
        proposal = []
        if draft is not None:
            draft.rollback(len(seq) - 1)
            for _ in range(block_length):
                proposal.append(int(draft.logits(seq + proposal)[-1].argmax()))
        target.rollback(len(seq) - 1)
        best = target.logits(seq, proposal).argmax(-1).tolist()
        run.target_calls += 1
        n = 0
        while n < len(proposal) and proposal[n] == best[n]:
            n += 1
        new = proposal[:n] + [best[n]]
        run.accepted += n
        for tok in new:
            if len(seq) - start == max_new_tokens:
                break
            seq.append(tok)
            if tok in stops:
                break
    run.tokens = seq[start:]
    return run
