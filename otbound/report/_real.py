"""The real-model report: traces of a draft/target pair on prompt sets, measured and aggregated."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from otbound._io import progress_bar, write_text_atomic
from otbound._validation import SAMPLINGS
from otbound.lm import collect_traces, load_pair, load_prompts, load_traces
from otbound.report._measure import aggregate, measure_trace


def run_real_report(pair="qwen2.5-coder", datasets=("humaneval", "mtbench"), num_prompts: int = 3,
                    max_new_tokens: int = 32, temperatures=(0.7, 1.0), num_drafts=(2, 3, 4), out="report-real",
                    progress: bool = True, *, dtype="auto", device="auto", verifiers=None, samplings=SAMPLINGS,
                    mc_samples: int = 16, seed: int = 0, batch_size: int | None = None) -> list[dict]:
    """Collect traces (resumable, ``<out>/traces``), measure every position (cached in
    ``<out>/measure``) and return the rows of :func:`otbound.report.aggregate` (also written to
    ``<out>/rows.json``).

    ``pair``: a registered pair name, a ``(draft, target)`` pair of ids/paths, a loaded
    :class:`ModelPair` or a callable returning one; it is loaded only if some trace is missing, so
    a rerun over finished traces needs no model. ``datasets``: shipped names or JSONL paths; the
    first ``num_prompts`` of each. ``mc_samples``: draft tuples per position for verifiers without
    an exact acceptance (their per-position noise averages out over the positions and is inside
    the CI).
    ``dtype``: model dtype; ``"auto"`` is bfloat16 on CUDA and on CPUs with native bfloat16, else
    float32 (see :func:`otbound.lm._models.resolve_dtype`). Each row records it as ``model_dtype``.
    """
    out = Path(out)
    prompts = [p for ds in datasets for p in load_prompts(ds, num_prompts)]
    if hasattr(pair, "target") or callable(pair):
        loader = pair
    else:
        def loader():
            return load_pair(pair, device=device, dtype=dtype, progress=progress)
    paths = collect_traces(loader, prompts, out / "traces", temperatures=temperatures, max_new_tokens=max_new_tokens,
                           batch_size=batch_size, seed=seed, progress=progress)
    bar = progress_bar(len(paths), "measure", progress)
    results = []
    for path in paths:
        (record,) = load_traces(path)
        results.append(measure_trace(record, num_drafts, verifiers=verifiers, samplings=samplings,
                                     mc_samples=mc_samples, seed=seed, cache_dir=out / "measure"))
        bar.update(1)
    bar.close()
    rows = aggregate(results)
    write_text_atomic(out / "rows.json", json.dumps(rows, indent=1))
    if progress:
        n = sum(r["positions"] for r in results)
        print(f"otbound: {len(rows)} rows from {n} positions -> {out / 'rows.json'}", file=sys.stderr)
    return rows
