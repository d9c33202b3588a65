"""The three public-code defects of issue 16, measured exactly by the conformance kit.

    python experiments/conformance_public_defects.py [--instances 48]

Re-implementations from the descriptions (otbound/conformance/examples.py): RRS that skips a draft
token already tried, block verification sharing one uniform across the backward scan, and block
verification comparing cumulative products of ratios with cumulative products of uniforms. For each
it prints, over the kit's adversarial + random instances, the exact lossless error (max |law − target|
of the output law; block level: of the emitted sequence continued by the target to L + 1 tokens),
the total-variation distortion among failing instances, the acceptance against the bound, and the
minimal counterexample. Everything is exact enumeration (float64), nothing is sampled.
"""

from __future__ import annotations

import argparse

import numpy as np

import otbound.conformance as oc
from otbound.conformance import examples as ex


def describe(res, bound: str) -> None:
    failing = [r for r in res.instances if not r.passed]
    tv = np.array([r.total_variation for r in failing])
    over = res.acceptance - res.optimal
    print(f"  {len(failing)}/{len(res.instances)} instances fail; max lossless error {res.lossless_error:.4f}")
    if failing:
        print(
            f"  total-variation distortion on failing instances: min {tv.min():.2e}, "
            f"median {np.median(tv):.4f}, max {tv.max():.4f}"
        )
    print(f"  acceptance − {bound}: max {over.max():+.4f} (above the bound on {int((over > 1e-9).sum())} instances)")
    c = res.counterexample
    if c is not None:
        shape = f"V = {c.vocab_size}, K = {c.num_drafts}" + (f", L = {c.block_len}" if c.block_len else "")
        print(f"  minimal counterexample: {shape}, error {c.lossless_error:.6f} (from '{c.label}')")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=48)
    n = ap.parse_args().instances

    print("(a) RRS skipping a draft token already tried")
    p, q = np.array([0.1, 0.4, 0.5]), np.array([0.6, 0.2, 0.2])
    one = oc.check_token_verifier(ex.rrs_skip_repeats, vocab_size=3, num_drafts=2, instances=[(p, q)], shrink=False)
    print(f"  p = {p}, q = {q}, K = 2: output law {np.round(one.counterexample.output_law, 12)}")
    for v, k in ((3, 2), (4, 2), (4, 3), (6, 4)):
        print(f" V = {v}, K = {k}:")
        bad = oc.check_token_verifier(ex.rrs_skip_repeats, vocab_size=v, num_drafts=k, instances=n)
        good = oc.check_token_verifier(ex.rrs, vocab_size=v, num_drafts=k, instances=n)
        describe(bad, "α*")
        print(
            f"  acceptance − correct RRS's: max {np.max(bad.acceptance - good.acceptance):+.4f}, "
            f"min {np.min(bad.acceptance - good.acceptance):+.4f}; correct RRS max error {good.lossless_error:.1e}"
        )
    for name, fn in (
        ("(b) block verification sharing one uniform", ex.block_shared_uniform),
        ("(c) block verification with cumulative products", ex.block_cumulative_products),
    ):
        print(name)
        for v, length in ((2, 3), (3, 3), (3, 2)):
            print(f" V = {v}, K = 1, L = {length}:")
            describe(
                oc.check_block_verifier(fn, vocab_size=v, num_drafts=1, block_len=length, instances=n // 2), "U_causal"
            )


if __name__ == "__main__":
    main()
