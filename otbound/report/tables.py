"""Report rows, tables (Hu et al. 2502.18779 Table 1 layout) and the report.md / report.json writer.

A *row* is a dict with at least ``dataset``, ``temperature``, ``num_drafts``, ``sampling``,
``verifier`` (``"optimal"`` for the bound α* of that law), ``acceptance`` (None: skipped),
``optimal`` (α* of the verifier's law), ``positions`` (how many (p, q) pairs were averaged);
optional ``acceptance_ci`` (half width of the 95% interval), ``efficiency`` (acceptance / optimal),
``method`` ("exact" or "monte_carlo"), ``lossless`` (the verifier's declared flag: a verifier with
``lossless`` False is labelled "(lossy)" in every table), ``gap`` and ``gap_ci`` (the paired gap
acceptance − α* over the same positions, and its 95% half width), ``skipped`` (why a verifier was not
measured).

The report opens with :func:`summary` (its findings, computed from the rows), then the run's record
(:func:`environment`: library versions, machine, wall time), what was not measured and why, and the
tables; Monte Carlo cells are marked with :data:`MC_MARK`.
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

import numpy as np

from otbound._io import atomic_path, json_text
from otbound.token.draft_laws import DRAFT_LAWS


def verifier_label(name: str, rows) -> str:
    """``name``, followed by " (lossy)" when a row of ``rows`` for it declares ``lossless`` False.

    Examples
    --------
    >>> verifier_label("hsd", [{"verifier": "hsd", "lossless": False}])
    'hsd (lossy)'
    >>> verifier_label("rrs", [{"verifier": "rrs", "lossless": True}])
    'rrs'
    """
    lossy = any(r.get("verifier", r.get("name")) == name and r.get("lossless") is False for r in rows)
    return f"{name} (lossy)" if lossy else name


#: the mark of a Monte Carlo cell (acceptance estimated from sampled draft tuples, not exact)
MC_MARK = "†"
#: the tolerance below which two gaps or two α* count as equal in the summary
TIE = 1e-9


def _cell(row) -> str:
    if row["acceptance"] is None:
        return "n/a"
    s = f"{row['acceptance']:.4f}" + (MC_MARK if row.get("method") == "monte_carlo" else "")
    ci = row.get("acceptance_ci")
    if ci:
        s += f" ± {ci:.4f}"
    if row["verifier"] != "optimal" and row.get("optimal"):
        s += f" ({100 * row['acceptance'] / row['optimal']:.1f}%)"
    return s


def main_table(rows, temperature, num_drafts) -> str:
    """Markdown table for one (T, K): rows = each law's optimum then its verifiers; columns = datasets.

    Cells: mean acceptance ± 95% CI half width (efficiency = acceptance / α* of the verifier's law).
    """
    sel = [r for r in rows if r["temperature"] == temperature and r["num_drafts"] == num_drafts]
    datasets = list(dict.fromkeys(r["dataset"] for r in sel))
    names = []
    for law in dict.fromkeys(r["sampling"] for r in sel):
        if law is not None:  # law None: verifiers skipped at this K (acceptance None)
            names.append((law, "optimal"))
        names += [(law, v) for v in dict.fromkeys(r["verifier"] for r in sel if r["sampling"] == law) if v != "optimal"]
    lookup = {(r["sampling"], r["verifier"], r["dataset"]): r for r in sel}
    lines = [
        f"| K = {num_drafts}, T = {temperature} | " + " | ".join(datasets) + " |",
        "|---" * (len(datasets) + 1) + "|",
    ]
    for law, v in names:
        label = f"**optimal ({law})**" if v == "optimal" else f"{verifier_label(v, sel)} ({law or 'skipped'})"
        cells = [_cell(lookup[(law, v, d)]) if (law, v, d) in lookup else "—" for d in datasets]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paper_tables(rows) -> str:
    """Markdown in the layout of Hu et al. (2502.18779) Table 1: one table per draft law; rows =
    (dataset, T); columns = for each K, α* of the law and then each of its verifiers.

    α* cells: mean ± 95% half width. Verifier cells: mean acceptance ± 95% half width (efficiency =
    acceptance / α*), then the paired gap to α* on the same positions (row keys ``gap``, ``gap_ci``:
    mean of acc_t − α*_t, cluster-robust over prompts). Skipped verifiers are left out.
    """
    rows = [r for r in rows if r["acceptance"] is not None and "block_len" not in r]
    out = []
    laws = list(dict.fromkeys(r["sampling"] for r in rows))
    order = {s: i for i, s in enumerate(DRAFT_LAWS)}
    for law in sorted(laws, key=lambda s: (order.get(s, len(order)), laws.index(s))):
        sel = [r for r in rows if r["sampling"] == law]
        ks = sorted({r["num_drafts"] for r in sel})
        columns = [(k, v) for k in ks for v in ["optimal"] + sorted(
            {r["verifier"] for r in sel if r["num_drafts"] == k and r["verifier"] != "optimal"})]
        lookup = {(r["dataset"], r["temperature"], r["num_drafts"], r["verifier"]): r for r in sel}
        head = [f"K = {k}: " + ("α*" if v == "optimal" else verifier_label(v, sel)) for k, v in columns]
        lines = [f"| {law} | T | " + " | ".join(head) + " |", "|---" * (len(columns) + 2) + "|"]
        for d, t in dict.fromkeys((r["dataset"], r["temperature"]) for r in sel):
            cells = []
            for k, v in columns:
                r = lookup.get((d, t, k, v))
                cell = "—" if r is None else _cell(r)
                if r is not None and v != "optimal" and r.get("gap") is not None:
                    cell += f"; gap {r['gap']:+.4f} ± {r['gap_ci']:.4f}"
                cells.append(cell)
            lines.append(f"| {d} | {t} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def all_tables(rows) -> str:
    keys = sorted({(r["temperature"], r["num_drafts"]) for r in rows})
    return "\n\n".join(main_table(rows, t, k) for t, k in keys)


def _pooled(values) -> tuple[float, float]:
    """Mean of independent cell means and its 95% half width, sqrt(Σ h_i²) / n."""
    means = [m for m, _ in values]
    return float(np.mean(means)), float(math.sqrt(sum(h * h for _, h in values)) / len(values))


def _gap(row) -> tuple[float, float]:
    """(gap, half width) of a verifier row: the paired ``gap`` / ``gap_ci`` where the row has them,
    else acceptance − optimal with the acceptance's half width."""
    if row.get("gap") is not None:
        return float(row["gap"]), float(row.get("gap_ci") or 0.0)
    return float(row["acceptance"] - row["optimal"]), float(row.get("acceptance_ci") or 0.0)


def summary(rows) -> dict:
    """The report's findings, computed from its token-level rows.

    ``closest``: per draft law and K, the lossless verifiers ranked by their gap to α* of the law
    (acceptance − α*, :func:`_gap`), pooled over the (dataset, T) cells measured at that K: the mean of
    the cells' gaps with half width sqrt(Σ h²) / n (cells taken as independent). ``best_law``: per
    (T, K), the draft laws ranked by α* pooled over the datasets the same way. Ties (within
    :data:`TIE`) are listed together. Lossy verifiers and skipped ones (acceptance None) are left out.

    Returns
    -------
    dict
        ``{"closest": [{"sampling", "num_drafts", "cells", "ranking": [{"verifier", "gap", "gap_ci",
        "monte_carlo"}, ...]}], "best_law": [{"temperature", "num_drafts", "ranking": [{"sampling",
        "optimal", "optimal_ci"}, ...]}]}``, rankings best first.

    Examples
    --------
    >>> rows = [dict(dataset="d", temperature=1.0, num_drafts=2, sampling="greedy", verifier=v,
    ...              acceptance=a, acceptance_ci=0.01, optimal=0.8, method="exact", lossless=True)
    ...         for v, a in (("optimal", 0.8), ("spechub", 0.78), ("greedy", 0.8))]
    >>> s = summary(rows)
    >>> [(r["verifier"], round(r["gap"], 4)) for r in s["closest"][0]["ranking"]]
    [('greedy', 0.0), ('spechub', -0.02)]
    >>> s["best_law"][0]["ranking"][0]["sampling"], s["best_law"][0]["ranking"][0]["optimal"]
    ('greedy', 0.8)
    """
    rows = [r for r in rows if r.get("acceptance") is not None and "block_len" not in r and r.get("sampling")]
    closest, best_law = [], []
    order = {s: i for i, s in enumerate(DRAFT_LAWS)}
    for law in sorted({r["sampling"] for r in rows}, key=lambda s: (order.get(s, len(order)), s)):
        for k in sorted({r["num_drafts"] for r in rows if r["sampling"] == law}):
            sel = [r for r in rows if r["sampling"] == law and r["num_drafts"] == k and r["verifier"] != "optimal"
                   and r.get("lossless") is not False]
            ranking = []
            for v in sorted({r["verifier"] for r in sel}):
                mine = [r for r in sel if r["verifier"] == v]
                g, h = _pooled([_gap(r) for r in mine])
                ranking.append(dict(verifier=v, gap=g, gap_ci=h, cells=len(mine),
                                    monte_carlo=any(r.get("method") == "monte_carlo" for r in mine)))
            if ranking:
                ranking.sort(key=lambda e: (-e["gap"], e["verifier"]))
                closest.append(dict(sampling=law, num_drafts=k, ranking=ranking))
    opt = [r for r in rows if r["verifier"] == "optimal"]
    for t, k in sorted({(r["temperature"], r["num_drafts"]) for r in opt}):
        ranking = []
        for law in {r["sampling"] for r in opt if r["temperature"] == t and r["num_drafts"] == k}:
            m, h = _pooled([(float(r["acceptance"]), float(r.get("acceptance_ci") or 0.0)) for r in opt
                            if r["temperature"] == t and r["num_drafts"] == k and r["sampling"] == law])
            ranking.append(dict(sampling=law, optimal=m, optimal_ci=h))
        ranking.sort(key=lambda e: (-e["optimal"], order.get(e["sampling"], len(order))))
        best_law.append(dict(temperature=t, num_drafts=k, ranking=ranking))
    return {"closest": closest, "best_law": best_law}


def _leaders(ranking, key) -> list:
    return [e for e in ranking if e[key] >= ranking[0][key] - TIE]


def _ranking_table(found, row_key, rows: dict, head, key, name, fmt, sort_names) -> list:
    """One summary table: a row per value of ``row_key`` (``rows``: value → label), a column per K;
    a cell names the leaders of its ranking (``key`` within :data:`TIE` of the first; their ``name``
    fields, sorted if ``sort_names``) with ``fmt`` of the first, then the runner-up."""
    ks = sorted({e["num_drafts"] for e in found})
    lines = [f"| {head} | " + " | ".join(f"K = {k}" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for r, label in rows.items():
        cells = []
        for k in ks:
            e = next((e for e in found if e[row_key] == r and e["num_drafts"] == k), None)
            if e is None:
                cells.append("—")
                continue
            lead = _leaders(e["ranking"], key)
            rest = e["ranking"][len(lead):]
            names = [x[name] for x in lead]
            cell = f"**{', '.join(sorted(names) if sort_names else names)}** {fmt(lead[0])}"
            if rest:
                cell += f"; next {rest[0][name]} {fmt(rest[0])}"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _gap_cell(e) -> str:  # a gap that rounds to zero prints as 0.0000, not -0.0000
    gap = round(e["gap"], 4) + 0.0
    return f"{gap:+.4f} ± {e['gap_ci']:.4f}" + (MC_MARK if e["monte_carlo"] else "")


def summary_markdown(found: dict) -> str:
    """The summary of :func:`summary` as markdown: two short tables, leaders and their intervals."""
    lines = ["## Summary", ""]
    if found["closest"]:
        lines += [
            "**Closest to the optimum of each draft law**: the lossless verifier with the smallest gap",
            "acceptance − α* of its own law (mean over the datasets and temperatures ± 95% half width; "
            f"{MC_MARK}: Monte Carlo), then the runner-up.",
            "",
        ]
        laws = {c["sampling"]: c["sampling"] for c in found["closest"]}
        lines += _ranking_table(found["closest"], "sampling", laws, "draft law", "gap", "verifier", _gap_cell, True)
        lines.append("")
    if found["best_law"]:
        lines += [
            "**The draft law that accepts most**: the largest α* at each K and T (mean over the datasets ± 95% "
            "half width), then the runner-up.",
            "",
        ]
        temps = {t: f"{t:g}" for t in sorted({b["temperature"] for b in found["best_law"]})}
        lines += _ranking_table(
            found["best_law"], "temperature", temps, "T", "optimal", "sampling",
            lambda e: f"{e['optimal']:.4f} ± {e['optimal_ci']:.4f}", False,
        )  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


#: the libraries whose versions a report records
LIBRARIES = ("otbound", "numpy", "scipy", "torch", "cvxpy", "highspy", "POT", "transformers", "matplotlib")


def environment(wall_time_s: float | None = None) -> dict:
    """The run's record: library versions, Python, machine (CPU model, cores, memory) and wall time.

    Examples
    --------
    >>> env = environment(12.5)
    >>> sorted(env), env["wall time (s)"], env["versions"]["numpy"] == __import__("numpy").__version__
    (['machine', 'versions', 'wall time (s)'], 12.5, True)
    """
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    mem = _memory_bytes()
    machine = {"cpu": _cpu_model(), "cores": os.cpu_count(),
               "memory (GB)": None if mem is None else round(mem / 1e9, 1),
               "system": f"{platform.system()} {platform.release()}"}
    env = {"versions": versions, "machine": machine}
    if wall_time_s is not None:
        env["wall time (s)"] = round(float(wall_time_s), 1)
    return env


def _wall(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s} s" if m else f"{seconds:.1f} s"


def skipped_markdown(rows, skipped=()) -> str:
    """What was not measured and why: the skipped rows' reasons (``skipped`` key) and ``skipped`` lines."""
    items = [f"{r['verifier']} at K = {r['num_drafts']} ({r['dataset']}, T = {r['temperature']:g}): {r['skipped']}"
             for r in rows if r.get("acceptance") is None and r.get("skipped")]
    items += list(skipped)
    if not items:
        return ""
    return "## Not measured\n\n" + "\n".join(f"- {x}" for x in dict.fromkeys(items)) + "\n"


def write_report(
    out, title: str, rows, *, sections: list[str] = (), figures: list[str] = (), meta: dict | None = None,
    skipped=(), wall_time_s: float | None = None,
) -> Path:
    """Write ``out/report.md`` and ``out/report.json`` (atomically, as a pair: both are written in
    full before either replaces its predecessor); return the folder.

    report.md opens with the findings (:func:`summary`), then the run (``meta``, library versions,
    machine, wall time: :func:`environment`), what was not measured and why (the rows' ``skipped``
    reasons and the ``skipped`` lines), the tables (Monte Carlo cells marked :data:`MC_MARK`), the
    ``sections`` and the figures. report.json holds ``title``, ``summary``, ``meta``,
    ``environment``, ``skipped`` and ``rows``.

    Examples
    --------
    >>> import tempfile, json
    >>> row = dict(dataset="d", temperature=1.0, num_drafts=2, sampling="greedy", verifier="optimal",
    ...            acceptance=0.75, optimal=0.75, positions=3)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = write_report(tmp, "demo", [row])
    ...     json.loads((Path(tmp) / "report.json").read_text())["rows"][0]["acceptance"]
    0.75
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    found = summary(rows)
    env = environment(wall_time_s)
    md = [f"# {title}", ""]
    if found["closest"] or found["best_law"]:
        md += [summary_markdown(found)]
    md += ["## Run", ""]
    md += [f"- {k}: {v}" for k, v in (meta or {}).items()]
    mach = env["machine"]
    md += [f"- machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory (GB)']} GB memory, {mach['system']}",
           "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items())]
    if wall_time_s is not None:
        md.append(f"- wall time: {_wall(wall_time_s)}")
    md.append("")
    not_measured = skipped_markdown(rows, skipped)
    if not_measured:
        md.append(not_measured)
    token_rows = [r for r in rows if "block_len" not in r]
    if token_rows:
        md += [
            "## Tables",
            "",
            "Token-level acceptance α = P(emitted token ∈ drafts). Cells: mean ± 95% CI half width over",
            "positions; in parentheses the efficiency = acceptance / α* of the verifier's own draft law;",
            f"{MC_MARK}: Monte Carlo estimate (sampled draft tuples), every other cell exact.",
            "",
            all_tables(token_rows),
            "",
        ]
    md += list(sections)
    md += [f"![{Path(f).stem}]({Path(f).name})" for f in figures]
    nulled: list = []
    document = {"title": title, "summary": found, "meta": meta or {}, "environment": env, "skipped": list(skipped),
                "rows": rows}
    payload = json_text(document, indent=1, nulled=nulled, default=float)
    if nulled:  # strict JSON has no NaN: say which values are empty and why
        document["meta"] = dict(meta or {}, **{"null values": f"{', '.join(nulled)}: not finite (undefined: a ratio "
                                                              "to a zero α*, or an interval from a single cluster), "
                                                              "written as null"})
        payload = json_text(document, indent=1, default=float)
    # both files written in full under temporary names first, then moved into place: a full disk or an
    # interrupted run leaves the previous pair (or none), never a report.md without its report.json
    with atomic_path(out / "report.json") as tmp_json, atomic_path(out / "report.md") as tmp_md:
        tmp_json.write_text(payload, encoding="utf-8")
        tmp_md.write_text("\n".join(md) + "\n", encoding="utf-8")
    return out
