"""``python -m otbound.engine --synthetic`` end to end against a real llama-server (built once by
llama_cpp_build(), cached), and its bad-input paths."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from otbound.engine import children_of, load_engine_json, recompute_figures
from otbound.lm import llama_cpp_build, write_tiny_gguf_pair

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def build():
    return llama_cpp_build(progress=False)


def _llama_servers_of(pid: int) -> list[int]:
    """llama-server processes descended from ``pid`` (walking /proc)."""
    found, frontier = [], [pid]
    while frontier:
        kids = [c for p in frontier for c in children_of(p)]
        for c in kids:
            try:
                with open(f"/proc/{c}/comm") as fh:
                    if fh.read().strip().startswith("llama-server"):
                        found.append(c)
            except OSError:
                pass
        frontier = kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run(args, tmp_path, timeout=1500, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "otbound.engine", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_synthetic_audit_end_to_end(build, tmp_path):
    out = tmp_path / "audit"
    proc = _run(["--synthetic", "--out", str(out), "--quiet", "--num-prompts", "3", "--seeds", "2",
                 "--n-predict", "24", "--lossless-samples", "1200"], tmp_path)
    seen = set()
    while proc.poll() is None:  # the servers it starts, while it runs
        seen.update(_llama_servers_of(proc.pid))
        time.sleep(0.5)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert seen, "no llama-server was seen running under the audit"
    for pid in seen:  # none outlives the command
        assert not _alive(pid)
    record = load_engine_json(out / "engine.json")  # checksum and recomputed figures checked
    assert (out / "engine.md").exists() and (out / "engine.png").exists()
    assert record["engine"]["name"] == "llama.cpp llama-server" and record["engine"]["sha256"]
    confs = record["configurations"]
    assert {c["config"]["spec_type"] for c in confs} == {"draft-simple", "ngram-simple"}
    for conf in confs:
        counters = conf["counters"]
        # the figures recompute from the raw counters, which are the difference of the stored snapshots
        assert recompute_figures(conf) == []
        for key in ("draft_tokens", "accepted_tokens", "drafts"):
            assert counters[key] == conf["counters_after"][key] - conf["counters_before"][key]
        assert conf["timings_match_counters"]
        loss = conf["lossless"]
        assert 0.0 <= loss["p_value"] <= 1.0 and loss["samples"] == 1200 and 0 < loss["detectable_tv"] < 0.2
        if conf["config"]["spec_type"] != "draft-simple":
            continue
        assert counters["drafts"] > 0 and counters["draft_tokens"] >= counters["drafts"]
        # the engine's iterations rebuilt from its outputs and the draft's choices are its own counters
        assert conf["reconstruction_matches_counters"], (conf["reconstruction"], counters)
        # acceptance never lies above the bound of its scheme beyond sampling noise (one-sided, level 0.001)
        lo, hi = conf["prediction"]["engine_minus_bound_interval"]
        assert lo < hi and not conf["prediction"]["exceeds_bound"], conf["prediction"]
        assert conf["predicted_mean_acceptance_length"] == conf["bound_mean_acceptance_length"]
        # the prediction recomputes from the stored per-iteration target probabilities
        iters = conf["iterations"]
        expected = 1.0 + np.mean([np.cumprod(it["target_probs"]).sum() for it in iters])
        assert abs(expected - conf["predicted_mean_acceptance_length"]) < 1e-12
        alt = conf["best_alternative"]
        assert alt["mean_acceptance_length"] <= alt["bound_mean_acceptance_length"] + 1e-9
        assert alt["node_budget"] == conf["config"]["draft_max"]
    # draft-simple is lossless: no configuration rejects at α = 0.01 (4 tests: a false alarm has
    # probability below 4%), and neither does the control without speculation
    assert all(c["lossless"]["p_value"] >= 0.01 for c in confs), [c["lossless"] for c in confs]
    assert all(c["p_value"] >= 0.01 for c in record["controls"].values())
    # the engine's laws agree with an independent float64 forward of the same weights: llama.cpp
    # computes in float32 with an f16 KV cache (median TV ~5e-4); a near tie at the top-4 boundary
    # can change the kept set (then the TV is ~0.02), on at most 2% of the contexts
    chk = record["laws_check"]
    assert chk["target_laws_checked"] > 10 and chk["median_tv_target_laws"] < 2e-3
    assert chk["p95_tv_target_laws"] < 1e-2 and chk["target_supports_differing"] <= 0.02 * chk["target_laws_checked"]
    assert chk["draft_choices_agreeing"] == chk["draft_choices_checked"] > 10


def test_tampered_counters_are_refused(build, tmp_path):
    from otbound._integrity import CorruptFileError
    from otbound.engine import run_audit
    from otbound.engine._laws import Sampling

    out = tmp_path / "a"
    run_audit(out, synthetic=True, configs=[("draft-simple", 2, 0.0)], samplings=[Sampling.named("topk4")],
              num_prompts=1, seeds_per_prompt=1, n_predict=8, lossless_samples=50, progress=False)
    record = json.loads((out / "engine.json").read_text())
    record["configurations"][0]["counters"]["accepted_tokens"] += 1
    (out / "engine.json").write_text(json.dumps(record))
    with pytest.raises(CorruptFileError, match="checksum"):
        load_engine_json(out / "engine.json")


def test_server_that_dies_mid_run_is_one_line_and_leaves_no_result(build, tmp_path):
    from otbound.engine import EngineError, run_audit
    from otbound.engine._laws import Sampling

    out = tmp_path / "dies"
    (out).mkdir()
    (out / "engine.json").write_text('{"earlier": "audit"}')  # an earlier result: a failing rerun keeps it

    def kill(server):
        os.killpg(server.pid, signal.SIGKILL)

    with pytest.raises(EngineError, match="died during the audit"):
        run_audit(out, synthetic=True, configs=[("draft-simple", 2, 0.0)], samplings=[Sampling.named("topk4")],
                  num_prompts=1, seeds_per_prompt=1, n_predict=8, lossless_samples=20, progress=False,
                  server_hook=kill)
    assert (out / "engine.json").read_text() == '{"earlier": "audit"}'
    assert sorted(p.name for p in out.iterdir()) == ["engine.json"]  # nothing partial beside it
    assert _llama_servers_of(os.getpid()) == []


@pytest.mark.parametrize("args, message", [
    (["--pair", "no-such-pair"], "unknown pair 'no-such-pair'"),
    (["--synthetic", "--engine", "vllm-x"], "unknown engine 'vllm-x'"),
    (["--url", "http://127.0.0.1:9"], "nothing healthy is listening at http://127.0.0.1:9"),
    (["--synthetic", "--sampling", "hot"], "unknown sampling preset 'hot'"),
    (["--synthetic", "--config", "draft-simple:x"], "expected TYPE:N_MAX:P_MIN"),
    (["--synthetic", "--lossless-depth", "2"], "--lossless-depth must be at least 3"),
    ([], "choose --synthetic, --pair NAME or --url URL"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    proc = _run([*args, "--out", str(tmp_path / "o")], tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o" / "engine.json").exists()


def test_a_build_that_fails_is_one_line_exit_2(tmp_path, monkeypatch):
    import otbound.engine._run as run_mod
    from otbound.engine.__main__ import main
    from otbound.lm import BuildError

    def fail(progress):
        raise BuildError("llama.cpp's build failed; see /x/build.log")

    monkeypatch.setattr(run_mod, "_build", fail)
    with pytest.raises(SystemExit) as exc:
        main(["--synthetic", "--out", str(tmp_path / "o"), "--quiet"])
    assert exc.value.code == 2 and not (tmp_path / "o" / "engine.json").exists()


def test_real_llama_server_serves_the_tiny_pair_with_its_own_laws(build, tmp_path):
    """The tiny GGUF pair loads in llama-server, and its post-sampling law is the numpy forward's."""
    from otbound.engine import LlamaServer, Sampling, ServerLaws, TinyLaws

    pair = write_tiny_gguf_pair(tmp_path, seed=4)
    with LlamaServer(build.binary("llama-server"), pair.target, ctx_size=256) as srv:
        laws, ref = ServerLaws(srv.url), TinyLaws(pair)
        sampling = Sampling("t", {"temperature": 0.9, "top_k": 6, "top_p": 1.0, "min_p": 0.0})
        for context in ([72, 101, 108], [5, 9, 200, 31, 31, 7]):
            ids, p = laws.target(context, sampling, 10)
            rid, rp = ref.target(context, sampling, 10)
            assert ids.tolist() == rid.tolist()
            np.testing.assert_allclose(p, rp, atol=2e-3)  # float32 and an f16 KV cache in llama.cpp
        pid = srv.pid
    assert not _alive(pid)


