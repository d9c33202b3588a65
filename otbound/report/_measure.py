"""Measurements on stored traces: per-position optimal acceptance α* and each verifier's
acceptance, aggregated per (dataset, temperature, K) with 95% confidence intervals.

Per position ``t`` (laws ``p_t``, ``q_t`` of a trace, temperature already applied):

* ``α*`` for every draft law in ``samplings`` and every ``K`` — the token layer's batched kernel
  (:class:`otbound.token.LawBatch`: torch, CPU or CUDA, one ratio sort per row, the same values as
  :func:`otbound.optimal_acceptance`);
* each verifier's acceptance ``P(Y ∈ x̄)`` under its own draft law, asked of every verifier of
  :data:`otbound.VERIFIERS` on the same batch (:meth:`otbound.token.Verifier.batch_estimate`): the
  closed forms of nss, rrs, rrs_wor (K ≤ 2), kseq, spechub, greedy and ot on the shared sorted
  rows; rrs_wor at K ≥ 3 a Rao–Blackwellised Monte Carlo average of ``mc_samples`` paths unless V
  is tiny enough for exact enumeration; the others their exact value when they have one, else a
  Monte Carlo estimate from ``mc_samples`` draft tuples (:func:`otbound.sample_drafts`) run through
  ``verifier.sample``. (Averaging the exact conditional acceptance ``P(Y ∈ x̄ | x̄)`` of
  ``verifier.conditional_law`` instead cost twice as much per draw on the real pair, for estimates
  about as spread.) A verifier that refuses the input (e.g. K above its ``max_drafts``, or V too
  large for an LP-based one) is skipped with its reason recorded.

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

from otbound._backend import on_one_cpu_thread, positive_counts
from otbound._io import json_text, safe_name, write_text_atomic
from otbound._validation import InvalidInputError, check_num_drafts, check_positive_int, check_real
from otbound.token import SamplingParams
from otbound.token.draft_laws import SAMPLINGS, draft_law

MEASURE_VERSION = 4  # 4: one rule at the top-p / min-p cuts for numpy and torch (laws on a cut may differ from 3)


#: bytes of working memory per (row, token) of a measurement (a dozen float64 / int64 rows)
_BYTES_PER_CELL = 112


def _default_batch_size(vocab: int, device) -> int:
    """Positions per batch of :func:`measure_laws`: about 256 MB of working memory on the CPU (15
    positions at V = 151,936), 8 GB on a GPU."""
    budget = 8 * 2**30 if str(device).startswith("cuda") else 256 * 2**20
    return max(1, budget // (_BYTES_PER_CELL * max(vocab, 1)))


@on_one_cpu_thread
def measure_laws(p, q, num_drafts=(2, 3, 4), *, verifiers=None, samplings=SAMPLINGS, mc_samples: int = 64,
                 seed=0, device=None, batch_size: int | None = None) -> dict:
    """Per-position measurements of laws ``p``, ``q`` (positions × V): α* for every draft law in
    ``samplings`` (and every verifier's own law) and each K, and every verifier's acceptance.

    The positions go in batches of ``batch_size`` (default: about 256 MB of working memory on the CPU, 15
    positions at V = 151,936; 8 GB on a GPU) on
    ``device`` (a torch device; default the device of ``p`` if it is a tensor, else the CPU). Each
    batch is one :class:`otbound.token.LawBatch`, sorted once by ratio; α* comes from
    :meth:`~otbound.token.LawBatch.optimal_acceptance` and each verifier of :data:`otbound.VERIFIERS`
    answers through its :meth:`~otbound.token.Verifier.batch_estimate`: its exact acceptance
    (closed forms on the shared sorted rows, or enumeration at tiny V), else a Monte Carlo
    estimate — RRS without replacement at K ≥ 3 averages ``mc_samples`` Rao–Blackwellised paths per
    position (seeded per batch ``c`` by ``SeedSequence(seed).spawn(...)[c]``, so values depend on
    ``batch_size`` but not on the device), the others ``mc_samples`` verified draft tuples
    (standard error ≤ 0.5/√mc_samples). A verifier that refuses the input (K above its
    ``max_drafts``, V too large for an LP-based one) is skipped with its reason.
    The torch work runs on one intra-op CPU thread, the caller's setting restored after
    (:func:`otbound._backend.one_cpu_thread`: rows of 10⁵ entries are too small for intra-op
    threads, whose hand-offs made the call 10× slower on two busy cores).

    **Rows with fewer than K draft tokens.** A truncated draft law (top-k, top-p, min-p) can keep
    fewer tokens of positive mass than K. The K drafts of the laws of distinct tokens (without
    replacement, greedy, deterministic) then cannot be distinct, so such a row is measured as the
    scheme that drafts every token of its support: α* and each verifier of those laws at
    ``K' = min(K, support)`` (the only tuple law left is that of the whole support, so α* at K' is
    the optimum of the row). With replacement is unaffected (its K draws may repeat). The
    number of rows so measured is returned per K under ``capped``; no row is skipped.

    Parameters
    ----------
    p, q : array_like or torch.Tensor, shape (positions, V) or (V,)
        Target and draft laws.
    num_drafts : int or sequence of int
        The K to measure.
    verifiers : sequence of str, optional
        Names in :data:`otbound.VERIFIERS` (default: every verifier with ``in_default_measurement``;
        the verifiers without replacement ``ot_wor_iid``, ``ot_wor_top`` and ``ot_wor``, whose exact
        acceptance needs a coupling or an LP per row, only when named).
    samplings : sequence of str
        Draft laws whose α* is reported (each verifier's own law is added).
    mc_samples : int
        Monte Carlo paths or tuples per position where no exact value exists.
    seed : int or sequence of int
    device : str or torch.device, optional
    batch_size : int, optional

    Returns
    -------
    dict
        JSON-ready::

            {"optimal": {sampling: {K: [α*_t ...]}},
             "verifiers": {name: {K: {"acceptance": [...], "method": "exact" | "monte_carlo",
                                      "sampling": ..., "mc_samples": int | None}}},
             "skipped": {name: {K: reason}},
             "capped": {K: rows measured at K' = support < K}}   # only the K with such rows

    Raises
    ------
    InvalidInputError
        Malformed laws, an unknown verifier, a non-positive ``batch_size`` or ``mc_samples``.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.report import measure_laws
    >>> p, q = np.array([[0.5, 0.3, 0.2]]), np.array([[0.2, 0.3, 0.5]])
    >>> res = measure_laws(p, q, (2,), verifiers=["rrs", "spechub"])
    >>> [round(x, 6) for x in res["optimal"]["with_replacement"][2]]
    [0.86]
    >>> res["verifiers"]["rrs"][2]["method"], [round(x, 6) for x in res["verifiers"]["rrs"][2]["acceptance"]]
    ('exact', [0.76])

    A draft truncated to one token (top-1) is drafted alone: K = 2 without replacement is measured at K' = 1,
    where α* = p(the token):

    >>> res = measure_laws(p, np.array([[1.0, 0.0, 0.0]]), (2,), verifiers=["rrs_wor"], samplings=())
    >>> res["capped"], res["optimal"]["without_replacement"][2], res["verifiers"]["rrs_wor"][2]["acceptance"]
    ({2: 1}, [0.5], [0.5])
    """
    import torch

    from otbound.token import LawBatch
    from otbound.token.verifiers import VERIFIERS

    if verifiers is None:
        names = [n for n, v in VERIFIERS.items() if v.in_default_measurement]
    else:
        names = list(verifiers)
    unknown = [n for n in names if n not in VERIFIERS]
    if unknown:
        raise InvalidInputError(f"unknown verifier(s) {unknown}; expected names in {sorted(VERIFIERS)}")
    mc_samples = check_positive_int(mc_samples, "mc_samples")
    ks = [check_num_drafts(k) for k in np.atleast_1d(num_drafts).tolist()]
    if not ks:
        raise InvalidInputError("num_drafts must list at least one number of drafts K")
    samplings = [draft_law(s).name for s in samplings]
    needed = sorted(set(samplings) | {VERIFIERS[n].sampling for n in names})
    if device is None:
        device = p.device if isinstance(p, torch.Tensor) else "cpu"
    p = torch.as_tensor(check_real(p, "p"), dtype=torch.float64)
    q = torch.as_tensor(check_real(q, "q"), dtype=torch.float64)
    if p.ndim == 1:
        p, q = p.reshape(1, -1), q.reshape(1, -1)
    b = _default_batch_size(p.shape[-1], device) if batch_size is None else batch_size
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
        raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    b = int(b)
    n_rows = p.shape[0]
    seeds = np.random.SeedSequence(seed).spawn(max(1, -(-n_rows // b)))
    rng = np.random.default_rng(seed)  # the per-row Monte Carlo of verifiers without a batched one
    optimal = {s: {k: [] for k in ks} for s in needed}
    values = {n: {k: [] for k in ks} for n in names}
    methods: dict = {n: {} for n in names}
    skipped: dict = {}
    support = positive_counts(q)  # (positions,) tokens of positive draft mass per row
    capped = {k: int((support < k).sum()) for k in ks}
    for c, start in enumerate(range(0, max(n_rows, 1), b)):
        rows = slice(start, start + b)
        n = p[rows].shape[0]
        # Rows whose draft keeps fewer tokens than the largest K form their own groups (the cap rule
        # of the docstring); with no such row the batch is one group seeded by seeds[c].
        caps = support[rows].clamp(max=max(ks))  # (n,)
        groups = [(int(cap), torch.nonzero(caps == cap).flatten()) for cap in caps.unique(sorted=True).tolist()]
        group_seeds = [seeds[c]] if len(groups) == 1 else seeds[c].spawn(len(groups))
        opt_batch = {s: {k: torch.empty(n, dtype=torch.float64) for k in ks} for s in needed}
        val_batch = {name: {k: torch.empty(n, dtype=torch.float64) for k in ks} for name in names}
        for (cap, idx), gseed in zip(groups, group_seeds):
            sub = (slice(start, start + n) if len(groups) == 1 else idx + start)
            batch = LawBatch(p[sub].to(device), q[sub].to(device), seed=gseed)
            if any(draft_law(s).sorted_rows for s in needed):
                _ = batch.sorted  # sorted first, as these laws need it: the greedy α* then reads its prefix sums too
            for s in needed:
                for k in ks:
                    opt_batch[s][k][idx] = batch.optimal_acceptance(_capped_k(k, cap, s), s).cpu()
            for name in names:
                law = VERIFIERS[name].sampling
                keff = {k: _capped_k(k, cap, law) for k in ks}
                res_at = VERIFIERS[name].batch_estimate(batch, sorted(set(keff.values())), mc_samples, rng)
                for k in ks:
                    res = res_at[keff[k]]
                    if isinstance(res, Exception):
                        skipped.setdefault(name, {})[k] = str(res)
                        continue
                    val_batch[name][k][idx] = res[0].cpu().to(torch.float64)
                    if methods[name].get(k) != "monte_carlo":
                        methods[name][k] = res[1]
        for s in needed:
            for k in ks:
                optimal[s][k].append(opt_batch[s][k])
        for name in names:
            for k in ks:
                values[name][k].append(val_batch[name][k])
    out = {"optimal": {s: {k: torch.cat(v).tolist() for k, v in d.items()} for s, d in optimal.items()},
           "verifiers": {}, "skipped": skipped, "capped": {k: c for k, c in capped.items() if c}}
    for name in names:
        v = VERIFIERS[name]
        for k in ks:
            if k in skipped.get(name, {}):
                continue
            method = methods[name][k]
            out["verifiers"].setdefault(name, {})[k] = {
                "acceptance": torch.cat(values[name][k]).tolist(), "method": method, "sampling": v.sampling,
                "mc_samples": mc_samples if method == "monte_carlo" else None,
            }
    return out


def _capped_k(k: int, cap: int, sampling: str) -> int:
    """The number of drafts a row with ``cap`` tokens of positive draft mass gets under ``sampling``:
    ``min(K, cap)`` for the laws of distinct tokens, ``K`` for the others (with replacement)."""
    return min(k, cap) if draft_law(sampling).distinct else k


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

    Parameters
    ----------
    record : otbound.lm.TraceRecord
        The trace: its target and draft logits (or none, then only the cache can answer), tokens,
        prompt id, dataset, temperature and sampling settings.
    num_drafts, verifiers, samplings, mc_samples, device, batch_size
        As in :func:`measure_laws`.
    seed : int
        Run seed; each trace is measured with the seed ``[seed, crc32("dataset|prompt id|T")]``.
    cache_dir : str or pathlib.Path, optional
        Folder of the measurement cache (none when None).
    reuse : bool
        Read a matching cached measurement instead of measuring again.

    Returns
    -------
    dict
        :func:`measure_laws`'s result plus ``prompt_id``, ``dataset``, ``temperature``,
        ``positions``, ``model_dtype`` and ``config`` (the cache key), K keys as ints.

    Raises
    ------
    InvalidInputError
        A record without logits and no matching cached measurement, or bad input to
        :func:`measure_laws`.

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np
    >>> from otbound.lm import TraceRecord
    >>> from otbound.report import measure_trace
    >>> target = np.log([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2]])  # logits at the two generated positions
    >>> draft = np.log([[0.2, 0.3, 0.5], [0.3, 0.4, 0.3]])
    >>> record = TraceRecord("p0", "demo", 1.0, np.array([1, 0, 2]), 1, target, draft)
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     res = measure_trace(record, (2,), verifiers=["rrs"], samplings=("with_replacement",),
    ...                         cache_dir=cache)
    ...     again = measure_trace(record, (2,), verifiers=["rrs"], samplings=("with_replacement",),
    ...                           cache_dir=cache)  # read back from the cache
    >>> res["positions"], [round(x, 4) for x in res["optimal"]["with_replacement"][2]]
    (2, [0.86, 0.91])
    >>> [round(x, 4) for x in res["verifiers"]["rrs"][2]["acceptance"]], again == res
    ([0.76, 0.79], True)
    """
    from otbound._integrity import content_key

    trace_key = _trace_key(record)
    sp, sq = record.sampling_params()  # the laws measured: the record's settings (stored, or given on load)
    config = {"version": MEASURE_VERSION, "num_drafts": [int(k) for k in np.atleast_1d(num_drafts)],
              "verifiers": None if verifiers is None else list(verifiers), "samplings": list(samplings),
              "mc_samples": int(mc_samples), "seed": int(seed),
              "trace": trace_key}
    if sp != SamplingParams(record.temperature) or sq != SamplingParams(record.temperature):
        config.update(target_sampling=sp.as_dict(), draft_sampling=sq.as_dict())
    path = None
    if cache_dir is not None:
        path = _cache_path(record, cache_dir)
        if reuse and path.exists():
            stored = _read_cached(path)
            if stored is None:
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
        plain = json.loads(json_text(res))  # the JSON form that is read back and checked
        write_text_atomic(path, json_text(dict(plain, sha256=content_key(plain))))
    return _int_keys(json.loads(json_text(res)))


def _trace_key(record) -> str:
    """Content key of a trace: its tokens and its metadata (never its file name)."""
    from otbound._integrity import content_key, tensor_digest

    return content_key({"tokens": tensor_digest(np.asarray(record.tokens, dtype=np.int64)),
                        "meta": {k: v for k, v in record.meta.items() if k != "sha256"}})


def _cache_path(record, cache_dir) -> Path:
    from otbound.lm import settings_dir

    sp, sq = record.sampling_params()
    return Path(cache_dir) / safe_name(record.dataset) / settings_dir(record.temperature, sp, sq) / (
        safe_name(record.prompt_id) + ".json")


def _read_cached(path):
    """A cache file's content, or None when it is unreadable or its checksum fails."""
    from otbound._integrity import content_key

    try:
        stored = json.loads(Path(path).read_text())
        return stored if stored.pop("sha256") == content_key(stored) else None
    except (ValueError, KeyError, AttributeError, OSError):
        return None


def stored_measurement(record, cache_dir):
    """The measurement of ``record`` stored in ``cache_dir`` by :func:`measure_trace`, whatever
    configuration (K, verifiers, draft laws) it was made with, when it is intact and was made on this
    trace (the same content key of tokens and metadata); None otherwise. Nothing is measured or written.

    Parameters
    ----------
    record : otbound.lm.TraceRecord
        The trace.
    cache_dir : str or pathlib.Path
        The measurement cache (``<report>/measure``).

    Returns
    -------
    dict or None
        As :func:`measure_trace` returns it (its ``config`` says what was measured), K keys as ints.

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np
    >>> from otbound.lm import TraceRecord
    >>> from otbound.report import measure_trace, stored_measurement
    >>> record = TraceRecord("p0", "demo", 1.0, np.array([1, 0]), 1, np.log([[0.5, 0.3, 0.2]]),
    ...                      np.log([[0.2, 0.3, 0.5]]))
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     before = stored_measurement(record, cache)
    ...     res = measure_trace(record, (2,), verifiers=["rrs"], samplings=("with_replacement",), cache_dir=cache)
    ...     after = stored_measurement(record, cache)
    >>> before is None, after == res, after["config"]["num_drafts"]
    (True, True, [2])
    """
    path = _cache_path(record, cache_dir)
    if not path.exists():
        return None
    stored = _read_cached(path)
    if stored is None or stored.get("config", {}).get("trace") != _trace_key(record):
        return None
    return _int_keys(stored)


def _record_laws(record):
    """``(p, q)`` of a record: float64 laws of its logits under its sampling settings (softmax of
    logits / T by default). Logits in numpy or on the CPU:
    :func:`otbound.laws_from_logits`, bit for bit what a reread of the stored trace gives; torch tensors on
    an accelerator: :meth:`otbound.SamplingParams.laws` there, the same steps in torch (equal up to
    float64 rounding, ~1e-16, every cut decided alike; taken on the CPU too inside
    :func:`otbound._backend.accelerator_paths`, where the tests compare the two)."""
    from otbound._backend import is_torch, on_accelerator
    from otbound.token.logits import laws_from_logits

    if not is_torch(record.target_logits):
        return record.p, record.q
    settings = record.sampling_params()
    ctx = record.contexts() if any(s.needs_context for s in settings) else None
    if not on_accelerator(record.target_logits):
        return tuple(laws_from_logits(x.float().numpy(), s, ctx)
                     for x, s in zip((record.target_logits, record.draft_logits), settings))
    return tuple(s.laws(x.double(), ctx) for x, s in zip((record.target_logits, record.draft_logits), settings))


def _int_keys(res: dict) -> dict:
    """JSON turns the K keys into strings; turn them back (in the fields ``res`` has)."""
    for field in ("optimal", "verifiers", "skipped"):
        if field in res:
            res[field] = {n: {int(k): v for k, v in d.items()} for n, d in res[field].items()}
    res["capped"] = {int(k): v for k, v in res.get("capped", {}).items()}
    return res


def cluster_mean_ci(values, clusters, confidence: float = 0.95) -> tuple[float, float]:
    """``(mean, half-width)`` of the mean of ``values`` with a cluster-robust CI (see module doc).

    ``SE² = C/(C−1) · Σ_c (Σ_{t∈c} (x_t − x̄))² / N²`` over the ``C`` clusters and half-width
    ``t_{(1+confidence)/2, C−1} · SE``; with one cluster, i.i.d. values and ``N − 1`` degrees of
    freedom. The one interval of every report: positions clustered by their trace (prompt) in the
    real report; independent observations (the synthetic report's instances) each their own
    cluster, where it is Student's ``t_{(1+confidence)/2, N−1} · s / √N``.

    Parameters
    ----------
    values : array_like
        The ``N`` values.
    clusters : array_like
        A cluster label per value (e.g. the prompt of each position).
    confidence : float
        Coverage of the interval.

    Returns
    -------
    mean : float
        NaN when ``values`` is empty.
    half_width : float
        NaN when there are no values or a single one.

    Examples
    --------
    >>> from otbound.report import cluster_mean_ci
    >>> mean, half = cluster_mean_ci([0.5, 0.7, 0.6, 0.8], clusters=[0, 0, 1, 1])
    >>> round(mean, 4), round(half, 4)
    (0.65, 0.6353)
    >>> cluster_mean_ci([0.5], [0])
    (0.5, nan)
    """
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
    results, cells sorted; the cluster id of each position is its trace's index within the cell. The
    results may be as measured or as read back from JSON (K keys as strings): the traces yielded
    have int K keys (shallow copies; the results given are not changed)."""
    cells: dict = {}
    for r in results:
        r = _int_keys(dict(r))
        cells.setdefault((r["dataset"], float(r["temperature"])), []).append(r)
    for (dataset, temp), group in sorted(cells.items()):
        clusters = np.concatenate([[i] * r["positions"] for i, r in enumerate(group)])
        ks = sorted({k for r in group for d in r["optimal"].values() for k in d})
        yield dataset, temp, group, clusters, ks


def _declared_lossless(registry, name: str) -> bool | None:
    return bool(registry[name].lossless) if name in registry else None


def aggregate(results, confidence: float = 0.95) -> list[dict]:
    """Rows per (dataset, temperature, K, verifier) from :func:`measure_trace` results.

    Row keys: dataset, temperature, num_drafts, sampling, verifier, method, mc_samples,
    acceptance, acceptance_ci (half-width), optimal (mean α* of the verifier's law), optimal_ci,
    efficiency, efficiency_ci, gap and gap_ci (the paired gap: mean of acc_t − α*_t over the same
    positions, cluster-robust; far tighter than the two separate intervals), positions, prompts,
    model_dtype (of the traces, if recorded), lossless (the verifier's declared ``lossless``; None for
    a name outside :data:`otbound.VERIFIERS`); the ``optimal`` rows also carry capped_positions (the
    positions whose draft kept fewer than K tokens, measured at K' = their support: see
    :func:`measure_laws`).
    One extra row per draft law with ``verifier="optimal"`` (acceptance = α*, efficiency 1).
    Skipped verifiers appear with acceptance None and their reason under ``skipped``.

    Parameters
    ----------
    results : iterable of dict
        Results of :func:`measure_trace` or :func:`measure_laws` (with dataset, temperature and
        positions added), one per trace: cells by dataset and temperature, the traces of a cell as
        clusters. As measured or as read back from JSON (K keys as strings, e.g. from a checkpoint).
    confidence : float
        Coverage of every interval (:func:`cluster_mean_ci`).

    Returns
    -------
    list of dict
        The rows, cells sorted by (dataset, temperature), then K.

    Raises
    ------
    KeyError
        A result lacking a field of :func:`measure_trace`'s results.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.lm import TraceRecord
    >>> from otbound.report import aggregate, measure_trace
    >>> target = np.log([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2]])
    >>> draft = np.log([[0.2, 0.3, 0.5], [0.3, 0.4, 0.3]])
    >>> records = [TraceRecord(f"p{i}", "demo", 1.0, np.array([1, 0, 2]), 1, t, draft)
    ...            for i, t in enumerate((target, target[::-1]))]
    >>> results = [measure_trace(r, (2,), verifiers=["rrs"], samplings=("with_replacement",)) for r in records]
    >>> for row in aggregate(results):
    ...     print(row["verifier"], row["positions"], row["prompts"], round(row["acceptance"], 4),
    ...           round(row["efficiency"], 4), round(row["gap"], 4))
    optimal 4 2 0.8825 1.0 0.0
    rrs 4 2 0.7725 0.8754 -0.11
    >>> import json
    >>> aggregate(json.loads(json.dumps(results))) == aggregate(results)   # stored as JSON, read back
    True
    """
    rows = []
    from otbound.token.verifiers import VERIFIERS as registry

    for dataset, temp, group, clusters, ks in trace_cells(results):
        for k in ks:
            dtypes = sorted({r.get("model_dtype") for r in group}, key=str)
            base = dict(dataset=dataset, temperature=temp, num_drafts=k, positions=int(clusters.size),
                        prompts=len(group), model_dtype=dtypes[0] if len(dtypes) == 1 else dtypes)
            capped = sum(int(r.get("capped", {}).get(k, 0)) for r in group)
            opt = {s: np.concatenate([r["optimal"][s][k] for r in group]) for s in group[0]["optimal"]}
            for s, vals in opt.items():
                m, h = cluster_mean_ci(vals, clusters, confidence)
                rows.append(dict(base, sampling=s, verifier="optimal", method="exact", mc_samples=None,
                                 acceptance=m, acceptance_ci=h, optimal=m, optimal_ci=h, efficiency=1.0,
                                 efficiency_ci=0.0, gap=0.0, gap_ci=0.0,
                                 capped_positions=capped if draft_law(s).distinct else 0))
            names = sorted({n for r in group for n in list(r["verifiers"]) + list(r["skipped"])})
            for name in names:
                entries = [r["verifiers"].get(name, {}).get(k) for r in group]
                if any(e is None for e in entries):
                    reasons = [r["skipped"].get(name, {}).get(k) for r in group]
                    reason = next((x for x in reasons if x), None)
                    if reason is None:  # name not measured at this K at all
                        continue
                    rows.append(dict(base, sampling=None, verifier=name, lossless=_declared_lossless(registry, name),
                                     method="skipped", mc_samples=None,
                                     acceptance=None, acceptance_ci=None, optimal=None, optimal_ci=None,
                                     efficiency=None, efficiency_ci=None, skipped=reason))
                    continue
                s = entries[0]["sampling"]
                acc = np.concatenate([e["acceptance"] for e in entries])
                a, ah = cluster_mean_ci(acc, clusters, confidence)
                o, oh = cluster_mean_ci(opt[s], clusters, confidence)
                eff = a / o if o > 0 else None
                _, r_h = cluster_mean_ci(acc - eff * opt[s], clusters, confidence) if o > 0 else (None, None)
                gap, gap_h = cluster_mean_ci(acc - opt[s], clusters, confidence)
                methods = {e["method"] for e in entries}
                rows.append(dict(base, sampling=s, verifier=name, lossless=_declared_lossless(registry, name),
                                 method="monte_carlo" if "monte_carlo" in methods else "exact",
                                 mc_samples=max((e["mc_samples"] or 0) for e in entries) or None,
                                 acceptance=a, acceptance_ci=ah, optimal=o, optimal_ci=oh,
                                 efficiency=eff, efficiency_ci=r_h / o if o > 0 else None,
                                 **({} if o > 0 else {"efficiency_undefined": "α* = 0 at every position: "
                                                                             "acceptance / α* is 0/0"}),
                                 gap=gap, gap_ci=gap_h))
    return rows
