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

How the reference laws are read matters. llama.cpp's logits at a context are not a function of the
context alone: they depend on how the cached tokens were evaluated (one batch, or one token at a
time). On the Qwen2.5-Coder Q4_K_M pair on CPU the post-sampling law at one prefix differs by a total
variation of 0.013 to 0.067 between the two, and even the size of the batch in which the prompt was
evaluated moves it (docs/results/engine.md). Plain decoding evaluates the prompt in one batch, then
its last token again on its own (a fully cached prompt is re-evaluated from its last token), then
each generated token on its own; the reference is read the same way (:func:`enumerate_cells`): the
prompt once in one batch of its own length, then the tree of contexts depth first, every context
read right after its parent so that only its last token is evaluated. The laws the engine reports while
sampling (``n_probs`` in the sampling requests) are stored and compared with the reference
(``reported_vs_reference_tv``: 0 when the two computations agree), and the total variation between the
reference and the same cells read with every context in one batch (``numerics_tv``) states how much
the engine's numerics alone move the tested law: a verifier evaluates its drafts in one batch, so a
rejection with speculation on whose empirical distance is of that size does not tell a lossy verifier
from the numerics.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import scipy.optimize

from otbound.conformance import degrees_of_freedom, g_test, power
from otbound.engine._audit import hashed_seed
from otbound.engine._client import EngineError, completion
from otbound.engine._laws import _SEED_TRIES, IGNORE_EOS, LawSource, Sampling, _probs_of

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


class Cells(NamedTuple):
    """The cells of the test: ``sequences`` (tuples of ids), their ``probs``, the ``rest`` mass, the reference
    ``tree`` the probabilities came from (one node per prefix read: ``prefix`` relative to the prompt, ``ids``,
    ``probs``), and ``numerics_tv``: the total variation between these cells' law and the same law read with
    every context evaluated in one batch (NaN where the source is not a server)."""

    sequences: list
    probs: np.ndarray
    rest: float
    tree: list
    numerics_tv: float = math.nan


def _server_law(url: str, context, params: dict, n: int, cache: bool) -> tuple[np.ndarray, np.ndarray]:
    # llama-server reports no probabilities when the sampled token leaves incomplete UTF-8 text: the law
    # does not depend on the seed, so another is tried (the context is then fully cached and its last
    # token evaluated alone again, the same computation)
    for seed in range(1, _SEED_TRIES + 1):
        body = {"prompt": [int(t) for t in context], "n_predict": 1, "n_probs": int(n), "post_sampling_probs": True,
                "seed": seed, "cache_prompt": bool(cache), **params}
        reply = completion(url, body)
        if reply.get("completion_probabilities"):
            break
    return _probs_of(reply)


def _read_tree(law, prompt, depth: int):
    """The reference laws, depth first: every context is read right after its parent, so that a server
    with a prompt cache evaluates only the context's last token (module docstring)."""
    tree = []

    def visit(prefix):
        ids, p = law(list(prompt) + list(prefix))
        tree.append({"prefix": list(prefix), "ids": [int(t) for t in ids], "probs": [float(x) for x in p]})
        if len(prefix) + 1 < depth:
            for t, pt in zip(ids.tolist(), p.tolist()):
                if pt > 0:
                    visit(prefix + (int(t),))

    visit(())
    return tree


def _cells_of(tree, depth: int):
    laws = {tuple(node["prefix"]): node for node in tree}
    cells = []
    frontier = [((), 1.0)]
    for level in range(depth):
        nxt = []
        for prefix, mass in frontier:
            node = laws[prefix]
            for t, pt in zip(node["ids"], node["probs"]):
                if pt <= 0:
                    continue
                (nxt if level < depth - 1 else cells).append((prefix + (int(t),), mass * pt))
        frontier = nxt
    seqs = [c for c, _ in cells]
    p = np.array([m for _, m in cells], dtype=np.float64)
    rest = 1.0 - float(p.sum())
    # the engine reports float32 probabilities: a rest below 1e-6 is rounding, not mass
    if rest < 1e-6:
        p = p / p.sum()
        rest = 0.0
    return seqs, p, rest


