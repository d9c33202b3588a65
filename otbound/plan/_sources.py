"""Where a plan's acceptance comes from: a report's run folder of traces, traces collected here, or
a synthetic pair (seconds, for trying the planner)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from otbound._validation import InvalidInputError
from otbound.plan._acceptance import DEFAULT_VERIFIERS, measure_table
from otbound.plan._cost import CostCurve, CostModel, machine_description, measure_verify_costs
from otbound.token.verifiers import VERIFIERS

#: pair fields every trace of one plan shares
PAIR_FIELDS = ("pair", "sources", "model_dtype", "vocab_size")


def trace_files(folder) -> list[Path]:
    """The trace files of a run folder (``<folder>/traces/**``, or ``<folder>/**`` if it has no
    ``traces`` subfolder).

    Raises
    ------
    InvalidInputError
        No folder, or no trace file in it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidInputError(f"no run folder at {folder}")
    root = folder / "traces" if (folder / "traces").is_dir() else folder
    files = sorted(root.rglob("*.safetensors"))
    if not files:
        raise InvalidInputError(f"run folder {folder} holds no traces (no .safetensors under {root})")
    return files


def load_run_traces(folder, *, temperature=None, dataset=None) -> list:
    """The :class:`otbound.lm.TraceRecord` of one pair and one temperature in a run folder.

    Raises
    ------
    InvalidInputError
        Empty folder; traces of several pairs (or model dtypes, vocabularies); several temperatures
        without ``temperature``; none left after the filters; traces stored without logits.
    """
    from otbound.lm import load_traces

    files = trace_files(folder)
    records = [r for f in files for r in load_traces(f)]
    if not records:
        raise InvalidInputError(f"run folder {folder} holds no otbound traces")
    pairs = {tuple(json.dumps(r.meta.get(k), sort_keys=True) for k in PAIR_FIELDS) for r in records}
    if len(pairs) > 1:
        raise InvalidInputError(f"run folder {folder} mixes traces of {len(pairs)} different pairs "
                                f"({sorted({r.meta.get('pair') for r in records}, key=str)}): plan one pair at a time")
    temps = sorted({float(r.temperature) for r in records})
    if temperature is None and len(temps) > 1:
        raise InvalidInputError(f"run folder {folder} mixes temperatures {temps}: choose one with --temperature")
    if temperature is not None:
        records = [r for r in records if float(r.temperature) == float(temperature)]
    if dataset is not None:
        records = [r for r in records if r.dataset == dataset]
    if not records:
        raise InvalidInputError(f"no trace in {folder} at temperature {temperature} and dataset {dataset} "
                                f"(it has temperatures {temps})")
    if any(r.target_logits is None for r in records):
        raise InvalidInputError(f"traces in {folder} were stored without logits (--store-logits none): the planner "
                                f"needs the laws at every position; recollect with logits")
    return records


def table_from_records(records, *, max_drafts: int, verifiers=DEFAULT_VERIFIERS, laws=None, mc_samples: int = 16,
                       seed: int = 0, progress: bool = False, cache_dir=None):
    """Measure an acceptance table on trace records (all of one pair and temperature).

    ``cache_dir``: a report's measurement cache (``<run>/measure``); what it holds for a trace
    (:func:`otbound.report.stored_measurement`: the report's K, verifiers and draft laws) is taken
    from it, the rest (e.g. K = 1, which the report does not measure) measured here.
    """
    from otbound._io import progress_bar
    from otbound.report import stored_measurement

    bar = progress_bar(len(records), "measuring traces", progress)

    def laws_of():
        for r in records:
            yield r.p, r.q
            bar.update(1)

    r0 = records[0]
    source = {"pair": r0.meta.get("pair"), "temperature": float(r0.temperature),
              "datasets": sorted({r.dataset for r in records}), "traces": len(records),
              "positions": int(sum(r.positions for r in records)), "vocab_size": r0.meta.get("vocab_size"),
              "model_dtype": r0.meta.get("model_dtype")}
    stored = [stored_measurement(r, cache_dir) for r in records] if cache_dir is not None else None
    if stored is not None:
        ks = sorted({k for x in stored if x for k in x["config"]["num_drafts"]})
        source["stored_measurements"] = {"folder": str(cache_dir), "traces": sum(x is not None for x in stored),
                                         "num_drafts": ks}
    table = measure_table(laws_of(), max_drafts=max_drafts, verifiers=verifiers, laws=laws, mc_samples=mc_samples,
                          seed=seed, source=source, ids=[(r.prompt_id, r.dataset) for r in records], stored=stored)
    bar.close()
    return table


#: the synthetic pair's vocabulary
SYNTHETIC_VOCAB = 16


def synthetic_laws(num_traces: int = 8, positions: int = 24, *, vocab_size: int = SYNTHETIC_VOCAB, seed: int = 0):
    """``[(p, q), ...]`` per synthetic trace: ``p_t ~ Dirichlet(0.5)`` over ``vocab_size`` tokens and
    ``q_t = (1 − w)·p_t + w·Dirichlet(0.5)``, the draft weight ``w ~ U(0.3, 0.8)`` per trace (traces
    differ, like prompts)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(int(num_traces)):
        w = rng.uniform(0.3, 0.8)
        p = rng.dirichlet(0.5 * np.ones(vocab_size), size=int(positions))
        q = (1 - w) * p + w * rng.dirichlet(0.5 * np.ones(vocab_size), size=int(positions))
        out.append((p, q / q.sum(axis=1, keepdims=True)))
    return out


def synthetic_table(num_traces: int = 8, positions: int = 24, *, max_drafts: int = 3, verifiers=DEFAULT_VERIFIERS,
                    laws=None, seed: int = 0):
    """The acceptance table of :func:`synthetic_laws` (each verifier at ``K ≤`` its ``synthetic_max_drafts``,
    ``rrs_wor`` and the ``ot_wor*`` verifiers at ``K ≤ 2``:
    their exact enumeration at ``K ≥ 3`` costs tens of seconds even at this vocabulary).

    Examples
    --------
    >>> t = synthetic_table(num_traces=2, positions=5, max_drafts=2, verifiers=("rrs",), laws=("with_replacement",))
    >>> t.lengths, sorted(t.acceptance["rrs"])
    ([5, 5], [1, 2])
    """
    lw = synthetic_laws(num_traces, positions, seed=seed)
    source = {"pair": f"synthetic(V={SYNTHETIC_VOCAB}, Dirichlet(0.5), draft weight U(0.3, 0.8), seed={seed})",
              "temperature": 1.0, "traces": int(num_traces), "positions": int(num_traces * positions),
              "vocab_size": SYNTHETIC_VOCAB}
    return measure_table(lw, max_drafts=max_drafts, verifiers=verifiers, laws=laws, seed=seed, source=source,
                         max_drafts_per_verifier={n: v.synthetic_max_drafts for n, v in VERIFIERS.items()
                                                  if v.synthetic_max_drafts is not None})


def synthetic_cost_model(table=None, laws=None) -> CostModel:
    """Illustrative forward costs for ``--synthetic`` (no models to measure): target ``25 ms +
    0.4 ms`` per extra new token, draft ``4 ms + 0.05 ms``; verification measured on the
    synthetic laws when ``table`` and ``laws`` (``[(p, q)]``) are given."""
    given = "given (illustrative, --synthetic)"
    cost = CostModel(draft=CostCurve([1, 64], [0.004, 0.004 + 63 * 0.00005], given),
                     target=CostCurve([1, 64], [0.025, 0.025 + 63 * 0.0004], given),
                     machine=machine_description("cpu"))
    if table is not None and laws is not None:
        p, q = laws[0]
        cost.verify = measure_verify_costs({n: table.drafts_measured(n) for n in table.acceptance},
                                           [(p[t], q[t]) for t in range(min(5, len(p)))])
    return cost
