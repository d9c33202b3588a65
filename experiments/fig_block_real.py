"""Deterministic drafting against sampled blocks at block level on the real pair: static top-k trees
against K sampled draft blocks of length L at the same node budget, on truncated real draft trees.

At one sampled position of every stored T = 1 trace (:func:`otbound.lm.collect_draft_trees`) the
draft's top-3 tree of depth 4 is collected with both models' laws merged per node (the 3 children
by draft rank and the rest), under four setting variants for both models: T = 1 and T = 0.7, each
plain and with top-p 0.8 / top-k 20 (the positions stay those the untruncated T = 1 target sampled;
the models run once per position, the variants only change the laws). Per position, variant, block
length L ∈ {2, 3, 4} and K ∈ {1, …, 4}:

* **static tree** (deterministic drafting, EAGLE/Medusa/SGLang): for every non-increasing branching
  ``b_1 ≥ … ≥ b_L`` (entries ≤ the stored width), the exact bound ``U_static = Σ_{w ∈ T} p(w)``, attained by
  traversal verification (``BLOCK_VERIFIERS["static_tree"]``); per cell the branching with the
  highest mean among those of at most ``K·L`` nodes (the nearest node count not above the budget;
  chosen in-sample, the row names it) and the fixed ``(K, 1, …, 1)`` tree (K greedy chains, exactly
  ``K·L`` nodes; where K exceeds the width, the row repeats the best tree);
* **K i.i.d. blocks** (``K·L`` drafted tokens): the certified bracket ``lower ≤ U_causal ≤ upper``
  from the merged tree (:meth:`otbound.lm.DraftTreeRecord.iid_bracket`; the first ``w`` children
  per node kept, ``w`` the largest ≤ 3 whose split LP has ≤ 70,000 variables: 3, or 2 at L = 4,
  K ≥ 3). ``U_causal`` is the best lossless verifier's ``E[τ]`` for K i.i.d. blocks and ``lower`` is
  attained by one (the lifted plan never accepts through the merged cell): static − upper > 0 with
  a significant interval means the static tree beats every lossless verifier of K i.i.d. blocks,
  static − lower < 0 that one of them (the lifted plan) beats the static tree; otherwise open;
* **greedy** (K ≥ 2, ``K·L`` drafted tokens): K − 1 deterministic greedy chains (first token of draft
  rank j < K − 1, then the draft's argmax) and one block whose first token is drawn from q without
  them (Hu et al. 2502.18779's greedy law at the first token) and continued from q
  (:meth:`otbound.lm.DraftTreeRecord.greedy_bracket`, all 3 children kept, so K ≤ 3); undefined, and
  left out of the cell, at positions where fewer than K draft tokens survive the settings.

Paired differences per (dataset, T, variant, L, K, law) with 95% cluster-robust intervals, prompts as
clusters (:func:`otbound.report.cluster_mean_ci`). Block-level drafts without replacement are not
measured: the merged tree does not determine the image of a without-replacement law (the chance
that two unkept tokens are drawn together depends on how the rest mass is spread).

Usage::

    python experiments/fig_block_real.py                       # table + figure from the stored result
    flock /tmp/otbound-real.lock python experiments/fig_block_real.py --collect-only \\
        --traces RUN/traces [--trees DIR]                      # collect the trees (loads the models)
    python experiments/fig_block_real.py --recompute --traces RUN/traces [--trees DIR]
                                                               # measure them (no models), then store

``--traces``: a folder holding the T = 1 traces of ``python -m otbound.compare`` (its defaults: 20
+ 20 prompts, 32 tokens, seed 0). ``--quick``: the same pipeline on the tiny random pair (traces of four
random prompts collected next to the results), width 3, depth 3, L ∈ {2, 3}, K ∈ {1, 2}; for the tests.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import sys
from pathlib import Path

import _common
import numpy as np

NAME = "fig_block_real"
#: the per-position values, beside the results (gzip JSON; its SHA-256 is in the results)
POSITIONS_FILE = f"{NAME}.positions.json.gz"
TRUNCATED = {"top_p": 0.8, "top_k": 20}
#: the variants measured on every tree: the T = 1 traces' own settings, truncated, and both at T = 0.7
VARIANTS = [{}, TRUNCATED, {"temperature": 0.7}, {"temperature": 0.7, **TRUNCATED}]
FULL = dict(pair=_common.REAL_PAIR, traces="the T = 1 traces of python -m otbound.compare (defaults: humaneval + "
            "mtbench, 20 + 20 prompts, 32 new tokens, seed 0, model dtype auto)", width=3, depth=4,
            positions_per_trace=1, seed=0, variants=VARIANTS, block_lens=[2, 3, 4], num_drafts=[1, 2, 3, 4],
            bracket_max_width=3, bracket_max_split_variables=70_000, model_dtype="trace")
QUICK = dict(FULL, pair="tiny(V=12)", traces="tiny pair, 4 random prompts, 6 new tokens, T = 1", width=3,
             depth=3, block_lens=[2, 3], num_drafts=[1, 2], positions_per_trace=1)


def params_for(args) -> dict:
    return dict(QUICK if args.quick else FULL)


def variant_label(v: dict) -> str:
    return "plain" if not v else ", ".join(f"{k.replace('_', '-')} {x}" for k, x in sorted(v.items()))


def branchings(width: int, length: int) -> list[tuple]:
    """Non-increasing ``(b_1, …, b_L)`` with entries in 1..width."""
    return [b for b in itertools.product(range(width, 0, -1), repeat=length)
            if all(x >= y for x, y in zip(b, b[1:]))]


def nodes(b) -> int:
    return int(sum(np.prod(b[: i + 1]) for i in range(len(b))))


def bracket_width(k: int, length: int, params) -> int:
    """The largest ``w ≤ bracket_max_width`` whose split LP ``(K − 1)(w + 1)^{2L}`` fits the budget."""
    for w in range(min(params["bracket_max_width"], params["width"]), 0, -1):
        if (k - 1) * (w + 1) ** (2 * length) <= params["bracket_max_split_variables"]:
            return w
    return 1


#: HiGHS time limit per LP solve (:func:`otbound.lp_time_limit`: an LP is tried at three settings,
#: so one LP stops within 3× this): HiGHS can stall on the near-deterministic laws of code
#: prompts (path probabilities ~1e-12 beside ~1); a bracket whose LP stops is recorded as missing
#: (None) and counted, never replaced by a number
LP_TIME_LIMIT_S = 5.0


def _limited(fn, *args):
    """``(fn(*args), None)``, or ``(None, why)`` when it raises ``RuntimeError`` (HiGHS failed or hit
    its time limit) / ``InvalidInputError`` (the law is undefined here). The time limit holds for
    this call only (other callers in the process keep their settings)."""
    from otbound import InvalidInputError, lp_time_limit

    try:
        with lp_time_limit(LP_TIME_LIMIT_S):
            return fn(*args), None
    except (RuntimeError, InvalidInputError) as err:
        return None, f"{type(err).__name__}: {err}"


def position_values(rec, params) -> dict:
    """Every number of one position: static-tree values per branching, the i.i.d. and greedy brackets
    per (L, K) (None where the law is undefined — fewer than K draft tokens surviving, K above the
    width — or the bracket's LPs failed or ran past :data:`LP_TIME_LIMIT_S`)."""
    out = {"prompt_id": rec.prompt_id, "dataset": rec.dataset, "temperature": rec.temperature,
           "position": rec.position, "variants": []}
    for s in range(rec.num_variants):
        static = {str(list(b)): rec.static_tree(b, variant=s).value
                  for length in params["block_lens"] for b in branchings(params["width"], length)}
        laws = {"iid": {}, "greedy": {}}
        for length in params["block_lens"]:
            for k in params["num_drafts"]:
                key = f"L{length}K{k}"
                width = bracket_width(k, length, params)
                b, why = _limited(_iid, rec, k, length, s, width)
                laws["iid"][key] = b
                if why:
                    _common.log(f"{rec.prompt_id} t={rec.position} variant {s} {key} iid: {why}")
                if k >= 2:  # K = 1: one random block, the i.i.d. law
                    g, why = _limited(_greedy, rec, k, length, s, params["width"])
                    if why and k <= params["width"] - 1 and "survive" not in why:  # not merely undefined
                        _common.log(f"{rec.prompt_id} t={rec.position} variant {s} {key} greedy: {why}")
                    laws["greedy"][key] = g
        out["variants"].append({"static": static, **laws})
    return out


def _iid(rec, k, length, variant, width) -> dict:
    return _bracket_dict(rec.iid_bracket(k, length, variant=variant, width=width))


def _greedy(rec, k, length, variant, width) -> dict:
    return _bracket_dict(rec.greedy_bracket(k, length, variant=variant, width=width))


def _bracket_dict(b) -> dict:
    return {"lower": b.lower, "upper": b.upper, "width": b.top_m, "target_mass_out": b.truncated_target_mass,
            "draft_mass_out": b.truncated_draft_mass}


def _quick_traces(folder: Path) -> Path:
    from otbound.lm import Prompt, collect_traces, tiny_pair, tiny_prompts

    pair = tiny_pair()
    prompts = [Prompt(f"{ds}/{i}", ds, "", tuple(ids))
               for ds in ("quick-humaneval", "quick-mtbench")
               for i, ids in enumerate(tiny_prompts(pair, 2, seed=len(ds)))]
    collect_traces(pair, prompts, folder, temperatures=[1.0], max_new_tokens=6, progress=False)
    return folder


def collect(args, params) -> tuple:
    """``(tree folder, tree files)``: the draft trees of the traces, collected where missing."""
    from otbound.lm import collect_draft_trees, load_pair, tiny_pair

    if args.quick:
        traces = _quick_traces(_common.results_dir(args) / f"{NAME}-traces")
        pair = tiny_pair
        trees = _common.results_dir(args) / f"{NAME}-trees"
    else:
        if not args.traces:
            raise _common.MissingResultsError(
                f"no stored {NAME}.json for these parameters; collect the trees with --collect-only "
                "--traces RUN/traces (the trace folder of python -m otbound.compare; loads the models) and "
                "measure them with --recompute --traces RUN/traces")
        traces = Path(args.traces)

        def pair():
            return load_pair(params["pair"], device=args.device, dtype=_trace_dtype(traces))

        trees = Path(args.trees) if args.trees else _default_trees()
    files = collect_draft_trees(pair, traces, trees, width=params["width"], depth=params["depth"],
                                positions_per_trace=params["positions_per_trace"], seed=params["seed"],
                                variants=params["variants"], progress=not args.quick)
    return trees, files


def compute(args, params, cp) -> dict:
    from otbound.lm import load_draft_trees

    trees, files = collect(args, params)
    positions, checksums = [], {}
    for i, f in enumerate(files):
        key = f.relative_to(trees).as_posix()
        done = cp.get(key)
        if done is None:
            done = [position_values(rec, params) for rec in load_draft_trees(f)]
            cp.put(key, done)
            _common.log(f"[{i + 1}/{len(files)}] {key}")
        positions += done
        checksums[key] = _tensor_checksums(f)
    settings = next(iter(load_draft_trees(files[0]))).settings
    side = _common.results_dir(args) / POSITIONS_FILE
    side.write_bytes(gzip.compress(json.dumps(positions, sort_keys=True).encode(), mtime=0))
    return {"source": "synthetic tiny pair" if args.quick else params["pair"], "positions_file": POSITIONS_FILE,
            "positions_sha256": hashlib.sha256(side.read_bytes()).hexdigest(), "tree_files": checksums,
            "variant_settings": [[a.as_dict(), b.as_dict()] for a, b in settings],
            "lp_time_limit_s": LP_TIME_LIMIT_S, "rows": aggregate(positions, params)}


def load_positions(results, folder) -> list:
    """The per-position values stored beside the results (gzip JSON), their checksum verified."""
    data = (Path(folder) / results["results"]["positions_file"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != results["results"]["positions_sha256"]:
        raise ValueError(f"{results['results']['positions_file']}: checksum mismatch")
    return json.loads(gzip.decompress(data))


def _tensor_checksums(path) -> dict:
    from otbound.lm import load_draft_trees

    return next(iter(load_draft_trees(path))).meta["sha256"]


def _trace_dtype(traces: Path) -> str:
    from otbound.lm import load_traces

    return next(iter(load_traces(next(traces.rglob("*.safetensors"))))).meta["model_dtype"]


def _default_trees() -> Path:
    from otbound.lm import cache_root

    return cache_root() / "runs" / NAME / "trees"


LAWS = ("iid", "greedy")


def aggregate(positions, params) -> list[dict]:
    """One row per (dataset, T, variant, L, K, sampled law): the static trees and the law's bracket
    with 95% cluster-robust intervals, and the paired differences static − lower / static − upper
    (on the positions where the law is defined)."""
    from otbound.report import cluster_mean_ci

    rows = []
    for ds, trace_t in sorted({(p["dataset"], p["temperature"]) for p in positions}):
        sel = [p for p in positions if p["dataset"] == ds and p["temperature"] == trace_t]
        for s, variant in enumerate(params["variants"]):
            t = float(variant.get("temperature", trace_t))
            label = variant_label({f: x for f, x in variant.items() if f != "temperature"})
            for length in params["block_lens"]:
                for k in params["num_drafts"]:
                    budget, key = k * length, f"L{length}K{k}"
                    fits = [b for b in branchings(params["width"], length) if nodes(b) <= budget]
                    # K greedy chains need K children at the root; wider than the stored tree: the best in it
                    chains = (k,) + (1,) * (length - 1) if k <= params["width"] else None
                    means = {b: np.mean([p["variants"][s]["static"][str(list(b))] for p in sel]) for b in fits}
                    best = max(fits, key=lambda b: (means[b], -nodes(b)))
                    for law in LAWS:
                        use = [p for p in sel if p["variants"][s][law].get(key) is not None]
                        if not use:
                            continue
                        clusters = [p["prompt_id"] for p in use]
                        vals = {
                            "static_best": np.array([p["variants"][s]["static"][str(list(best))] for p in use]),
                            "static_chains": np.array([p["variants"][s]["static"][str(list(chains or best))]
                                                       for p in use]),
                            "lower": np.array([p["variants"][s][law][key]["lower"] for p in use]),
                            "upper": np.array([p["variants"][s][law][key]["upper"] for p in use]),
                        }
                        vals.update(best_minus_lower=vals["static_best"] - vals["lower"],
                                    best_minus_upper=vals["static_best"] - vals["upper"],
                                    chains_minus_lower=vals["static_chains"] - vals["lower"],
                                    chains_minus_upper=vals["static_chains"] - vals["upper"])
                        row = {"dataset": ds, "temperature": t, "trace_temperature": trace_t, "variant": label,
                               "block_len": length, "num_drafts": k, "budget": budget, "law": law,
                               "positions": len(use), "positions_in_cell": len(sel), "prompts": len(set(clusters)),
                               "best_branching": list(best), "best_nodes": nodes(best),
                               "chains_branching": list(chains or best),
                               "bracket_width": use[0]["variants"][s][law][key]["width"]}
                        for name, v in vals.items():
                            row[name], row[name + "_ci"] = cluster_mean_ci(v, clusters)
                        row["verdict"] = verdict(row)
                        rows.append(row)
    return rows


def verdict(row) -> str:
    """Who wins the cell at 95%: static (above every verifier of the sampled law), the sampled law
    (a lossless verifier of it above the static tree), or open (the bracket straddles the static value)."""
    if row["best_minus_upper"] - row["best_minus_upper_ci"] > 0:
        return "static"
    if row["best_minus_lower"] + row["best_minus_lower_ci"] < 0:
        return row.get("law", "iid")
    return "open"


def tables(results) -> str:
    res = results["results"]
    lines = [
        f"# Static trees vs K sampled blocks at the same node budget ({res['source']})",
        "",
        "E[τ] (accepted draft tokens, bonus excluded), mean ± 95% half width, prompts as clusters. "
        "static: the best non-increasing branching with ≤ K·L nodes (named, node count); chains: (K, 1, …, 1). "
        "Sampled law (iid: K i.i.d. blocks; greedy: K − 1 greedy chains + 1 block): U_causal ∈ [lower, upper], "
        "lower attained by a lossless verifier; positions: where the law is defined / in the cell. "
        "Paired differences on the same positions; verdict at 95%.",
        "",
        "| dataset | T | settings | L | K | budget | static (branching, nodes) | chains | law | positions | lower "
        "| upper | static − lower | static − upper | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        def f(name, r=r):
            return f"{r[name]:.3f} ± {r[name + '_ci']:.3f}"

        def d(name, r=r):
            return f"{r[name]:+.3f} ± {r[name + '_ci']:.3f}"

        lines.append(
            f"| {r['dataset']} | {r['temperature']:g} | {r['variant']} | {r['block_len']} | {r['num_drafts']} | "
            f"{r['budget']} | {f('static_best')} ({tuple(r['best_branching'])}, {r['best_nodes']}) | "
            f"{f('static_chains')} | {r['law']} | {r['positions']}/{r['positions_in_cell']} | {f('lower')} | "
            f"{f('upper')} | {d('best_minus_lower')} | {d('best_minus_upper')} | {r['verdict']} |")
    return "\n".join(lines)


def draw(results, out, formats) -> list:
    from otbound.report import plots

    res, params = results["results"], results["params"]
    rows = [r for r in res["rows"] if r["law"] == "iid"]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lens = params["block_lens"]
    fig, axes = plots.figure(nrows=len(variants), ncols=len(lens), height=2.6)
    cells = sorted({(r["dataset"], r["temperature"]) for r in rows})
    colors = plt_colors(len(cells))
    for i, var in enumerate(variants):
        for j, length in enumerate(lens):
            ax = axes[i][j]
            for c, (ds, t) in zip(colors, cells):
                sel = sorted((r for r in rows if r["variant"] == var and r["block_len"] == length
                              and r["dataset"] == ds and r["temperature"] == t), key=lambda r: r["num_drafts"])
                ks = [r["num_drafts"] for r in sel]
                ax.plot(ks, [r["static_best"] for r in sel], color=c, marker="o", label=f"{ds} T={t:g}: static tree")
                ax.fill_between(ks, [r["lower"] for r in sel], [r["upper"] for r in sel], color=c,
                                alpha=0.25, label=f"{ds} T={t:g}: K i.i.d. blocks, [lower, upper]")
                ax.plot(ks, [r["lower"] for r in sel], color=c, linestyle="--")
            ax.set_title(f"L = {length}, {var}", fontsize=8)
            ax.set_xlabel("K (budget K·L nodes)")
            ax.set_ylabel("E[τ]")
            ax.set_xticks(params["num_drafts"])
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=6)
    return _common.save_real_pair_figure(fig, results, out, NAME, formats)


def plt_colors(n: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return [cmap(i) for i in range(n)]


def main(argv=None) -> list:
    ap = _common.parser(__doc__.splitlines()[0])
    ap.add_argument("--trees", default=None, help="draft-tree folder (default: <otbound cache>/runs/fig_block_real/"
                                                  "trees; quick: next to the results)")
    ap.add_argument("--collect-only", action="store_true",
                    help="collect the draft trees (loads the models: run it under the real-model lock) and stop")
    args = ap.parse_args(argv)
    params = params_for(args)
    if args.collect_only:
        files = collect(args, params)[1]
        _common.log(f"{len(files)} draft-tree files ready")
        return files
    results = _common.load_or_compute(args, NAME, params, lambda p, cp: compute(args, p, cp))
    return _common.finish(NAME, results, args, draw, tables)


if __name__ == "__main__":
    main(sys.argv[1:])
