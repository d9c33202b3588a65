"""Shared test helpers: the single-thread torch fixture, goodness of fit through the conformance
kit's G-test and power bound, the adversarial token-level (p, q) pairs (:data:`ADVERSARIAL_PAIRS`,
fixture ``adversarial_pair``) and the block-level test pairs.

Modules that need torch on one thread declare ``pytestmark = pytest.mark.usefixtures("one_thread")``;
the functions are imported (``from conftest import gof_pvalue, sun_toy``).
"""

from __future__ import annotations

import numpy as np
import pytest

from otbound.conformance import g_test
from otbound.conformance import power as kit_power


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for the module: tiny models gain nothing from threads (spin-waiting
    threads on a shared CPU are slow), and Ray workers run on one thread, so floats match to the bit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pooled_g_test(counts, law, *, tv: float | None = 0.01, power: float = 0.995, alpha: float = 1e-3) -> float:
    """p-value of the conformance kit's G-test (:func:`otbound.conformance.g_test`) of ``counts``
    against ``law`` (same shape, flattened; any total mass: the expected counts are ``law``'s shares
    of the draws).

    Cells expecting fewer than 5 draws are pooled into one (so the chi-square law of the statistic
    holds); a count where ``law`` is 0 must never occur (asserted). Unless ``tv`` is None, the test
    must detect any ``tv`` total-variation distortion with probability at least ``power`` at level
    ``alpha`` for its actual cells and draws (asserted with the kit's lower bound
    :func:`otbound.conformance.power`): the samplers' own tests use the default 1% at 0.995, the
    model-level checks, which draw a few thousand tokens (one model call each), 15% at 0.99.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    law = np.asarray(law, dtype=np.float64).ravel()
    assert counts[law == 0].sum() == 0, f"emitted cells of probability 0: {np.flatnonzero(counts * (law == 0))}"
    n = counts.sum()
    big = law / law.sum() * n >= 5
    small = ~big & (law > 0)
    obs = np.append(counts[big], counts[small].sum())
    cells = np.append(law[big], law[small].sum())
    keep = cells > 0
    if keep.sum() < 2:
        return 1.0
    if tv is not None:
        got = kit_power(int(n), int(keep.sum()) - 1, tv, alpha)
        assert got >= power, f"{int(keep.sum())} cells, {int(n)} draws: power {got:.3f} against a {tv:g} distortion"
    return g_test(obs[keep], cells[keep])[1]


def gof_pvalue(tokens, law, **power_args) -> float:
    """:func:`pooled_g_test` of the counts of ``tokens`` (ids into ``law``) against ``law``."""
    law = np.asarray(law, dtype=np.float64)
    return pooled_g_test(np.bincount(np.asarray(tokens), minlength=law.size), law, **power_args)


def _law(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


#: The hand-written adversarial token-level pairs ``name -> (p, q)`` every token-level test runs on
#: (small V, float64, each normalised): disjoint or nearly disjoint supports, one-hot and
#: near-deterministic laws, zeros on either side, tied ratios p/q, masses near float64 rounding.
ADVERSARIAL_PAIRS = {
    # the canonical case that needs a random partition: α* = 1, neither singletons nor one level work
    "needs_mixture": (_law([0.3, 0.7]), _law([0.5, 0.5])),
    "disjoint": (_law([0.5, 0.3, 0.2, 0, 0, 0]), _law([0, 0, 0, 0.2, 0.3, 0.5])),
    "disjoint_halves": (_law([0.5, 0.5, 0.0, 0.0]), _law([0.0, 0.0, 0.5, 0.5])),  # α* = 0
    "one_shared_token": (_law([0.5, 0.5, 0.0]), _law([0.0, 0.5, 0.5])),
    "near_deterministic": (_law([0.998, 0.001, 0.001, 0, 0]), _law([0.002, 0.004, 0.004, 0.49, 0.5])),
    "peaked_target": (_law([0.9, 0.05, 0.05]), _law([0.4, 0.3, 0.3])),
    "peaked_draft": (_law([0.25, 0.25, 0.25, 0.25]), _law([0.97, 0.01, 0.01, 0.01])),
    "one_hot_target": (_law([1.0, 0.0, 0.0, 0.0]), _law([0.25, 0.25, 0.25, 0.25])),
    "one_hot_target_spread_draft": (_law([1.0, 0.0, 0.0]), _law([0.2, 0.3, 0.5])),
    "near_one_hot_target": (_law([1 - 1e-9, 1e-9, 0.0]), _law([1 / 3, 1 / 3, 1 / 3])),
    "ratio_ties": (_law([0.1, 0.2, 0.3, 0.4]), _law([0.1, 0.2, 0.3, 0.4])),
    "equal_ratio_blocks": (_law([0.05, 0.05, 0.3, 0.3, 0.3]), _law([0.1, 0.1, 0.2, 0.2, 0.4])),
    "q_zero_on_p_mode": (_law([0.7, 0.1, 0.1, 0.1]), _law([0.0, 0.2, 0.3, 0.5])),
    "exactly_k_tokens": (_law([0.2, 0.3, 0.5, 0.0]), _law([0.6, 0.4, 0.0, 0.0])),
    # rejection probability 1e-20 rounds the residual mass (p − m on C) to 0 (found by hypothesis)
    "rejection_below_rounding": (_law([0.0, 1.0]), _law([1e-10, 1.0])),
    "q_mass_1e-12_outside_p": (_law([0.6, 0.4, 0.0]), _law([0.6, 0.4 - 1e-12, 1e-12])),
    "tiny_masses": (_law([1e-14, 0.5, 0.5 - 1e-14, 1e-15]), _law([0.25, 1e-15, 0.25, 0.5])),
    "mild": (_law([0.3, 0.4, 0.3]), _law([0.6, 0.3, 0.1])),
}


@pytest.fixture(params=sorted(ADVERSARIAL_PAIRS))
def adversarial_pair(request):
    """``(name, p, q)`` for each of :data:`ADVERSARIAL_PAIRS` (copies: a test may modify them)."""
    p, q = ADVERSARIAL_PAIRS[request.param]
    return request.param, p.copy(), q.copy()


def adversarial_rows(v: int) -> tuple[np.ndarray, np.ndarray]:
    """``(P, Q)`` (n, v): every pair of :data:`ADVERSARIAL_PAIRS` with V ≤ ``v``, padded with tokens
    of mass 0 under both laws (rows for the batched kernels)."""
    pairs = [(p, q) for p, q in ADVERSARIAL_PAIRS.values() if p.size <= v]
    pad = [(np.pad(p, (0, v - p.size)), np.pad(q, (0, v - q.size))) for p, q in pairs]
    return np.array([p for p, _ in pad]), np.array([q for _, q in pad])


def sun_toy():
    """Sun et al.'s context-free toy (2403.10444): target ``(1/3, 2/3)``, draft ``(2/3, 1/3)``."""
    from otbound.block.models import context_free_model

    return context_free_model([1 / 3, 2 / 3]), context_free_model([2 / 3, 1 / 3])


