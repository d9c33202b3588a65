"""Wall-clock speed of multi-draft speculative sampling against plain target sampling, same process.

Both go through :func:`otbound.lm.speculative_sample` (plain = ``block_len=0``: one target
forward per token) on the same prompts and seeds; the time per generated token is the median over
``--repeats`` runs, and the speed-up is the ratio of medians. Also prints tokens per target call.

    python experiments/bench_end_to_end.py                            # tiny random pair (V = 12), CPU
    python experiments/bench_end_to_end.py --pair qwen-shapes --dtype bfloat16 --device cuda
        # random weights of the offline Qwen pair's shapes (0.5B drafting for 1.5B): times like the
        # real models; acceptance is meaningless there (random laws), so only the per-call costs count

On the tiny pair the models cost less than the Python verification, so speculative sampling is
*slower* per token there (the table says by how much); the speed-up needs a target whose forward
dominates the verifier's bookkeeping.
"""

from __future__ import annotations

import argparse
import statistics

from otbound.lm import random_pair, speculative_sample, tiny_pair, tiny_prompts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", choices=("tiny", "qwen-shapes"), default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--verifiers", nargs="+", default=["rrs", "kseq", "block", "traversal"])
    ap.add_argument("--num-drafts", type=int, default=2)
    ap.add_argument("--block-len", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args(argv)
    if args.pair == "tiny":
        pair = tiny_pair(12)
    else:
        pair = random_pair(device=args.device, dtype=args.dtype, seed=0)
    prompts = tiny_prompts(pair, args.prompts, length=16, seed=0)

    def per_token(verifier, block_len):
        times, calls, tokens = [], 0, 0
        for rep in range(args.repeats):
            secs, n = 0.0, 0
            for j, pr in enumerate(prompts):
                r = speculative_sample(
                    pair,
                    pr,
                    verifier=verifier,
                    num_drafts=args.num_drafts,
                    block_len=block_len,
                    temperature=args.temperature,
                    max_new_tokens=args.max_new_tokens,
                    seed=[rep, j],
                )
                secs += r.seconds
                n += len(r.tokens)
                calls += r.target_calls
                tokens += len(r.tokens)
            times.append(secs / n)
        return statistics.median(times), tokens / calls

    speculative_sample(pair, prompts[0], block_len=0, max_new_tokens=4)  # warm-up
    base, _ = per_token("rrs", 0)
    print(
        f"pair {pair.name}, device {args.device}, {args.dtype}; K = {args.num_drafts}, L = {args.block_len}; "
        f"{args.prompts} prompts x {args.max_new_tokens} tokens, median of {args.repeats}"
    )
    print(f"{'decoder':<12} {'ms/token':>9} {'tokens/call':>12} {'speed-up':>9}")
    print(f"{'plain':<12} {1e3 * base:>9.2f} {1.0:>12.2f} {1.0:>9.2f}")
    for name in args.verifiers:
        t, tpc = per_token(name, args.block_len)
        print(f"{name:<12} {1e3 * t:>9.2f} {tpc:>12.2f} {base / t:>9.2f}")


if __name__ == "__main__":
    main()
