"""Per-position cost of the public measurement ``otbound.report.measure_laws(P, Q, (2, 3, 4))`` (every
verifier of ``otbound.VERIFIERS`` and α* of the three draft laws, as users call it) against one
``np.sort`` of a row, in the same process (medians of several runs).

16 rows at V = 151,936 per call, on several row families:

* ``zipf_noise``: Zipf logits ``−1.1·ln(rank)`` (ranks permuted per row) for the draft, the target
  the draft's logits plus unit Gaussian noise (draft ≈ target up to noise over a Zipf head);
* ``peaked``: logits N(0, 6²): near-deterministic laws, the target with N(0, 1) noise;
* ``flat``: logits N(0, 0.3²): near-uniform laws, the target with N(0, 0.3²) noise;
* ``close``: logits N(0, 2.5²), the target with N(0, 0.1²) noise (draft ≈ target);
* ``far``: independent logits N(0, 2.5²) for target and draft (draft far from target);
* ``ties``: logits N(0, 2.5²) rounded to integers, target and draft independently (many exactly
  tied ratios).

Per family it prints the median time per position of the public call, that of one ``np.sort`` of a
row of ratios, their ratio, and the share of α* without replacement at K = 3, 4 (the branch and
bound per row, timed alone on a fresh :class:`otbound.token.LawBatch` of the same rows). The
process calls :func:`otbound.retain_freed_memory` first, as ``python -m otbound.compare``
does. torch's intra-op threads are left as a user's process has them (``--threads`` to set them).

``--profile`` also times each quantity of the default set alone, per position, as a multiple of
the ``np.sort`` of a row (CPU time, medians): the checked batch (``LawBatch`` and its support), the
sort by ratio (``LawBatch.sorted``: the integer sort, gathers, ratios, near-tie repair, prefix and
suffix sums), α* of each draft law at K = 2, 3, 4 (α* without replacement also at K = 2 alone and
at K = 3, 4), and each verifier's ``batch_estimate`` at K = 2, 3, 4; each on a fresh batch of the
same rows that has already sorted its rows and counted its support (a verifier's batch also holds
α* of its own law, which some verifiers read). Caches a quantity shares with another one (the
top-q selection of the greedy, deterministic and K = 2 without-replacement laws; the RRS
thresholds of rrs and rrs_wor) are counted in each, so the shares add up to a little more than
the public call.

    python experiments/bench_engine.py                 # ~2 min on 2 busy cores
    python experiments/bench_engine.py --quick         # tiny, for the tests
    python experiments/bench_engine.py --device cuda   # the measurement on a GPU
    python experiments/bench_engine.py --profile --rows 8 --repeats 3 --families zipf_noise peaked ties
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import numpy as np

LM_VOCAB = 151_936
KS = (2, 3, 4)
FAMILIES = ("zipf_noise", "peaked", "flat", "close", "far", "ties")


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rows(family: str, n: int, vocab: int, seed: int = 0):
    """``(p, q)`` of shape (n, vocab) for a row family (module docstring)."""
    rng = np.random.default_rng(seed)
    shape = (n, vocab)
    if family == "zipf_noise":
        ranks = np.argsort(rng.random(shape), axis=1) + 1
        z = -1.1 * np.log(ranks)
        return _softmax(z + rng.standard_normal(shape)), _softmax(z)
    if family == "peaked":
        z = rng.standard_normal(shape) * 6.0
        return _softmax(z + rng.standard_normal(shape)), _softmax(z)
    if family == "flat":
        z = rng.standard_normal(shape) * 0.3
        return _softmax(z + 0.3 * rng.standard_normal(shape)), _softmax(z)
    if family == "close":
        z = rng.standard_normal(shape) * 2.5
        return _softmax(z + 0.1 * rng.standard_normal(shape)), _softmax(z)
    if family == "far":
        return _softmax(rng.standard_normal(shape) * 2.5), _softmax(rng.standard_normal(shape) * 2.5)
    if family == "ties":
        p, q = (_softmax(np.round(rng.standard_normal(shape) * 2.5)) for _ in range(2))
        return p, q
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def median_time(fn, repeats: int) -> np.ndarray:
    """Median wall and median CPU time of this process over ``repeats`` calls of ``fn()`` after a
    warm-up (CPU time is the steadier figure on a shared machine)."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return np.array([statistics.median(walls), statistics.median(cpus)])


