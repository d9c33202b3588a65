"""The performance page's asv record, generated from the asv results stored in ``benchmarks/results/``.

``docs/results/performance-asv.md`` is this script's output (``tests/test_asv_suite.py`` checks that
the stored page is what the stored results give): the machine and dates asv recorded, the commands
that made the results, the budget table (each public call as a multiple of ``np.sort`` of the same
row at V = 151,936, against its budget) and every benchmark of one commit against another. Run from
the repository root, after the commands printed in the page (``COMMANDS``)::

    python benchmarks/asv_page.py --before a6e5102 --after HEAD > docs/results/performance-asv.md

Values are read with asv's own loader (:class:`asv.results.Results`); a benchmark that failed or
was skipped for a commit (a draft law the earlier version lacks) reads "n/a".
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FULL_VOCAB = 151_936
SLOWER = 1.10  # asv compare's default factor: a ratio above it is reported as slower

# the budgets at V = 151,936 (× np.sort of the same row, median, in the same process)
BUDGETS = {
    "with_replacement:2": 2.0, "with_replacement:4": 2.0,
    "greedy:2": 1.5, "greedy:4": 1.5, "deterministic:2": 1.5, "deterministic:4": 1.5,
    "without_replacement:2": 4.0, "without_replacement:4": 8.0,
    "measure_laws": 8.0,
}

COMMANDS = """\
cd benchmarks
asv machine --yes
export OMP_NUM_THREADS=1
mkdir -p /tmp/base-a6e5102 && git archive a6e5102 | tar -x -C /tmp/base-a6e5102
ASV_PYTHONPATH=/tmp/base-a6e5102 asv run --python=same --set-commit-hash $(git rev-parse a6e5102)
ASV_PYTHONPATH=$(cd .. && pwd) asv run --python=same --set-commit-hash $(git rev-parse HEAD)
asv compare --split $(git rev-parse a6e5102) $(git rev-parse HEAD)
cd .. && python benchmarks/asv_page.py --before a6e5102 --after HEAD > docs/results/performance-asv.md"""


def _load(commit: str, results_dir: Path):
    """The asv :class:`~asv.results.Results` of ``commit`` (a full hash) in ``results_dir``, and the
    machine's description (asv's ``machine.json``)."""
    from asv.results import Results

    found = []
    for machine_dir in sorted(p for p in results_dir.iterdir() if p.is_dir()):
        for path in sorted(machine_dir.glob(f"{commit[:8]}-*.json")):
            res = Results.load(str(path))
            if res.commit_hash == commit:
                info = json.loads((machine_dir / "machine.json").read_text())
                found.append((res, info))
    if not found:
        raise SystemExit(f"no asv results for commit {commit[:8]} under {results_dir}")
    if len(found) > 1:
        raise SystemExit(f"{len(found)} asv result files for commit {commit[:8]} under {results_dir}: keep one")
    return found[0]


def _values(res) -> dict:
    """``{(benchmark, params tuple): value}`` of one commit's results (NaN where it failed)."""
    out = {}
    for key in res.get_all_result_keys():
        params = res.get_result_params(key)
        values = res.get_result_value(key, params)
        combos = list(itertools.product(*params)) if params else [()]
        if not params:
            values = [values]
        for combo, value in zip(combos, values):
            out[(key, tuple(_param(c) for c in combo))] = math.nan if value is None else float(value)
    return out


def _param(text: str):
    """An asv parameter's repr as the value (strings unquoted, integers as int)."""
    text = str(text)
    if text.startswith("'") and text.endswith("'"):
        return text[1:-1]
    try:
        return int(text)
    except ValueError:
        return text


