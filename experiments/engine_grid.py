"""The real pair through llama.cpp's speculative decoding: the grid of drafting and sampling settings.

    python experiments/engine_grid.py                 # run what is missing, then assemble
    python experiments/engine_grid.py --assemble      # table and figure from the stored results only
    python experiments/engine_grid.py --dry-run       # list the cells and which are stored

Every cell is one :func:`otbound.engine.run_audit` of the registered pair (Qwen2.5-Coder 0.5B
drafting for 1.5B, GGUF, on a llama-server built here) with one configuration and one sampling
setting; its ``engine.json`` (raw counters, checksum) is stored as it completes as
``data/results/engine_grid_<cell>.json``, and a cell whose stored file passes
:func:`otbound.engine.load_engine_json` with the same settings is skipped: a killed run loses at
most the cell it was in. Two kinds of cells:

* **acceptance** (``lossless_samples = 0``): every configuration (draft-simple at draft lengths 2,
  4, 8 with ``p_min`` 0 — this llama.cpp's default — and 0.75, and ngram-simple at llama.cpp's
  defaults) at every sampling setting (llama.cpp's default chain at T 0.7 and 1.0, Qwen's
  recommended settings) on both prompt sets (HumanEval, MT-Bench): the engine's counters, the
  bound of its scheme, the planner's best alternative, tokens/s with and without speculation;
* **lossless** (depth 3, many continuations): once per sampling setting, on the first HumanEval
  prompt, with a control without speculation. llama-server's verification rule (sample the
  target's chain at each drafted position, accept while the sample equals the draft) does not
  depend on the draft length or ``p_min``, and a continuation of three tokens drafts at most one
  token whatever ``n_max`` is, so one configuration per sampling setting tests the rule.

The table (markdown, printed and written to ``--table``) and the figure (``figures/engine_grid.png``)
are assembled from the stored files only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otbound import InvalidInputError  # noqa: E402
from otbound.engine import Sampling, load_engine_json, run_audit  # noqa: E402
from otbound.report import cluster_mean_ci  # noqa: E402

RESULTS = ROOT / "data" / "results"
FIGURE = ROOT / "figures" / "engine_grid.png"
PAIR = "qwen2.5-coder"
PROMPT_SETS = ("humaneval", "mtbench")
SAMPLINGS = ("default@0.7", "default@1.0", "qwen")
#: (spec type, n_max, p_min); ngram-simple drafts llama.cpp's default m-gram (--spec-ngram-simple-size-m
#: 48 after a 12-gram match) and ignores n_max and p_min
CONFIGS = tuple(("draft-simple", n, p) for n in (2, 4, 8) for p in (0.0, 0.75)) + (("ngram-simple", 4, 0.0),)
#: the configuration that carries the losslessness test of each sampling setting
LOSSLESS_CONFIG = ("draft-simple", 4, 0.0)


def sampling_of(text: str) -> Sampling:
    name, _, t = text.partition("@")
    return Sampling.named(name, float(t) if t else None)


def slug(*parts) -> str:
    text = "_".join(str(p) for p in parts)
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text.replace("@", "T").replace(".", ""))


def cells(args) -> list[dict]:
    """The grid in the order it runs: HumanEval's acceptance cells, the lossless cells, MT-Bench's."""
    acc = {"num_prompts": args.num_prompts, "seeds_per_prompt": args.seeds, "n_predict": args.n_predict,
           "lossless_samples": 0, "lossless_depth": args.lossless_depth, "n_probs": args.n_probs, "seed": args.seed,
           "speed_without_speculation": args.speed}
    loss = {"num_prompts": 1, "seeds_per_prompt": 1, "n_predict": 8, "lossless_samples": args.lossless_samples,
            "lossless_depth": args.lossless_depth, "n_probs": args.n_probs, "seed": args.seed,
            "speed_without_speculation": args.speed}

    def acceptance(prompts, configs, config_major=False):
        pairs = ([(s, c) for c in configs for s in SAMPLINGS] if config_major else
                 [(s, c) for s in SAMPLINGS for c in configs])
        return [{"kind": "acceptance", "prompts": prompts, "sampling": s, "config": c, "settings": acc,
                 "file": RESULTS / f"engine_grid_{slug('acc', prompts, s, *c)}.json"} for s, c in pairs]

    lossless = [{"kind": "lossless", "prompts": "humaneval", "sampling": s, "config": LOSSLESS_CONFIG,
                 "settings": loss, "file": RESULTS / f"engine_grid_{slug('lossless', 'humaneval', s)}.json"}
                for s in SAMPLINGS]
    # by priority, so that a run cut short leaves out whole configurations, never a sampling setting:
    # HumanEval at n_max 2 and 4 with p_min 0 (this llama.cpp's default) and ngram, the losslessness
    # tests, MT-Bench's n_max 4 and ngram, HumanEval's n_max 8, HumanEval's p_min 0.75, MT-Bench's
    # other draft lengths, MT-Bench's p_min 0.75 (n_max 8 cells cost about twice the others)
    first = [("draft-simple", 2, 0.0), ("draft-simple", 4, 0.0), ("ngram-simple", 4, 0.0)]
    mt_first = [("draft-simple", 4, 0.0), ("ngram-simple", 4, 0.0)]
    rest = [("draft-simple", 8, 0.0)] + [c for c in CONFIGS if c[2] > 0]
    out = (acceptance("humaneval", first, config_major=True) + lossless
           + acceptance("mtbench", mt_first, config_major=True) + acceptance("humaneval", rest, config_major=True)
           + acceptance("mtbench", [c for c in CONFIGS if c not in mt_first], config_major=True))
    if args.only:
        out = [c for c in out if c["kind"] == args.only]
    return out


def stored(cell) -> dict | None:
    """The cell's stored audit if it is complete, intact and was run with the cell's settings."""
    if not cell["file"].exists():
        return None
    try:
        record = load_engine_json(cell["file"])
    except InvalidInputError as err:  # a damaged or incomplete file (CorruptFileError)
        print(f"  stored file unusable, rerunning: {err}", file=sys.stderr)
        return None
    s = record["settings"]
    sampling = sampling_of(cell["sampling"])
    want = dict(cell["settings"], prompt_source=cell["prompts"],
                samplings=[{"name": sampling.name, "params": sampling.params}])
    conf = record["configurations"][0]["config"] if record.get("configurations") else {}
    if (any(s.get(k) != v for k, v in want.items())
            or (conf.get("spec_type"), conf.get("draft_max"), conf.get("p_min")) != tuple(cell["config"])):
        print(f"  stored {cell['file'].name} has other settings, rerunning", file=sys.stderr)
        return None
    return record


def run_cell(cell, progress: bool) -> dict:
    st = cell["settings"]
    with tempfile.TemporaryDirectory(prefix="otbound-engine-grid-") as tmp:
        record = run_audit(Path(tmp) / "out", pair=PAIR, configs=[cell["config"]],
                           samplings=[sampling_of(cell["sampling"])], num_prompts=st["num_prompts"],
                           seeds_per_prompt=st["seeds_per_prompt"], n_predict=st["n_predict"],
                           lossless_samples=st["lossless_samples"], lossless_depth=st["lossless_depth"],
                           n_probs=st["n_probs"], prompt_source=cell["prompts"], seed=st["seed"],
                           speed_without_speculation=st["speed_without_speculation"], progress=progress)
        text = (Path(tmp) / "out" / "engine.json").read_text()
    part = cell["file"].with_suffix(".json.partial")
    part.write_text(text)
    os.replace(part, cell["file"])  # the engine's file as it wrote it, moved into place whole
    return record


def run_grid(args) -> None:
    todo = cells(args)
    t_start, done_times = time.time(), []
    for i, cell in enumerate(todo, 1):
        label = (f"[{i}/{len(todo)}] {cell['kind']} {cell['prompts']} {cell['sampling']} "
                 f"{' '.join(map(str, cell['config']))}")
        if stored(cell) is not None:
            print(f"{label}: stored, skipped", file=sys.stderr, flush=True)
            continue
        if args.dry_run:
            print(f"{label}: to run", file=sys.stderr, flush=True)
            continue
        t0 = time.time()
        print(f"{label}: running ({time.strftime('%H:%M:%S', time.gmtime())} UTC)", file=sys.stderr, flush=True)
        run_cell(cell, progress=not args.quiet)
        done_times.append(time.time() - t0)
        left = len(todo) - i
        eta = left * np.median(done_times) / 60
        print(f"{label}: done in {done_times[-1]:.0f} s; {left} left, about {eta:.0f} min at the median cell "
              f"time; {(time.time() - t_start) / 60:.1f} min so far", file=sys.stderr, flush=True)


# -- assembling -------------------------------------------------------------------------------------

def _f(x, digits=2):
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{digits}f}"


def _cfg_text(c):
    if c[0] == "ngram-simple":
        return "ngram-simple"
    return f"draft-simple n{c[1]} p{c[2]:g}"


def collect(args) -> list[tuple[dict, dict]]:
    out = []
    for cell in cells(argparse.Namespace(**{**vars(args), "only": None})):
        record = stored(cell)
        if record is not None:
            out.append((cell, record))
    return out


def bound_gaps(conf) -> np.ndarray:
    """Per rebuilt draft-simple iteration: accepted tokens minus their exact expectation
    ``Σ_ℓ Π_{j≤ℓ} p(d_j | c, d_<j)`` (the bound of the scheme at that iteration), from the stored
    iterations (outputs and target probabilities). If the engine's verifier accepts with exactly
    these probabilities, the gaps are martingale differences (mean 0 given every earlier
    iteration), so their mean's standard error needs no clustering."""
    return np.array([it["accepted"] - float(np.cumprod(it["target_probs"]).sum())
                     for it in conf.get("iterations") or []], dtype=np.float64)


