"""Benchmark: ``ot_wor_top`` (the optimum seen through the top-m tokens, drafts without replacement)
beside ``rrs_wor`` and ``ot``, and its gap to α* as a function of m.

    python experiments/bench_optimal_wor.py [--runs 3] [--instances 2] [--ks 2 4 8] [--families ...] [--figure PATH]

Row families at V = 151,936 (``--families``, default all):

* ``lm_T0.5``, ``lm_T1`` — LM-like pairs (logits N(0, 2.5²) with 50 boosted tokens; the draft's
  logits add N(0, 1) noise; both laws softmax(logits / T));
* ``flat``, ``ties``, ``far`` — the families of ``experiments/bench_engine.py`` (near-uniform laws;
  integer logits, many tied ratios; independent target and draft).

Times are process CPU times (one thread; the machine is shared), medians of ``--runs`` runs, then
the median over ``--instances`` instances:

* ``per token`` — the public ``sample`` on one drafted tuple with an empty cache (a fresh p, q, as
  in decoding): for ``ot_wor_top`` the whole set-up (the clock pass over T^c, the sets, the LP);
  ``rrs_wor`` and ``ot`` (i.i.d. drafts, the with-replacement optimum) the same call; the ratio
  ``ot_wor_top / rrs_wor`` of the two medians;
* ``batched`` — per tuple, 1,000 tuples of one (p, q) in one ``sample`` call, set-up cached;
* ``acceptance`` — the exact acceptance of ``ot_wor_top`` and α* without replacement.

Gap table: ``α* − α(ot_wor_top)`` for ``max_sets`` ∈ ``--max-sets`` (m = ``truncation_size``),
written as a figure with ``--figure``.

Real traces: ``--traces DIR`` (a folder of ``otbound-trace-1`` files, :func:`otbound.lm.collect_traces`)
replaces all of the above by the mean over every stored position of α*_wor and of the exact
acceptance of ``ot_wor_top`` at each ``max_sets`` (and K in ``--ks``), with the mean gap; beside
them α* with replacement (``ot_wor_iid``'s proven floor) and the Monte Carlo acceptance of
``ot_wor_iid``, ``ot_wor`` (the better of the two per position) and ``rrs_wor``: exact where the
verifier has it, else Monte Carlo on the same ``--mc`` draft tuples per position (standard error of
the mean over positions below 0.5 / √(positions · mc)). ``--gap-only`` keeps the ``ot_wor_top``
columns; ``--stride N`` takes every N-th position.

``ot_wor_iid`` (ot on i.i.d. draws rebuilt from the drafts) is timed beside the others.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from bench_engine import rows as family_rows  # noqa: E402

from otbound import VERIFIERS, optimal_acceptance, sample_drafts  # noqa: E402
from otbound.token import laws_from_logits  # noqa: E402
from otbound.token.verifiers import OptimalWithoutReplacementVerifier, truncation_size  # noqa: E402

V = 151_936
WOR = "without_replacement"


def lm_pair(seed: int, temperature: float, v: int = V):
    r = np.random.default_rng(seed)
    z = r.standard_normal(v) * 2.5
    z[:50] += 8 * r.random(50)
    return laws_from_logits(z, temperature), laws_from_logits(z + r.standard_normal(v), temperature)


FAMILIES = ("lm_T0.5", "lm_T1", "flat", "ties", "far")


def instance(family: str, k: int, i: int):
    """(p, q) of instance i of a family (module docstring)."""
    if family.startswith("lm_T"):
        return lm_pair(1000 * k + i, float(family[4:]))
    p, q = family_rows(family, 1, V, seed=1000 * k + i)
    return p[0], q[0]


def cpu_median(fn, runs):
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def per_token(name, p, q, drafts, runs):
    ver = VERIFIERS[name]
    rng = np.random.default_rng(0)

    def once():
        ver.clear_cache()  # its own set-ups and those of the verifiers it runs inside
        ver.sample(p, q, drafts, rng)

    return cpu_median(once, runs)


def batched(name, p, q, drafts, runs):
    ver = VERIFIERS[name]
    rng = np.random.default_rng(0)
    ver.sample(p, q, drafts[:1], rng)  # set-up cached
    return cpu_median(lambda: ver.sample(p, q, drafts, rng), runs) / drafts.shape[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--max-sets", type=int, nargs="*", default=[100, 300, 1000, 2500])
    ap.add_argument("--gap-only", action="store_true", help="with --traces: the ot_wor_top columns only")
    ap.add_argument("--stride", type=int, default=1, help="with --traces: every N-th position")
    ap.add_argument("--figure", default=None, help="write the gap figure here (PNG)")
    ap.add_argument("--traces", default=None, help="folder of stored traces: the gap on real laws instead")
    ap.add_argument("--mc", type=int, default=200, help="draft tuples per position for the Monte Carlo columns")
    args = ap.parse_args(argv)
    if args.traces:
        return real_gap(args)
    print(f"{datetime.date.today()} {platform.processor() or platform.machine()}, V = {V:,}, CPU ms, "
          f"medians of {args.runs} runs, median over {args.instances} instances")
    print(f"{'family':>8} {'K':>2} {'m':>3} | {'ot_wor_top':>10} {'rrs_wor':>8} {'ratio':>6} {'ot':>8} "
          f"{'ot_wor_iid':>10} {'ot_wor':>7} | per tuple batched: {'ot_wor_top':>10} {'rrs_wor':>8} | "
          f"{'α(ot_wor_top)':>13} {'α*_wor':>7}")
    for family in args.families:
        for k in args.ks:
            cells = {key: [] for key in ("wor", "rrs", "fast", "iid", "best", "bwor", "brrs", "acc", "star")}
            for i in range(args.instances):
                p, q = instance(family, k, i)
                rng = np.random.default_rng(i)
                wor_drafts = sample_drafts(q, k, WOR, 1000, rng)
                iid_drafts = sample_drafts(q, k, "with_replacement", 1, rng)
                cells["wor"].append(per_token("ot_wor_top", p, q, wor_drafts[:1], args.runs))
                cells["rrs"].append(per_token("rrs_wor", p, q, wor_drafts[:1], args.runs))
                cells["fast"].append(per_token("ot", p, q, iid_drafts, args.runs))
                cells["iid"].append(per_token("ot_wor_iid", p, q, wor_drafts[:1], args.runs))
                cells["best"].append(per_token("ot_wor", p, q, wor_drafts[:1], args.runs))
                cells["bwor"].append(batched("ot_wor_top", p, q, wor_drafts, args.runs))
                cells["brrs"].append(batched("rrs_wor", p, q, wor_drafts[:64], 1))
                cells["acc"].append(VERIFIERS["ot_wor_top"].acceptance(p, q, k))
                cells["star"].append(optimal_acceptance(p, q, k, WOR))
            med = {key: statistics.median(val) for key, val in cells.items()}
            print(f"{family:>8} {k:>2} {truncation_size(k):>3} | {1e3 * med['wor']:>10.1f} {1e3 * med['rrs']:>8.1f} "
                  f"{med['wor'] / med['rrs']:>6.1f} {1e3 * med['fast']:>8.1f} {1e3 * med['iid']:>10.1f} "
                  f"{1e3 * med['best']:>7.1f} | {'':>19}{1e3 * med['bwor']:>10.3f} {1e3 * med['brrs']:>8.3f} | "
                  f"{med['acc']:>13.4f} {med['star']:>7.4f}", flush=True)
    if not args.max_sets:
        return
    print("\nGap α* − α(ot_wor_top) by max_sets (m), median over instances")
    gaps = {}
    for family in args.families:
        for k in args.ks:
            row = []
            for ms in args.max_sets:
                if 2 ** (k + 1) - 1 > ms:
                    row.append(None)
                    continue
                ver = OptimalWithoutReplacementVerifier(ms)
                vals = []
                for i in range(args.instances):
                    p, q = instance(family, k, i)
                    vals.append(optimal_acceptance(p, q, k, WOR) - ver.acceptance(p, q, k))
                row.append(statistics.median(vals))
            gaps[(family, k)] = row
            cells = " ".join(
                f"m={truncation_size(k, ms):>2}: {'—':>6}" if g is None else f"m={truncation_size(k, ms):>2}: {g:.4f}"
                for ms, g in zip(args.max_sets, row)
            )
            print(f"{family}, K = {k}: {cells}", flush=True)
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 4))
        styles = ["-", "--", ":", "-."]
        for (family, k), row in gaps.items():
            xs = [truncation_size(k, ms) for ms, g in zip(args.max_sets, row) if g is not None]
            ys = [g for g in row if g is not None]
            ax.plot(xs, ys, marker="o", ms=3, color=f"C{args.families.index(family)}",
                    ls=styles[args.ks.index(k) % len(styles)], label=f"{family}, K = {k}")
        ax.set_xlabel("m (tokens of T)")
        ax.set_ylabel("α*_wor − α(ot_wor_top)")
        ax.set_xscale("log")
        ax.set_title(f"Top-m truncation gap, synthetic pairs, V = {V:,}")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=120)
        print(f"figure: {args.figure}")


def real_gap(args):
    from otbound.lm import load_traces

    laws = []
    for rec in load_traces(args.traces):
        p_rows, q_rows = rec.p, rec.q
        laws += [(rec.dataset, rec.prompt_id, rec.temperature, p_rows[i], q_rows[i])
                 for i in range(0, rec.positions, args.stride)]
    groups = sorted({(x[0], x[2]) for x in laws})
    prompts = sorted({x[1] for x in laws})
    print(f"{datetime.date.today()}: {len(laws)} positions (every {args.stride}) of {len(prompts)} prompts, "
          f"groups {groups}", flush=True)
    curves = {}  # (group label, K) -> [(m, mean gap)]
    for k in args.ks:
        sets = [ms for ms in args.max_sets if 2 ** (k + 1) - 1 <= ms]
        star = np.array([optimal_acceptance(p, q, k, WOR) for *_, p, q in laws])
        acc = {ms: np.array([OptimalWithoutReplacementVerifier(ms).acceptance(p, q, k) for *_, p, q in laws])
               for ms in sets}
        for label, pick in [(f"{d}, T = {t:g}", [x[0] == d and x[2] == t for x in laws]) for d, t in groups] + [
            ("pooled", [True] * len(laws))
        ]:
            pick = np.asarray(pick)
            cells = [f"α*_wor {star[pick].mean():.4f}"]
            for ms in sets:
                gap = star[pick] - acc[ms][pick]
                m = truncation_size(k, ms)
                curves.setdefault((label, k), []).append((m, float(gap.mean())))
                cells.append(f"m={m}: α {acc[ms][pick].mean():.4f}, gap {gap.mean():.4f} "
                             f"(median {np.median(gap):.4f}, max {gap.max():.4f}, "
                             f"efficiency {acc[ms][pick].mean() / star[pick].mean():.1%})")
            print(f"K = {k}, {label} ({int(pick.sum())} positions): " + "; ".join(cells), flush=True)
        if args.gap_only:
            continue
        iid = np.array([optimal_acceptance(p, q, k) for *_, p, q in laws])
        rng = np.random.default_rng(k)
        value = {"ot_wor_iid": [], "ot_wor": [], "rrs_wor": []}
        exact = {name: 0 for name in value}
        for *_, p, q in laws:
            drafts = sample_drafts(q, k, WOR, args.mc, rng)
            for name in value:
                a = VERIFIERS[name].acceptance(p, q, k)  # exact where the verifier has it
                exact[name] += a is not None
                value[name].append(a if a is not None else VERIFIERS[name].sample(p, q, drafts, rng).accepted.mean())
        print(f"K = {k}, pooled: α*_iid {iid.mean():.4f}; " + ", ".join(
            f"{name} {np.mean(val):.4f} ({exact[name]}/{len(laws)} exact)" for name, val in value.items()), flush=True)
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 4))
        labels = list(dict.fromkeys(label for label, _ in curves if label != "pooled"))
        styles = ["-", "--", ":", "-."]
        for (label, k), pts in curves.items():
            if label == "pooled":
                continue
            ax.plot(*zip(*pts), marker="o", ms=3, color=f"C{labels.index(label)}",
                    ls=styles[args.ks.index(k) % len(styles)], label=f"{label}, K = {k}")
        ax.set_xlabel("m (tokens of T)")
        ax.set_ylabel("mean α*_wor − α(ot_wor_top)")
        ax.set_xscale("log")
        ax.set_title("Top-m truncation gap, real traces (Qwen2.5-Coder 0.5B → 1.5B)", fontsize=9)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=120)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
