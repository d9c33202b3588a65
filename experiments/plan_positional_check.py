"""The planner's positional approximation against the exact ``E[τ]`` on truncated real draft trees.

The planner predicts a shape's accepted length from per-position acceptance along a trace:
``Σ_ℓ Π_{d ≤ ℓ} α_V(p_{t+d−1}, q_{t+d−1}, b_d)`` (docs/guide/planner.md). On block traces of the
pair (:func:`otbound.lm.collect_block_traces`: at sampled positions ``t`` of the same traces, ``K``
i.i.d. draft blocks of length ``L`` with both models' laws along every block) the exact ``E[τ |
drafts]`` of ``K' ≤ K`` chains of length ``L' ≤ L`` (the first ``K'`` blocks, cut at ``L'``) is
computed two ways, over the verifier's own randomness:

* **decoder**: :class:`otbound.block.verifiers.MultiPathVerifier` on the drafted tree — the rule of
  :func:`otbound.lm.speculative_sample`, where rows sharing a prefix stay together (i.i.d. rows whose
  first tokens coincide give the accepted node several drafts);
* **shape**: the planner's shape ``(K', 1, ..., 1)``: ``K'`` drafts at the root, then only the first
  row that drafted the accepted token.

Averaged over the drafts' own draw (one draw per position), each is an unbiased estimate of its
``E[τ]`` at that context. Reported per verifier and shape, with paired 95% intervals cluster-robust
over traces: ``shape − predicted`` (the positional approximation's error: the drafted path's laws
against the trace's continuation), ``decoder − shape`` (what the shape leaves out for i.i.d. chains)
and ``decoder − predicted``.

Usage (block collection loads the pair: under the real-model lock, taken by the script itself just
before the models load)::

    python experiments/plan_positional_check.py RUN --blocks BLOCKS --collect --temperature 1.0
    python experiments/plan_positional_check.py RUN --blocks BLOCKS --temperature 1.0

Results: ``data/results/plan_positional_check.json`` (configuration, rows, SHA-256). ``--tiny``: the
tiny random pair (``RUN`` collected with it), for trying the script.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402


def shape_value(verifier, drafts, p, q, length: int, merge: bool) -> float:
    """Exact ``E[τ | drafts]`` of the first ``length`` depths of the rows ``drafts`` (``(K, L)``),
    laws ``p`` (``(K, L+1, V)``) and ``q`` (``(K, L, V)``) along them: the token verifier at every
    node; below the root the rows of the accepted token stay together (``merge``) or only the first
    of them continues (the planner's chain shape)."""

    def value(depth: int, members: np.ndarray) -> float:
        if depth == length:
            return 0.0
        if depth >= 1 and not merge:
            members = members[:1]
        row = drafts[members, depth]
        law = verifier.conditional_law(p[members[0], depth], q[members[0], depth], row)
        return float(sum(law[y] * (1.0 + value(depth + 1, members[row == y])) for y in np.unique(row).tolist()
                         if law[y] > 0))

    return value(0, np.arange(drafts.shape[0]))


def take_lock(path):
    """Block until the real-model lock is ours (released when the process exits)."""
    if not path:
        return None
    fh = open(path, "a")  # noqa: SIM115 - held for the process's life
    t0 = time.perf_counter()
    fcntl.flock(fh, fcntl.LOCK_EX)
    print(f"lock {path} taken after {time.perf_counter() - t0:.0f} s", flush=True)
    return fh


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run folder with the traces (traces/)")
    ap.add_argument("--blocks", required=True, help="block-trace folder")
    ap.add_argument("--collect", action="store_true", help="collect the block traces (loads the pair) and stop")
    ap.add_argument("--lock", default="/tmp/otbound-real.lock", help="real-model lock taken before loading models")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--num-drafts", type=int, default=4)
    ap.add_argument("--block-length", type=int, default=4)
    ap.add_argument("--positions-per-trace", type=int, default=2)
    ap.add_argument("--verifiers", nargs="+", default=["rrs", "kseq", "ot"])
    ap.add_argument("--shapes", nargs="+", default=["1x2", "1x4", "2x2", "2x4", "4x2", "4x4"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-prompts", type=int, default=None, help="traces per dataset (default: all)")
    ap.add_argument("--budget-seconds", type=float, default=None, help="collect no new trace's blocks after this")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--results", default=str(_common.RESULTS / "plan_positional_check.json"))
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    from otbound import plan as pl
    from otbound.block.verifiers import MultiPathVerifier
    from otbound.lm import collect_block_traces, load_block_traces
    from otbound.report import cluster_mean_ci
    from otbound.token.verifiers import VERIFIERS

    records = pl.load_run_traces(args.run, temperature=args.temperature)
    by_ds: dict = {}
    for r in sorted(records, key=lambda r: (r.dataset, len(r.prompt_id), r.prompt_id)):
        by_ds.setdefault(r.dataset, []).append(r)
    records = [r for group in zip(*[v[: args.num_prompts] for v in by_ds.values()]) for r in group]
    if args.collect:
        if args.tiny:
            from otbound.lm import tiny_pair

            pair = tiny_pair()
        else:
            from otbound.lm import load_pair

            take_lock(args.lock)
            r0 = records[0]
            pair = load_pair(r0.meta.get("pair") or "qwen2.5-coder", device="cpu", dtype=r0.meta.get("model_dtype"))
        t_collect = time.perf_counter()
        for i, path in enumerate(dict.fromkeys(r.path for r in records)):
            if args.budget_seconds is not None and time.perf_counter() - t_collect > args.budget_seconds:
                print(f"budget reached after {i} traces", flush=True)
                break
            collect_block_traces(pair, path, args.blocks, num_drafts=args.num_drafts, block_length=args.block_length,
                                 positions_per_trace=args.positions_per_trace, seed=args.seed,
                                 logits_dtype="float16", progress=False)
        print(f"block traces collected in {time.perf_counter() - t_start:.0f} s", flush=True)
        return None

    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes]
    stored = Path(args.run) / "measure"  # a report's measurements, reused where they hold the values
    table = pl.table_from_records(records, max_drafts=max(k for k, _ in shapes), verifiers=args.verifiers,
                                  laws=["with_replacement"], progress=False,
                                  cache_dir=stored if stored.is_dir() else None)
    for name in args.verifiers:
        if table.sampling[name] != "with_replacement":
            raise SystemExit(f"plan_positional_check.py: error: {name} drafts with the {table.sampling[name]} law; "
                             f"block traces hold i.i.d. blocks (with_replacement verifiers only)")
    where = {(r.dataset, r.prompt_id): c for c, r in enumerate(records)}
    cells = {(name, k, length): ([], [], [], []) for name in args.verifiers for k, length in shapes}
    checked, n_blocks, dtype = 0, 0, None
    for b in load_block_traces(args.blocks):  # one record at a time: each holds K·(2L+1)·V float64 laws
        c = where.get((b.dataset, b.prompt_id))
        if c is None or float(b.temperature) != args.temperature:
            continue
        n_blocks += 1
        dtype = b.meta.get("model_dtype")
        t = int(b.position)
        bp, bq = b.p, b.q
        for name in args.verifiers:
            token_v = VERIFIERS[name]
            for k, length in shapes:
                if t + length > table.lengths[c] or k > b.num_drafts or length > b.block_length:
                    continue
                prod, total = 1.0, 0.0
                for d, m in enumerate([k] + [1] * (length - 1)):
                    prod *= float(table.values(name, "with_replacement", m)[c][t + d])
                    total += prod
                drafts, p, q = b.drafts[:k, :length], bp[:k, : length + 1], bq[:k, :length]
                exact_shape = shape_value(token_v, drafts, p, q, length, merge=False)
                exact_dec = shape_value(token_v, drafts, p, q, length, merge=True)
                if checked < 3 and k > 1:  # the recursion agrees with the block layer's verifier on the tree
                    tm, dm = pl_tree_models(drafts, p, q)
                    ref = float(MultiPathVerifier(name).conditional_acceptance(tm, dm, drafts))
                    assert abs(ref - exact_dec) < 1e-9, (ref, exact_dec)
                    checked += 1
                for lst, x in zip(cells[(name, k, length)], (total, exact_shape, exact_dec, c)):
                    lst.append(x)
        del bp, bq, b
    rows = []
    for (name, k, length), lists in cells.items():
        if not lists[0]:
            continue
        pred, shape_e, dec_e, clusters = map(np.asarray, lists)

        def ci(x, clusters=clusters):
            m, h = cluster_mean_ci(x, clusters)
            return [float(m), float(h)]

        rows.append({"verifier": name, "num_drafts": k, "block_len": length, "positions": int(pred.size),
                     "traces": int(np.unique(clusters).size),
                     "predicted_mean_acceptance_length": ci(1.0 + pred),
                     "shape_exact_mean_acceptance_length": ci(1.0 + shape_e),
                     "decoder_exact_mean_acceptance_length": ci(1.0 + dec_e),
                     "shape_minus_predicted": ci(shape_e - pred), "decoder_minus_shape": ci(dec_e - shape_e),
                     "decoder_minus_predicted": ci(dec_e - pred)})
    params = {"run": str(args.run), "blocks": str(args.blocks), "temperature": args.temperature,
              "num_drafts": args.num_drafts, "block_length": args.block_length,
              "positions_per_trace": args.positions_per_trace, "verifiers": args.verifiers, "shapes": args.shapes,
              "seed": args.seed, "tiny": args.tiny}
    stored = {"meta": {"script": "experiments/plan_positional_check.py",
                       "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "seconds": round(time.perf_counter() - t_start, 1),
                       "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "command": " ".join(sys.argv)},
              "params": params,
              "results": {"rows": rows, "traces": table.source, "block_positions": n_blocks, "model_dtype": dtype}}
    stored["meta"]["sha256"] = _common._results_key(stored)
    _common.write_json(Path(args.results), stored)
    print(markdown(stored))
    return stored


def pl_tree_models(drafts, p, q):
    from otbound.lm import tree_block_models

    return tree_block_models(drafts, p, q)


def markdown(stored: dict) -> str:
    """The comparison table of a results file."""
    f = lambda x: f"{x[0]:.3f} ± {x[1]:.3f}"  # noqa: E731
    lines = ["| verifier | K × L | positions | predicted (positional) | exact, planner's shape | exact, decoder's tree "
             "| shape − predicted | decoder − shape |", "|---|---|---|---|---|---|---|---|"]
    for r in stored["results"]["rows"]:
        lines.append(f"| {r['verifier']} | {r['num_drafts']} × {r['block_len']} | {r['positions']} | "
                     f"{f(r['predicted_mean_acceptance_length'])} | {f(r['shape_exact_mean_acceptance_length'])} | "
                     f"{f(r['decoder_exact_mean_acceptance_length'])} | {f(r['shape_minus_predicted'])} | "
                     f"{f(r['decoder_minus_shape'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