def _law_tv(cells_a, cells_b) -> float:
    a = dict(zip(cells_a[0], cells_a[1].tolist()))
    b = dict(zip(cells_b[0], cells_b[1].tolist()))
    inner = sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
    return 0.5 * (inner + abs(cells_a[2] - cells_b[2]))


def enumerate_cells(laws: LawSource, prompt, sampling: Sampling, depth: int, n: int, *,
                    numerics: bool = True) -> Cells:
    """The cells (module docstring), read from ``laws`` depth first.

    From a llama.cpp server (:class:`~otbound.engine.ServerLaws`) the laws are read the way plain decoding
    computes them (module docstring): the prompt once in one batch of its own length, then every context
    with only its last token evaluated on the cached ones; the server's cache is left as the sampling
    requests that follow need it (the prompt as evaluated here). With ``numerics`` the same cells are
    first read with every context evaluated in one batch, and the total variation between the two
    sequence laws is ``Cells.numerics_tv``. The sampling must follow on the same server with no
    other request in between.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.engine import LawSource, enumerate_cells
    >>> class Coin(LawSource):
    ...     def target(self, context, sampling, n):
    ...         return np.array([7, 9]), np.array([0.75, 0.25])
    >>> cells = enumerate_cells(Coin(), [1, 2], None, depth=2, n=2)
    >>> cells.sequences, cells.probs.tolist(), cells.rest
    ([(7, 7), (7, 9), (9, 7), (9, 9)], [0.5625, 0.1875, 0.1875, 0.0625], 0.0)
    >>> [node["prefix"] for node in cells.tree]   # depth first
    [[], [7], [9]]
    """
    url = getattr(laws, "target_url", None)
    if url is None:
        tree = _read_tree(lambda ctx: laws.target(ctx, sampling, n), prompt, depth)
        seqs, p, rest = _cells_of(tree, depth)
        return Cells(seqs, p, rest, tree)
    params = {**sampling.params, **IGNORE_EOS}
    batch = None
    if numerics:  # first: these reads leave the cache computed in batches of other sizes
        batch = _read_tree(lambda ctx: _server_law(url, ctx, params, n, cache=False), prompt, depth)
    # the prompt alone in one batch, as a server's first request evaluates it; every later request with
    # this prompt finds it cached and evaluates its last token alone, as the depth-first reads do
    _server_law(url, prompt, params, n, cache=False)
    tree = _read_tree(lambda ctx: _server_law(url, ctx, params, n, cache=True), prompt, depth)
    seqs, p, rest = _cells_of(tree, depth)
    spread = math.nan if batch is None else _law_tv((seqs, p, rest), _cells_of(batch, depth))
    return Cells(seqs, p, rest, tree, spread)


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


def sample_continuations(url: str, prompt, sampling: Sampling, *, depth: int, samples: int, n: int, label: str,
                         timeout: float = 300.0, progress=None) -> list[dict]:
    """``samples`` continuations of ``depth`` tokens, one hashed seed each (:func:`otbound.engine.hashed_seed`
    of ``label``, 0 and the sample's index), each with the laws the engine reports for its tokens.

    Every request asks for the ``n`` most likely tokens of the post-sampling law at each generated
    position (``n_probs`` with ``post_sampling_probs``; this changes nothing in the sampling): llama-server
    reports them for the tokens it samples without speculation and none for the tokens of a verified
    draft, so ``laws[j]`` is ``[ids, probs]`` or ``None``.
    """
    out = []
    for r in range(int(samples)):
        seed = hashed_seed(label, 0, r)
        body = {"prompt": [int(t) for t in prompt], "n_predict": int(depth), "seed": seed, "return_tokens": True,
                "cache_prompt": True, "n_probs": int(n), "post_sampling_probs": True, **sampling.params,
                **IGNORE_EOS}
        reply = completion(url, body, timeout=timeout)
        tokens = reply.get("tokens")
        if tokens is None:
            raise EngineError(f"{url} returned no 'tokens' (needs llama.cpp's /completion with return_tokens)")
        laws = []
        for entry in reply.get("completion_probabilities") or []:
            top = entry.get("top_probs") or []
            laws.append([[int(t["id"]) for t in top], [float(t["prob"]) for t in top]] if top else None)
        t = reply.get("timings", {}) or {}
        out.append({"seed": seed, "tokens": [int(x) for x in tokens], "laws": laws,
                    "draft_n": int(t.get("draft_n", 0)), "draft_n_accepted": int(t.get("draft_n_accepted", 0))})
        if progress is not None:
            progress.update(1)
    return out


