"""The figure scripts (experiments/fig_*.py, make_figures.py) in quick mode: files written, numbers sane.

One quick ``make_figures`` run (tiny sizes, synthetic stand-in for the real pair) writes every
figure and result into a temporary folder; the tests then check the files and the numbers:
optimum ≥ every verifier, agreement of independent solvers, the block-bound hierarchy, and the
stored full-size results in data/results/ where they exist.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ADVERSARIAL_PAIRS

from otbound import BLOCK_VERIFIERS

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

make_figures = importlib.import_module("make_figures")
_common = importlib.import_module("_common")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    report = make_figures.main(["--quick", "--out", str(out), "--formats", "png", "pdf"])
    return out, report


def _results(out, name):
    return json.loads((out / f"{name}.json").read_text())


def test_every_script_produces_png_and_pdf(quick):
    out, report = quick
    assert report["skipped"] == {}
    assert set(report["produced"]) == set(make_figures.SCRIPTS)
    for name in make_figures.SCRIPTS:
        for fmt in ("png", "pdf"):
            f = out / f"{name}.{fmt}"
            assert f.is_file() and f.stat().st_size > 1000, f
    assert sorted(p.stem for p in EXPERIMENTS.glob("fig_*.py")) == sorted(make_figures.SCRIPTS)


def _check_khisti(res):
    from otbound import draft_joint, optimal_acceptance_brute_force

    fig = importlib.import_module("fig_khisti_toy")
    assert set(res["results"]) == {f"{r}/{f}" for r in fig.READINGS for f in fig.FAMILIES}
    for case, c in res["results"].items():
        opt = np.array(c["optimal"])
        for name in fig.VERIFIER_LABELS:
            assert np.all(np.array(c[name]) <= opt + 1e-9), (case, name)
        # Khisti et al.: IS with LP-optimal selection weights attains the optimum at K = 2
        np.testing.assert_allclose(c["khisti_lp"], opt, atol=1e-8)
        # the optimum against an independent method (all 2^V subsets of the explicit joint law)
        for q2, a in list(zip(c["q2"], opt))[:: max(1, len(opt) // 7)]:
            p, q = fig.laws(case, q2)
            assert a == pytest.approx(optimal_acceptance_brute_force(p, draft_joint(q, 2)).value, abs=1e-12)
    # family A at q2 = 1/3 is draft = target (uniform): every verifier accepts surely
    for reading in fig.READINGS:
        c = res["results"][f"{reading}/A"]
        i = int(np.argmin(np.abs(np.array(c["q2"]) - 1 / 3)))
        if abs(c["q2"][i] - 1 / 3) < 1e-12:
            assert all(c[n][i] == pytest.approx(1.0, abs=1e-12) for n in ("optimal", "kseq", "rrs", "khisti_is"))
    # draft uniform on 3 symbols and K = 2: the optimum accepts surely iff no target mass exceeds 5/9
    # (P(y in drafts) = 1 - (2/3)^2 = 5/9 for every y), i.e. α* = Σ_y min(p(y), 5/9) here
    c = res["results"]["paper/A"]
    for q2, a in zip(c["q2"], c["optimal"]):
        p, _ = fig.laws("paper/A", q2)
        assert a == pytest.approx(np.minimum(p, 5 / 9).sum(), abs=1e-12)


def test_khisti_toy(quick):
    _check_khisti(_results(quick[0], "fig_khisti_toy"))


def test_solve_time_methods_agree(quick):
    fig = importlib.import_module("fig_solve_time")
    cells = _results(quick[0], "fig_solve_time")["results"]["cells"]
    assert cells
    for c in cells:
        assert set(c["median_s"]) == set(fig.METHODS), c  # quick sizes are small enough for every method
        assert all(t > 0 for t in c["median_s"].values())
        assert not any(fig.inaccurate(c, m) for m in fig.METHODS), c
    assert (quick[0] / "fig_solve_time.md").read_text().count("\n") >= len(cells) + 2


def test_maxflow_matches_dual_on_adversarial_laws():
    from otbound import draft_joint, optimal_acceptance

    fig = importlib.import_module("fig_solve_time")
    for p, q in ADVERSARIAL_PAIRS.values():
        for k in (1, 2, 3):
            value, err = fig.maxflow_acceptance(p, draft_joint(q, k))
            assert abs(value - optimal_acceptance(p, q, k)) <= err + 1e-15


def test_alpha_vs_k(quick):
    cells = _results(quick[0], "fig_alpha_vs_k")["results"]["cells"]
    by = {}
    for c in cells:
        assert 0.0 <= c["mean"] <= 1.0
        by.setdefault((c["dataset"], c["temperature"], c["sampling"]), {})[c["num_drafts"]] = c["mean"]
    for curve in by.values():
        ks = sorted(curve)
        assert all(curve[a] <= curve[b] + 1e-12 for a, b in zip(ks, ks[1:]))  # more drafts never hurt the optimum
    for (ds, t, _), curve in by.items():  # with one draft the three laws coincide (1 − TV)
        if 1 in curve:
            assert curve[1] == pytest.approx(by[(ds, t, "with_replacement")][1], abs=1e-12)


def test_verifier_table(quick):
    out = quick[0]
    rows = _results(out, "fig_verifier_table")["results"]["rows"]
    assert {r["verifier"] for r in rows} >= {"optimal", "nss", "rrs", "kseq", "rrs_wor", "greedy", "ot_wor_top",
                                             "ot_wor_iid", "ot_wor"}
    for r in rows:
        if r["method"] == "exact":
            assert r["acceptance"] <= r["optimal"] + 1e-9, r
        else:  # Monte Carlo estimate: within its interval of the bound
            assert r["acceptance"] <= r["optimal"] + 3 * r["acceptance_ci"] + 1e-9, r
        if r["verifier"] in ("greedy", "spechub", "ot", "optimal"):
            assert r["acceptance"] == pytest.approx(r["optimal"], abs=1e-8), r
    text = (out / "fig_verifier_table.md").read_text()
    assert "**optimal (with_replacement)**" in text and "| K = 2, T = 1.0 |" in text
    assert (out / "fig_temperature_sweep.md").is_file()


def _check_real_full(res):
    """Rows and paired differences of a fig_real_full result: acceptance never above α* of its law (Monte
    Carlo: within 3 half-widths), the exact optimal verifiers on α*, the rows' paired gaps equal to the
    paired differences, every cell present in both."""
    rows, paired = res["results"]["rows"], res["results"]["paired"]
    measured = [r for r in rows if r["acceptance"] is not None]
    assert {r["verifier"] for r in measured} >= {"optimal", "nss", "rrs", "kseq", "ot", "rrs_wor", "greedy"}
    for r in measured:
        slack = 3 * r["acceptance_ci"] if r["method"] == "monte_carlo" else 0.0
        assert r["acceptance"] <= r["optimal"] + slack + 1e-9, r
        if r["verifier"] in ("optimal", "ot", "greedy"):
            assert r["acceptance"] == pytest.approx(r["optimal"], abs=1e-9), r
    gaps = {(r["dataset"], r["temperature"], r["num_drafts"], r["a"]): r for r in paired if r["kind"] == "gap"}
    for r in measured:
        if r["verifier"] != "optimal":
            g = gaps[(r["dataset"], r["temperature"], r["num_drafts"], r["verifier"])]
            assert g["difference"] == pytest.approx(r["gap"], abs=1e-12)
            assert g["difference_ci"] == pytest.approx(r["gap_ci"], abs=1e-12)
    assert res["results"]["wall_time_s"] > 0


def test_real_full(quick):
    out = quick[0]
    res = _results(out, "fig_real_full")
    _check_real_full(res)
    assert res["meta"]["sha256"] == _common._results_key(res)
    assert res["results"]["prompts"] == {"quick-humaneval": 2, "quick-mtbench": 2}
    assert sorted({r["num_drafts"] for r in res["results"]["rows"]}) == [2, 3]
    text = (out / "fig_real_full.md").read_text()
    assert "| with_replacement | T | K = 2: α* | K = 2: kseq |" in text and "gap -" in text
    assert "| without_replacement | T |" in text and "## Paired differences" in text
    assert "- not run: `spechub` — K = 3" in text
    r = next(r for r in res["results"]["rows"] if r["verifier"] == "kseq" and r["num_drafts"] == 3
             and r["dataset"] == "quick-mtbench" and r["temperature"] == 1.0)
    table = next(b for b in text.split("\n\n") if b.startswith("| with_replacement |")).splitlines()
    line = next(x for x in table if x.startswith("| quick-mtbench | 1.0 |"))
    cell = line.split(" | ")[table[0].split(" | ").index("K = 3: kseq")]
    assert cell == (f"{r['acceptance']:.4f} ± {r['acceptance_ci']:.4f} ({100 * r['efficiency']:.1f}%); "
                    f"gap {r['gap']:+.4f} ± {r['gap_ci']:.4f}")


def test_real_full_imports_a_run_folder(quick, tmp_path):
    """--from-run stores a finished run folder as it is (same rows, the given wall time) and refuses a
    folder whose settings differ, naming the difference."""
    import shutil

    fig = importlib.import_module("fig_real_full")
    run = quick[0] / "fig_real_full-run"
    opts = ["--quick", "--results", str(tmp_path), "--out", str(tmp_path), "--formats", "png"]
    fig.main(opts + ["--from-run", str(run), "--wall-time-s", "12.5"])
    got, want = _results(tmp_path, "fig_real_full"), _results(quick[0], "fig_real_full")
    assert got["results"]["rows"] == want["results"]["rows"] and got["results"]["paired"] == want["results"]["paired"]
    assert got["results"]["wall_time_s"] == 12.5 and "--wall-time-s" in got["results"]["wall_time_source"]
    with pytest.raises(SystemExit):  # argparse error: --from-run needs --wall-time-s
        fig.main(opts + ["--from-run", str(run)])
    bad = tmp_path / "bad"
    shutil.copytree(run, bad, ignore=shutil.ignore_patterns("traces*", "shards", "measure"))
    opts = ["--quick", "--results", str(bad), "--out", str(bad), "--formats", "png"]  # not computed in this process
    rows = json.loads((run / "rows.json").read_text())
    (bad / "rows.json").write_text(json.dumps([r for r in rows if r["num_drafts"] != 3]))
    with pytest.raises(SystemExit, match="K is"):
        fig.main(opts + ["--from-run", str(bad), "--wall-time-s", "1"])
    (bad / "rows.json").write_text(json.dumps(rows))
    (bad / "report.json").write_text(json.dumps({"meta": {"pair": "someone else's"}}))
    with pytest.raises(SystemExit, match="the pair is"):
        fig.main(opts + ["--from-run", str(bad), "--wall-time-s", "1"])
    assert not (bad / "fig_real_full.json").exists()


def test_real_full_without_stored_result_says_how(tmp_path):
    fig = importlib.import_module("fig_real_full")
    with pytest.raises(_common.MissingResultsError, match="--from-run RUN_FOLDER --wall-time-s"):
        fig.main(["--results", str(tmp_path), "--out", str(tmp_path)])


def test_block_bounds(quick):
    fig = importlib.import_module("fig_block_bounds")
    res = _results(quick[0], "fig_block_bounds")["results"]
    assert res["random"] and all(c["verifiers"] for c in res["random"])
    for c in res["random"] + [res["sun_toy"]]:
        b = c["bounds"]
        assert b["causal"] <= b["joint"] + 1e-7 <= b["per_level"] + 2e-7, c
        for name, v in c["verifiers"].items():
            # a lossless verifier never beats U_causal of its own draft law (K i.i.d. blocks, or univer's
            # tree: own_bounds); one that does must be measured as lossy
            causal = c.get("own_bounds", {}).get(name, [b["causal"]])[0]
            assert v <= causal + 1e-7 or c["lossless_error"][name] > fig.LOSSLESS_TOL, (name, c)
    # the verifiers measured lossy are exactly the ones the registry declares lossy
    assert fig.not_lossless(res) == {n for n, v in BLOCK_VERIFIERS.items() if not v.lossless}
    univer = [c for c in res["random"] if "univer" in c["verifiers"]]
    assert univer and all(c["own_bounds"]["univer"][0] <= c["own_bounds"]["univer"][1] + 1e-7 for c in univer)
    toy = res["sun_toy"]
    assert toy["bounds"]["causal"] == pytest.approx(11 / 9, abs=1e-9)
    assert toy["bounds"]["joint"] == pytest.approx(12 / 9, abs=1e-9)
    assert toy["bounds"]["per_level"] == pytest.approx(12 / 9, abs=1e-9)
    assert toy["verifiers"]["token"] == pytest.approx(10 / 9, abs=1e-9)  # token-level verification
    assert toy["verifiers"]["block"] == pytest.approx(11 / 9, abs=1e-9)  # block verification reaches U_causal
    for br in res["brackets"]:
        assert br["lower"] <= br["upper"] + 1e-9, br
    _check_tree_verifiers(res, fig)


def _check_tree_verifiers(res, fig):
    """Verifiers measured by Monte Carlo on the truncated trees: every one that needs only the draft
    tree ran, and each lossless one stays below every upper bracket of U_causal on its tree (within
    twice its 95% CI half width plus ``fig.unseen_margin``, the bias that tuples never drawn can
    cause and the CI does not see — e.g. a zero-width CI when every drawn tuple gives the same
    value); the brackets are for K i.i.d. blocks, so a verifier run on its own
    draft law (univer) is only checked to lie in [0, L]."""
    tree = res["tree_verifiers"]
    sources = {b["source"] for b in res["brackets"]}
    assert {r["source"] for r in tree} == sources
    lossy = fig.not_lossless(res)
    for src in sources:
        rows = {r["verifier"]: r for r in tree if r["source"] == src}
        assert set(rows) >= {"token", "block", "multipath_rrs", "multipath_kseq", "traversal"}, src
        upper = min(b["upper"] for b in res["brackets"] if b["source"] == src and b["kind"] == "causal")
        for name, r in rows.items():
            assert 0 <= r["mean"] <= r["block_len"] and r["ci"] >= 0
            if name not in lossy and r.get("sampling", "with_replacement") == "with_replacement":
                assert r["mean"] <= upper + 2 * r["ci"] + fig.unseen_margin(r["block_len"]), (src, name, r, upper)


def test_stored_results_are_read_not_recomputed(tmp_path, quick):
    """A results file computed with the script's current parameters is read as is; other parameters recompute."""
    src = quick[0] / "fig_khisti_toy.json"
    stored = json.loads(src.read_text())
    stored["meta"]["created"] = "sentinel"
    (tmp_path / "fig_khisti_toy.json").write_text(json.dumps(stored))
    fig = importlib.import_module("fig_khisti_toy")
    paths = fig.main(["--quick", "--results", str(tmp_path), "--out", str(tmp_path), "--formats", "png"])
    assert json.loads((tmp_path / "fig_khisti_toy.json").read_text())["meta"]["created"] == "sentinel"
    assert [p.name for p in paths] == ["fig_khisti_toy.png", "fig_khisti_toy.md"]
    stored["params"]["points"] += 1
    (tmp_path / "fig_khisti_toy.json").write_text(json.dumps(stored))
    fig.main(["--quick", "--results", str(tmp_path), "--out", str(tmp_path), "--formats", "png"])
    assert json.loads((tmp_path / "fig_khisti_toy.json").read_text())["meta"]["created"] != "sentinel"


