"""The planner's candidate in the serving engines' own configuration: llama.cpp, vLLM, SGLang.

Each engine drafts and verifies in its own fixed way, so a candidate (draft law × shape × verifier,
:class:`otbound.plan.Candidate`) maps onto an engine exactly, onto its nearest configuration, or not at
all; :func:`engine_configurations` says which, with ready-to-run arguments:

* **llama.cpp** ``llama-server --spec-type draft-simple`` (flags of ``common/arg.cpp``:
  ``--spec-draft-n-max``, ``--spec-draft-n-min``, ``--spec-draft-p-min``) drafts one chain of the
  draft's most likely tokens and verifies it by sampling the target and accepting while the sample
  equals the draft — the deterministic law at one draft per node, which no lossless verifier beats.
  Exact for a deterministic chain (``n_min = 0`` and ``p_min = 0``: every iteration drafts the whole
  chain, as the planner's fixed shape does). It cannot sample drafts nor verify several per node; its
  multi-draft example ``llama-speculative`` is not lossless (docs/guide/engine.md) and is not offered.
* **vLLM** ``speculative_config = {"method": "draft_model", "model": ..., "num_speculative_tokens": L}``
  (``--speculative-config`` of ``vllm serve``): one chain of ``L`` drafted tokens per step. Exact shape
  for a chain of one draft per node; trees and several drafts per node are not expressible with a
  draft model.
* **SGLang** ``--speculative-algorithm STANDALONE --speculative-draft-model-path ...
  --speculative-num-steps L --speculative-eagle-topk k --speculative-num-draft-tokens N``: a tree of
  the draft's top-``k`` children per step, ``L`` steps, the ``N − 1`` best nodes by the draft's
  scores verified (``N`` counts the verified root). Exact for a deterministic chain (``k = 1``,
  ``N = L + 1``); for a deterministic tree the nearest (same depth, largest branching, same node
  count: SGLang picks the nodes by score, not by a fixed branching); sampled laws: the nearest
  deterministic shape.

Where the candidate is not exact, the nearest configuration's own prediction is taken from the plan
when the plan holds it (the deterministic law in the same shape), so the cost of the engine's
restriction is stated in the planner's own numbers.
"""

from __future__ import annotations

import json
import shlex

from otbound._validation import InvalidInputError

#: the engines :func:`engine_configurations` speaks
ENGINES = ("llama.cpp", "vllm", "sglang")


def _shape_of(candidate):
    shape = candidate["shape"] if isinstance(candidate, dict) else candidate.shape
    law = candidate["draft_law"] if isinstance(candidate, dict) else candidate.draft_law
    return law, [int(b) for b in shape["branching"]], int(shape["nodes"])


def _as_dict(c) -> dict:
    return c if isinstance(c, dict) else c.as_dict()


def _nearest(plan, branching) -> dict | None:
    """The plan's best candidate (or optimum) of the deterministic law in ``branching``, if planned."""
    if plan is None:
        return None
    pool = [_as_dict(c) for c in list(plan.candidates) + list(plan.optimum)]
    fit = [c for c in pool if c["draft_law"] == "deterministic" and list(c["shape"]["branching"]) == list(branching)]
    if not fit:
        return None
    best = max(fit, key=lambda c: c["predicted_speedup"])
    return {"draft_law": "deterministic", "branching": list(branching), "verifier": best["verifier"],
            "mean_acceptance_length": best["mean_acceptance_length"], "predicted_speedup": best["predicted_speedup"]}


