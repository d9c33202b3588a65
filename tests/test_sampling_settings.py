"""SamplingParams against transformers' own logits processors (float64, 1e-12), validation, and the
stated rules at the cuts (masses on a cut, ties straddling it)."""

import dataclasses
import zlib

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from otbound import InvalidInputError, SamplingParams, laws_from_logits

TOL = 1e-12


def reference(s: SamplingParams, logits: np.ndarray, context: np.ndarray | None, on_cut: bool = False) -> np.ndarray:
    """transformers' processors in generate's order, in float64, then softmax.

    ``on_cut``: top-p and min-p lowered by 1e-12, so that a mass *on* a cut in exact arithmetic
    (which transformers' float64 puts on either side by rounding) falls on the side the stated rule
    gives it — removed at top-p (``≤``), kept at min-p (``<``) — and nothing else moves (masses
    this close to a cut without being on it have probability ~1e-12 on random logits)."""
    if on_cut:
        s = dataclasses.replace(s, top_p=None if s.top_p is None else max(s.top_p - 1e-12, 0.0),
                                min_p=None if s.min_p is None else max(s.min_p - 1e-12, 0.0))
    procs = LogitsProcessorList()
    if s.repetition_penalty is not None:
        procs.append(RepetitionPenaltyLogitsProcessor(s.repetition_penalty))
    procs.append(TemperatureLogitsWarper(s.temperature))
    if s.top_k is not None:
        procs.append(TopKLogitsWarper(top_k=s.top_k, min_tokens_to_keep=1))
    if s.top_p is not None:
        procs.append(TopPLogitsWarper(top_p=s.top_p, min_tokens_to_keep=1))
    if s.min_p is not None:
        procs.append(MinPLogitsWarper(min_p=s.min_p, min_tokens_to_keep=1))
    z = torch.tensor(logits, dtype=torch.float64)
    ids = torch.tensor(context if context is not None else np.zeros((logits.shape[0], 0)), dtype=torch.long)
    return torch.softmax(procs(ids, z), dim=-1).numpy()


SETTINGS = [
    SamplingParams(),
    SamplingParams(0.7),
    SamplingParams(1.3, top_k=5),
    SamplingParams(0.8, top_p=0.9),
    SamplingParams(0.5, top_p=0.5),
    SamplingParams(1.0, min_p=0.05),
    SamplingParams(0.7, top_k=20, top_p=0.8, repetition_penalty=1.05),
    SamplingParams(1.3, top_k=3, top_p=0.95, min_p=0.1, repetition_penalty=1.3),
    SamplingParams(0.9, repetition_penalty=0.8),
    SamplingParams(1.0, top_k=1),
    SamplingParams(1.0, top_p=0.0),
    SamplingParams(1.0, top_p=1.0, min_p=1.0),
    SamplingParams(2.0, top_k=1000),
]


def _random_case(rng, v, rows, ties):
    if ties:  # few distinct values: ties everywhere, including at the cuts
        logits = rng.integers(-3, 3, size=(rows, v)).astype(np.float64)
    else:
        logits = rng.normal(0, 3, size=(rows, v))
    context = rng.integers(0, v, size=(rows, 7))
    return logits, context


