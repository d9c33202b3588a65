"""Shared test helpers: the single-thread torch fixture, the chi-square goodness-of-fit test and the
block-level test pairs.

Modules that need torch on one thread declare ``pytestmark = pytest.mark.usefixtures("one_thread")``;
the functions are imported (``from conftest import chi2_pvalue, sun_toy``).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
from stat_power import chi2_power


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for the module: tiny models gain nothing from threads (spin-waiting
    threads on a shared CPU are slow), and Ray workers run on one thread, so floats match to the bit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def chi2_pvalue(tokens, law, *, tv: float = 0.01, power: float = 0.995, alpha: float = 1e-3) -> float:
    """Pearson chi-square p-value of the counts of ``tokens`` against ``law``.

    Bins expecting fewer than 5 draws are merged into one; a token of probability 0 must never be
    emitted (asserted). The test must detect any ``tv`` total-variation distortion with probability
    at least ``power`` at level ``alpha`` for its actual bins and draws (asserted,
    :func:`stat_power.chi2_power`): the samplers' own tests use the default 1% at 0.995, the
    model-level checks, which draw a few thousand tokens (one model call each), 15% at 0.99.
    """
    tokens, law = np.asarray(tokens), np.asarray(law, dtype=np.float64)
    counts = np.bincount(tokens, minlength=law.size)
    assert counts[law == 0].sum() == 0, f"emitted tokens with probability 0: {np.flatnonzero(counts * (law == 0))}"
    expected = law * tokens.size
    big = expected >= 5
    obs = np.append(counts[big], counts[~big & (law > 0)].sum())
    exp = np.append(expected[big], expected[~big & (law > 0)].sum())
    keep = exp > 0
    if keep.sum() < 2:
        return 1.0
    got = chi2_power(int(keep.sum()) - 1, tokens.size, tv, alpha)
    assert got >= power, f"{int(keep.sum())} bins, {tokens.size} draws: power {got:.3f} against a {tv:g} distortion"
    return float(scipy.stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


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


def binned_chi2_pvalue(tokens, p, key, bins: int = 16) -> float:
    """χ² p-value of ``tokens`` against the law ``p`` over ``bins`` bins of about equal p-mass,
    tokens taken in the order of ``key`` (so a distortion along that order is not averaged out)."""
    order = np.argsort(key, kind="stable")
    edges = np.searchsorted(np.cumsum(p[order]), np.arange(1, bins) / bins)
    bin_of = np.empty(p.size, dtype=np.int64)
    bin_of[order] = np.searchsorted(edges, np.arange(p.size), side="right")
    obs = np.bincount(bin_of[tokens], minlength=bins)
    exp = np.bincount(bin_of, weights=p, minlength=bins) * tokens.size
    keep = exp > 0
    return float(scipy.stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


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
