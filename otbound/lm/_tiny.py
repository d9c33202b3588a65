"""A tiny random Qwen2 pair and prompts for tests and demos of the decoders (no download)."""

from __future__ import annotations

import numpy as np

from otbound.lm._models import random_pair

TINY_SHAPE = dict(
    num_hidden_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    initializer_range=0.3,
)


def tiny_pair(vocab_size: int = 12, *, noise: float = 0.5, seed: int = 0):
    """A tiny random Qwen2 pair for tests and demos (CPU, float32, no tokenizer): the target has
    random weights (``initializer_range`` 0.3, so its laws are far from uniform); the draft is the
    target with its output layer perturbed by ``noise`` × N(0, 0.3²) per weight, so the draft's
    logits are the target's plus noise (a draft that mostly agrees). Acceptance figures from it
    mean nothing about real models.

    Parameters
    ----------
    vocab_size : int
        V.
    noise : float
        Scale of the draft's output-layer perturbation (0: the draft is the target).
    seed : int

    Returns
    -------
    otbound.lm.ModelPair

    Examples
    --------
    >>> import torch
    >>> from otbound.lm import tiny_pair
    >>> pair = tiny_pair()
    >>> pair.name, pair.vocab_size, pair.tokenizer
    ('tiny(V=12, noise=0.5, seed=0)', 12, None)
    >>> pair.target(torch.tensor([[1, 2]])).logits.shape
    torch.Size([1, 2, 12])
    """
    import torch

    pair = random_pair(TINY_SHAPE, TINY_SHAPE, vocab_size=vocab_size, device="cpu", dtype="float32", seed=seed)
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        pair.draft.load_state_dict(pair.target.state_dict())
        head = pair.draft.get_output_embeddings().weight
        head.add_(noise * TINY_SHAPE["initializer_range"] * torch.randn(head.shape, generator=gen))
    pair.name = f"tiny(V={vocab_size}, noise={noise}, seed={seed})"
    return pair


def tiny_prompts(pair, num: int, length: int = 4, seed: int = 0) -> list:
    """``num`` random prompts of ``length`` token ids over ``pair``'s vocabulary (seeded).

    Examples
    --------
    >>> from otbound.lm import tiny_pair, tiny_prompts
    >>> tiny_prompts(tiny_pair(), 2)
    [[10, 7, 6, 3], [3, 0, 0, 0]]
    """
    rng = np.random.default_rng(seed)
    return rng.integers(0, pair.vocab_size, size=(num, length)).tolist()
