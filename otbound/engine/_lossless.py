"""Is a serving engine lossless? Its short continuations against the target's exact law.

Many continuations of ``depth`` tokens (``n_predict = depth``, end-of-text ignored so that every
continuation has ``depth`` tokens) are sampled from the engine with speculation on, one hashed seed
each. The cells are fixed before sampling from the target's post-sampling laws alone: the tree of
every sequence whose tokens are each among the ``n`` most likely of the target's law at their
prefix (``n_probs``; where ``n`` covers the support, as under top-k, the tree is the whole support),
one cell per sequence with its exact probability ``Π_j p(y_j | prompt, y_<j)``, and one "rest" cell
with the remaining mass. The histogram of the continuations over these cells is G-tested against
their probabilities (:func:`otbound.conformance._stats.g_test`), and the smallest total variation
the test detects at α = 0.01 with 80% power is stated (:func:`otbound.conformance._stats.power`:
a lower bound on power over every distortion of that size). The same test on the same number of
continuations with speculation off is the control: it shows that the laws and the test agree with
the engine when no drafting is involved.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize

from otbound.conformance import degrees_of_freedom, g_test, power
from otbound.engine._audit import generate
from otbound.engine._laws import LawSource, Sampling

#: the test's level and the power at which the detectable distance is stated
LEVEL, POWER = 0.01, 0.8


def detectable_tv(samples: int, df: int, level: float = LEVEL, target_power: float = POWER) -> float:
    """The smallest total variation δ with :func:`otbound.conformance._stats.power` ≥ ``target_power``.

    Examples
    --------
    >>> from otbound.conformance._stats import power
    >>> from otbound.engine._lossless import detectable_tv
    >>> d = detectable_tv(2000, 15)
    >>> round(d, 4), round(power(2000, 15, d, 0.01), 4)
    (0.0564, 0.8)
    """
    if samples < 1:
        return math.nan
    if power(samples, df, 1.0, level) < target_power:
        return math.nan
    return float(scipy.optimize.brentq(lambda d: power(samples, df, d, level) - target_power, 1e-9, 1.0,
                                       xtol=1e-12))


def enumerate_cells(laws: LawSource, prompt, sampling: Sampling, depth: int, n: int):
    """The cells (module docstring): ``(sequences, probabilities, rest mass)``; the laws asked once per prefix."""
    cells, probs = [], []
    frontier = [((), 1.0)]
    for level in range(depth):
        nxt = []
        for prefix, mass in frontier:
            ids, p = laws.target(list(prompt) + list(prefix), sampling, n)
            for t, pt in zip(ids.tolist(), p.tolist()):
                if pt <= 0:
                    continue
                seq = prefix + (int(t),)
                if level == depth - 1:
                    cells.append(seq)
                    probs.append(mass * pt)
                else:
                    nxt.append((seq, mass * pt))
        frontier = nxt
    probs = np.array(probs, dtype=np.float64)
    rest = 1.0 - float(probs.sum())
    # the engine reports float32 probabilities: a rest below 1e-6 is rounding, not mass
    if rest < 1e-6:
        probs = probs / probs.sum()
        rest = 0.0
    return cells, probs, rest


def histogram_test(sequences, cells, probs, rest: float) -> dict:
    """G-test of ``sequences`` over the cells (plus the rest cell if it has mass or counts)."""
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    for s in sequences:
        counts[index.get(tuple(s), len(cells))] += 1
    law = np.append(probs, rest)
    if rest == 0.0 and counts[-1] == 0:
        counts, law = counts[:-1], law[:-1]
    g, p = g_test(counts, law)
    n = int(counts.sum())
    df = degrees_of_freedom(law)
    expected = law / law.sum() * n
    tv = 0.5 * float(np.abs(counts / max(n, 1) - law / law.sum()).sum())
    return {"samples": n, "cells": int(law.size), "df": df, "g": g, "p_value": p,
            "detectable_tv": detectable_tv(n, df), "empirical_tv": tv, "rest_mass": rest,
            "rest_count": int(counts[-1]) if law.size > len(cells) else 0,
            "min_expected": float(expected[law > 0].min()) if n else math.nan,
            "level": LEVEL, "power": POWER}


def lossless_test(url: str, laws: LawSource, prompt, sampling: Sampling, *, depth: int, samples: int, n: int,
                  label: str, cells=None, progress=None) -> dict:
    """Sample ``samples`` continuations of ``depth`` tokens from ``url`` and G-test them (module docstring)."""
    if cells is None:
        cells = enumerate_cells(laws, prompt, sampling, depth, n)
    reqs = generate(url, [prompt], n_predict=depth, sampling=sampling, seeds_per_prompt=samples, label=label,
                    progress=progress)
    result = histogram_test([r["tokens"] for r in reqs], *cells)
    result["depth"] = depth
    result["draft_tokens"] = int(sum(r["draft_n"] for r in reqs))
    result["draft_tokens_accepted"] = int(sum(r["draft_n_accepted"] for r in reqs))
    result["lossless"] = bool(result["p_value"] >= LEVEL)
    return result
