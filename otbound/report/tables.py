"""Report rows, tables (Hu et al. 2502.18779 Table 1 layout) and the report.md / report.json writer.

A *row* is a dict with at least ``dataset``, ``temperature``, ``num_drafts``, ``sampling``,
``verifier`` (``"optimal"`` for the bound α* of that law), ``acceptance`` (None: skipped),
``optimal`` (α* of the verifier's law), ``positions`` (how many (p, q) pairs were averaged);
optional ``acceptance_ci`` (half width of the 95% interval), ``efficiency`` (acceptance / optimal),
``method`` ("exact" or "monte_carlo"), ``lossless`` (the verifier's declared flag: a verifier with
``lossless`` False is labelled "(lossy)" in every table).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from otbound._io import atomic_path, json_text
from otbound._validation import SAMPLINGS


def mean_ci(values) -> tuple[float, float]:
    """Mean and the half width of its normal 95% interval (1.96·s/√n; 0 for n < 2)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return float(x.mean()), 0.0
    return float(x.mean()), float(1.96 * x.std(ddof=1) / math.sqrt(x.size))


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


def _cell(row) -> str:
    if row["acceptance"] is None:
        return "n/a"
    s = f"{row['acceptance']:.4f}"
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
    for law in sorted(laws, key=lambda s: (SAMPLINGS.index(s) if s in SAMPLINGS else len(SAMPLINGS), laws.index(s))):
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


def write_report(
    out, title: str, rows, *, sections: list[str] = (), figures: list[str] = (), meta: dict | None = None
) -> Path:
    """Write ``out/report.md`` and ``out/report.json`` (atomically, as a pair: both are written in
    full before either replaces its predecessor); return the folder.

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
    md = [f"# {title}", ""]
    if meta:
        md += [f"- {k}: {v}" for k, v in meta.items()] + [""]
    md += [
        "Token-level acceptance α = P(emitted token ∈ drafts). Cells: mean ± 95% CI half width over",
        "positions; in parentheses the efficiency = acceptance / α* of the verifier's own draft law.",
        "",
        all_tables([r for r in rows if "block_len" not in r]),
        "",
    ]
    md += list(sections)
    md += [f"![{Path(f).stem}]({Path(f).name})" for f in figures]
    nulled: list = []
    payload = json_text({"title": title, "meta": meta or {}, "rows": rows}, indent=1, nulled=nulled, default=float)
    if nulled:  # strict JSON has no NaN: say which values are empty and why
        meta = dict(meta or {}, **{"null values": f"{', '.join(nulled)}: not finite (undefined: a ratio to a zero "
                                                 "α*, or an interval from a single cluster), written as null"})
        payload = json_text({"title": title, "meta": meta, "rows": rows}, indent=1, default=float)
    # both files written in full under temporary names first, then moved into place: a full disk or an
    # interrupted run leaves the previous pair (or none), never a report.md without its report.json
    with atomic_path(out / "report.json") as tmp_json, atomic_path(out / "report.md") as tmp_md:
        tmp_json.write_text(payload, encoding="utf-8")
        tmp_md.write_text("\n".join(md) + "\n", encoding="utf-8")
    return out
