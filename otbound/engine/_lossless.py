"""Is a serving engine lossless? Its short continuations against the target's exact law.

Many continuations of ``depth`` tokens (``n_predict = depth``, end-of-text ignored so that every
continuation has ``depth`` tokens) are sampled from the engine with speculation on, one hashed seed
each. The cells are fixed before sampling from the target's post-sampling laws alone: the tree of
every sequence whose tokens are each among the ``n`` most likely of the target's law at their
prefix (``n_probs``; where ``n`` covers the support, as under top-k, the tree is the whole support),
one cell per sequence with its exact probability ``Π_j p(y_j | prompt, y_<j)``, and one "rest" cell
with the remaining mass; cells expected to hold fewer than five samples are pooled with the rest
(:func:`histogram_test`). The histogram of the continuations over these cells is G-tested against
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
#: cells expected to hold fewer samples than this are pooled before the test
MIN_EXPECTED = 5.0


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
    """G-test of ``sequences`` over the cells (module docstring).

    The cells whose expected count ``n·prob`` is below :data:`MIN_EXPECTED` are pooled, with the rest
    cell, into one cell before the test (a choice made from the laws and ``n`` alone, before looking at
    the samples), so that the chi-square law of the statistic holds; the detectable total variation is
    then that of the laws coarsened to the tested cells. A sample in a cell of probability 0 rejects.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.engine._lossless import histogram_test
    >>> cells, probs = [(0,), (1,), (2,)], np.array([0.5, 0.499, 0.001])
    >>> res = histogram_test([(0,)] * 50 + [(1,)] * 50, cells, probs, rest=0.0)
    >>> res["cells"], res["pooled_cells"], round(res["p_value"], 3)   # the 0.001 cell joins the 0.499 one
    (2, 1, 1.0)
    """
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    for s in sequences:
        counts[index.get(tuple(s), len(cells))] += 1
    law = np.append(probs, rest)
    n = int(counts.sum())
    small = law * n < MIN_EXPECTED
    small[-1] = True  # the rest cell is always pooled (it may hold mass the top-n lists left out)
    pooled_law, pooled_counts = law[small].sum(), counts[small].sum()
    law, counts = law[~small], counts[~small]
    if law.size and pooled_law * n < MIN_EXPECTED:  # a small pool joins the smallest tested cell
        j = int(np.argmin(law))
        law[j], counts[j] = law[j] + pooled_law, counts[j] + pooled_counts
    elif pooled_law > 0 or pooled_counts > 0:
        law, counts = np.append(law, pooled_law), np.append(counts, pooled_counts)
    g, p = g_test(counts, law)
    df = degrees_of_freedom(law)
    tv = 0.5 * float(np.abs(counts / max(n, 1) - law / law.sum()).sum())
    return {"samples": n, "cells": int(law.size), "pooled_cells": int(small[:-1].sum()), "df": df, "g": g,
            "p_value": p, "detectable_tv": detectable_tv(n, df), "empirical_tv": tv, "rest_mass": rest,
            "pooled_mass": float(pooled_law), "pooled_count": int(pooled_counts),
            "min_expected": float((law * n)[law > 0].min()) if n else math.nan,
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
