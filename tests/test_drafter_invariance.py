"""Drafter invariance as a conformance property: Gumbel-max list sampling passes, SpecInfer's RRS
fails with a counterexample that reproduces, and the command line reports both."""

import json

import numpy as np
import pytest

import otbound.conformance as oc
from otbound import InvalidInputError, sample_drafts
from otbound.conformance.__main__ import main
from otbound.conformance.examples import gls_procedure, specinfer_procedure


@pytest.mark.parametrize("k", [1, 2, 3])
def test_gls_is_drafter_invariant(k):
    res = oc.check_drafter_invariance(gls_procedure, num_drafts=k, vocab_size=4, instances=8, runs=32)
    assert res.passed and res.differing == 0 and res.runs == 8 * 32 and res.counterexample is None


@pytest.mark.parametrize("k", [1, 2])
def test_specinfer_is_not_and_its_counterexample_reproduces(k):
    res = oc.check_drafter_invariance(specinfer_procedure, num_drafts=k, instances=6, runs=32)
    assert not res.passed and res.differing > 0
    c = res.counterexample
    d1, t1 = specinfer_procedure(c.p, c.q, k, np.random.default_rng(list(c.stream)))
    d2, t2 = specinfer_procedure(c.p, c.q_other, k, np.random.default_rng(list(c.stream)))
    assert (tuple(d1), t1, tuple(d2), t2) == (c.drafts, c.token, c.drafts_other, c.token_other)
    assert t1 != t2


def test_a_procedure_drawing_its_output_first_is_invariant():
    """Naive sampling drawing Y ~ p before the drafts is invariant too: the check is about the stream,
    not about one algorithm."""

    def nss_first(p, q, k, rng):
        y = int(rng.choice(p.size, p=p))
        return sample_drafts(q, k, "with_replacement", 1, rng)[0], y

    assert oc.check_drafter_invariance(nss_first, instances=6, runs=16).passed


def test_contract_errors():
    with pytest.raises(oc.ConformanceError, match="returns \\(drafts, token\\)"):
        oc.check_drafter_invariance(lambda p, q, k, rng: 3, instances=2, runs=2)
    with pytest.raises(oc.ConformanceError, match="not a token id"):
        oc.check_drafter_invariance(lambda p, q, k, rng: ([0], 7), instances=2, runs=2)
    with pytest.raises(InvalidInputError, match="V = 1"):
        oc.check_drafter_invariance(gls_procedure, vocab_size=1)


def test_command_line(tmp_path, capsys):
    base = ["--level", "token", "--num-drafts", "2", "--drafter-invariance", "--instances", "4"]
    assert main(["otbound.conformance.examples:gls_procedure", *base, "--out", str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "report.json").read_text())["passed"] is True
    assert main(["otbound.conformance.examples:specinfer_procedure", *base, "--out", str(tmp_path / "b")]) == 1
    assert "NOT drafter-invariant" in capsys.readouterr().out
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["differing"] > 0 and report["counterexample"]["token"] != report["counterexample"]["token_other"]
    assert main(["otbound.conformance.examples:rrs", *base, "--out", str(tmp_path / "c")]) == 2
    assert main(["otbound.conformance.examples:gls_procedure", *base, "--mode", "sample", "--out",
                 str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error:") for line in err)