def test_url_mode_audits_a_running_server_as_configured(build, tmp_path):
    """--url: a server someone else started; its counters, its laws (n_predict = 1 never drafts) and the
    lossless test work without local models; the prediction needs the draft's laws, so it is absent."""
    from otbound.engine import LlamaServer, run_audit
    from otbound.engine._laws import Sampling

    pair = write_tiny_gguf_pair(tmp_path / "pair", seed=2)
    with LlamaServer(build.binary("llama-server"), pair.target, draft=pair.draft, spec_type="draft-simple",
                     draft_max=3, ctx_size=512) as srv:
        prompts_before = srv.url
        record = run_audit(tmp_path / "out", url=srv.url, configs=[("draft-simple", 3, 0.0)],
                           samplings=[Sampling.named("topk4")], num_prompts=2,
                           seeds_per_prompt=2, n_predict=12, lossless_samples=300, progress=False,
                           prompt_source=str(_prompt_file(tmp_path)))
    assert prompts_before and record["engine"]["url"] == srv.url
    (conf,) = record["configurations"]
    assert conf["config"]["spec_type"] == "draft-simple" and conf["config"]["draft_max"] == 3
    assert conf["counters"]["drafts"] > 0 and recompute_figures(conf) == []
    assert conf["predicted_mean_acceptance_length"] is None and conf["best_alternative"] is None
    assert conf["lossless"]["samples"] == 300 and conf["lossless"]["p_value"] >= 0.01
    assert record["controls"] == {}


def _prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "x", "token_ids": [72, 101, 108, 108, 111]}\n'
                    '{"prompt": "y", "token_ids": [87, 111, 114, 108, 100, 33]}\n')
    return path