def engine_configurations(candidate, plan=None, *, target: str = "TARGET.gguf", draft: str = "DRAFT.gguf",
                          target_hf: str = "TARGET", draft_hf: str = "DRAFT") -> dict:
    """``{engine: configuration}`` for one planned candidate (module docstring).

    Parameters
    ----------
    candidate : Candidate or dict
        The planner's candidate (:meth:`otbound.plan.Plan.best`), or its dictionary.
    plan : Plan, optional
        The plan it came from: where an engine cannot run the candidate exactly, its nearest
        configuration's prediction is looked up there.
    target, draft : str
        The GGUF files in llama.cpp's command.
    target_hf, draft_hf : str
        The model names or paths in vLLM's and SGLang's.

    Returns
    -------
    dict
        Per engine: ``match`` (``"exact"``, ``"nearest"``), ``runs`` (the shape the engine runs:
        ``draft_law``, ``branching``, ``nodes``), the engine's arguments (``args`` and a ``command``
        for llama.cpp and SGLang, ``speculative_config`` and a ``command`` for vLLM), ``note`` (what the
        engine cannot express, in words) and ``nearest_prediction`` (the plan's prediction for what the
        engine runs, where the match is not exact and the plan holds it, else None).

    Raises
    ------
    InvalidInputError
        A candidate with no branching or an unknown draft law.

    Examples
    --------
    >>> from otbound.plan._engines import engine_configurations
    >>> chain = {"draft_law": "deterministic", "verifier": "onehot",
    ...          "shape": {"kind": "chains", "num_drafts": 1, "block_len": 4, "branching": [1, 1, 1, 1], "nodes": 4}}
    >>> cfg = engine_configurations(chain)
    >>> cfg["llama.cpp"]["match"], cfg["llama.cpp"]["args"]
    ('exact', ['--spec-type', 'draft-simple', '--spec-draft-n-max', '4', '--spec-draft-n-min', '0', \
'--spec-draft-p-min', '0'])
    >>> cfg["vllm"]["speculative_config"]
    {'method': 'draft_model', 'model': 'DRAFT', 'num_speculative_tokens': 4}
    >>> cfg["sglang"]["args"][-6:]
    ['--speculative-num-steps', '4', '--speculative-eagle-topk', '1', '--speculative-num-draft-tokens', '5']
    >>> sampled = dict(chain, draft_law="with_replacement", verifier="rrs")
    >>> engine_configurations(sampled)["llama.cpp"]["match"]
    'nearest'
    """
    law, branching, nodes = _shape_of(candidate)
    if not branching or min(branching) < 1:
        raise InvalidInputError(f"the candidate's branching must be a non-empty list of positive ints, got {branching}")
    if law not in ("with_replacement", "without_replacement", "greedy", "deterministic"):
        raise InvalidInputError(f"unknown draft law {law!r}")
    depth, chain = len(branching), all(b == 1 for b in branching)
    det_chain = [1] * depth
    out = {}

    # llama.cpp: a deterministic chain only
    exact = law == "deterministic" and chain
    args = ["--spec-type", "draft-simple", "--spec-draft-n-max", str(depth), "--spec-draft-n-min", "0",
            "--spec-draft-p-min", "0"]
    if exact:
        note = ("draft-simple drafts the draft's most likely token at each of the chain's positions and verifies "
                "by sampling the target: the candidate itself")
    else:
        what = "several drafts per node" if not chain else "sampled drafts"
        note = (f"llama-server cannot run {what}: draft-simple drafts one chain of the draft's most likely tokens; "
                f"the nearest is that chain at the candidate's depth {depth}")
        if not chain:
            note += ("; llama-speculative's several draft sequences (-np, --draft-p-split) are not lossless "
                     "and are not offered")
    out["llama.cpp"] = {
        "match": "exact" if exact else "nearest",
        "runs": {"draft_law": "deterministic", "branching": det_chain, "nodes": depth},
        "args": args,
        "command": shlex.join(["llama-server", "-m", target, "-md", draft, *args]),
        "note": note, "nearest_prediction": None if exact else _nearest(plan, det_chain)}

    # vLLM: one chain of a draft model
    config = {"method": "draft_model", "model": draft_hf, "num_speculative_tokens": depth}
    exact = chain
    out["vllm"] = {
        "match": "exact" if exact else "nearest",
        "runs": {"draft_law": law if chain else "deterministic", "branching": det_chain, "nodes": depth},
        "speculative_config": config,
        "command": shlex.join(["vllm", "serve", target_hf, "--speculative-config", json.dumps(config)]),
        "note": ("one chain of num_speculative_tokens drafted tokens per step, verified by vLLM's rejection sampler"
                 if exact else "a draft model drafts one chain in vLLM: several drafts per node are not expressible; "
                 f"the nearest is a chain at the candidate's depth {depth}"),
        "nearest_prediction": None if exact else _nearest(plan, det_chain)}

    # SGLang: a top-k tree of the draft
    topk = max(branching)
    sg_args = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft_hf,
               "--speculative-num-steps", str(depth), "--speculative-eagle-topk", str(topk),
               "--speculative-num-draft-tokens", str(nodes + 1)]
    exact = law == "deterministic" and chain
    if exact:
        note = "a chain of the draft's most likely tokens (top-1 per step): the candidate itself"
    elif law == "deterministic":
        note = (f"SGLang keeps the {nodes} best nodes of a top-{topk} tree by the draft's scores, not the fixed "
                f"branching {branching}: the nearest tree of the same depth and node count")
    else:
        note = (f"SGLang drafts the draft's top-{topk} tokens per step (deterministic); the candidate samples its "
                "drafts: the nearest deterministic tree of the same depth and node count")
    out["sglang"] = {
        "match": "exact" if exact else "nearest",
        "runs": {"draft_law": "deterministic", "branching": branching if law == "deterministic" or chain else
                 [topk] * depth, "nodes": nodes},
        "args": sg_args,
        "command": shlex.join(["python", "-m", "sglang.launch_server", "--model-path", target_hf, *sg_args]),
        "note": note,
        "nearest_prediction": None if exact else _nearest(plan, branching)}
    return out


def engines_markdown(configs: dict) -> list[str]:
    """The ``plan.md`` section of :func:`engine_configurations`' result (lines)."""
    lines = ["## The recommended candidate in the engines' configuration", "",
             "| engine | match | runs | configuration | what it cannot express | its prediction (planner) |",
             "|---|---|---|---|---|---|"]
    for name, c in configs.items():
        runs = f"{c['runs']['draft_law']} {'-'.join(map(str, c['runs']['branching']))}"
        pred = c.get("nearest_prediction")
        pred_text = (f"{pred['mean_acceptance_length']:.3f} ({pred['predicted_speedup']:.2f}×)" if pred else
                     ("the candidate's" if c["match"] == "exact" else "not in the plan"))
        lines.append(f"| {name} | {c['match']} | {runs} | `{c['command']}` | {c['note']} | {pred_text} |")
    return lines + [""]