def test_real_pair_without_traces_or_results_says_how(tmp_path):
    fig = importlib.import_module("fig_alpha_vs_k")
    with pytest.raises(_common.MissingResultsError, match="--recompute"):
        fig.main(["--results", str(tmp_path), "--out", str(tmp_path), "--traces", str(tmp_path / "none")])


def test_command_line(tmp_path):
    cmd = [
        sys.executable,
        str(EXPERIMENTS / "fig_khisti_toy.py"),
        "--quick",
        "--out",
        str(tmp_path),
        "--formats",
        "png",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fig_khisti_toy.png").is_file() and "max(α* − α)" in done.stdout


def _check_deterministic_real(res):
    """Every exact acceptance at most α* of its law; the deterministic verifiers at α*(det) exactly; no
    position capped without truncation; the paired α* differences equal the difference of the means."""
    results = res["results"]["settings"]
    assert set(results) == set(res["params"]["settings"])
    for label, data in results.items():
        rows = data["rows"]
        opt = {(r["dataset"], r["temperature"], r["num_drafts"], r["sampling"]): r for r in rows
               if r["verifier"] == "optimal"}
        for law in ("deterministic", "without_replacement", "with_replacement", "greedy"):
            assert any(k[3] == law for k in opt), (label, law)
        for r in rows:
            if r["verifier"] != "optimal" and r["method"] == "exact" and r.get("lossless"):
                assert r["acceptance"] <= r["optimal"] + 1e-9, (label, r)
            if r["verifier"] in ("onehot", "nss_deterministic"):
                assert r["acceptance"] == pytest.approx(r["optimal"], abs=1e-9), (label, r)
        if not res["params"]["settings"][label]:
            assert all((r.get("capped_positions") or 0) == 0 for r in opt.values())
        checked = 0
        for p in data["paired"]:
            if p["kind"] == "laws" and {p["a"], p["b"]} == {"α*(deterministic)", "α*(wor)"}:
                key = (p["dataset"], p["temperature"], p["num_drafts"])
                want = opt[key + ("deterministic",)]["acceptance"] - opt[key + ("without_replacement",)]["acceptance"]
                sign = 1 if p["a"] == "α*(deterministic)" else -1
                assert sign * p["difference"] == pytest.approx(want, abs=1e-9)
                checked += 1
        assert checked == len({k[:3] for k in opt})


def test_deterministic_real(quick):
    res = _results(quick[0], "fig_deterministic_real")
    _check_deterministic_real(res)
    capped = [r["capped_positions"] for r in res["results"]["settings"]["top-p 0.8, top-k 20"]["rows"]
              if r["verifier"] == "optimal" and r["sampling"] == "without_replacement"]
    assert max(capped) > 0  # top-p 0.8 leaves fewer than K tokens somewhere on the tiny pair: the rule is exercised
    text = (quick[0] / "fig_deterministic_real.md").read_text()
    assert "α*(det) − α*(wor)" in text and "top-p 0.8, top-k 20" in text


@pytest.mark.parametrize(
    "name",
    ["fig_khisti_toy", "fig_solve_time", "fig_block_bounds", "fig_alpha_vs_k", "fig_verifier_table", "fig_real_full",
     "fig_deterministic_real"],
)
def test_stored_full_results_are_sane(name):
    """The committed data/results/<name>.json (when present) passes the same checks as the quick run."""
    path = _common.RESULTS / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{path} not stored (real-pair results need the model pair)")
    res = json.loads(path.read_text())
    assert res["meta"]["quick"] is False
    if name == "fig_khisti_toy":
        _check_khisti(res)
    elif name == "fig_solve_time":
        fig = importlib.import_module("fig_solve_time")
        for c in res["results"]["cells"]:
            for m in ("dual", "highs", "maxflow"):  # POT / cvxpy may miss α* on large LPs: marked † in the table
                assert m not in c["median_s"] or not fig.inaccurate(c, m), (m, c)
    elif name == "fig_block_bounds":
        fig = importlib.import_module("fig_block_bounds")
        for c in res["results"]["random"]:
            b = c["bounds"]
            assert b["causal"] <= b["joint"] + 1e-7 <= b["per_level"] + 2e-7
            for n, v in c["verifiers"].items():
                causal = c.get("own_bounds", {}).get(n, [b["causal"]])[0]
                assert v <= causal + 1e-7 or c["lossless_error"][n] > fig.LOSSLESS_TOL, (n, c)
        for br in res["results"]["brackets"]:
            assert br["lower"] <= br["upper"] + 1e-9
        _check_tree_verifiers(res["results"], fig)
    elif name == "fig_alpha_vs_k":
        assert all(0 <= c["mean"] <= 1 for c in res["results"]["cells"])
    elif name == "fig_deterministic_real":
        assert res["meta"]["sha256"] == _common._results_key(res)
        _check_deterministic_real(res)
    elif name == "fig_real_full":
        assert res["meta"]["sha256"] == _common._results_key(res)
        assert res["results"]["prompts"] == {"humaneval": 164, "mtbench": 80}
        _check_real_full(res)
    else:
        for r in res["results"]["rows"]:
            if r["method"] == "exact":
                assert r["acceptance"] <= r["optimal"] + 1e-9


def test_readme_figure_names_exist():
    """The README's figure (figures/main_job.png) shows only verifiers and draft laws the package has:
    its sidecar (written with it by fig_real_full) names them, and they are the ones with a paired gap
    at its temperature in the stored real-pair results it was drawn from."""
    from otbound import SAMPLINGS, VERIFIERS

    readme = (ROOT / "README.md").read_text()
    assert "(figures/main_job.png)" in readme
    side = json.loads((ROOT / "figures" / "main_job.json").read_text())
    assert side["figure"] == "main_job.png" and (ROOT / "figures" / "main_job.png").is_file()
    assert side["verifiers"] and set(side["verifiers"]) <= set(VERIFIERS), set(side["verifiers"]) - set(VERIFIERS)
    assert side["draft_laws"] and set(side["draft_laws"]) <= set(SAMPLINGS)
    stored = json.loads((ROOT / "data" / "results" / "fig_real_full.json").read_text())
    gaps = {r["a"] for r in stored["results"]["paired"] if r["kind"] == "gap"
            and r["temperature"] == side["temperature"]}
    assert set(side["verifiers"]) == gaps
    assert side["results_created"] == stored["meta"]["created"]


def test_quick_run_writes_the_readme_figure(quick):
    out = quick[0]
    side = json.loads((out / "main_job.json").read_text())
    assert (out / "main_job.png").stat().st_size > 1000
    res = _results(out, "fig_real_full")
    assert set(side["verifiers"]) == {r["a"] for r in res["results"]["paired"] if r["kind"] == "gap"
                                      and r["temperature"] == side["temperature"]}


def test_one_colour_per_name():
    """Every draft law and verifier of the registries has its own colour: the verifiers (token and block
    level, which the end-to-end figure shows together) all differ, and so do the laws."""
    from otbound import BLOCK_VERIFIERS, SAMPLINGS, VERIFIERS
    from otbound.report import plots

    assert set(SAMPLINGS) | set(VERIFIERS) | set(BLOCK_VERIFIERS) <= set(plots.COLORS)
    assert len({plots.color(s) for s in SAMPLINGS}) == len(SAMPLINGS)
    for law in SAMPLINGS:
        names = [n for n, v in VERIFIERS.items() if v.sampling == law]
        assert len({plots.color(n) for n in names}) == len(names), law
    names = set(VERIFIERS) | set(BLOCK_VERIFIERS)
    assert len({plots.color(n) for n in names}) == len(names)