def random_block_pair(v: int, seed: int, *, draft_seed: int, concentration: float = 0.7):
    """Target and draft Dirichlet block models over ``v`` tokens (seeds ``seed`` and ``draft_seed``)."""
    from otbound.block.models import dirichlet_model

    return (dirichlet_model(v, seed=seed, concentration=concentration),
            dirichlet_model(v, seed=draft_seed, concentration=concentration))


def lm_like_laws(v: int, seed: int, temperature: float = 1.0, noise: float = 1.0):
    """``(p, q)`` shaped like a language model's laws: N(0, 2.5²) logits with a boosted head of 50
    tokens for the target, the draft the same logits plus N(0, noise²), both at ``temperature``."""
    from otbound.token import laws_from_logits

    r = np.random.default_rng(seed)
    z = r.standard_normal(v) * 2.5
    z[:50] += 8 * r.random(50)
    return laws_from_logits(z, temperature), laws_from_logits(z + r.standard_normal(v) * noise, temperature)


def binned_gof_pvalue(tokens, p, key, bins: int = 16) -> float:
    """The kit's G-test p-value (:func:`otbound.conformance.g_test`) of ``tokens`` against the law
    ``p`` over ``bins`` bins of about equal p-mass, tokens taken in the order of ``key`` (so a
    distortion along that order is not averaged out)."""
    order = np.argsort(key, kind="stable")
    edges = np.searchsorted(np.cumsum(p[order]), np.arange(1, bins) / bins)
    bin_of = np.empty(p.size, dtype=np.int64)
    bin_of[order] = np.searchsorted(edges, np.arange(p.size), side="right")
    obs = np.bincount(bin_of[tokens], minlength=bins)
    mass = np.bincount(bin_of, weights=p, minlength=bins)
    return g_test(obs, mass)[1]


def report_bytes(path) -> bytes:
    """A report file's bytes with its wall time (the one thing two runs of the same report do not share)
    blanked: report.json's ``environment["wall time (s)"]``, report.md's ``- wall time:`` line; other
    files as they are."""
    import json
    import re
    from pathlib import Path

    path = Path(path)
    data = path.read_bytes()
    if path.name == "report.json":
        obj = json.loads(data)
        obj.get("environment", {}).pop("wall time (s)", None)
        return json.dumps(obj, sort_keys=True).encode()
    if path.name == "report.md":
        return re.sub(rb"(?m)^- wall time: .*$", b"- wall time:", data)
    return data


def gguf_names_of_qwen2(n_layer: int) -> dict[str, str]:
    """transformers' Qwen2 parameter names -> the GGUF tensor names of the tiny pair
    (otbound.lm._tiny_gguf), for loading a GGUF file's weights into an independent forward."""
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    for i in range(n_layer):
        for hf, gg in (("input_layernorm.weight", "attn_norm.weight"), ("post_attention_layernorm.weight",
                       "ffn_norm.weight"), ("self_attn.o_proj.weight", "attn_output.weight"),
                       ("mlp.gate_proj.weight", "ffn_gate.weight"), ("mlp.up_proj.weight", "ffn_up.weight"),
                       ("mlp.down_proj.weight", "ffn_down.weight")):
            names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{gg}"
        for p in "qkv":
            for kind in ("weight", "bias"):
                names[f"model.layers.{i}.self_attn.{p}_proj.{kind}"] = f"blk.{i}.attn_{p}.{kind}"
    return names
