"""The losslessness test's reference laws: read the way the engine computes what it samples.

A miniature of llama-server (its prompt cache, and logits that depend on whether each cached token was
evaluated alone or in a batch, as llama.cpp's quantised CPU kernels do) stands in for the server: the
control without speculation must pass against it, the laws the engine reports while sampling must equal
the reference exactly, and every p-value must be recomputable from what the result stores.
"""

import hashlib

import numpy as np
import pytest

from otbound.engine import Sampling, ServerLaws, _audit, _laws, _lossless
from otbound.engine._lossless import Cells, enumerate_cells, histogram_test, lossless_test, reported_vs_reference_tv

V = 4
PROMPT = [1, 2, 3, 0, 2]


class CachedEngine:
    """llama-server in miniature: one slot whose cache keeps the last request's evaluated tokens, each with
    the size of the batch it was evaluated in; the law at a context is a fixed random law of its tokens,
    its first logit shifted by ``shift · Σ log(batch size)`` over the context's tokens (0 for a token
    evaluated alone)."""

    def __init__(self, shift: float):
        self.shift, self.cache = float(shift), []

    def law(self, cached) -> np.ndarray:
        tokens = tuple(t for t, _ in cached)
        seed = int.from_bytes(hashlib.sha256(repr(tokens).encode()).digest()[:4], "little")
        z = np.random.default_rng(seed).normal(size=V)
        z[0] += self.shift * sum(np.log(size) for _, size in cached)
        p = np.exp(z - z.max())
        return p / p.sum()

    def __call__(self, url, body, timeout=None):
        ctx = [int(t) for t in body["prompt"]]
        keep = 0
        if body.get("cache_prompt", True):
            while keep < min(len(ctx), len(self.cache)) and self.cache[keep][0] == ctx[keep]:
                keep += 1
            keep = min(keep, len(ctx) - 1)  # a fully cached prompt has its last token evaluated again
        new = ctx[keep:]
        self.cache = self.cache[:keep] + [(t, len(new)) for t in new]
        rng = np.random.default_rng(int(body["seed"]))
        tokens, probs = [], []
        for j in range(int(body["n_predict"])):
            p = self.law(self.cache)
            tok = int(rng.choice(V, p=p))
            tokens.append(tok)
            order = np.argsort(-p, kind="stable")[: int(body.get("n_probs", 0))]
            probs.append({"top_probs": [{"id": int(i), "prob": float(p[i])} for i in order]})
            if j + 1 < int(body["n_predict"]):  # the last sampled token is never evaluated
                self.cache.append((tok, 1))
        reply = {"tokens": tokens, "timings": {}}
        if int(body.get("n_probs", 0)) > 0:
            reply["completion_probabilities"] = probs
        return reply


@pytest.fixture()
def engine(monkeypatch):
    fake = CachedEngine(shift=1.0)
    for module in (_audit, _laws, _lossless):
        monkeypatch.setattr(module, "completion", fake)
    return fake


SAMPLING = Sampling("plain", {"temperature": 1.0})


def test_the_control_passes_when_the_reference_is_read_as_plain_decoding_computes(engine):
    laws = ServerLaws("http://fake")
    res = lossless_test("http://fake", laws, PROMPT, SAMPLING, depth=3, samples=3000, n=V, label="control")
    # the miniature's laws move with the batches its tokens were evaluated in: read in another order (or
    # with the prompt's cache left by batches of other sizes) the reference is far from what is sampled
    # (the former breadth-first reading rejected this control: p = 0, empirical total variation 0.17)
    assert res["reported_vs_reference_tv"] == 0.0
    assert res["p_value"] >= 0.01, res
    assert res["numerics_tv"] > 0.005  # the same cells read with every context in one batch


def test_the_reference_is_read_depth_first_one_new_token_per_request(engine, monkeypatch):
    seen = []
    inner = engine.__call__

    def recording(url, body, timeout=None):
        before = [t for t, _ in engine.cache]
        reply = inner(url, body, timeout)
        if body.get("cache_prompt", True):
            seen.append((before, list(body["prompt"])))
        return reply

    for module in (_laws, _lossless):
        monkeypatch.setattr(module, "completion", recording)
    cells = enumerate_cells(ServerLaws("http://fake"), PROMPT, SAMPLING, depth=3, n=V, numerics=False)
    assert len(cells.tree) == 1 + V + V * V
    for before, ctx in seen[1:]:  # after the prompt's first evaluation: one token evaluated per context
        common = 0
        while common < min(len(before), len(ctx)) and before[common] == ctx[common]:
            common += 1
        assert len(ctx) - common <= 1, (before, ctx)
    assert all(engine.cache[i][1] == 1 for i in range(len(PROMPT) - 1, len(engine.cache)))
    assert all(engine.cache[i][1] == len(PROMPT) for i in range(len(PROMPT) - 1))  # the prompt in its own batch


def test_every_p_value_is_recomputable_from_the_stored_result(engine):
    res = lossless_test("http://fake", ServerLaws("http://fake"), PROMPT, SAMPLING, depth=2, samples=400, n=2,
                        label="stored")
    seqs, probs, rest = _lossless._cells_of(res["reference"], 2)
    again = histogram_test([s["tokens"] for s in res["sequences"]], seqs, probs, rest)
    assert again["p_value"] == pytest.approx(res["p_value"], rel=1e-12)
    assert again["g"] == pytest.approx(res["g"], rel=1e-12)
    assert rest > 1e-4  # n = 2 of 4 tokens: a rest cell that the stored laws rebuild too
    assert {len(s["tokens"]) for s in res["sequences"]} == {2}
    assert all(len(s["laws"]) == 2 for s in res["sequences"])


def test_a_law_source_without_a_server_is_read_depth_first_with_exact_cells():
    class Fixed:
        def __init__(self):
            self.asked = []

        def target(self, context, sampling, n):
            self.asked.append(tuple(context[len(PROMPT):]))
            return np.array([0, 1]), np.array([0.75, 0.25])

    src = Fixed()
    cells = enumerate_cells(src, PROMPT, SAMPLING, depth=2, n=2)
    assert isinstance(cells, Cells) and np.isnan(cells.numerics_tv)
    assert src.asked == [(), (0,), (1,)]
    assert cells.sequences == [(0, 0), (0, 1), (1, 0), (1, 1)]
    np.testing.assert_allclose(cells.probs, [0.5625, 0.1875, 0.1875, 0.0625], rtol=0, atol=1e-15)
    assert cells.rest == 0.0


def test_reported_laws_that_differ_from_the_reference_are_measured():
    tree = [{"prefix": [], "ids": [0, 1], "probs": [0.5, 0.5]},
            {"prefix": [0], "ids": [0, 1], "probs": [0.9, 0.1]}]
    seqs = [{"tokens": [0, 1], "laws": [[[0, 1], [0.5, 0.5]], [[0, 1], [0.8, 0.2]]]},
            {"tokens": [1, 0], "laws": [[[0, 1], [0.5, 0.5]], None]}]
    assert reported_vs_reference_tv(seqs, tree) == pytest.approx(0.1, abs=1e-12)
    assert reported_vs_reference_tv([{"tokens": [0], "laws": [None]}], tree) is None