def _seconds(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    if x < 1e-3:
        return f"{x * 1e6:.1f} µs"
    if x < 1.0:
        return f"{x * 1e3:.2f} ms"
    return f"{x:.2f} s"


def _date(res) -> str:
    """When the run ended (its last benchmark's start; asv's ``date`` is the commit's)."""
    stamp = max(res.started_at.values(), default=res.date)
    return datetime.datetime.fromtimestamp(stamp / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _python(res) -> str:
    match = re.search(r"python(\d+\.\d+)", str(res.params.get("python", "")))
    version = re.search(r"versions/(\d+\.\d+\.\d+)", str(res.params.get("python", "")))
    return version.group(1) if version else (match.group(1) if match else "?")


def _rev(name: str) -> str:
    return subprocess.run(["git", "rev-parse", name], cwd=HERE.parent, check=True,
                          capture_output=True, text=True).stdout.strip()


def render(before: str, after: str, results_dir: Path = RESULTS) -> str:
    """The page (Markdown) for two full commit hashes."""
    (res_b, machine), (res_a, machine_a) = _load(before, results_dir), _load(after, results_dir)
    if machine.get("machine") != machine_a.get("machine"):
        raise SystemExit(f"{before[:8]} was run on {machine.get('machine')!r} and {after[:8]} on "
                         f"{machine_a.get('machine')!r}: compare runs of one machine")
    vb, va = _values(res_b), _values(res_a)
    lines = [
        "# Performance: the asv record",
        "",
        "Generated by `python benchmarks/asv_page.py` from the asv results stored in",
        "`benchmarks/results/` (the suite: `benchmarks/benchmarks/public_calls.py`); edit the script,",
        "not this page. The commands that made the results, from the repository root:",
        "",
        "```",
        COMMANDS,
        "```",
        "",
        f"- machine: `{machine.get('machine', '?')}`, {machine.get('cpu', '?')}, {machine.get('num_cpu', '?')} "
        f"cores, {int(machine.get('ram', 0) or 0) // 2**20 / 1024:.0f} GB RAM, {machine.get('os', '?')} "
        f"(asv's `machine.json`)",
        f"- before: `{before[:8]}`, run {_date(res_b)}; after: `{after[:8]}`, run {_date(res_a)}; "
        f"Python {_python(res_a)}",
        "",
        f"## Budgets at V = {FULL_VOCAB:,}",
        "",
        "Each public call's time as a multiple of one `np.sort` of the same row's ratios p/q, both timed",
        "alternately in the benchmark's process (`track_x_np_sort`; medians); `measure_laws` per position",
        "of its 4-row batch. A cell reads the multiple at the *after* commit, then whether it is within the",
        "budget, then in brackets the *before* commit's multiple.",
        "",
    ]
    families = sorted({k[1][0] for k in va if k[0] == "public_calls.OptimalAcceptance.track_x_np_sort"},
                      key=_family_order)
    lines += ["| call | budget | " + " | ".join(f"`{f}`" for f in families) + " |",
              "|---|---|" + "---|" * len(families)]
    for call, budget in BUDGETS.items():
        cells = []
        for fam in families:
            if call == "measure_laws":
                key = ("public_calls.MeasureLaws.track_x_np_sort", (fam, FULL_VOCAB))
            else:
                key = ("public_calls.OptimalAcceptance.track_x_np_sort", (fam, FULL_VOCAB, call))
            a, b = va.get(key, math.nan), vb.get(key, math.nan)
            if not math.isfinite(a):
                cells.append("—")
                continue
            verdict = "within" if a <= budget else "**over**"
            cells.append(f"{a:.2f}× {verdict}" + (f" ({b:.2f}×)" if math.isfinite(b) else " (n/a)"))
        name = "`measure_laws` (default set), per position" if call == "measure_laws" else \
            f"`optimal_acceptance`, {call.split(':')[0].replace('_', ' ')}, K = {call.split(':')[1]}"
        lines.append(f"| {name} | ≤ {budget:g}× | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## Every benchmark: `{after[:8]}` against `{before[:8]}`",
        "",
        f"Seconds (`time_*`, asv's median) and multiples of `np.sort` (`track_*`); *after / before* above "
        f"{SLOWER:.2f} (asv compare's factor) is marked **slower**.",
        "",
        "| benchmark | parameters | before | after | after / before |",
        "|---|---|---|---|---|",
    ]
    for key in sorted(set(va) | set(vb), key=lambda k: (k[0], [_sort_key(x) for x in k[1]])):
        a, b = va.get(key, math.nan), vb.get(key, math.nan)
        track = key[0].split(".")[-1].startswith("track_")
        fmt = (lambda x: f"{x:.2f}×" if math.isfinite(x) else "n/a") if track else _seconds
        ratio = a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan
        mark = "" if not math.isfinite(ratio) else (f"**{ratio:.2f} slower**" if ratio > SLOWER else f"{ratio:.2f}")
        params = ", ".join(str(x) for x in key[1])
        lines.append(f"| `{key[0].removeprefix('public_calls.')}` | {params} | {fmt(b)} | {fmt(a)} | "
                     f"{mark or 'n/a'} |")
    return "\n".join(lines) + "\n"


def _family_order(fam: str):
    order = ("zipf_noise", "peaked", "flat", "close", "far", "ties")
    return order.index(fam) if fam in order else len(order)


def _sort_key(x):
    return (0, x, "") if isinstance(x, int) else (1, 0, str(x))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the baseline commit (any git revision)")
    ap.add_argument("--after", required=True, help="the commit to report (any git revision)")
    ap.add_argument("--results", default=str(RESULTS), help="asv's results folder")
    args = ap.parse_args(argv)
    sys.stdout.write(render(_rev(args.before), _rev(args.after), Path(args.results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
