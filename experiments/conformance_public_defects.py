"""Three defects found in public verifier code, measured exactly by the conformance kit.

    python experiments/conformance_public_defects.py [--instances 48]

Re-implementations from the descriptions (otbound/conformance/examples.py): RRS that skips a draft
token already tried, block verification sharing one uniform across the backward scan, and block
verification comparing cumulative products of ratios with cumulative products of uniforms. For each
it prints, over the kit's adversarial + random instances, the exact lossless error (max |law − target|
of the output law; block level: of the emitted sequence continued by the target to L + 1 tokens),
the total-variation distortion among failing instances, the acceptance against the bound, and the
minimal counterexample. Then (d) the installed transformers' ``_speculative_sampling``, unmodified
under ``route_randomness``, in float64 and float32, and a copy whose residual ``(p − q)+`` is clamped
at 1e-5 (a defect an older rejection sampler had): a 1e-5-size distortion no sampling test of
practical size sees, caught exactly even at float32 precision. Everything is exact enumeration,
nothing is sampled.
"""

from __future__ import annotations

import argparse
import inspect
import textwrap

import numpy as np

import otbound.conformance as oc
from otbound.conformance import examples as ex
from otbound.conformance.adapters import transformers_speculative_sampling


def describe(res, bound: str) -> None:
    failing = [r for r in res.instances if not r.passed]
    tv = np.array([r.total_variation for r in failing])
    over = res.acceptance - res.optimal
    print(f"  {len(failing)}/{len(res.instances)} instances fail; max lossless error {res.lossless_error:.4g}")
    if failing:
        print(
            f"  total-variation distortion on failing instances: min {tv.min():.2e}, "
            f"median {np.median(tv):.4g}, max {tv.max():.4g}"
        )
    print(f"  acceptance − {bound}: max {over.max():+.4f} (above the bound on {int((over > 1e-9).sum())} instances)")
    c = res.counterexample
    if c is not None:
        shape = f"V = {c.vocab_size}, K = {c.num_drafts}" + (f", L = {c.block_len}" if c.block_len else "")
        print(f"  minimal counterexample: {shape}, error {c.lossless_error:.6g} (from '{c.label}')")


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
    transformers_section(n)


def clamped_transformers(floor: float):
    """The installed ``_speculative_sampling`` with its residual clamped at ``floor`` instead of 0."""
    import transformers.generation.utils as tgu

    src = textwrap.dedent(inspect.getsource(tgu._speculative_sampling))
    line = "p_prime = torch.clamp((p_n_plus_1 - q_n_plus_1), min=0)"
    if line not in src:
        raise SystemExit("the installed transformers changed its residual line; update clamped_transformers")
    namespace = dict(vars(tgu))
    exec(src.replace(line, line.replace("min=0", f"min={floor!r}")), namespace)  # noqa: S102 — a mutant
    return namespace["_speculative_sampling"]


def transformers_section(n: int) -> None:
    print("(d) transformers' _speculative_sampling, unmodified, K = 1, V = 2")
    for length in (1, 2, 3):
        for dtype, precision in (("float64", "float64"), ("float32", "float64"), ("float32", "float32")):
            res = oc.check_block_verifier(
                transformers_speculative_sampling(dtype=dtype), vocab_size=2, num_drafts=1, block_len=length,
                instances=n // 4, precision=precision,
            )  # fmt: skip
            note = " (float32 rounding)" if res.within_float32_rounding else ""
            print(
                f"  L = {length}, logits {dtype}, checked at {precision}: {'PASS' if res.passed else 'FAIL'}{note}, "
                f"max error {res.lossless_error:.2e}"
            )
    print("  residual (p - q)+ clamped at 1e-5, float32, checked at float32 precision (tolerance 1e-6):")
    res = oc.check_block_verifier(
        transformers_speculative_sampling(clamped_transformers(1e-5), dtype="float32"), vocab_size=2, num_drafts=1,
        block_len=2, instances=n // 4, precision="float32",
    )  # fmt: skip
    describe(res, "U_causal")


if __name__ == "__main__":
    main()
