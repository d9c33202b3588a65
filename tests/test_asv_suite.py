"""The asv suite (benchmarks/benchmarks/) cannot rot: every benchmark's setup and timed functions run
once at a tiny vocabulary, its row families are those of experiments/bench_engine.py, and it times
the public calls (its values are those of the library)."""

import importlib.util
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def suite():
    return _module(ROOT / "benchmarks" / "benchmarks" / "public_calls.py", "asv_public_calls")


def test_asv_configuration_names_the_suite_and_the_existing_environment():
    text = (ROOT / "benchmarks" / "asv.conf.json").read_text()
    conf = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))  # asv allows // comments
    assert conf["environment_type"] == "existing"
    assert (ROOT / "benchmarks" / conf["benchmark_dir"] / "__init__.py").is_file()
    assert (ROOT / "benchmarks" / conf["repo"] / "pyproject.toml").is_file()


def test_suite_row_families_are_the_benchmarks(suite):
    engine = _module(ROOT / "experiments" / "bench_engine.py", "bench_engine_for_asv")
    assert set(suite.FAMILIES) == set(engine.FAMILIES)
    for fam in engine.FAMILIES:
        for a, b in zip(suite.rows(fam, 2, 50), engine.rows(fam, 2, 50)):
            np.testing.assert_array_equal(a, b)


def test_every_benchmark_runs_once_at_a_tiny_vocabulary(suite):
    vocab = 12
    ran = 0
    for cls in (suite.OptimalAcceptance, suite.MeasureLaws, suite.VerifierAcceptance):
        names = [n for n in dir(cls) if n.startswith(("time_", "track_"))]
        assert names, cls.__name__
        for combo in itertools.product(*cls.params):
            args = tuple(vocab if isinstance(a, int) else a for a in combo)  # the vocabulary made tiny
            bench = cls()
            bench.setup(*args)
            for name in names:
                out = getattr(bench, name)(*args)
                if name.startswith("track_"):
                    assert math.isfinite(out) and out > 0
                ran += 1
    assert ran >= len(suite.CALLS) * len(suite.FAMILIES)


def test_timed_call_is_the_public_value(suite):
    """What the suite times is the public call on its row: its value is α* of that row (with
    replacement at K = 2: 1 + min over prefixes of the ratio order of Pc − Qc², computed here)."""
    bench = suite.OptimalAcceptance()
    bench.setup("far", 40, "with_replacement:2")
    p, q = bench.p, bench.q
    order = np.argsort(p / q, kind="stable")
    f = np.cumsum(p[order]) - np.cumsum(q[order]) ** 2
    expected = 1.0 + min(0.0, f.min())
    assert bench.call(p, q, bench.k, bench.law) == pytest.approx(expected, abs=1e-12)


def test_cross_version_benchmark_runs_and_compares_values():
    """experiments/bench_public.py against this same checkout: every call and measure_laws timed for
    both, and the two loads' values equal (the same code), so the value check it applies to two
    versions holds."""
    import sys

    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        bench = importlib.import_module("bench_public")
    finally:
        sys.path.pop(0)
    out = bench.main(["--against", str(ROOT), "--quick", "--families", "far", "ties", "--measure"])
    rows = [v for k, v in out.items() if isinstance(k, tuple)]
    assert len(rows) == 2 * (len(bench.CALLS) + 1)  # every call and measure_laws, per family
    assert all(r["max_diff"] == 0.0 and r["this_x_sort"] > 0 and r["ratio"] > 0 for r in rows)
    assert all(v["compared"] > 0 for k, v in out.items() if isinstance(k, tuple) and k[2] == "measure_laws")


def test_performance_page_is_generated_from_the_stored_asv_results():
    """docs/results/performance-asv.md is what benchmarks/asv_page.py makes of the stored asv results
    (the release before the redesign against the later commit stored beside it), so the page and
    its figures cannot drift apart; its budget table marks the cells over their budget."""
    page = _module(ROOT / "benchmarks" / "asv_page.py", "asv_page")
    from asv.results import Results

    stored = sorted({Results.load(str(p)).commit_hash for p in (ROOT / "benchmarks" / "results").glob("*/*.json")
                     if p.name not in ("machine.json", "benchmarks.json")})
    before = [c for c in stored if c.startswith("a6e5102")]
    assert len(before) == 1 and len(stored) == 2, stored
    after = next(c for c in stored if c not in before)
    text = page.render(before[0], after)
    assert text == (ROOT / "docs" / "results" / "performance-asv.md").read_text()
    budgets = text.split("## Budgets")[1].split("## Every benchmark")[0]
    for line in budgets.splitlines():
        if line.startswith("| `optimal_acceptance`") or line.startswith("| `measure_laws`"):
            limit = float(re.search(r"≤ ([\d.]+)×", line).group(1))
            for value, verdict in re.findall(r"([\d.]+)× (within|\*\*over\*\*)", line):
                assert (float(value) <= limit) == (verdict == "within"), line
