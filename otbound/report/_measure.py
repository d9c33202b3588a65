"""Measurements on stored traces: per-position optimal acceptance α* and each verifier's
acceptance, aggregated per (dataset, temperature, K) with 95% confidence intervals.

Per position ``t`` (laws ``p_t``, ``q_t`` of a trace, temperature already applied):

* ``α*`` for every draft law in ``samplings`` and every ``K`` — the batched engine
  (:mod:`otbound.report._engine`: torch, CPU or CUDA, one ratio sort per row; equal to
  :func:`otbound.optimal_acceptance` to 1e-9);
* each verifier's acceptance ``P(Y ∈ x̄)`` under its own draft law: nss, rrs, rrs_wor, kseq,
  spechub and greedy from the engine (exact; rrs_wor at K ≥ 3 a Rao–Blackwellised Monte Carlo
  average of ``mc_samples`` paths, unless V is tiny enough for exact enumeration); the others
  their exact value (``verifier.acceptance``) when they have one, else a Monte Carlo estimate from
  ``mc_samples`` draft tuples (:func:`otbound.sample_drafts`) run through ``verifier.sample``. (Averaging the exact
  conditional acceptance ``P(Y ∈ x̄ | x̄)`` of ``verifier.conditional_law`` instead cost twice as
  much per draw on the real pair, for estimates about as spread.) A verifier that refuses the
  input (e.g. K above its ``max_drafts``, or V too large for an LP-based one) is skipped with
  its reason recorded.

Aggregation (:func:`aggregate`): means over all positions of a (dataset, T, K) cell. Positions of
one prompt are correlated, so the 95% CI is cluster-robust with prompts as clusters:
``SE² = C/(C−1) · Σ_c (Σ_{t∈c} (x_t − x̄))² / N²`` and half-width ``t_{0.975, C−1} · SE``
(``C`` prompts, ``N`` positions; with one prompt, i.i.d. positions and ``t_{0.975, N−1}``). The
Monte Carlo noise of an estimated verifier is inside this interval (each per-position estimate is
unbiased). Efficiency = mean acceptance / mean α* (ratio of means), its CI by the delta method on
the residuals ``acc_t − eff · α*_t`` with the same clustering. The paired gap ``acc_t − α*_t``
(and any two verifiers' difference, :mod:`otbound.report._paired`) gets the same interval.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import scipy.stats

from otbound._io import safe_name, write_text_atomic
from otbound._validation import SAMPLINGS, InvalidInputError, check_num_drafts
from otbound.token import SamplingParams

MEASURE_VERSION = 2  # 2: ot_fast joined the registry (cached measurements lack it)


def _verifier_registry():
    from otbound.token.verifiers import VERIFIERS

    return VERIFIERS


def measure_laws(p, q, num_drafts=(2, 3, 4), *, verifiers=None, samplings=SAMPLINGS, mc_samples: int = 64,
                 seed=0, device=None, batch_size: int | None = None) -> dict:
    """Per-position measurements of laws ``p``, ``q`` (positions × V). Returns a JSON-ready dict::

        {"optimal": {sampling: {K: [α*_t ...]}},
         "verifiers": {name: {K: {"acceptance": [...], "method": "exact" | "monte_carlo",
                                  "sampling": ..., "mc_samples": int | None}}},
         "skipped": {name: {K: reason}}}

    ``verifiers``: names in :data:`otbound.VERIFIERS` (default: all). The bounds and the verifiers
    of :data:`otbound.report._engine.ENGINE_VERIFIERS` come from the batched engine
    (:func:`otbound.report._engine.measure_batch`, on ``device``: a torch device, default the device of
    ``p`` if it is a tensor, else the CPU; ``batch_size`` positions per call); the others, and
    ``rrs_wor`` at K ≥ 3 where enumeration is exact (tiny V), row by row through
    ``verifier.acceptance``. Exact acceptances are exact to float64 rounding; the engine's Monte Carlo
    (``rrs_wor``, K ≥ 3) averages ``mc_samples`` Rao–Blackwellised paths per position, the per-row
    one ``mc_samples`` verified draft tuples (standard error ≤ 0.5/√mc_samples).
    """
    from otbound.report._engine import ENGINE_VERIFIERS, measure_rows

    registry = _verifier_registry()
    names = list(registry) if verifiers is None else list(verifiers)
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise InvalidInputError(f"unknown verifier(s) {unknown}; expected names in {sorted(registry)}")
    ks = [check_num_drafts(k) for k in np.atleast_1d(num_drafts).tolist()]
    needed = sorted(set(samplings) | {registry[n].sampling for n in names})
    on_engine = [n for n in names if n in ENGINE_VERIFIERS]
    batch = measure_rows(p, q, ks, samplings=needed, verifiers=on_engine, mc_samples=mc_samples, seed=seed,
                         device=device, batch_size=batch_size)
    rows = {}  # numpy copies of p and q, made only for the per-row verifiers

    def numpy_rows():
        if not rows:
            rows.update(p=_rows_numpy(p), q=_rows_numpy(q))
        return rows["p"], rows["q"]

    out = {"optimal": {s: {k: batch.optimal[s][k].tolist() for k in ks} for s in needed}, "verifiers": {},
           "skipped": {}}
    rng = np.random.default_rng(seed)
    for name in names:
        v = registry[name]
        for k in ks:
            if name in on_engine and not (name == "rrs_wor" and k >= 3 and _exact_per_row(v, p, q, k)):
                if k in batch.skipped.get(name, {}):
                    out["skipped"].setdefault(name, {})[k] = batch.skipped[name][k]
                    continue
                method = batch.methods[name][k]
                values = batch.verifiers[name][k].tolist()
            else:
                try:
                    values, method = _verifier_values(v, *numpy_rows(), k, mc_samples, rng)
                except InvalidInputError as exc:
                    out["skipped"].setdefault(name, {})[k] = str(exc)
                    continue
            out["verifiers"].setdefault(name, {})[k] = {
                "acceptance": values, "method": method, "sampling": v.sampling,
                "mc_samples": mc_samples if method == "monte_carlo" else None,
            }
    return out


def _rows_numpy(x):
    from otbound._backend import to_numpy

    return np.asarray(to_numpy(x)[0], dtype=np.float64)


def _exact_per_row(verifier, p, q, k):
    """Whether ``verifier.acceptance`` is exact on these rows (it enumerates the draft tuples when
    the vocabulary is tiny; asked of the first row, the answer depends only on V and K)."""
    p, q = _rows_numpy(p[:1]), _rows_numpy(q[:1])
    try:
        return p.shape[0] > 0 and verifier.acceptance(p[0], q[0], k) is not None
    except InvalidInputError:
        return False


def _verifier_values(v, p, q, k, mc_samples, rng):
    values, method = [], "exact"
    for pt, qt in zip(p, q):
        a, how = v.acceptance_or_estimate(pt, qt, k, mc_samples, rng)
        method = "monte_carlo" if how == "monte_carlo" else method
        values.append(float(a))
    return values, method


def measure_trace(record, num_drafts=(2, 3, 4), *, verifiers=None, samplings=SAMPLINGS, mc_samples: int = 64,
                  seed=0, cache_dir=None, device=None, batch_size: int | None = None, reuse: bool = True) -> dict:
    """:func:`measure_laws` on a :class:`TraceRecord`, plus its prompt id, dataset, temperature.

    With ``cache_dir`` the result is stored as ``<cache_dir>/<dataset>/T<T>/<id>.json`` (atomic)
    and reused only when its key matches: the measurement configuration and a content key of the
    trace (its tokens and its metadata: pair, converted-model digest, seed, temperature, ...; the
    logits are a function of these and are checked against their own checksums on load), never its
    file name, so a re-collected trace is measured again (``reuse=False``: never reused). The cache
    file carries a checksum of its own content; a damaged or edited one is recomputed (with a
    message). A record whose logits are torch tensors (streaming, see
    :func:`otbound.lm.collect_traces`) is measured on their device unless ``device`` says otherwise;
    a record stored without logits can only be read back from the cache.
    """
    from otbound._integrity import content_key, tensor_digest
    from otbound.lm import settings_dir

    trace_key = content_key({"tokens": tensor_digest(np.asarray(record.tokens, dtype=np.int64)),
                             "meta": {k: v for k, v in record.meta.items() if k != "sha256"}})
    sp, sq = record.sampling_params()  # the laws measured: the record's settings (stored, or given on load)
    config = {"version": MEASURE_VERSION, "num_drafts": [int(k) for k in np.atleast_1d(num_drafts)],
              "verifiers": None if verifiers is None else list(verifiers), "samplings": list(samplings),
              "mc_samples": int(mc_samples), "seed": int(seed),
              "trace": trace_key}
    if sp != SamplingParams(record.temperature) or sq != SamplingParams(record.temperature):
        config.update(target_sampling=sp.as_dict(), draft_sampling=sq.as_dict())
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / safe_name(record.dataset) / settings_dir(record.temperature, sp, sq) / (
            safe_name(record.prompt_id) + ".json")
        if reuse and path.exists():
            try:
                stored = json.loads(path.read_text())
                intact = stored.pop("sha256") == content_key(stored)
            except (ValueError, KeyError, AttributeError):
                intact = False
            if not intact:
                print(f"otbound: {path} is damaged (checksum or JSON); measuring again", file=sys.stderr)
            elif stored.get("config") == config:
                return _int_keys(stored)
    if record.target_logits is None:
        raise InvalidInputError(
            f"{record.path} was collected without logits (--store-logits none) and has no stored measurement "
            f"with this configuration {config}; measure with the configuration it was collected with, or recollect")
    cell_seed = [int(seed), zlib.crc32(f"{record.dataset}|{record.prompt_id}|{record.temperature!r}".encode())]
    p, q = _record_laws(record)
    res = measure_laws(p, q, num_drafts, verifiers=verifiers, samplings=samplings,
                       mc_samples=mc_samples, seed=cell_seed, device=device, batch_size=batch_size)
    res.update(prompt_id=record.prompt_id, dataset=record.dataset, temperature=record.temperature,
               positions=record.positions, model_dtype=record.meta.get("model_dtype"), config=config)
    if path is not None:
        plain = json.loads(json.dumps(res))  # the JSON form that is read back and checked
        write_text_atomic(path, json.dumps(dict(plain, sha256=content_key(plain))))
    return _int_keys(json.loads(json.dumps(res)))


def _record_laws(record):
    """``(p, q)`` of a record: float64 laws of its logits under its sampling settings (softmax of
    logits / T by default). Logits in numpy or on the CPU:
    :func:`otbound.lm.laws64`, bit for bit what a reread of the stored trace gives; torch tensors on
    an accelerator: the same max-shifted formula there (equal up to float64 rounding, ~1e-16)."""
    from otbound._backend import is_torch
    from otbound.token.logits import laws_from_logits as laws64

    if not is_torch(record.target_logits):
        return record.p, record.q
    settings = record.sampling_params()
    ctx = record.contexts() if any(s.needs_context for s in settings) else None
    if record.target_logits.device.type == "cpu":
        return tuple(laws64(x.float().numpy(), s, ctx) for x, s in zip((record.target_logits, record.draft_logits),
                                                                        settings))
    import torch

    if settings == (SamplingParams(record.temperature),) * 2:
        return tuple(torch.softmax(x.double() / float(record.temperature), dim=-1)
                     for x in (record.target_logits, record.draft_logits))
    return tuple(s.laws(x.double(), ctx) for x, s in zip((record.target_logits, record.draft_logits), settings))


def _int_keys(res: dict) -> dict:
    """JSON turns the K keys into strings; turn them back."""
    res["optimal"] = {s: {int(k): v for k, v in d.items()} for s, d in res["optimal"].items()}
    res["verifiers"] = {n: {int(k): v for k, v in d.items()} for n, d in res["verifiers"].items()}
    res["skipped"] = {n: {int(k): v for k, v in d.items()} for n, d in res["skipped"].items()}
    return res


def cluster_mean_ci(values, clusters, confidence: float = 0.95) -> tuple[float, float]:
    """``(mean, half-width)`` of the mean of ``values`` with a cluster-robust CI (see module doc)."""
    x = np.asarray(values, dtype=np.float64)
    g = np.asarray(clusters)
    n = x.size
    if n == 0:
        return float("nan"), float("nan")
    mean = float(x.mean())
    labels = np.unique(g)
    c = labels.size
    if c >= 2:
        sums = np.array([np.sum(x[g == lab] - mean) for lab in labels])
        se = np.sqrt(c / (c - 1) * np.sum(sums**2)) / n
        dof = c - 1
    elif n >= 2:
        se, dof = float(x.std(ddof=1) / np.sqrt(n)), n - 1
    else:
        return mean, float("nan")
    return mean, float(scipy.stats.t.ppf(0.5 + confidence / 2, dof) * se)


def trace_cells(results):
    """Yield ``(dataset, T, traces, cluster ids, Ks)`` for each (dataset, temperature) cell of per-trace
    results, cells sorted; the cluster id of each position is its trace's index within the cell."""
    cells: dict = {}
    for r in results:
        cells.setdefault((r["dataset"], float(r["temperature"])), []).append(r)
    for (dataset, temp), group in sorted(cells.items()):
        clusters = np.concatenate([[i] * r["positions"] for i, r in enumerate(group)])
        ks = sorted({k for r in group for d in r["optimal"].values() for k in d})
        yield dataset, temp, group, clusters, ks