def _straddled_rows(s, logits, context):
    """Rows with tokens of equal processed logit on both sides of the top-p cut (where
    transformers' choice is its unstable sort's)."""
    out = np.zeros(logits.shape[0], dtype=bool)
    if s.top_p is None:
        return out
    pre = SamplingParams(s.temperature, top_k=s.top_k, repetition_penalty=s.repetition_penalty)
    with np.errstate(divide="ignore"):
        z = np.log(pre.laws(logits, context))  # the logits top-p sees, up to a row constant
    kept = SamplingParams(s.temperature, top_k=s.top_k, top_p=s.top_p, repetition_penalty=s.repetition_penalty).laws(
        logits, context) > 0
    for i, (zr, kr) in enumerate(zip(z, kept)):
        fin = np.isfinite(zr)
        out[i] = np.isin(zr[kr & fin], zr[~kr & fin]).any()
    return out


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("v", [16, 50, 257])
@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.describe())
def test_matches_transformers(s, v, ties):
    rng = np.random.default_rng([v, int(ties), zlib.crc32(s.describe().encode())])
    logits, context = _random_case(rng, v, 12, ties)
    ours = s.laws(logits, context)
    assert ours.dtype == np.float64 and ours.shape == logits.shape
    np.testing.assert_allclose(ours.sum(-1), 1.0, atol=1e-14)
    ref = reference(s, logits, context, on_cut=True)
    straddled = _straddled_rows(s, logits, context)
    # rows off such ties: equal entry by entry
    np.testing.assert_allclose(ours[~straddled], ref[~straddled], atol=TOL, rtol=0)
    # rows where tied tokens straddle the top-p cut: transformers keeps an arbitrary subset of the
    # tie; the number kept and the law's sorted values agree
    np.testing.assert_array_equal((ours[straddled] > 0).sum(-1), (ref[straddled] > 0).sum(-1))
    np.testing.assert_allclose(np.sort(ours[straddled], -1), np.sort(ref[straddled], -1), atol=TOL, rtol=0)
    # the torch path gives the same law, on the input's device, as float64
    t = s.laws(torch.tensor(logits), torch.tensor(context))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64
    np.testing.assert_allclose(t.numpy(), ours, atol=TOL, rtol=0)


def test_tie_rule_at_top_p_cut_removes_the_lower_index_first():
    # 16 tokens (torch's CPU sort is stable at this size): transformers' own choice, which is the
    # stated rule (a stable ascending sort: of equal logits the lower index is removed first)
    rng = np.random.default_rng(3)
    s = SamplingParams(1.0, top_p=0.5)
    logits = rng.integers(-2, 2, size=(40, 16)).astype(np.float64)
    ours = s.laws(logits)
    np.testing.assert_allclose(ours, reference(s, logits, None, on_cut=True), atol=TOL, rtol=0)
    # a hand case: four equal tokens, top-p 0.5 keeps the two of highest index
    np.testing.assert_allclose(s.laws(np.zeros(4)), [0.0, 0.0, 0.5, 0.5], atol=TOL)
    np.testing.assert_allclose(s.laws(torch.zeros(4)).numpy(), [0.0, 0.0, 0.5, 0.5], atol=TOL)


def test_top_k_keeps_ties_at_the_kth_value():
    law = SamplingParams(top_k=2).laws(np.array([1.0, 3.0, 1.0, 0.0]))
    np.testing.assert_allclose(law[[0, 2]], law[0])
    assert law[3] == 0 and (law > 0).sum() == 3


def test_repetition_penalty_context_forms():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 10))
    s = SamplingParams(repetition_penalty=1.4)
    shared = s.laws(logits, [1, 4, 4])
    np.testing.assert_allclose(shared, s.laws(logits, np.tile([1, 4, 4], (3, 1))), atol=TOL)
    # padding (< 0) and out-of-vocabulary ids are ignored
    np.testing.assert_allclose(s.laws(logits, [1, 4, -1, 99]), shared, atol=TOL)
    np.testing.assert_allclose(SamplingParams(repetition_penalty=1.0).laws(logits), laws_from_logits(logits, 1.0),
                               atol=TOL)
    with pytest.raises(InvalidInputError, match="context"):
        s.laws(logits)
    with pytest.raises(InvalidInputError, match="shape"):
        s.laws(logits, np.zeros((2, 3), dtype=int))
    with pytest.raises(InvalidInputError, match="integer"):
        s.laws(logits, [0.5])


