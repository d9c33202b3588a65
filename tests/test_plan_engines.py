"""The planner's candidate in llama.cpp's, vLLM's and SGLang's configuration (otbound.plan.engine_configurations):
flags checked against llama.cpp's own argument parser, exact only where the engine drafts and verifies
what the candidate does, and written into plan.json and plan.md."""

import json
import re
import shlex
import tempfile
from pathlib import Path

import pytest

from otbound import InvalidInputError
from otbound.plan import (
    chain_shape,
    engine_configurations,
    make_plan,
    synthetic_cost_model,
    synthetic_table,
    tree_shape,
    write_plan,
)


def _cand(law, shape, verifier="onehot"):
    return {"draft_law": law, "shape": shape, "verifier": verifier}


def test_a_deterministic_chain_is_exact_in_every_engine():
    cfg = engine_configurations(_cand("deterministic", chain_shape(1, 3)), target="t.gguf", draft="d.gguf",
                                target_hf="T", draft_hf="D")
    assert {e: c["match"] for e, c in cfg.items()} == {"llama.cpp": "exact", "vllm": "exact", "sglang": "exact"}
    assert shlex.split(cfg["llama.cpp"]["command"]) == [
        "llama-server", "-m", "t.gguf", "-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "3",
        "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    assert cfg["vllm"]["speculative_config"] == {"method": "draft_model", "model": "D", "num_speculative_tokens": 3}
    cmd = shlex.split(cfg["vllm"]["command"])
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == cfg["vllm"]["speculative_config"]
    sg = cfg["sglang"]["args"]
    assert sg[sg.index("--speculative-num-steps") + 1] == "3"
    assert sg[sg.index("--speculative-eagle-topk") + 1] == "1"
    assert sg[sg.index("--speculative-num-draft-tokens") + 1] == "4"  # the verified root counts


def test_sampled_drafts_and_trees_are_only_the_nearest_and_say_why():
    sampled = engine_configurations(_cand("with_replacement", chain_shape(1, 4), "rrs"))
    assert sampled["llama.cpp"]["match"] == "nearest" and "sampled drafts" in sampled["llama.cpp"]["note"]
    assert sampled["vllm"]["match"] == "exact"  # one chain: vLLM's draft model drafts a chain
    tree = engine_configurations(_cand("with_replacement", tree_shape([2, 2, 1]), "rrs"))
    assert tree["llama.cpp"]["match"] == tree["vllm"]["match"] == tree["sglang"]["match"] == "nearest"
    assert "not lossless" in tree["llama.cpp"]["note"] and "-np" in tree["llama.cpp"]["note"]
    assert tree["llama.cpp"]["runs"] == {"draft_law": "deterministic", "branching": [1, 1, 1], "nodes": 3}
    sg = tree["sglang"]["args"]
    assert sg[sg.index("--speculative-eagle-topk") + 1] == "2"
    assert sg[sg.index("--speculative-num-draft-tokens") + 1] == str(tree_shape([2, 2, 1])["nodes"] + 1)


def test_bad_candidates_are_refused():
    with pytest.raises(InvalidInputError, match="draft law"):
        engine_configurations(_cand("beam", chain_shape(1, 2)))
    with pytest.raises(InvalidInputError, match="branching"):
        engine_configurations(_cand("deterministic", {"branching": [], "nodes": 0}))


def test_the_llama_cpp_flags_are_the_vendored_servers_own():
    """Every flag the planner writes for llama-server is declared by llama.cpp's argument parser
    (common/arg.cpp of the pinned source), for the server."""
    from otbound.lm import llama_cpp_build

    src = llama_cpp_build(progress=False).source / "common" / "arg.cpp"
    text = src.read_text()
    cfg = engine_configurations(_cand("deterministic", chain_shape(1, 2)))
    for flag in [a for a in cfg["llama.cpp"]["args"] if a.startswith("--")]:
        m = re.search(r'common_arg\(\s*\{[^}]*"' + re.escape(flag) + r'"[^}]*\}', text)
        assert m is not None, flag
        declaration = text[m.start():text.find("add_opt(", m.end())]
        examples = re.search(r"\.set_examples\(\{([^}]*)\}", declaration)
        assert examples is not None and "LLAMA_EXAMPLE_SERVER" in examples.group(1), flag


def test_the_plan_writes_the_engine_configurations_of_its_best_candidate():
    table = synthetic_table(num_traces=3, positions=6, max_drafts=2, verifiers=("rrs", "onehot"),
                            laws=("with_replacement", "deterministic"))
    plan = make_plan(table, synthetic_cost_model(), max_depth=3, budgets=(1, 2, 4))
    out = Path(tempfile.mkdtemp())
    write_plan(plan, out)
    body = json.loads((out / "plan.json").read_text())
    best = plan.best()
    assert body["engines"] == json.loads(json.dumps(engine_configurations(best, plan)))
    assert body["engines"]["llama.cpp"]["args"][3] == str(len(best.shape["branching"]))
    md = (out / "plan.md").read_text()
    assert "in the engines' configuration" in md and body["engines"]["llama.cpp"]["command"] in md
    if body["engines"]["llama.cpp"]["match"] == "nearest":  # the plan holds the deterministic chain
        pred = body["engines"]["llama.cpp"]["nearest_prediction"]
        same = [c for c in plan.candidates + plan.optimum
                if c.draft_law == "deterministic" and c.shape["branching"] == pred["branching"]]
        assert pred["predicted_speedup"] == pytest.approx(max(c.predicted_speedup for c in same), rel=1e-12)