def gap_interval(gaps, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of the gaps and its t interval (``nan`` below two gaps).

    Examples
    --------
    >>> m, lo, hi = gap_interval(np.array([1.0, -1.0, 0.5, -0.5]))
    >>> round(m, 3), round(hi - m, 3)   # t_0.975(3) · sqrt(2.5 / 3) / 2 = 3.1824 · 0.4564
    (0.0, 1.453)
    """
    n = len(gaps)
    m, half = cluster_mean_ci(gaps, np.arange(n), confidence)  # each gap its own cluster: Student's t
    return m, m - half, m + half


def acceptance_table(rows) -> str:
    lines = ["| prompts | sampling | configuration | drafts | MAL [95% CI] | acc. rate | bound of the scheme "
             "| engine − bound [95% CI] | best alternative (gain; verifier, drafts per level) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cell, rec in rows:
        if cell["kind"] != "acceptance":
            continue
        conf = rec["configurations"][0]
        cnt = conf["counters"]
        pred = conf.get("prediction") or {}
        alt = conf.get("best_alternative") or {}
        iv = conf.get("mean_acceptance_length_interval") or [None, None]
        if not cnt["drafts"]:
            mal = "no drafts"
        else:
            mal = f"{_f(conf['mean_acceptance_length'])} [{_f(iv[0])}, {_f(iv[1])}]"
            if conf.get("reconstruction_matches_counters") is False:
                mal += " ‡"
        gaps = bound_gaps(conf)
        if gaps.size:
            m, lo, hi = gap_interval(gaps)
            diff = f"{_f(m)} [{_f(lo)}, {_f(hi)}]" + (" **above**" if pred.get("exceeds_bound") else "")
        else:
            diff = "–"
        bound = conf.get("bound_mean_acceptance_length")
        alt_mal = alt.get("mean_acceptance_length")
        alt_text = (f"{_f(alt_mal)} ({alt_mal - bound:+.2f}; {alt.get('verifier')}, "
                    f"{'×'.join(map(str, alt.get('branching') or []))})" if alt and bound is not None else "–")
        lines.append(f"| {cell['prompts']} | {cell['sampling']} | {_cfg_text(cell['config'])} | {int(cnt['drafts'])} | "
                     f"{mal} | {_f(conf['acceptance_rate'])} | {_f(conf.get('bound_mean_acceptance_length'))} | "
                     f"{diff} | {alt_text} |")
    return "\n".join(lines)


def pooled_gap(rows) -> str:
    """The bound gaps of every stored draft-simple cell together: is the engine above its bound anywhere?"""
    from scipy import stats

    # only cells whose rebuilt iterations reproduce the engine's counters: elsewhere some rebuilt
    # drafts are not the engine's, and their gaps compare its outputs with drafts it did not make
    per_cell = [bound_gaps(r["configurations"][0]) for c, r in rows if c["kind"] == "acceptance"
                and r["configurations"][0].get("reconstruction_matches_counters", True)]
    per_cell = [g for g in per_cell if g.size]
    gaps = np.concatenate(per_cell) if per_cell else np.zeros(0)
    if gaps.size < 2:
        return "Pooled: fewer than two iterations."
    m, lo, hi = gap_interval(gaps)
    t = m / (gaps.std(ddof=1) / np.sqrt(gaps.size))
    p_above = float(stats.t.sf(t, gaps.size - 1))
    return (f"Pooled over the {gaps.size} iterations of the {len(per_cell)} draft-simple cells whose rebuilt "
            f"iterations reproduce the counters: engine − bound {m:.3f} "
            f"[{lo:.3f}, {hi:.3f}] tokens per iteration; one-sided p for "
            f"\"above the bound\": {p_above:.3f}.")


def lossless_table(rows) -> str:
    lines = ["| sampling | speculation on: p (n; cells; detectable TV; empirical TV) | drafted / accepted tokens "
             "| control, speculation off: p (n; cells; empirical TV) | verdict |",
             "|---|---|---|---|---|"]
    for cell, rec in rows:
        if cell["kind"] != "lossless":
            continue
        loss = rec["configurations"][0]["lossless"]
        ctl = next(iter(rec["controls"].values()))
        if ctl["p_value"] < 0.01:
            verdict = "inconclusive (the control rejects)"
        else:
            verdict = "lossless within the stated power" if loss["lossless"] else "**rejected**"
        lines.append(f"| {cell['sampling']} | {_f(loss['p_value'], 3)} ({loss['samples']}; {loss['cells']}; "
                     f"{_f(loss['detectable_tv'], 3)}; {_f(loss['empirical_tv'], 3)}) | {loss['draft_tokens']} / "
                     f"{loss['draft_tokens_accepted']} | {_f(ctl['p_value'], 3)} ({ctl['samples']}; {ctl['cells']}; "
                     f"{_f(ctl['empirical_tv'], 3)}) | {verdict} |")
    return "\n".join(lines)


def figure(rows, path: Path) -> None:
    from otbound.report import plots

    acc = [(c, r) for c, r in rows if c["kind"] == "acceptance"]
    panels = [(p, s) for p in PROMPT_SETS for s in SAMPLINGS]
    fig, axes = plots.figure(nrows=len(PROMPT_SETS), ncols=len(SAMPLINGS), height=2.4)
    labels = [_cfg_text(c).replace("draft-simple ", "") for c in CONFIGS]
    for (prompts, sampling), ax in zip(panels, axes.ravel()):
        x = np.arange(len(CONFIGS))
        eng, lo, hi, bound, alt = (np.full(len(CONFIGS), np.nan) for _ in range(5))
        for cell, rec in acc:
            if (cell["prompts"], cell["sampling"]) != (prompts, sampling):
                continue
            j = CONFIGS.index(tuple(cell["config"]))
            conf = rec["configurations"][0]
            if conf["counters"]["drafts"]:
                eng[j] = conf["mean_acceptance_length"]
            b = conf.get("bound_mean_acceptance_length")
            bound[j] = np.nan if b is None else b
            gaps = bound_gaps(conf)
            if gaps.size and b is not None:  # the engine's gap to the bound, its interval placed on the bound
                _, g_lo, g_hi = gap_interval(gaps)
                lo[j], hi[j] = b + g_lo, b + g_hi
            a = (conf.get("best_alternative") or {}).get("mean_acceptance_length")
            alt[j] = np.nan if a is None else a
        ok = ~(np.isnan(lo) | np.isnan(eng))
        ax.errorbar(x[ok], eng[ok], yerr=[np.maximum(eng[ok] - lo[ok], 0), np.maximum(hi[ok] - eng[ok], 0)],
                    fmt="none", color="C0", lw=1)
        ax.plot(x, eng, "o", color="C0", ms=4, label="engine (counters; 95% CI of engine − bound)")
        ax.plot(x, bound, "_", color="C3", ms=12, mew=2, label="bound of its scheme")
        ax.plot(x, alt, "^", color="C2", ms=4, label="best alternative, same budget")
        ax.set_title(f"{prompts}, {sampling.replace('@', ' T=')}", fontsize=7)
        ax.set_xticks(x, labels, fontsize=5, rotation=60)
        ax.set_ylim(1, 8)
    axes[0, 0].set_ylabel("mean acceptance length")
    axes[-1, 0].set_ylabel("mean acceptance length")
    axes[-1, 1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize=6)
    path.parent.mkdir(parents=True, exist_ok=True)
    plots.save(fig, path, formats=("png",))


def assemble(args) -> str:
    rows = collect(args)
    n_acc, n_loss = (sum(c["kind"] == kind for c, _ in rows) for kind in ("acceptance", "lossless"))
    text = (f"Acceptance ({n_acc} cells stored):\n\n{acceptance_table(rows)}\n\n{pooled_gap(rows)}\n\n"
            f"Losslessness ({n_loss} cells stored):\n\n{lossless_table(rows)}\n")
    if rows:
        figure(rows, args.figure)
    if args.table:
        Path(args.table).write_text(text)
    return text


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assemble", action="store_true", help="only assemble the table and figure from stored cells")
    ap.add_argument("--dry-run", action="store_true", help="list the cells and whether they are stored")
    ap.add_argument("--only", choices=("acceptance", "lossless"), default=None)
    ap.add_argument("--num-prompts", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--n-predict", type=int, default=24)
    ap.add_argument("--lossless-samples", type=int, default=150)
    ap.add_argument("--speed", action="store_true",
                    help="also time the requests without speculation (tokens/s off; costs a third more)")
    ap.add_argument("--lossless-depth", type=int, default=3)
    ap.add_argument("--n-probs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--table", default=None, help="also write the assembled markdown here")
    ap.add_argument("--figure", type=Path, default=FIGURE)
    ap.add_argument("--quiet", action="store_true")
    return ap


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    if not args.assemble:
        run_grid(args)
    if not args.dry_run:
        print(assemble(args))


if __name__ == "__main__":
    main()
