"""The audit of one speculative configuration of a running engine, through the engine's own API.

Acceptance
    Requests are sent to the speculative server; ``/metrics`` is read before and after, and the
    difference of its counters (``num_draft_tokens``, ``num_accepted_tokens``, ``num_drafts``,
    ``num_accepted_tokens_per_pos``) gives the engine's figures: mean acceptance length
    ``1 + accepted / drafts``, acceptance rate ``accepted / draft_tokens``, per-position acceptance
    ``accepted_per_pos[ℓ] / drafts`` (vLLM's definitions; :mod:`otbound.report._metrics`).
Prediction (draft-simple)
    llama.cpp's draft-simple drafts deterministically: at each step the draft's top token (after
    its top-k 10 sampler), until ``n_max`` tokens, the request's remaining budget minus one, or a
    top probability below ``p_min``; the server then samples the target at each drafted position and
    accepts while the sample equals the draft. Given the engine's output tokens and the draft's
    choices, every iteration is reconstructed (its context, its drafted tokens, its accepted count)
    and checked against the counters. At an iteration with drafts ``d_1..d_m`` at context ``c`` the
    exact expected accepted count is ``E[τ] = Σ_ℓ Π_{j ≤ ℓ} p(d_j | c, d_<j)`` with ``p`` the target's
    post-sampling law; a deterministic draft cannot do better with any lossless verifier (the output
    must follow ``p``, and accepting ``ℓ`` tokens emits ``d_1..d_ℓ``), so this prediction is also the
    bound of the scheme: the engine's verifier is optimal for its draft law, and its measured
    acceptance may exceed the bound only by sampling noise (the paired interval says how much).
Best alternative
    The planner's search (:func:`otbound.plan.measure_table`, :func:`otbound.plan.best_tree`) on the
    target's and the draft's laws at the iteration contexts: sampled drafts (with or without
    replacement) or a tree under the same node budget, with the best lossless verifier.
Losslessness
    :func:`lossless_test` (module :mod:`otbound.engine._lossless`).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from otbound._validation import InvalidInputError
from otbound.engine._client import EngineError, completion, counter_delta, spec_counters
from otbound.engine._laws import IGNORE_EOS, LawSource, Sampling
from otbound.report import cluster_mean_ci

#: level of the one-sided test "the engine accepts more than the bound of its scheme allows"
ABOVE_BOUND_LEVEL = 0.001


@dataclass(frozen=True)
class SpecConfig:
    """One speculative configuration: the server's drafting flags and the requests' sampling.

    Examples
    --------
    >>> from otbound.engine import Sampling, SpecConfig
    >>> SpecConfig("draft-simple", 8, 0.75, Sampling.named("default", 1.0)).label()
    'draft-simple n_max=8 p_min=0.75 [default T=1]'
    """

    spec_type: str
    draft_max: int
    p_min: float
    sampling: Sampling
    draft_min: int = 0

    def label(self) -> str:
        return f"{self.spec_type} n_max={self.draft_max} p_min={self.p_min:g} [{self.sampling.name}]"

    def describe(self) -> dict:
        out = asdict(self)
        out["sampling"] = {"name": self.sampling.name, "params": dict(self.sampling.params)}
        return out


def hashed_seed(*parts) -> int:
    """A request seed drawn by hashing ``parts`` (sequential seeds are a lattice in some engines' RNGs).

    Examples
    --------
    >>> from otbound.engine._audit import hashed_seed
    >>> hashed_seed("a", 1) == hashed_seed("a", 1) != hashed_seed("a", 2)
    True
    """
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") % (2**31 - 1)


def generate(url: str, prompts, *, n_predict: int, sampling: Sampling, seeds_per_prompt: int, label: str,
             timeout: float = 300.0, progress=None) -> list[dict]:
    """One request per (prompt, seed): the output tokens, the stop type and the engine's timings."""
    out = []
    for i, prompt in enumerate(prompts):
        for r in range(seeds_per_prompt):
            seed = hashed_seed(label, i, r)
            body = {"prompt": [int(t) for t in prompt], "n_predict": int(n_predict), "seed": seed,
                    "return_tokens": True, "cache_prompt": True, **sampling.params, **IGNORE_EOS}
            reply = completion(url, body, timeout=timeout)
            tokens = reply.get("tokens")
            if tokens is None:
                raise EngineError(f"{url} returned no 'tokens' (needs llama.cpp's /completion with return_tokens)")
            t = reply.get("timings", {}) or {}
            out.append({"prompt": i, "seed": seed, "tokens": [int(x) for x in tokens],
                        "stop_type": reply.get("stop_type"),
                        "draft_n": int(t.get("draft_n", 0)), "draft_n_accepted": int(t.get("draft_n_accepted", 0)),
                        "predicted_n": int(t.get("predicted_n", len(tokens))),
                        "predicted_ms": float(t.get("predicted_ms", math.nan)),
                        "predicted_per_second": float(t.get("predicted_per_second", math.nan))})
            if progress is not None:
                progress.update(1)
    return out


def counter_metrics(counters: dict) -> dict:
    """The engine's figures recomputed from its raw counter deltas (module docstring).

    Examples
    --------
    >>> from otbound.engine._audit import counter_metrics
    >>> m = counter_metrics({"draft_tokens": 8.0, "accepted_tokens": 5.0, "drafts": 4.0,
    ...                      "accepted_per_pos": [3.0, 2.0]})
    >>> m["mean_acceptance_length"], m["acceptance_rate"], m["per_position"]
    (2.25, 0.625, [0.75, 0.5])
    """
    drafts, drafted, accepted = counters["drafts"], counters["draft_tokens"], counters["accepted_tokens"]
    if not drafts > 0:
        return {"mean_acceptance_length": math.nan, "acceptance_rate": math.nan, "per_position": []}
    return {"mean_acceptance_length": 1.0 + accepted / drafts, "acceptance_rate": accepted / drafted,
            "per_position": [a / drafts for a in counters["accepted_per_pos"]]}


def rate_interval(requests, confidence: float = 0.95) -> tuple[float, float]:
    """Cluster-robust interval of the acceptance rate ``Σ a_i / Σ d_i`` over requests (one cluster each).

    Each request's ``d_i`` drafted tokens enter :func:`otbound.report.cluster_mean_ci` as ``a_i`` ones
    and ``d_i − a_i`` zeros labelled by the request: the interval depends on the cluster sums only,
    so this is the ratio estimator's cluster-robust interval without knowing which tokens were accepted.
    """
    values, clusters = [], []
    for i, r in enumerate(requests):
        d, a = int(r["draft_n"]), int(r["draft_n_accepted"])
        values += [1.0] * a + [0.0] * (d - a)
        clusters += [i] * d
    mean, half = cluster_mean_ci(values, clusters, confidence)
    return mean - half, mean + half


def reconstruct(requests, prompts, laws: LawSource, config: SpecConfig, n_predict: int) -> list[dict]:
    """The engine's draft-simple iterations, rebuilt from its outputs and the draft's choices.

    Returns one dict per iteration that drafted: ``request``, ``context`` (ids), ``draft`` (ids),
    ``accepted`` (the τ the outputs show).
    """
    iters = []
    for k, r in enumerate(requests):
        y = r["tokens"]
        base = [int(t) for t in prompts[r["prompt"]]]
        i = 1  # the first token is sampled from the target before any draft
        while i < len(y):
            budget = min(config.draft_max, n_predict - i - 1)
            context = base + y[:i]
            draft = []
            while len(draft) < budget:
                tok, p = laws.draft_choice(context + draft)
                if p < config.p_min:
                    break
                draft.append(tok)
            if len(draft) < config.draft_min:
                draft = []
            if not draft:
                i += 1
                continue
            tau = 0
            while tau < len(draft) and i + tau < len(y) and y[i + tau] == draft[tau]:
                tau += 1
            iters.append({"request": k, "context": context, "draft": draft, "accepted": tau})
            i += tau + 1
    return iters


def predict(iters, laws: LawSource, sampling: Sampling, n_probs: int) -> list[list[float]]:
    """Per iteration, the target's post-sampling probabilities of its drafted tokens, ``p(d_j | c, d_<j)``."""
    out = []
    for it in iters:
        probs = []
        for j, tok in enumerate(it["draft"]):
            ids, p = laws.target(it["context"] + it["draft"][:j], sampling, n_probs)
            hit = np.flatnonzero(ids == tok)
            probs.append(float(p[hit[0]]) if hit.size else 0.0)
        out.append(probs)
    return out


def prediction_figures(iters, node_probs, confidence: float = 0.95) -> dict:
    """Predicted figures along the iterations, and the engine-minus-prediction paired interval."""
    expected, levels, observed, clusters = [], [], [], []
    depth = max((len(it["draft"]) for it in iters), default=0)
    for it, probs in zip(iters, node_probs):
        prods = np.cumprod(probs)
        expected.append(float(prods.sum()))
        levels.append(np.pad(prods, (0, depth - len(prods))))
        observed.append(it["accepted"])
        clusters.append(it["request"])
    if not iters:
        return {}
    expected, observed = np.array(expected), np.array(observed, dtype=np.float64)
    drafted = sum(len(it["draft"]) for it in iters)
    diff_mean, diff_half = cluster_mean_ci(observed - expected, clusters, confidence)
    _, strict_half = cluster_mean_ci(observed - expected, clusters, 1.0 - 2 * ABOVE_BOUND_LEVEL)
    obs_mean, obs_half = cluster_mean_ci(observed, clusters, confidence)
    return {
        "predicted_mean_acceptance_length": 1.0 + float(expected.mean()),
        "predicted_acceptance_rate": float(expected.sum() / drafted),
        "predicted_per_position": np.mean(levels, axis=0).tolist(),
        "reconstructed_mean_acceptance_length": 1.0 + obs_mean,
        "reconstructed_mean_acceptance_length_interval": [1.0 + obs_mean - obs_half, 1.0 + obs_mean + obs_half],
        "engine_minus_bound": diff_mean,
        "engine_minus_bound_interval": [diff_mean - diff_half, diff_mean + diff_half],
        # one-sided test at level ABOVE_BOUND_LEVEL: is the engine's acceptance above the bound of its scheme?
        "exceeds_bound": bool(diff_mean - strict_half > 0),
        "exceeds_bound_level": ABOVE_BOUND_LEVEL,
    }


def best_alternative(iters, laws: LawSource, sampling: Sampling, budget: int, n_probs: int,
                     max_positions: int = 48, mc_samples: int = 16) -> dict:
    """The planner's best sampled-draft chain or tree under ``budget`` nodes at the iteration contexts."""
    from otbound.plan import best_tree, measure_table

    contexts = [it["context"] for it in iters[:max_positions]]
    if not contexts:
        return {}
    rows = [(laws.target(c, sampling, n_probs), laws.draft(c, sampling, n_probs)) for c in contexts]
    vocab = sorted({int(t) for (pi, _), (qi, _) in rows for t in np.concatenate([pi, qi])})
    col = {t: j for j, t in enumerate(vocab)}
    P, Q = np.zeros((len(rows), len(vocab))), np.zeros((len(rows), len(vocab)))
    for r, ((pi, pp), (qi, qp)) in enumerate(rows):
        P[r, [col[int(t)] for t in pi]] = pp
        Q[r, [col[int(t)] for t in qi]] = qp
    P /= P.sum(axis=1, keepdims=True)
    Q /= Q.sum(axis=1, keepdims=True)
    budget = int(budget)
    table = measure_table([(P, Q)], max_drafts=budget, mc_samples=mc_samples,
                          laws=("with_replacement", "without_replacement"))
    best = None
    for verifier, law in sorted(table.sampling.items()):
        if law not in ("with_replacement", "without_replacement") or not table.drafts_measured(verifier):
            continue
        shape, value = best_tree(table.mean_acceptance(verifier, law), budget, budget)
        if best is None or value > best["value"]:
            best = {"verifier": verifier, "draft_law": law, "branching": list(shape), "value": value}
    bounds = {law: best_tree(table.mean_acceptance(None, law), budget, budget) for law in table.optimal}
    law_b, (shape_b, value_b) = max(bounds.items(), key=lambda kv: kv[1][1])
    return {"node_budget": budget, "positions": len(rows), "support": len(vocab),
            "mean_acceptance_length": 1.0 + best["value"] if best else math.nan,
            "verifier": best["verifier"] if best else None, "draft_law": best["draft_law"] if best else None,
            "branching": best["branching"] if best else None,
            "bound_mean_acceptance_length": 1.0 + value_b, "bound_draft_law": law_b, "bound_branching": list(shape_b),
            "note": "positional independence (the planner's tree search); drafts sampled at the served settings"}


def run_configuration(spec_url: str, off_url: str | None, config: SpecConfig, prompts, *, laws: LawSource | None,
                      n_predict: int, seeds_per_prompt: int, n_probs: int, alternative: bool = True,
                      speed_without_speculation: bool = True, progress=None, check_alive=None) -> dict:
    """Acceptance, prediction and bound, best alternative and speed of one configuration (module docstring)."""
    label = config.label()
    before = spec_counters(spec_url)
    t0 = time.perf_counter()
    requests = generate(spec_url, prompts, n_predict=n_predict, sampling=config.sampling,
                        seeds_per_prompt=seeds_per_prompt, label=label, progress=progress)
    wall = time.perf_counter() - t0
    after = spec_counters(spec_url)
    if check_alive is not None:
        check_alive()
    counters = counter_delta(before, after)
    out = {"config": config.describe(), "counters": counters, "counters_before": before, "counters_after": after,
           "requests": requests}
    out.update(counter_metrics(counters))
    timing_tokens = sum(r["draft_n"] for r in requests), sum(r["draft_n_accepted"] for r in requests)
    out["timings_match_counters"] = bool(timing_tokens == (counters["draft_tokens"], counters["accepted_tokens"]))
    lo, hi = rate_interval(requests)
    out["acceptance_rate_interval"] = [lo, hi]
    drafts = counters["drafts"]
    per_draft = counters["draft_tokens"] / drafts if drafts > 0 else math.nan
    out["mean_acceptance_length_interval"] = [1.0 + lo * per_draft, 1.0 + hi * per_draft]
    out["tokens_per_second"] = float(np.nanmedian([r["predicted_per_second"] for r in requests]))
    out["wall_seconds"] = wall
    if off_url is not None and speed_without_speculation:
        plain = generate(off_url, prompts, n_predict=n_predict, sampling=config.sampling,
                         seeds_per_prompt=seeds_per_prompt, label=label + " plain")
        out["tokens_per_second_without_speculation"] = float(np.nanmedian([r["predicted_per_second"] for r in plain]))
    if laws is None or config.spec_type != "draft-simple":
        out["prediction"] = None
        out["predicted_mean_acceptance_length"] = None
        out["bound_mean_acceptance_length"] = None
        out["best_alternative"] = None
        return out
    iters = reconstruct(requests, prompts, laws, config, n_predict)
    recon = {"drafts": len(iters), "draft_tokens": sum(len(it["draft"]) for it in iters),
             "accepted_tokens": sum(it["accepted"] for it in iters)}
    out["reconstruction"] = recon
    out["reconstruction_matches_counters"] = bool(
        (recon["drafts"], recon["draft_tokens"], recon["accepted_tokens"])
        == (counters["drafts"], counters["draft_tokens"], counters["accepted_tokens"]))
    node_probs = predict(iters, laws, config.sampling, n_probs)
    pred = prediction_figures(iters, node_probs)
    out["prediction"] = pred
    out["iterations"] = [{"request": it["request"], "draft": it["draft"], "accepted": it["accepted"],
                          "target_probs": probs} for it, probs in zip(iters, node_probs)]
    out["predicted_mean_acceptance_length"] = pred.get("predicted_mean_acceptance_length")
    # deterministic drafting: the best lossless verifier's acceptance for this draft law is the prediction
    out["bound_mean_acceptance_length"] = pred.get("predicted_mean_acceptance_length")
    if recon["drafts"]:
        lo_r, hi_r = pred["reconstructed_mean_acceptance_length_interval"]
        if out["reconstruction_matches_counters"]:
            out["mean_acceptance_length_interval"] = [lo_r, hi_r]
    out["best_alternative"] = (best_alternative(iters, laws, config.sampling, config.draft_max, n_probs)
                               if alternative and iters else None)
    return out


def check_inputs(prompts, n_predict: int, seeds_per_prompt: int) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InvalidInputError("the audit needs at least one non-empty prompt")
    if n_predict < 2 or seeds_per_prompt < 1:
        raise InvalidInputError(f"need n_predict >= 2 and seeds >= 1, got {n_predict} and {seeds_per_prompt}")
