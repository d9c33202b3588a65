"""Regenerate every paper figure and table into figures/ (PNG and PDF) in one command.

    python experiments/make_figures.py              # from the stored results in data/results/
    python experiments/make_figures.py --recompute  # recompute every result first (slow; the
                                                    # real-pair figures need the Qwen pair)
    python experiments/make_figures.py --only fig_khisti_toy fig_solve_time

Each figure script (``experiments/fig_*.py``) is run in this process with the same options. A
script whose stored results are missing and cannot be recomputed here (the real model pair is not
available) is reported as skipped, with the reason, and the exit status is 1.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

SCRIPTS = (
    "fig_khisti_toy",
    "fig_solve_time",
    "fig_block_bounds",
    "fig_alpha_vs_k",
    "fig_verifier_table",
    "fig_temperature_sweep",
    "fig_real_full",
    "fig_deterministic_real",
    "fig_block_real",
)


def main(argv=None) -> dict:
    ap = _common.parser(__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=SCRIPTS, default=None, help="run only these scripts")
    args, _ = ap.parse_known_args(argv)
    from otbound.report import plots

    plots.use_file_backend()  # files only, no windows
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    if args.only:  # drop "--only a b ..." before handing the options to each script
        i = passthrough.index("--only")
        passthrough = passthrough[:i] + passthrough[i + 1 + len(args.only) :]
    produced, skipped = {}, {}
    for name in args.only or SCRIPTS:
        t0 = time.perf_counter()
        try:
            paths = importlib.import_module(name).main(passthrough)
        except _common.MissingResultsError as exc:
            skipped[name] = str(exc)
            _common.log(f"[skipped] {name}: {exc}")
            continue
        produced[name] = [str(p) for p in paths]
        _common.log(f"[done] {name} in {time.perf_counter() - t0:.1f} s: " + ", ".join(Path(p).name for p in paths))
    _common.log(f"\n{sum(map(len, produced.values()))} files from {len(produced)} scripts into {args.out}")
    for name, why in skipped.items():
        _common.log(f"skipped {name}: {why}")
    return {"produced": produced, "skipped": skipped}


if __name__ == "__main__":
    sys.exit(1 if main()["skipped"] else 0)