def aggregate(results, confidence: float = 0.95) -> list[dict]:
    """Rows per (dataset, temperature, K, verifier) from :func:`measure_trace` results.

    Row keys: dataset, temperature, num_drafts, sampling, verifier, method, mc_samples,
    acceptance, acceptance_ci (half-width), optimal (mean α* of the verifier's law), optimal_ci,
    efficiency, efficiency_ci, gap and gap_ci (the paired gap: mean of acc_t − α*_t over the same
    positions, cluster-robust; far tighter than the two separate intervals), positions, prompts,
    model_dtype (of the traces, if recorded).
    One extra row per draft law with ``verifier="optimal"`` (acceptance = α*, efficiency 1).
    Skipped verifiers appear with acceptance None and their reason under ``skipped``.
    """
    rows = []
    for dataset, temp, group, clusters, ks in trace_cells(results):
        for k in ks:
            dtypes = sorted({r.get("model_dtype") for r in group}, key=str)
            base = dict(dataset=dataset, temperature=temp, num_drafts=k, positions=int(clusters.size),
                        prompts=len(group), model_dtype=dtypes[0] if len(dtypes) == 1 else dtypes)
            opt = {s: np.concatenate([r["optimal"][s][k] for r in group]) for s in group[0]["optimal"]}
            for s, vals in opt.items():
                m, h = cluster_mean_ci(vals, clusters, confidence)
                rows.append(dict(base, sampling=s, verifier="optimal", method="exact", mc_samples=None,
                                 acceptance=m, acceptance_ci=h, optimal=m, optimal_ci=h, efficiency=1.0,
                                 efficiency_ci=0.0, gap=0.0, gap_ci=0.0))
            names = sorted({n for r in group for n in list(r["verifiers"]) + list(r["skipped"])})
            for name in names:
                entries = [r["verifiers"].get(name, {}).get(k) for r in group]
                if any(e is None for e in entries):
                    reasons = [r["skipped"].get(name, {}).get(k) for r in group]
                    reason = next((x for x in reasons if x), None)
                    if reason is None:  # name not measured at this K at all
                        continue
                    rows.append(dict(base, sampling=None, verifier=name, method="skipped", mc_samples=None,
                                     acceptance=None, acceptance_ci=None, optimal=None, optimal_ci=None,
                                     efficiency=None, efficiency_ci=None, skipped=reason))
                    continue
                s = entries[0]["sampling"]
                acc = np.concatenate([e["acceptance"] for e in entries])
                a, ah = cluster_mean_ci(acc, clusters, confidence)
                o, oh = cluster_mean_ci(opt[s], clusters, confidence)
                eff = a / o if o > 0 else float("nan")
                _, r_h = cluster_mean_ci(acc - eff * opt[s], clusters, confidence)
                gap, gap_h = cluster_mean_ci(acc - opt[s], clusters, confidence)
                methods = {e["method"] for e in entries}
                rows.append(dict(base, sampling=s, verifier=name,
                                 method="monte_carlo" if "monte_carlo" in methods else "exact",
                                 mc_samples=max((e["mc_samples"] or 0) for e in entries) or None,
                                 acceptance=a, acceptance_ci=ah, optimal=o, optimal_ci=oh,
                                 efficiency=eff, efficiency_ci=r_h / o if o > 0 else float("nan"),
                                 gap=gap, gap_ci=gap_h))
    return rows
