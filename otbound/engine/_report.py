"""engine.json, engine.md and engine.png of an audit, and the check that a stored audit is what it says.

``engine.json`` carries the raw counters of every configuration and a checksum over its whole
content (``sha256``: :func:`otbound.content_key` of everything else); :func:`load_engine_json`
refuses a file whose checksum or recomputed figures disagree (:func:`recompute_figures`).
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import numpy as np

from otbound._integrity import CorruptFileError, content_key
from otbound._io import atomic_path, json_text
from otbound.engine._audit import counter_metrics

#: the figures of a configuration recomputed from its raw counters, and their tolerance (float64 sums)
RECOMPUTED = ("mean_acceptance_length", "acceptance_rate", "per_position")
TOLERANCE = 1e-12


def recompute_figures(configuration: dict) -> list[str]:
    """The figures of ``configuration`` that differ from those recomputed from its raw counters.

    Examples
    --------
    >>> from otbound.engine._report import recompute_figures
    >>> counters = {"draft_tokens": 4.0, "accepted_tokens": 2.0, "drafts": 2.0, "accepted_per_pos": [2.0, 0.0]}
    >>> conf = {"counters": counters,
    ...         "mean_acceptance_length": 2.0, "acceptance_rate": 0.5, "per_position": [1.0, 0.0]}
    >>> recompute_figures(conf)
    []
    >>> recompute_figures(dict(conf, acceptance_rate=0.6))
    ['acceptance_rate']
    """
    fresh = counter_metrics(configuration["counters"])
    bad = []
    for key in RECOMPUTED:
        a, b = np.asarray(fresh[key], dtype=float), np.asarray(configuration[key], dtype=float)
        if a.shape != b.shape or not np.allclose(a, b, rtol=0, atol=TOLERANCE, equal_nan=True):
            bad.append(key)
    return bad


def load_engine_json(path) -> dict:
    """Read ``engine.json``, checking its checksum and that its figures recompute from its counters.

    Raises
    ------
    otbound._integrity.CorruptFileError
        A file that is not a complete audit, fails its checksum, or holds figures its counters disagree with.

    Examples
    --------
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from otbound._integrity import CorruptFileError
    >>> from otbound.engine import load_engine_json
    >>> path = Path(tempfile.mkdtemp()) / "engine.json"
    >>> _ = path.write_text(json.dumps({"configurations": [], "sha256": "0" * 64}))
    >>> try:
    ...     load_engine_json(path)
    ... except CorruptFileError as err:
    ...     print(str(err).split(": ", 1)[1])
    checksum mismatch (the file was altered or damaged)
    """
    path = Path(path)
    try:
        record = json.loads(path.read_text())
        stored = record.pop("sha256")
    except (OSError, ValueError, KeyError, AttributeError) as err:
        raise CorruptFileError(f"{path}: not a complete engine audit ({err})") from None
    if content_key(record) != stored:
        raise CorruptFileError(f"{path}: checksum mismatch (the file was altered or damaged)")
    for conf in record.get("configurations", []):
        bad = recompute_figures(conf)
        if bad:
            raise CorruptFileError(f"{path}: {', '.join(bad)} of {conf['config']} do not follow from its counters")
    record["sha256"] = stored
    return record


def _f(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def _interval(iv) -> str:
    return f"[{_f(iv[0])}, {_f(iv[1])}]" if iv else "–"


def engine_markdown(record: dict) -> str:
    eng = record["engine"]
    lines = ["# Engine audit", "",
             f"Engine: {eng.get('name')} ({eng.get('build_info') or eng.get('llama_cpp_python', '')}); "
             f"started {record['started']}, finished {record['finished']}; checksum `{record['sha256'][:16]}…`.", "",
             "Acceptance from the engine's own `/metrics` counters (deltas around each configuration; mean acceptance "
             "length = 1 + accepted / drafts), with cluster-robust 95% intervals over requests. *Predicted* is "
             "otbound's exact expectation for draft-simple along the engine's own outputs, which for deterministic "
             "drafting is also the *bound* of the scheme; *best alternative* is the planner's best sampled-draft "
             "chain or tree with a lossless verifier under the same node budget. *Lossless*: G-test of short "
             "continuations with speculation on against the target's exact post-sampling law (α = 0.01; "
             "*detectable TV*: the smallest total variation detected with 80% power).", "",
             "| configuration | MAL [95% CI] | acceptance rate | predicted = bound | engine − bound [95% CI] "
             "| best alternative (bound) | lossless p (n, detectable TV) | tok/s on / off |",
             "|---|---|---|---|---|---|---|---|"]
    for conf in record["configurations"]:
        c = conf["config"]
        label = f"{c['spec_type']} n_max={c['draft_max']} p_min={c['p_min']:g} [{c['sampling']['name']}]"
        pred = conf.get("prediction") or {}
        alt = conf.get("best_alternative") or {}
        alt_text = (f"{_f(alt.get('mean_acceptance_length'))} ({alt.get('verifier')}, {alt.get('draft_law')}, "
                    f"{alt.get('branching')}; bound {_f(alt.get('bound_mean_acceptance_length'))})") if alt else "–"
        loss = conf.get("lossless") or {}
        loss_text = (f"{_f(loss.get('p_value'))} ({loss.get('samples')}, {_f(loss.get('detectable_tv'))})"
                     if loss else "–")
        diff = (f"{_f(pred.get('engine_minus_bound'))} {_interval(pred.get('engine_minus_bound_interval'))}"
                if pred else "–")
        lines.append(f"| {label} | {_f(conf['mean_acceptance_length'])} "
                     f"{_interval(conf.get('mean_acceptance_length_interval'))} | {_f(conf['acceptance_rate'])} | "
                     f"{_f(conf.get('predicted_mean_acceptance_length'))} | {diff} | {alt_text} | {loss_text} | "
                     f"{_f(conf.get('tokens_per_second'), 1)} / "
                     f"{_f(conf.get('tokens_per_second_without_speculation'), 1)} |")
    if record.get("controls"):
        lines += ["", "Controls (speculation off, the same test):", ""]
        for name, ctl in record["controls"].items():
            lines.append(f"- {name}: p = {_f(ctl['p_value'])}, {ctl['samples']} continuations, {ctl['cells']} cells, "
                         f"detectable TV {_f(ctl['detectable_tv'])}")
    if record.get("laws_check"):
        chk = record["laws_check"]
        lines += ["", f"Laws check against {chk['source']}: largest TV of the target's laws "
                  f"{chk['max_tv_target_laws']:.2e} over {chk['target_laws_checked']} contexts; draft choices agreeing "
                  f"{chk['draft_choices_agreeing']}/{chk['draft_choices_checked']}."]
    lines += ["", "![engine audit](engine.png)", ""]
    return "\n".join(lines)


def _number(x) -> float:
    """A stored figure as a float (JSON's null, an undefined value, as NaN)."""
    return np.nan if x is None else float(x)


def engine_figure(record: dict, path) -> None:
    from otbound.report import plots

    confs = record["configurations"]
    fig, axes = plots.figure(ncols=1, height=2.6)
    ax = axes[0, 0]
    x = np.arange(len(confs))
    mal = [_number(c["mean_acceptance_length"]) for c in confs]
    # an interval JSON stores as nulls (undefined: one request) is drawn without a bar
    iv = [[_number(v) for v in (c.get("mean_acceptance_length_interval") or [m, m])] for c, m in zip(confs, mal)]
    iv = [[m, m] if np.isnan(lo) or np.isnan(hi) else [lo, hi] for m, (lo, hi) in zip(mal, iv)]
    ax.errorbar(x, mal, yerr=[[m - lo for m, (lo, _) in zip(mal, iv)], [hi - m for m, (_, hi) in zip(mal, iv)]],
                fmt="o", color="C0", label="engine (counters, 95% CI)")
    pred = [c.get("bound_mean_acceptance_length") for c in confs]
    ax.plot(x, [np.nan if p is None else p for p in pred], "_", ms=14, mew=2, color="C3", label="bound of its scheme")
    alt = [(c.get("best_alternative") or {}).get("mean_acceptance_length") for c in confs]
    ax.plot(x, [np.nan if a is None else a for a in alt], "^", color="C2", label="best alternative (same budget)")
    ax.set_xticks(x, [f"{c['config']['spec_type'].replace('draft-', '')}\nn={c['config']['draft_max']} "
                      f"p={c['config']['p_min']:g}" for c in confs], fontsize=6)
    ax.set_ylabel("mean acceptance length")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, fontsize=6)
    plots.save(fig, Path(path), formats=("png",))  # path ends in .png


def write_outputs(out, record: dict) -> None:
    """Write ``engine.json``, ``engine.md`` and ``engine.png`` into ``out``: each in full under a
    temporary name beside its target first, then all moved into place (strict JSON: no NaN), so a
    run that fails while writing leaves the previous three files, never a mixed set."""
    out = Path(out)
    text = json_text(record, indent=1, sort_keys=True)
    with contextlib.ExitStack() as stack:
        engine_figure(record, stack.enter_context(atomic_path(out / "engine.png")))
        stack.enter_context(atomic_path(out / "engine.md")).write_text(engine_markdown(record), encoding="utf-8")
        stack.enter_context(atomic_path(out / "engine.json")).write_text(text, encoding="utf-8")
