"""The best deterministic draft tree at a node budget B against the draft's best static top-k tree and
the best sampled scheme, and the oracle's growth in B (fit a + b log B; Pankratov & Alistarh,
arXiv 2512.11718, predict logarithmic growth).

    python experiments/oracle_tree.py                          # synthetic models and the tiny pair
    python experiments/oracle_tree.py --trees DIR --pair qwen2.5-coder [--device cuda]   # real trees

All values are E[τ] per iteration (accepted draft tokens, bonus excluded), averaged over contexts:

* ``oracle`` — :func:`otbound.block.oracle_tree_bound`: Σ of the B largest target path probabilities
  (the target's own best tree; every deterministic drafter with B nodes stays below it);
* ``static`` — the draft's best static top-k tree with at most B nodes (:func:`otbound.block.static_tree_bound`,
  over every branching of depth ≤ D);
* ``sampled`` — U_causal of K i.i.d. draft blocks of L tokens with K·L ≤ B, the best (K, L)
  (:func:`otbound.block.block_bound`; attained by ``causal_optimal``).

Default run (no model download): a synthetic pair (Dirichlet target, concentration 0.3, V = 6, draft
= half target, half an independent Dirichlet model) at ``--contexts`` seeds, and the tiny random
Qwen2 pair (:func:`otbound.lm.tiny_pair`, V = 6) at as many random contexts; D = 6, sampled K ≤ 4 and
L ≤ 2 (U_causal's LP has (K − 1)·V^(2L) split variables), so the sampled row is at most 2 by
construction and informative only at small B.

Real mode (``--trees``): stored draft trees (:func:`otbound.lm.collect_draft_trees`; width m,
depth D; ``--collect TRACES`` first stores those of a trace folder there, ``--width`` m,
``--depth`` D, ``--positions-per-trace``, resumable).
From the stored laws alone: ``static`` (every branching with b ≤ m) and ``draft-tree oracle`` (the
best B-node subtree of the draft's top-m tree: the bound of a dynamic tree drafted from it, EAGLE-2
style), and the certified bracket of ``sampled`` (:meth:`otbound.lm.DraftTreeRecord.iid_bracket`,
lower side). With ``--pair``, the true oracle needs the target's laws off the draft's tree: the
target runs live at each tree's context (:func:`otbound.lm.lm_block_models`, one forward per
expanded node; ``--backend llama.cpp`` runs the pair's GGUF files in llama.cpp, about 4 GB, each
model walking the trees depth first on its KV cache). ``--temperature T …`` gives one panel per
trace temperature. Each tree's rows are appended to ``TREES/oracle_tree_rows.jsonl`` as it
finishes and reused by a rerun (an interrupted run resumes). ``--pair tiny`` runs the same path on
the tiny pair (tests)::

    python experiments/oracle_tree.py --pair qwen2.5-coder --backend llama.cpp --collect RUN/traces \
        --trees TREES --width 3 --depth 4 --temperature 0.7 1.0

Writes ``figures/oracle_tree.png`` (E[τ] against B, log axis, with the fitted line) and
``figures/oracle_tree.md`` (the table and the fits), results in ``data/results/oracle_tree.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def _synthetic_models(v: int, seed: int):
    """Dirichlet target (concentration 0.3) and a draft mixing it half and half with another."""
    from otbound.block import dirichlet_model, mixture_model

    target = dirichlet_model(v, concentration=0.3, seed=2 * seed, name="target")
    draft = mixture_model(target, dirichlet_model(v, concentration=0.3, seed=2 * seed + 1), 0.5, name="draft")
    return target, draft


def _mean_rows(comparisons) -> dict:
    def col(name):
        return np.nanmean(np.stack([getattr(c, name) for c in comparisons]), axis=0).tolist()

    return {"budgets": comparisons[0].budgets.tolist(), "oracle": col("oracle"), "static": col("static"),
            "sampled": col("sampled")}


def run_models(pairs, budgets, depth: int, sampled_len: int) -> dict:
    from otbound.block import fit_log_growth, node_budget_comparison

    comps = []
    for i, (t, d) in enumerate(pairs):
        comps.append(node_budget_comparison(t, d, budgets, max_depth=depth, sampled_max_block_len=sampled_len,
                                            sampled_max_drafts=4))
        print(f"oracle_tree: {i + 1}/{len(pairs)} contexts", file=sys.stderr)
    rows = _mean_rows(comps)
    fit = fit_log_growth(rows["budgets"], rows["oracle"])
    rows["fit"] = {"a": fit.a, "b": fit.b, "r2": fit.r2, "max_residual": fit.max_residual}
    return rows


def run_synthetic(args) -> dict:
    pairs = [_synthetic_models(6, s) for s in range(args.contexts)]
    return run_models(pairs, args.budgets, args.depth, 2)


def run_tiny(args) -> dict:
    from otbound.lm import lm_block_models, tiny_pair, tiny_prompts

    pair = tiny_pair(vocab_size=6)
    pairs = [lm_block_models(pair, ctx, 1.0) for ctx in tiny_prompts(pair, args.contexts, length=4, seed=1)]
    return run_models(pairs, args.budgets, args.depth, 2)


def load_live_pair(args):
    """The pair of ``--pair`` through ``--backend`` (``tiny``: the tiny random pair), or None."""
    if args.pair == "tiny":
        from otbound.lm import tiny_pair

        return tiny_pair(vocab_size=args.tiny_vocab)
    if not args.pair:
        return None
    from otbound.lm import load_pair

    name = tuple(args.pair.split(",")) if "," in args.pair else args.pair  # "DRAFT,TARGET" paths
    if args.backend == "llama.cpp":
        return load_pair(name, backend="llama.cpp")
    return load_pair(name, device=args.device)


def _tree_key(rec) -> str:
    return f"{rec.meta.get('trace', rec.prompt_id)}|T{rec.temperature!r}|t{rec.position}"


def _load_checkpoint(path) -> dict:
    """Per-tree rows of an interrupted run (one JSON object a line; a torn last line is dropped)."""
    rows, good = {}, []
    if path is not None and Path(path).exists():
        lines = Path(path).read_text().splitlines()
        for line in lines:
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows[item["key"]] = item["rows"]
            good.append(line)
        if len(good) < len(lines):  # rewrite without the torn line, so that appends start on a line of their own
            Path(path).write_text("".join(x + "\n" for x in good))
    return rows


def _tree_rows(rec, budgets, sampled_len, pair, oracle_depth) -> dict:
    """One stored tree's curves at ``budgets`` (lists): the best subtree of the draft's tree, the
    best static tree, the sampled bracket and, with a live ``pair``, the oracle (deepest node
    ``oracle_depth``: None the tree's depth, 0 no limit)."""
    from otbound import InvalidInputError
    from otbound.block import oracle_tree_bound, static_branchings
    from otbound.lm import lm_block_models

    at = np.array(budgets) - 1
    m, depth = rec.width, rec.depth
    out = {}
    target, _ = rec.merged_models(depth)
    sub = oracle_tree_bound(target, budgets[-1], max_depth=depth, vocab_size=m + 1,
                            candidates=lambda prefix, kept=range(m): kept)
    out["draft_tree_oracle"] = np.concatenate([sub.curve, np.full(budgets[-1] - sub.curve.size, sub.value)])[at]
    statics = [(rec.static_tree(br).value, nodes) for br, nodes in static_branchings(budgets[-1], depth, m)]
    out["static"] = [max((v for v, nodes in statics if nodes <= b), default=np.nan) for b in budgets]
    brackets = {}
    for k in range(1, min(m, 4) + 1):
        for length in range(1, min(depth, sampled_len) + 1):
            if k * length <= budgets[-1]:
                try:
                    brackets[(k, length)] = rec.iid_bracket(k, length)
                except InvalidInputError as exc:
                    print(f"oracle_tree: skipped K = {k}, L = {length}: {exc}", file=sys.stderr)
    out["sampled_lower"] = [max((br.lower for s, br in brackets.items() if s[0] * s[1] <= b), default=np.nan)
                            for b in budgets]
    out["sampled_upper"] = [max((br.upper for s, br in brackets.items() if s[0] * s[1] <= b), default=np.nan)
                            for b in budgets]
    if pair is not None:
        live, _ = lm_block_models(pair, rec.prefix.tolist(), rec.temperature, settings=rec.settings[0])
        cap = depth if oracle_depth is None else (oracle_depth or None)
        full = oracle_tree_bound(live, budgets[-1], max_depth=cap)
        out["oracle"] = np.concatenate([full.curve, np.full(budgets[-1] - full.curve.size, full.value)])[at]
    return {k: np.asarray(v, dtype=np.float64).tolist() for k, v in out.items()}


def run_trees(args, pair=None, temperature=None) -> dict:
    """Stored draft trees (and, with a live ``pair``, the target for the true oracle; ``pair`` may
    be a callable loading it, called only for a tree the checkpoint lacks); only the trees of
    ``temperature`` when given. Per-tree rows go to ``args.checkpoint`` (JSON lines) as they finish
    and are reused from it."""
    from otbound.block import fit_log_growth
    from otbound.lm import load_draft_trees

    budgets = sorted(args.budgets)
    rows = {k: [] for k in ("oracle", "draft_tree_oracle", "static", "sampled_lower", "sampled_upper")}
    checkpoint = getattr(args, "checkpoint", None)
    done = _load_checkpoint(checkpoint)
    oracle_depth = getattr(args, "oracle_depth", None)
    tag = {"budgets": budgets, "sampled_len": args.sampled_len, "live": pair is not None}
    if pair is not None and oracle_depth is not None:
        tag["oracle_depth"] = oracle_depth
    n, interrupted, datasets, reused = 0, False, [], 0
    for rec in load_draft_trees(args.trees):
        if temperature is not None and abs(rec.temperature - temperature) > 1e-9:
            continue
        if args.max_trees and n >= args.max_trees:
            break
        key = json.dumps([_tree_key(rec), tag])
        if key in done:
            n, reused = n + 1, reused + 1
            datasets.append(rec.dataset)
            for k, v in done[key].items():
                rows[k].append(np.array(v, dtype=np.float64))
            continue
        try:
            live = pair() if callable(pair) else pair
            mine = _tree_rows(rec, budgets, args.sampled_len, live, oracle_depth)
        except KeyboardInterrupt:  # Ctrl-C (SIGINT): keep the trees that finished
            interrupted = True
            print(f"oracle_tree: interrupted; {n} finished trees kept", file=sys.stderr)
            break
        n += 1
        datasets.append(rec.dataset)
        for k, v in mine.items():
            rows[k].append(np.asarray(v, dtype=np.float64))
        if checkpoint is not None:
            with open(checkpoint, "a") as fh:
                fh.write(json.dumps({"key": key, "rows": mine}) + "\n")
        print(f"oracle_tree: {n} trees", file=sys.stderr, flush=True)
    if n == 0:
        print(f"oracle_tree: no draft trees under {args.trees}"
              + ("" if temperature is None else f" at T = {temperature}"), file=sys.stderr)
        raise SystemExit(2)
    out = {"budgets": budgets, "trees": n, "trees_from_checkpoint": reused}  # wall_s: only the trees computed
    if interrupted:
        out["interrupted"] = True
    if pair is not None:
        out["oracle_depth"] = "tree depth" if oracle_depth is None else (oracle_depth or "none")
    for key, vals in rows.items():
        if vals:
            out[key] = np.nanmean(np.array(vals, dtype=np.float64), axis=0).tolist()
    main_curve = out.get("oracle", out["draft_tree_oracle"])
    fit = fit_log_growth(budgets, main_curve)
    of = "oracle" if "oracle" in out else "draft_tree_oracle"
    out["fit"] = {"a": fit.a, "b": fit.b, "r2": fit.r2, "max_residual": fit.max_residual, "of": of}
    if len(set(datasets)) > 1:  # the same curves and fit per dataset (contexts of different entropy)
        out["by_dataset"] = {}
        for ds in sorted(set(datasets)):
            pick = [i for i, d in enumerate(datasets) if d == ds]
            part = {"budgets": budgets, "trees": len(pick)}
            for key, vals in rows.items():
                if vals:
                    part[key] = np.nanmean(np.array(vals, dtype=np.float64)[pick], axis=0).tolist()
            f = fit_log_growth(budgets, part[of])
            part["fit"] = {"a": f.a, "b": f.b, "r2": f.r2, "max_residual": f.max_residual, "of": of}
            out["by_dataset"][ds] = part
    return out


LABELS = {"oracle": "oracle (target's best tree)", "draft_tree_oracle": "best subtree of the draft's tree",
          "static": "draft's best static top-k tree", "sampled": "K i.i.d. blocks, U_causal (K·L ≤ B)",
          "sampled_lower": "K i.i.d. blocks, U_causal lower (K·L ≤ B)"}


def table(name: str, rows: dict) -> str:
    """The panel's table and fits, then those of each dataset (real mode, several datasets)."""
    text = _table(name, rows)
    for ds, part in rows.get("by_dataset", {}).items():
        text += "\n" + _table(f"{name}: {ds} ({part['trees']} trees)", part)
    return text


def _table(name: str, rows: dict) -> str:
    keys = [k for k in LABELS if k in rows]
    lines = [f"### {name}", "", "| B | " + " | ".join(LABELS[k] for k in keys) + " |",
             "|---|" + "---|" * len(keys)]
    for i, b in enumerate(rows["budgets"]):
        lines.append(f"| {b} | " + " | ".join(f"{rows[k][i]:.4f}" for k in keys) + " |")
    f = rows["fit"]
    lines += ["", f"Fit of the {f.get('of', 'oracle')} curve: E[τ] ≈ {f['a']:.4f} + {f['b']:.4f} log B "
              f"(R² = {f['r2']:.4f}, largest residual {f['max_residual']:.4f})."]
    b = np.array(rows["budgets"], dtype=float)
    y = np.array(rows[f.get("of", "oracle")], dtype=float)
    tail = b >= 4
    if tail.sum() >= 3:
        from otbound.block import fit_log_growth

        ft = fit_log_growth(b[tail], y[tail])
        design = np.stack([np.ones(tail.sum()), np.log(b[tail])], axis=1)
        (c0, c1), *_ = np.linalg.lstsq(design, np.log(y[tail]), rcond=None)
        pred = np.exp(design @ np.array([c0, c1]))
        r2 = 1 - float(((y[tail] - pred) ** 2).sum()) / float(((y[tail] - y[tail].mean()) ** 2).sum())
        lines.append(f"On B ≥ 4: {ft.a:.4f} + {ft.b:.4f} log B (R² = {ft.r2:.4f}, largest residual "
                     f"{ft.max_residual:.4f}); a power law c·B^d fits {'better' if r2 > ft.r2 else 'worse'} "
                     f"({np.exp(c0):.4f}·B^{c1:.4f}, "
                     f"R² = {r2:.4f}, largest residual {np.abs(y[tail] - pred).max():.4f}).")
    return "\n".join(lines + [""])


def draw(results: dict, path: Path) -> None:
    from otbound.report import plots

    panels = {}
    for name, rows in results["panels"].items():  # each panel, then its datasets' (real mode)
        panels[name] = rows
        panels.update({f"{name}: {ds}": part for ds, part in rows.get("by_dataset", {}).items()})
    fig, axes = plots.figure(ncols=len(panels), height=2.6)
    axes = axes.ravel()
    for ax, (name, rows) in zip(axes, panels.items()):
        b = np.array(rows["budgets"], dtype=float)
        for key in LABELS:
            if key in rows:
                ax.plot(b, rows[key], marker="o", ms=2.5, label=LABELS[key])
        f = rows["fit"]
        grid = np.geomspace(b.min(), b.max(), 50)
        ax.plot(grid, f["a"] + f["b"] * np.log(grid), "k:", lw=1, label=f"{f['a']:.2f} + {f['b']:.2f} log B")
        ax.set_xscale("log")
        ax.set_xlabel("node budget B")
        ax.set_title(name, fontsize=8)
    axes[0].set_ylabel("E[τ] (accepted draft tokens)")
    axes[-1].legend(fontsize=5.5, loc="upper left")
    plots.save(fig, path.with_suffix(""), ("png",))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, default=4, help="synthetic seeds / tiny-pair contexts (default 4)")
    ap.add_argument("--depth", type=int, default=6, help="deepest tree node D (default 6)")
    ap.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    ap.add_argument("--trees", default=None, help="stored draft trees (otbound.lm.collect_draft_trees)")
    ap.add_argument("--pair", default=None,
                    help="with --trees: the live pair for the true oracle (a registered pair, DRAFT,TARGET paths, "
                         "or 'tiny' for tests)")
    ap.add_argument("--tiny-vocab", type=int, default=6, help="V of --pair tiny (default 6)")
    ap.add_argument("--backend", choices=("transformers", "llama.cpp"), default="transformers",
                    help="how --pair runs (llama.cpp: the GGUF files, about 4 GB)")
    ap.add_argument("--device", default="auto", help="transformers backend only")
    ap.add_argument("--collect", default=None, metavar="TRACES",
                    help="first collect the draft trees of these traces into --trees (needs --pair; resumable)")
    ap.add_argument("--width", type=int, default=3, help="with --collect: children per node m (default 3)")
    ap.add_argument("--positions-per-trace", type=int, default=1, help="with --collect: trees per trace (default 1)")
    ap.add_argument("--oracle-depth", type=int, default=None,
                    help="deepest node of the live oracle (default: the stored trees' depth; 0: no limit)")
    ap.add_argument("--temperature", type=float, nargs="+", default=None,
                    help="one panel per temperature of the stored trees (default: one panel of all)")
    ap.add_argument("--sampled-len", type=int, default=2, help="longest sampled block L (default 2)")
    ap.add_argument("--max-trees", type=int, default=0, help="stop after this many trees (0: all)")
    ap.add_argument("--redraw", action="store_true", help="table and figure from the stored results only")
    ap.add_argument("--out", default=str(ROOT / "figures"))
    ap.add_argument("--results", default=str(ROOT / "data" / "results"))
    args = ap.parse_args(argv)
    if min(args.budgets) < 1 or args.depth < 1 or args.contexts < 1:
        ap.error("budgets, --depth and --contexts must be positive")
    if args.pair and not args.trees:
        ap.error("--pair needs --trees (the live target is asked at the stored trees' contexts)")
    if args.collect and not (args.pair and args.trees):
        ap.error("--collect needs --pair (the models) and --trees (where the draft trees go)")
    if args.oracle_depth is not None and args.oracle_depth < 0:
        ap.error("--oracle-depth must be 0 (no limit) or positive")
    if args.width < 1 or args.positions_per_trace < 1:
        ap.error("--width and --positions-per-trace must be positive")
    if args.redraw:
        name = "oracle_tree_real" if args.trees else "oracle_tree"
        from otbound import content_key

        results = json.loads((Path(args.results) / f"{name}.json").read_text())
        panels = results["panels"]
        if results["meta"].get("sha256") != content_key(panels):
            print(f"oracle_tree: {name}.json fails its checksum: recompute it", file=sys.stderr)
            raise SystemExit(2)
        (Path(args.out) / f"{name}.md").write_text("\n".join(table(k, v) for k, v in panels.items()))
        draw(results, Path(args.out) / f"{name}.png")
        return results
    start = time.time()
    if args.trees:
        from otbound import InvalidInputError
        from otbound.lm import ModelUnavailableError

        args.checkpoint = None if args.pair == "tiny" else str(Path(args.trees) / "oracle_tree_rows.jsonl")
        loaded = []

        def get_pair():  # the models, loaded on first need (a rerun on a full checkpoint needs none)
            if not loaded:
                loaded.append(load_live_pair(args))
            return loaded[0]

        pair = get_pair if args.pair else None
        try:
            if args.collect:
                from otbound.lm import collect_draft_trees

                collect_draft_trees(get_pair, args.collect, args.trees, width=args.width, depth=args.depth,
                                    positions_per_trace=args.positions_per_trace)
            if args.temperature:
                panels = {f"stored draft trees, T = {t:g}": run_trees(args, pair, t) for t in args.temperature}
            else:
                panels = {"stored draft trees": run_trees(args, pair)}
        except (InvalidInputError, ModelUnavailableError, OSError) as exc:
            print(f"oracle_tree: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        finally:
            for live in loaded:
                for model in (live.draft, live.target):
                    if hasattr(model, "close"):
                        model.close()
        name = "oracle_tree_real"
    else:
        panels = {"synthetic (Dirichlet 0.3, V = 6)": run_synthetic(args),
                  "tiny random Qwen2 pair (V = 6)": run_tiny(args)}
        name = "oracle_tree"
    results = {"meta": {"command": "python experiments/oracle_tree.py " + " ".join(argv or sys.argv[1:]),
                        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                        "wall_s": round(time.time() - start, 1), "depth": args.depth,
                        "backend": args.backend if args.pair and args.pair != "tiny" else None},
               "panels": panels}
    from otbound import content_key, write_text_atomic

    results["meta"]["sha256"] = content_key(panels)  # checksum of the stored values
    out, res = Path(args.out), Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    res.mkdir(parents=True, exist_ok=True)
    write_text_atomic(res / f"{name}.json", json.dumps(results, indent=1) + "\n")
    (out / f"{name}.md").write_text("\n".join(table(k, v) for k, v in panels.items()))
    draw(results, out / f"{name}.png")
    print("\n".join(table(k, v) for k, v in panels.items()))
    return results


if __name__ == "__main__":
    main()