def reported_vs_reference_tv(sequences, tree) -> float | None:
    """The largest total variation between a law the engine reported while sampling and the reference law
    of the same prefix (``None`` where the engine reported none).

    Examples
    --------
    >>> from otbound.engine._lossless import reported_vs_reference_tv
    >>> tree = [{"prefix": [], "ids": [5, 6], "probs": [0.75, 0.25]}]
    >>> reported_vs_reference_tv([{"tokens": [5], "laws": [[[5, 6], [0.7, 0.3]]]}], tree)
    0.05
    """
    ref = {tuple(node["prefix"]): dict(zip(node["ids"], node["probs"])) for node in tree}
    worst = None
    for s in sequences:
        for j, law in enumerate(s.get("laws") or []):
            prefix = tuple(s["tokens"][:j])
            if law is None or prefix not in ref:
                continue
            mine, theirs = dict(zip(*law)), ref[prefix]
            d = 0.5 * sum(abs(mine.get(k, 0.0) - theirs.get(k, 0.0)) for k in set(mine) | set(theirs))
            worst = d if worst is None else max(worst, d)
    return None if worst is None else round(worst, 12)


def lossless_test(url: str, laws: LawSource, prompt, sampling: Sampling, *, depth: int, samples: int, n: int,
                  label: str, cells=None, progress=None) -> dict:
    """Sample ``samples`` continuations of ``depth`` tokens from ``url`` and G-test them (module docstring).

    The result holds what the test needs to be recomputed: ``reference`` (the laws the cells were built
    from, prefix by prefix), ``sequences`` (per continuation: its seed, tokens, the laws the engine
    reported for them, its drafted and accepted tokens); and ``numerics_tv`` (of the cells,
    :func:`enumerate_cells`) and ``reported_vs_reference_tv`` (the largest distance between a law the
    engine reported while sampling and the reference at the same prefix).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.engine import EngineError, LawSource, Sampling, lossless_test
    >>> class Coin(LawSource):
    ...     def target(self, context, sampling, n):
    ...         return np.array([7, 9]), np.array([0.75, 0.25])
    >>> try:
    ...     lossless_test("http://127.0.0.1:9", Coin(), [1, 2], Sampling.named("topk4"), depth=3, samples=10, n=2,
    ...                   label="x")
    ... except EngineError:
    ...     print("no server")
    no server
    """
    if cells is None:
        cells = enumerate_cells(laws, prompt, sampling, depth, n)
    reqs = sample_continuations(url, prompt, sampling, depth=depth, samples=samples, n=n, label=label,
                                progress=progress)
    result = histogram_test([r["tokens"] for r in reqs], cells.sequences, cells.probs, cells.rest)
    result["depth"] = depth
    result["draft_tokens"] = int(sum(r["draft_n"] for r in reqs))
    result["draft_tokens_accepted"] = int(sum(r["draft_n_accepted"] for r in reqs))
    result["lossless"] = bool(result["p_value"] >= LEVEL)
    result["numerics_tv"] = None if math.isnan(cells.numerics_tv) else float(cells.numerics_tv)
    result["reported_vs_reference_tv"] = reported_vs_reference_tv(reqs, cells.tree)
    result["reference"] = cells.tree
    result["sequences"] = reqs
    return result
