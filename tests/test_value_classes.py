"""Values a user reads, each checked against an independent computation.

* Main and paper tables rendered from rows at several temperatures: every cell against the row it
  came from (expected text formatted here, not by the renderer), and a synthetic report at two
  temperatures whose α* cells are recomputed from the documented per-cell seeds.
* The greedy draft law with ties among the top K − 1 draft tokens carrying different target
  probabilities: the batched measurement (:func:`otbound.report.measure_laws`) against the per-row
  ``optimal_acceptance(p, q, K, sampling="greedy")`` and a hand-computed value.
* :func:`otbound.lm.speculative_sample` at T ∈ {0.5, 0.8, 1.3}: the first generated token's law
  G-tested against the target's exact law at T (power stated in the test).
* Checkpoints of another model pair in the same folder are never reused.
"""

from __future__ import annotations

import functools
import json
import re
import zlib

import numpy as np
import pytest
import scipy.stats

import otbound as ob
from otbound.conformance import degrees_of_freedom, g_test, power
from otbound.report import Shard, run_shards, tables

# ---------------------------------------------------------------------------------------------
# tables at several temperatures

TEMPS = (0.5, 1.0, 1.5)
KS = (2, 3)
DATASETS = ("alpha", "beta")
LAWS = {"with_replacement": ["rrs", "kseq"], "greedy": ["greedy"]}


def _rows_at_several_temperatures():
    """One row per (dataset, T, K, law, verifier) with a value unique to it (so a cell taken from
    any other row shows a different number)."""
    rows, n = [], 0
    for d in DATASETS:
        for t in TEMPS:
            for k in KS:
                for law, names in LAWS.items():
                    n += 1
                    opt = 0.5 + 0.001 * n + 0.1 * TEMPS.index(t)
                    rows.append(dict(dataset=d, temperature=t, num_drafts=k, sampling=law, verifier="optimal",
                                     acceptance=opt, acceptance_ci=0.0001 * n, optimal=opt, positions=10,
                                     method="exact"))
                    for j, v in enumerate(names):
                        acc = opt - 0.01 * (j + 1) - 0.0003 * n
                        rows.append(dict(dataset=d, temperature=t, num_drafts=k, sampling=law, verifier=v,
                                         acceptance=acc, acceptance_ci=0.0002 * n, optimal=opt, positions=10,
                                         method="exact", gap=acc - opt, gap_ci=0.00005 * n))
    return rows


def _expected_cell(r) -> str:
    s = f"{r['acceptance']:.4f} ± {r['acceptance_ci']:.4f}"
    if r["verifier"] != "optimal":
        s += f" ({100 * r['acceptance'] / r['optimal']:.1f}%)"
    return s


def _parse_tables(markdown: str) -> list[list[list[str]]]:
    """Markdown tables as lists of rows of stripped cells (separator lines dropped)."""
    out, cur = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                cur.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif cur:
            out.append(cur)
            cur = []
    return out


def test_main_tables_at_several_temperatures_show_each_row_in_its_own_cell():
    rows = _rows_at_several_temperatures()
    seen = set()
    for table in _parse_tables(tables.all_tables(rows)):
        m = re.fullmatch(r"K = (\d+), T = ([\d.]+)", table[0][0])
        assert m, table[0]
        k, t = int(m.group(1)), float(m.group(2))
        datasets = table[0][1:]
        assert datasets == list(DATASETS)
        for line in table[1:]:
            label, cells = line[0], line[1:]
            lm = re.fullmatch(r"\*\*optimal \((\w+)\)\*\*|(\w+) \((\w+)\)", label)
            law, verifier = (lm.group(1), "optimal") if lm.group(1) else (lm.group(3), lm.group(2))
            for d, cell in zip(datasets, cells):
                (r,) = [r for r in rows if (r["dataset"], r["temperature"], r["num_drafts"], r["sampling"],
                                             r["verifier"]) == (d, t, k, law, verifier)]
                assert cell == _expected_cell(r), (k, t, law, verifier, d)
                seen.add(id(r))
    assert seen == {id(r) for r in rows}, "every row is shown exactly where it belongs"