def profile(pt, qt, repeats: int, sync=lambda: None) -> dict:
    """CPU seconds per position of each quantity of ``measure_laws``'s default set at K = 2, 3, 4,
    each timed alone on a fresh :class:`otbound.token.LawBatch` of the rows ``(pt, qt)`` (module
    docstring): ``{label: seconds}``, medians of ``repeats`` fresh batches after a warm-up."""
    from otbound.token import LawBatch
    from otbound.token.verifiers import VERIFIERS

    n = pt.shape[0]

    def sorted_batch():
        b = LawBatch(pt, qt)
        _ = b.sorted, b.support
        return b

    def timed(prepare, work):
        out = []
        for j in range(repeats + 1):
            b = prepare()
            c0 = time.process_time()
            work(b)
            sync()
            if j:  # the first is a warm-up
                out.append(time.process_time() - c0)
        return statistics.median(out) / n

    res = {"checked batch (LawBatch, support)": timed(lambda: None, lambda _: LawBatch(pt, qt).support),
           "sort by ratio (LawBatch.sorted)": timed(lambda: LawBatch(pt, qt), lambda b: b.sorted)}
    laws = {"with_replacement": KS, "without_replacement": KS, "greedy": KS, "deterministic": KS}
    for law, ks in laws.items():
        res[f"alpha* {law} K=2,3,4"] = timed(sorted_batch, lambda b, law=law, ks=ks: [
            b.optimal_acceptance(k, law) for k in ks])
    res["alpha* without_replacement K=2"] = timed(sorted_batch,
                                                  lambda b: b.optimal_acceptance(2, "without_replacement"))
    res["alpha* without_replacement K=3,4"] = timed(sorted_batch, lambda b: [
        b.optimal_acceptance(k, "without_replacement") for k in KS if k >= 3])
    rng = np.random.default_rng(0)
    for name, ver in VERIFIERS.items():
        if not ver.in_default_measurement:
            continue

        def prepare(ver=ver):
            b = sorted_batch()
            for k in KS:
                b.optimal_acceptance(min(k, b.support) if ver.sampling != "with_replacement" else k, ver.sampling)
            return b

        res[f"verifier {name} K=2,3,4"] = timed(prepare, lambda b, ver=ver: ver.batch_estimate(b, list(KS), 64, rng))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="V = 2,000, 4 rows, 2 runs (for the tests)")
    ap.add_argument("--rows", type=int, default=16, help="positions per call")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's own, as a user's process has them)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--profile", action="store_true",
                    help="also time each quantity of the default set alone (module docstring)")
    args = ap.parse_args(argv)
    import torch

    from otbound import retain_freed_memory
    from otbound.report import measure_laws
    from otbound.token import LawBatch

    retain_freed_memory()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    vocab, repeats, n = (LM_VOCAB, args.repeats, args.rows) if not args.quick else (2_000, 2, 4)
    out = {"date": datetime.date.today().isoformat(), "vocab": vocab, "rows": n, "repeats": repeats,
           "device": args.device, "threads": torch.get_num_threads(), "torch": torch.__version__, "families": {}}
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    for fam in args.families:
        p, q = rows(fam, n, vocab)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(q > 0, p / q, np.inf)
        t_sort = median_time(lambda: [np.sort(r) for r in ratio], repeats) / n  # noqa: B023
        pt, qt = torch.from_numpy(p).to(args.device), torch.from_numpy(q).to(args.device)

        def public():
            measure_laws(pt, qt, KS)  # noqa: B023
            sync()

        def wor_k34():
            b = LawBatch(pt, qt)  # noqa: B023
            _ = b.sorted, b.support  # the shared sort and support check, not timed here
            t0, c0 = time.perf_counter(), time.process_time()
            for k in (3, 4):
                b.optimal_acceptance(k, "without_replacement")
            sync()
            return np.array([time.perf_counter() - t0, time.process_time() - c0])

        t_public = median_time(public, repeats) / n
        wor_k34()
        t_wor = np.median([wor_k34() for _ in range(repeats)], axis=0) / n
        res = {}
        for i, clock in enumerate(("wall", "cpu")):
            r = res[clock] = {"np_sort_ms": 1e3 * t_sort[i], "measure_laws_ms": 1e3 * t_public[i],
                              "ratio_to_sort": t_public[i] / t_sort[i], "wor_k34_ms": 1e3 * t_wor[i],
                              "rest_ratio_to_sort": (t_public[i] - t_wor[i]) / t_sort[i]}
            print(f"{fam:10s} V={vocab} ({clock:4s}): np.sort {r['np_sort_ms']:.2f} ms/row | measure_laws "
                  f"{r['measure_laws_ms']:.1f} ms/position = {r['ratio_to_sort']:.1f}x np.sort | of which "
                  f"alpha*_wor K=3,4 {r['wor_k34_ms']:.1f} ms; the rest {r['rest_ratio_to_sort']:.1f}x np.sort",
                  flush=True)
        if args.profile:
            shares = profile(pt, qt, repeats, sync)
            res["profile_x_sort"] = {label: t / t_sort[1] for label, t in shares.items()}
            for label, x in res["profile_x_sort"].items():
                print(f"{fam:10s}   {label:40s} {x:6.2f}x np.sort", flush=True)
        out["families"][fam] = res
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
