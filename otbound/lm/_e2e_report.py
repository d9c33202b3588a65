"""The end-to-end section of ``python -m otbound.compare --end-to-end`` (see :mod:`otbound.lm._e2e`)."""

from __future__ import annotations

import time

from otbound.block_verifiers import BLOCK_VERIFIERS
from otbound.lm._e2e import end_to_end_figure, end_to_end_markdown, end_to_end_rows, tiny_pair, tiny_prompts
from otbound.verifiers import VERIFIERS

#: the tiny pair's vocabulary in the default section
TINY_VOCAB = 12


def end_to_end_section(args, out):
    """``(rows as dicts with block_len, markdown, figure path)`` for the CLI's arguments."""
    t0 = time.perf_counter()
    if args.e2e_pair == "tiny":
        pair = tiny_pair(TINY_VOCAB, seed=args.seed)
        prompts = tiny_prompts(pair, args.e2e_prompts, seed=args.seed)
    else:
        from otbound.lm import encode_prompt, load_pair, load_prompts

        pair = load_pair(tuple(args.e2e_pair.split(",")) if "," in args.e2e_pair else args.e2e_pair, device="cpu",
                         dtype="float32")
        per = max(1, args.e2e_prompts // len(args.datasets))
        prompts = [encode_prompt(pair.tokenizer, p) for d in args.datasets for p in load_prompts(d, per)]
    names = args.e2e_verifiers or list(VERIFIERS) + list(BLOCK_VERIFIERS)
    temperature = (args.temperature or [1.0])[0]
    real = args.e2e_pair != "tiny"
    rows = end_to_end_rows(pair, prompts, verifiers=names, num_drafts=args.e2e_drafts, block_lens=args.e2e_lens,
                           temperature=temperature, max_new_tokens=args.e2e_tokens, seed=args.seed,
                           exact_context=not real)
    meta = {"pair": pair.name, "prompts": len(prompts), "new tokens per prompt": args.e2e_tokens, "T": temperature,
            "seed": args.seed, "seconds": round(time.perf_counter() - t0, 1)}
    fig = end_to_end_figure(rows, out / "end_to_end")
    return [dict(r.as_dict(), section="end_to_end") for r in rows], end_to_end_markdown(rows, meta), fig