def test_paper_tables_at_several_temperatures_show_each_row_in_its_own_cell():
    rows = _rows_at_several_temperatures()
    seen = set()
    parsed = _parse_tables(tables.paper_tables(rows))
    assert [t[0][0] for t in parsed] == ["with_replacement", "greedy"]
    for table in parsed:
        law = table[0][0]
        columns = [re.fullmatch(r"K = (\d+): (.+)", h).groups() for h in table[0][2:]]
        for line in table[1:]:
            d, t = line[0], float(line[1])
            for (k, v), cell in zip(columns, line[2:]):
                v = "optimal" if v == "α*" else v
                (r,) = [r for r in rows if (r["dataset"], r["temperature"], r["num_drafts"], r["sampling"],
                                             r["verifier"]) == (d, t, int(k), law, v)]
                want = _expected_cell(r)
                if v != "optimal":
                    want += f"; gap {r['gap']:+.4f} ± {r['gap_ci']:.4f}"
                assert cell == want, (law, d, t, k, v)
                seen.add(id(r))
    assert seen == {id(r) for r in rows}


def test_synthetic_report_at_two_temperatures_alpha_cells_match_a_recomputation(tmp_path):
    """The report's α* cells at T = 0.6 and 1.4 against α* recomputed here from the documented
    per-cell seed ``default_rng([seed, crc32("family|T")])`` (exact; printed to 4 decimals)."""
    from otbound import compare
    from otbound.report._synthetic import synthetic_pair

    instances, vocab, seed = 3, 6, 4
    compare.main(["--synthetic", "--vocab-size", str(vocab), "--instances", str(instances), "--num-drafts", "2",
                  "--temperature", "0.6", "1.4", "--mc-samples", "200", "--seed", str(seed), "--out", str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    checked = 0
    for table in _parse_tables(md):
        m = re.fullmatch(r"K = (\d+), T = ([\d.]+)", table[0][0])
        if not m:
            continue
        k, t = int(m.group(1)), float(m.group(2))
        for line in table[1:]:
            lm = re.fullmatch(r"\*\*optimal \((\w+)\)\*\*", line[0])
            if not lm:
                continue
            for name, cell in zip(table[0][1:], line[1:]):
                family = name.split(" ")[0]
                rng = np.random.default_rng([seed, zlib.crc32(f"{family}|{t!r}".encode())])
                pairs = [synthetic_pair(family, vocab, t, rng) for _ in range(instances)]
                want = np.mean([ob.optimal_acceptance(p, q, k, sampling=lm.group(1)) for p, q in pairs])
                assert float(cell.split(" ")[0]) == pytest.approx(want, abs=5e-5), (t, family, lm.group(1))
                checked += 1
    assert checked == 2 * 2 * len(ob.SAMPLINGS)  # T × family × law


# ---------------------------------------------------------------------------------------------
# greedy ties with different target probabilities on the tied tokens


def _greedy_tie_rows(v=7, seed=3):
    """Rows whose draft law ties among its top tokens (several tie patterns), and whose target puts
    different probabilities on the tied tokens (so the tie rule changes α*_greedy)."""
    rng = np.random.default_rng(seed)
    qs = [
        [0.3, 0.3, 0.1, 0.1, 0.1, 0.05, 0.05],  # tie for the top (K = 2: one of the two kept)
        [0.4, 0.15, 0.15, 0.15, 0.05, 0.05, 0.05],  # tie for places 2-4 (K = 3: two of three kept)
        [0.2, 0.2, 0.2, 0.2, 0.1, 0.05, 0.05],  # four-way tie at the top
        [0.05, 0.25, 0.05, 0.25, 0.2, 0.1, 0.1],  # tie at non-leading indices
        np.array([1, 5, 1, 5, 1, 1, 5]) / 19,  # the top K - 1 = 3 all tied (no tie at the edge of G for K = 4)
    ]
    p, q = [], []
    for row in qs:
        row = np.asarray(row, dtype=np.float64)
        # a target far above q' on the tied tokens, with other values on each: the tie rule decides α*
        tied = np.flatnonzero(np.isin(row, [x for x in row if np.count_nonzero(row == x) > 1]))
        weight = np.full(v, 0.2)
        weight[tied] = [6.0, 2.0, 1.0, 0.5, 3.0, 0.3, 4.0][: tied.size]
        for law in (weight * row / (weight * row).sum(), weight[::-1] * row / (weight[::-1] * row).sum()):
            p.append(law)
            q.append(row)
        for _ in range(2):
            p.append(rng.dirichlet(np.full(v, 0.4)))
            q.append(row)
    return np.array(p), np.array(q)


def _greedy_reference(p, q, k):
    """``(G, α*_greedy)`` computed directly, independent of the library's top-token code: G the first
    K − 1 tokens by (−q, index) (a Python sort), q' = q off G renormalised, and
    α* = p(G) + Σ_{x∉G} min(p(x), q'(x))."""
    g = sorted(range(q.size), key=lambda x: (-q[x], x))[: k - 1]
    off = np.ones(q.size, dtype=bool)
    off[g] = False
    qp = np.where(off, q, 0.0) / q[off].sum()
    return g, float(p[g].sum() + np.minimum(p, qp)[off].sum())


def test_greedy_ties_batched_measurement_matches_the_per_row_bound():
    """The batched and per-row greedy bounds on rows with ties among the top draft tokens against
    α*_greedy computed directly (:func:`_greedy_reference`, atol 1e-12), and the tokens G of
    :func:`otbound.greedy_split` and of the kernel's batched split against the reference order
    (decreasing q, ties to the lower index)."""
    from otbound.token._kernel import LawBatch, greedy_split_rows

    p, q = _greedy_tie_rows()
    ks = (2, 3, 4)
    ref = {k: [_greedy_reference(p[i], q[i], k) for i in range(len(p))] for k in ks}
    for k in ks:
        for i in range(len(p)):
            assert ob.greedy_split(q[i], k)[0].tolist() == ref[k][i][0], f"K={k}, row {i}"
    # the whole batch, and each row alone (torch.topk orders tied values differently by batch shape)
    for rows in [np.arange(len(p))] + [np.array([i]) for i in range(len(p))]:
        out = ob.report.measure_laws(p[rows], q[rows], ks, verifiers=["greedy"], samplings=("greedy",))
        for k in ks:
            idx = greedy_split_rows(LawBatch(p[rows], q[rows]), k - 1)[0]
            assert idx.tolist() == [ref[k][i][0] for i in rows], f"K={k}, rows {rows}"
            np.testing.assert_allclose(out["optimal"]["greedy"][k], [ref[k][i][1] for i in rows], rtol=0,
                                       atol=1e-12, err_msg=f"K={k}, rows {rows}")
            per_row = [ob.optimal_acceptance(p[i], q[i], k, sampling="greedy") for i in rows]
            np.testing.assert_allclose(out["optimal"]["greedy"][k], per_row, rtol=0, atol=1e-12,
                                       err_msg=f"K={k}, rows {rows}")
            # the greedy verifier attains the greedy bound (exact acceptance), ties included
            np.testing.assert_allclose(out["verifiers"]["greedy"][k]["acceptance"], per_row, rtol=0, atol=1e-12)
    out = ob.report.measure_laws(p, q, ks, verifiers=["greedy"], samplings=("greedy",))
    # the tie rule matters on these rows: a different rule (highest index first) gives other values
    flipped = [ob.optimal_acceptance(pi[::-1], qi[::-1], 2, sampling="greedy") for pi, qi in zip(p, q)]
    assert np.max(np.abs(np.array(flipped) - out["optimal"]["greedy"][2])) > 0.01


def test_greedy_tie_hand_computed_value_in_the_batched_measurement():
    """q ties tokens 0 and 1 for the top; the deterministic draft keeps the lower index (0), so
    α*_greedy(K=2) = p(0) + Σ_{x≠0} min(p(x), q'(x)) with q' = q without 0, renormalised:
    p = (0.1, 0.6, 0.3), q = (0.4, 0.4, 0.2), q' = (0, 2/3, 1/3): 0.1 + 0.6 + 0.3 = 1.0; the other
    tie rule would give 0.6 + min(0.1, 2/3) + min(0.3, 1/3) = 1.0 too, so p is chosen with p(1) >
    q'(1) instead: p = (0.1, 0.8, 0.1): 0.1 + 2/3 + 0.1 = 0.8667 (other rule 0.8 + 0.1 + 0.1 = 1)."""
    p = np.array([[0.1, 0.8, 0.1]])
    q = np.array([[0.4, 0.4, 0.2]])
    out = ob.report.measure_laws(p, q, (2,), verifiers=["greedy"], samplings=("greedy",))
    assert out["optimal"]["greedy"][2][0] == pytest.approx(0.1 + 2 / 3 + 0.1, abs=1e-12)
    assert ob.optimal_acceptance(p[0], q[0], 2, sampling="greedy") == pytest.approx(0.1 + 2 / 3 + 0.1, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# the speculative decoder at temperatures other than 1

LEVEL = 1e-3
N_FIRST = 600  # decoder runs per (temperature, prompt)
SPEC_PROMPTS = ([1, 2, 3], [5, 0])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """torch on one thread: the tiny models' forwards are fastest so on a shared machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pair8():
    return ob.lm.tiny_pair(8, noise=0.5, seed=1)


def _first_token_g_test(pair, temperature, verifier, k, length):
    """G-test of the first generated token (pooled over the prompts, cells with expected count < 5
    merged) against the target's exact law at ``temperature``; returns (p-value, degrees of freedom)."""
    import torch

    from otbound.lm import forward

    g, dof = 0.0, 0
    for j, prompt in enumerate(SPEC_PROMPTS):
        with torch.no_grad():
            logits = forward(pair.target, torch.tensor([prompt]), keep=1)[0, -1, : pair.vocab_size].double().numpy()
        law = ob.laws_from_logits(logits, temperature)
        counts = np.zeros(pair.vocab_size)
        for s in range(N_FIRST):
            r = ob.lm.speculative_sample(pair, prompt, verifier=verifier, num_drafts=k, block_len=length,
                                         temperature=temperature, max_new_tokens=1, seed=[j, s, 7])
            counts[r.tokens[0]] += 1
        big = N_FIRST * law >= 5
        cells = np.append(law[big], law[~big].sum())
        obs = np.append(counts[big], counts[~big].sum())[cells > 0]
        g += g_test(obs, cells[cells > 0])[0]  # the conformance kit's G statistic of this prompt
        dof += degrees_of_freedom(cells)
    return float(scipy.stats.chi2.sf(g, dof)), dof


@pytest.mark.parametrize("temperature", [0.5, 0.8, 1.3])
@pytest.mark.parametrize("verifier,k,length", [("rrs", 2, 2), ("greedy", 2, 1)])
def test_speculative_sample_is_lossless_at_temperatures_other_than_one(pair8, temperature, verifier, k, length):
    """Lossless at T ≠ 1: the first emitted token follows the target's law at T (G-test, level
    1e-3). Power: with N = 600 runs per prompt over two prompts (pooled, ≤ 14 degrees of freedom)
    a distortion of total variation 0.11 on each prompt's first token is detected with probability
    ≥ 0.99 (the kit's bound :func:`otbound.conformance.power`, asserted below); drafting from the
    law at T = 1 instead of T is a distortion of TV 0.25 at T = 0.5 on this pair."""
    pv, dof = _first_token_g_test(pair8, temperature, verifier, k, length)
    assert power(len(SPEC_PROMPTS) * N_FIRST, dof, 0.11, 1e-3) > 0.99
    assert pv > LEVEL, f"{verifier} at T={temperature}: G-test p = {pv:.2e}"


# ---------------------------------------------------------------------------------------------
# checkpoints of another model pair


def _pair_tag(load_pair, *, x):
    return {"pair": load_pair().name, "x": x}


class _Named:
    def __init__(self, name):
        self.name = name
        self.target = None


def test_run_shards_never_reuses_another_pairs_checkpoint(tmp_path):
    """Same shard ids and arguments, another pair: every shard is recomputed with the new pair."""
    first = [Shard(f"s{i}", _pair_tag, {"x": i}, pair="pair-a", loader=functools.partial(_Named, "A"))
             for i in range(3)]
    assert [r["pair"] for r in run_shards(first, tmp_path, progress=False)] == ["A"] * 3
    second = [Shard(f"s{i}", _pair_tag, {"x": i}, pair="pair-b", loader=functools.partial(_Named, "B"))
              for i in range(3)]
    assert [r["pair"] for r in run_shards(second, tmp_path, progress=False)] == ["B"] * 3
    stored = {k: v["result"]["pair"] for k, v in ob.report.read_checkpoints(tmp_path).items()}
    assert stored == {"s0": "B", "s1": "B", "s2": "B"}


def test_real_report_rerun_with_another_pair_does_not_reuse_the_old_pair(tmp_path):
    """A real-model report rerun in the same folder with another (loaded) pair (the same datasets, so
    the same shard ids): refused before any work, naming both pairs, and the old report's rows stay; in a
    fresh folder the other pair gives other numbers (so reuse would have been visible)."""
    from otbound.report import run_real_report

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "token_ids": [i, i + 1, 2]}) + "\n" for i in range(3)))
    kw = dict(datasets=[data], num_prompts=3, max_new_tokens=4, temperatures=(1.0,), num_drafts=(2,),
              progress=False, verifiers=["rrs"], mc_samples=8, prompts_per_shard=2, store_logits="none")
    a, b = ob.lm.tiny_pair(8, seed=0), ob.lm.tiny_pair(8, seed=1)
    rows_a = run_real_report(a, out=tmp_path / "r", **kw)
    before = (tmp_path / "r" / "rows.json").read_text()
    with pytest.raises(ob.InvalidInputError, match="another model pair"):
        run_real_report(b, out=tmp_path / "r", **kw)
    assert (tmp_path / "r" / "rows.json").read_text() == before
    rows_b = run_real_report(b, out=tmp_path / "fresh", **kw)
    assert [r["acceptance"] for r in rows_a] != [r["acceptance"] for r in rows_b]
    assert run_real_report(a, out=tmp_path / "r", **kw) == rows_a  # the same pair resumes as before