def test_laws_from_logits_takes_settings():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(5, 30))
    s = SamplingParams(0.8, top_k=10, top_p=0.9)
    np.testing.assert_array_equal(laws_from_logits(logits, s), s.laws(logits))
    np.testing.assert_allclose(SamplingParams(0.8).laws(logits), laws_from_logits(logits, 0.8), atol=1e-15)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.1}, "top_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ],
)
def test_validation_names_the_field(kwargs, field):
    with pytest.raises(InvalidInputError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


def test_frozen_round_trip_and_bad_logits():
    s = SamplingParams(0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
    with pytest.raises(AttributeError):
        s.top_k = 3
    assert SamplingParams.from_dict(s.as_dict()) == s and hash(SamplingParams.from_dict(s.as_dict())) == hash(s)
    with pytest.raises(InvalidInputError, match="unknown sampling setting"):
        SamplingParams.from_dict({"temp": 1.0})
    with pytest.raises(InvalidInputError, match="NaN"):
        s.laws(np.array([0.0, np.nan]))
    with pytest.raises(InvalidInputError, match="-inf everywhere"):
        SamplingParams().laws(np.full(3, -np.inf))
    assert not SamplingParams(top_p=1.0).truncates and SamplingParams(min_p=0.1).truncates


# -- the truncation defect class ------------------------------------------------------------------


def _mismatch():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import truncation_mismatch

    return truncation_mismatch


def test_mismatch_law_matches_the_package_verifier_and_the_kit_flags_the_example():
    from otbound import VERIFIERS
    from otbound.conformance import check_token_verifier
    from otbound.conformance import examples as ex

    tm = _mismatch()
    rng = np.random.default_rng(4)
    for _ in range(5):
        logits = rng.normal(0, 2, 12)
        p = SamplingParams(0.8, top_k=6).laws(logits + rng.normal(0, 0.5, 12))
        q_trunc, q_raw = SamplingParams(0.8, top_k=6).laws(logits), SamplingParams(0.8).laws(logits)
        # forward direction: drafts from the truncated law, the package's RRS fed the raw one
        out, reported, true = tm.mismatch_output_law(p, q_trunc, q_raw)
        support = np.flatnonzero(q_trunc > 0)
        laws = VERIFIERS["rrs"].conditional_law(p, q_raw, support[:, None])
        np.testing.assert_allclose(out, q_trunc[support] @ laws, atol=1e-12)
        assert reported == pytest.approx(VERIFIERS["rrs"].acceptance(p, q_raw, 1), abs=1e-12)
        assert true == pytest.approx(float(q_trunc[support] @ laws[np.arange(support.size), support]), abs=1e-12)
        # fed the law it drafts from, the output is p
        np.testing.assert_allclose(tm.mismatch_output_law(p, q_trunc, q_trunc)[0], p, atol=1e-12)
    # the kit's example of the reverse direction: the worked numbers, and exact mode flags it
    out, reported, true = tm.mismatch_output_law([0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0, 2 / 3, 1 / 3])
    np.testing.assert_allclose(out, [0.55, 0.27, 0.18], atol=1e-12)
    assert (reported, true) == pytest.approx((0.5, 0.55), abs=1e-12)
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.6, 0.3])
    res = check_token_verifier(ex.rrs_truncated_q, vocab_size=3, num_drafts=1, instances=[(p, q)], shrink=False)
    assert not res.passed
    np.testing.assert_allclose(res.counterexample.output_law, [0.55, 0.27, 0.18], atol=1e-12)
    assert check_token_verifier(ex.rrs_truncated_q, vocab_size=2, num_drafts=2).passed  # nothing to truncate


# -- the command line -----------------------------------------------------------------------------


def test_cli_flags_reach_the_report_header(tmp_path):
    from otbound.compare import main

    out = main(["--synthetic", "--num-drafts", "2", "4", "--temperature", "0.8", "--instances", "2",
                "--mc-samples", "200", "--vocab-size", "8", "--top-k", "3", "--top-p", "0.9",
                "--draft-temperature", "0.9", "--out", str(tmp_path / "r")])
    md = (out / "report.md").read_text()
    assert "- target sampling: T=0.8, top-k=3, top-p=0.9" in md
    assert "- draft sampling: T=0.9, top-k=3, top-p=0.9" in md
    assert "optimal (deterministic)" in md and "onehot (deterministic)" in md
    # K = 4 drafts on a top-3 draft law: the laws needing 4 distinct tokens are listed, not valued
    assert "deterministic at K=4, T=0.8: 2 of 2" in md
    import json

    rows = json.loads((out / "report.json").read_text())["rows"]
    assert not [r for r in rows if r["num_drafts"] == 4 and r["sampling"] != "with_replacement"]


@pytest.mark.parametrize("flag,value", [("--top-k", "0"), ("--top-p", "1.5"), ("--min-p", "-1"),
                                        ("--repetition-penalty", "0"), ("--draft-temperature", "-1")])
def test_cli_bad_settings_exit_2_with_one_line(flag, value, tmp_path, capsys):
    from otbound.compare import main

    with pytest.raises(SystemExit) as err:
        main(["--synthetic", flag, value, "--out", str(tmp_path / "r")])
    assert err.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
