"""Speculative decoders measured against the bounds at the contexts they visit: the
end-to-end section of ``python -m otbound.compare --end-to-end``.

For every iteration ``i`` of a :func:`speculative_sample` run (context ``c_i``, accepted ``τ_i``),
:func:`measure_run` evaluates, from the laws along the drafted tree and the live models:

* ``given_drafts`` — the verifier's exact ``E[τ | c_i, drafts_i]`` over its own coins
  (``conditional_acceptance`` of the block verifier, :class:`~otbound.block.verifiers.MultiPathVerifier`
  for tree verification): ``τ_i − given_drafts_i`` has mean 0 given the past, so the mean of ``τ``
  must agree with the mean of ``given_drafts`` within its interval;
* ``given_context`` — the exact ``E[τ | c_i]`` where the draft tuples can be enumerated (tiny
  vocabularies): token-level tree verification by recursion over the nodes (at a node with ``m``
  drafts, the verifier's ``conditional_law`` on every draft tuple of its law with ``K = m``), a
  block verifier by ``acceptance`` when ``(V^L)^K ≤ exact_max_tuples``;
* ``acceptance_sum`` / ``alpha_sum`` (token-level verifiers) — over the nodes verified in the
  iteration (depth ``d ≤ min(τ, L − 1)``, ``m`` drafts through the node), the sum of the verifier's
  exact acceptance ``α_V(p, q, m)`` / of the optimum ``α*(p, q, m)`` of its draft law (SpecTr
  2310.15141, docs/theory/token-bounds.md (one draft)). ``τ = Σ_d 1[node d reached and accepted]`` and a
  reached node accepts with probability ``α_V``, so ``E[τ] = E[acceptance_sum] ≤ E[alpha_sum]``;
* ``per_level`` / ``causal`` — the block bounds on ``E[τ | c_i]`` for K i.i.d. blocks
  (:func:`otbound.block_bound`, exact on the full ``V^L`` tree when its LP is small,
  ``(K − 1)·V^{2L} ≤ exact_lp_cells``,
  else the certified top-``m`` bracket :func:`otbound.block_bound_bracket`, reported as
  ``(lower, upper)``); they bound every lossless verifier with i.i.d. drafts (not the
  without-replacement / greedy tree laws: reported as None there). A block verifier with its own
  drafting scheme (``univer``: its own tree, ``m = K`` branches per node) gets ``causal`` = U_causal
  of *its own* draft law (``own_law_bounds``, exact, where its trees can be enumerated:
  ``(V^L)^K ≤ exact_block_tuples``; else None) and ``per_level`` None.

:func:`end_to_end_rows` runs every verifier for each K and L on a set of prompts plus plain
target sampling, and returns one row per (verifier, K, L) with the empirical mean of ``τ`` and its
95% interval (cluster-robust over prompts), the means of the quantities above, the acceptance per
draft position ``P(τ ≥ ℓ)``, tokens per target call and the wall-clock speed-up over plain
sampling (seconds per generated token, same process). :func:`end_to_end_figure` plots them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from otbound._validation import InvalidInputError
from otbound.block import block_bound, block_bound_bracket
from otbound.block.verifiers import BLOCK_VERIFIERS, MultiPathVerifier
from otbound.lm import LiveModels, resolve_verifier, speculative_sample, tiny_pair, tiny_prompts, tree_block_models
from otbound.report import plots
from otbound.report._measure import cluster_mean_ci
from otbound.report._metrics import engine_metrics
from otbound.token import optimal_acceptance
from otbound.token.verifiers import VERIFIERS, support_tuples


@dataclass
class IterationMeasure:
    """Measurements of one iteration (module docstring); None where not available.

    Attributes
    ----------
    num_accepted : int
        τ, the draft tokens accepted (bonus excluded).
    given_drafts : float
        The verifier's exact ``E[τ | context, drafts]``.
    drafted_tokens : int
        Draft tokens the target call verified (the nodes of the drafted tree).
    given_context : float or None
        Exact ``E[τ | context]``.
    acceptance_sum, alpha_sum : float or None
        Σ of the verifier's exact acceptance / of α* of its draft law over the verified nodes.
    per_level, causal : tuple of float or None
        ``(lower, upper)`` of the block bounds at the context (equal when exact).
    causal_levels : numpy.ndarray or None
        ``P(τ ≥ ℓ)`` of the causal optimum, ℓ = 1..L (exact bounds only).

    Examples
    --------
    >>> from otbound.report import IterationMeasure
    >>> IterationMeasure(num_accepted=1, given_drafts=0.75, drafted_tokens=4)
    IterationMeasure(num_accepted=1, given_drafts=0.75, drafted_tokens=4, given_context=None, \
acceptance_sum=None, alpha_sum=None, per_level=None, causal=None)
    """

    num_accepted: int
    given_drafts: float
    drafted_tokens: int = 0
    given_context: float | None = None
    acceptance_sum: float | None = None
    alpha_sum: float | None = None
    per_level: tuple | None = None
    causal: tuple | None = None
    causal_levels: np.ndarray | None = field(default=None, repr=False)


def tree_expected_accepted(verifier, target, draft, num_drafts: int, block_len: int) -> float:
    """Exact ``E[τ]`` of token-level ``verifier`` run as tree verification (module docstring of
    :mod:`otbound.lm._specsample`) from block models ``target``/``draft``: ``f(u, m) = Σ_x̄
    Q_m(x̄|u) Σ_{y ∈ x̄} P_V(y | x̄)(1 + f(u·y, #{k: x_k = y}))``, ``f = 0`` at depth ``L``.
    Enumerates ``|V|^m`` tuples per node: tiny vocabularies only.

    Parameters
    ----------
    verifier : otbound.token.Verifier
        A token-level verifier with exact ``acceptance`` and ``conditional_law``.
    target, draft : callable
        Block models: a prefix (tuple of token ids) to the law of the next token.
    num_drafts : int
        Drafts ``m`` at the root.
    block_len : int
        Depth ``L`` of the tree.

    Returns
    -------
    float
        ``E[τ]``, accepted draft tokens (bonus excluded).

    Raises
    ------
    InvalidInputError
        The verifier has no exact acceptance at some node's number of drafts.

    Examples
    --------
    >>> from otbound.block.models import dirichlet_model, mixture_model
    >>> from otbound.block.verifiers import BLOCK_VERIFIERS
    >>> from otbound.report import tree_expected_accepted
    >>> from otbound.token.verifiers import VERIFIERS
    >>> target = dirichlet_model(3, seed=0)
    >>> draft = mixture_model(target, dirichlet_model(3, seed=1), 0.5)
    >>> round(tree_expected_accepted(VERIFIERS["rrs"], target, draft, 2, 2), 6)
    1.62525
    >>> round(BLOCK_VERIFIERS["multipath_rrs"].acceptance(target, draft, vocab_size=3, num_drafts=2, block_len=2), 6)
    1.62525
    """
    memo = {}

    def f(node, m):
        if len(node) == block_len:
            return 0.0
        key = (node, m)
        if key not in memo:
            p, q = target(node), draft(node)
            if len(node) == block_len - 1:  # last level: the verifier's own acceptance
                memo[key] = verifier.acceptance(p, q, m)
            else:
                weights, tuples = support_tuples(q, m, verifier.sampling)
                laws = verifier.conditional_law(p, q, tuples)
                total = 0.0
                for w, tup, law in zip(weights, tuples, laws, strict=True):
                    ys, counts = np.unique(tup, return_counts=True)
                    total += w * sum(
                        law[y] * (1.0 + f(node + (int(y),), int(c)))
                        for y, c in zip(ys, counts, strict=True)
                        if law[y] > 0
                    )
                memo[key] = total
        if memo[key] is None:
            raise InvalidInputError(f"verifier {verifier.name!r} has no exact acceptance at K = {m} here")
        return memo[key]

    return float(f((), num_drafts))


def measure_run(
    run,
    pair,
    *,
    exact_context: bool = True,
    bounds: bool = True,
    exact_max_tuples: int = 25_000,
    exact_block_tuples: int = 2_000,
    exact_lp_cells: int = 25_000,
    top_m: int = 4,
) -> list[IterationMeasure]:
    """One :class:`IterationMeasure` per iteration of ``run`` (made with ``keep_laws=True``).

    Parameters
    ----------
    run
        A result of :func:`otbound.lm.speculative_sample` with ``keep_laws=True`` and ``block_len ≥ 1``.
    pair
        The model pair it ran on (the live models give the laws off the drafted tree).
    exact_context : bool
        Compute ``given_context`` where the draft tuples can be enumerated.
    bounds : bool
        Compute the block bounds at each context.
    exact_max_tuples : int
        Largest ``|V|^K`` enumerated per node (tree verification).
    exact_block_tuples : int
        Largest ``(V^L)^K`` enumerated for a block verifier.
    exact_lp_cells : int
        Largest ``(K − 1)·V^{2L}`` for the exact block bounds, else the top-``m`` bracket.
    top_m : int
        ``top_m`` of :func:`otbound.block_bound_bracket`.

    Returns
    -------
    list of IterationMeasure

    Raises
    ------
    InvalidInputError
        Plain sampling (``block_len = 0``), or a run without its laws.

    Examples
    --------
    >>> from otbound.lm import speculative_sample, tiny_pair
    >>> from otbound.report import measure_run
    >>> pair = tiny_pair(4)
    >>> run = speculative_sample(pair, [1, 2], verifier="rrs", num_drafts=2, block_len=2, max_new_tokens=4,
    ...                          keep_laws=True)
    >>> for m in measure_run(run, pair, bounds=False):
    ...     print(m.num_accepted, m.drafted_tokens, round(m.given_drafts, 3), round(m.given_context, 3))
    0 2 0.206 0.971
    2 3 1.804 1.525
    """
    k, length, v = run.num_drafts, run.block_len, pair.vocab_size
    if length == 0:
        raise InvalidInputError("plain sampling (block_len = 0) accepts no drafts: nothing to measure")
    block, sampling, _ = resolve_verifier(run.verifier_object)
    token = block._verifier() if isinstance(block, MultiPathVerifier) else None  # tree verification
    out = []
    for i, it in enumerate(run.iterations):
        if it.target_logits is None:
            raise InvalidInputError(
                "measure_run needs the laws along the tree: run speculative_sample with keep_laws=True"
            )
        settings = (run.target_sampling, run.draft_sampling) if run.target_sampling is not None else None
        live = LiveModels(pair, run.context(i), run.temperature, settings)
        p, q = it.p, it.q
        tm, dm = tree_block_models(it.drafts, p, q, default_target=live.target, default_draft=live.draft)
        m = IterationMeasure(it.num_accepted, float(block.conditional_acceptance(tm, dm, it.drafts)),
                             drafted_tokens=tree_nodes(it.drafts))
        if token is not None:
            acc, opt = 0.0, 0.0
            for depth, rows in it.node_visits:
                r = rows[0]
                a = token.acceptance(p[r, depth], q[r, depth], rows.size)
                acc = None if a is None or acc is None else acc + a
                opt += optimal_acceptance(p[r, depth], q[r, depth], rows.size, sampling)
            m.acceptance_sum, m.alpha_sum = acc, float(opt)
        if exact_context:
            m.given_context = _given_context(
                token, block, live.models, v, k, length, exact_max_tuples, exact_block_tuples
            )
        if bounds and sampling == "with_replacement":
            tgt, drf = live.models()
            if (k - 1) * v ** (2 * length) <= exact_lp_cells:
                pl = block_bound(tgt, drf, vocab_size=v, num_drafts=k, block_len=length, kind="per_level").value
                cb = block_bound(tgt, drf, vocab_size=v, num_drafts=k, block_len=length, kind="causal")
                m.per_level, m.causal, m.causal_levels = (pl, pl), (cb.value, cb.value), cb.levels
            else:
                br = [
                    block_bound_bracket(tgt, drf, vocab_size=v, num_drafts=k, block_len=length, kind=kind, top_m=top_m)
                    for kind in ("per_level", "causal")
                ]
                m.per_level, m.causal = [(b.lower, b.upper) for b in br]
        elif bounds and token is None and (v**length) ** k <= exact_block_tuples:  # its own draft law
            tgt, drf = live.models()
            try:
                own = block.own_law_bounds(tgt, drf, vocab_size=v, num_drafts=k, block_len=length).causal
                m.causal = (own, own)
            except InvalidInputError:  # its law cannot be built here (e.g. UniVer: too few drafted tokens)
                pass
        out.append(m)
    return out


def tree_nodes(drafts) -> int:
    """Draft tokens one target call verifies: the distinct prefixes (tree nodes) of the drafted
    rows ``drafts`` (K, L) — ``K·L`` for K distinct chains, fewer where rows share prefixes.

    Examples
    --------
    >>> tree_nodes(np.array([[1, 2], [1, 3], [4, 5]]))
    5
    """
    d = np.asarray(drafts)
    return int(sum(np.unique(d[:, :depth], axis=0).shape[0] for depth in range(1, d.shape[1] + 1)))


def _given_context(token, block, models, v, k, length, exact_max_tuples, exact_block_tuples):
    """Exact ``E[τ | context]`` or None when the draft tuples are too many to enumerate
    (``|V|^K`` per node for tree verification, ``(V^L)^K`` whole trees for a block verifier)."""
    tgt, drf = models()
    if token is not None:
        if v**k > exact_max_tuples:
            return None
        try:
            return tree_expected_accepted(token, tgt, drf, k, length)
        except InvalidInputError:
            return None
    if (v**length) ** k > exact_block_tuples:
        return None
    try:
        return float(block.acceptance(tgt, drf, vocab_size=v, num_drafts=k, block_len=length))
    except InvalidInputError:  # its own draft law cannot be enumerated here
        return None


@dataclass
class EndToEndRow:
    """One (verifier, K, L) cell of :func:`end_to_end_rows` (means over the visited contexts).

    mean_accepted ± accepted_ci: empirical τ per iteration (95%, cluster-robust over prompts);
    residual_ci: 95% interval of mean(τ − given_drafts), which must contain 0. ``*_lower/_upper``:
    bracket ends of the block bounds (equal when exact); None where not measured. Engine metrics
    (:func:`otbound.report.engine_metrics`, docs/guide/metrics.md): mean_acceptance_length =
    1 + mean τ (± mean_acceptance_length_ci, the interval of τ), acceptance_rate = accepted /
    drafted tokens (drafted: the tree nodes of each call), per_position_acceptance[ℓ−1] = P(τ ≥ ℓ),
    acceptance_length_histogram[a−1] = fraction of calls with τ + 1 = a.
    position_bound[ℓ−1]: the causal optimum's P(τ ≥ ℓ) (exact trees only). speedup: seconds per
    generated token of plain target sampling / this decoder's (same process, same prompts).
    :meth:`as_dict`: the fields as a dict.

    Examples
    --------
    >>> from otbound.report import EndToEndRow
    >>> row = EndToEndRow(
    ...     verifier="rrs", sampling="with_replacement", num_drafts=2, block_len=1, iterations=10,
    ...     mean_accepted=0.8, accepted_ci=0.1, given_drafts=0.79, residual=0.01, residual_ci=0.05,
    ...     given_context=0.78, acceptance_sum=0.78, alpha_sum=0.85, per_level_lower=None, per_level_upper=None,
    ...     causal_lower=0.86, causal_upper=0.86, mean_acceptance_length=1.8, mean_acceptance_length_ci=0.1,
    ...     acceptance_rate=0.4, per_position_acceptance=[0.8], acceptance_length_histogram=[0.2, 0.8],
    ...     position_bound=[0.86], tokens_per_call=1.8, seconds_per_token=0.01, speedup=1.5)
    >>> d = row.as_dict()
    >>> d["verifier"], d["mean_acceptance_length"], len(d)
    ('rrs', 1.8, 26)
    """

    verifier: str
    sampling: str
    num_drafts: int
    block_len: int
    iterations: int
    mean_accepted: float
    accepted_ci: float
    given_drafts: float
    residual: float
    residual_ci: float
    given_context: float | None
    acceptance_sum: float | None
    alpha_sum: float | None
    per_level_lower: float | None
    per_level_upper: float | None
    causal_lower: float | None
    causal_upper: float | None
    mean_acceptance_length: float
    mean_acceptance_length_ci: float
    acceptance_rate: float
    per_position_acceptance: list
    acceptance_length_histogram: list
    position_bound: list | None
    tokens_per_call: float
    seconds_per_token: float
    speedup: float

    def as_dict(self) -> dict:
        return asdict(self)


def _mean_or_none(values):
    vals = list(values)
    return None if not vals or any(x is None for x in vals) else float(np.mean(vals))


def end_to_end_rows(
    pair,
    prompts,
    *,
    verifiers,
    num_drafts=(2,),
    block_lens=(2,),
    temperature: float = 1.0,
    max_new_tokens: int = 24,
    seed: int = 0,
    exact_context: bool = True,
    bounds: bool = True,
    top_m: int = 4,
    progress: bool = True,
) -> list[EndToEndRow]:
    """Run plain sampling and every verifier (names of :data:`otbound.VERIFIERS` /
    :data:`otbound.BLOCK_VERIFIERS`) for each K and L on ``prompts`` (token-id lists), measure
    every iteration (:func:`measure_run`) and aggregate one :class:`EndToEndRow` per cell. A
    verifier that cannot run at a K (e.g. ``spechub`` beyond K = 2) is left out of that cell.

    Parameters
    ----------
    pair
        A loaded model pair (e.g. :func:`otbound.lm.tiny_pair`).
    prompts : sequence of sequence of int
        The prompts' token ids; prompt ``j`` runs with seed ``[seed, j]``.
    verifiers : sequence of str
        Verifier names.
    num_drafts, block_lens : sequence of int
        The K and L of the cells.
    temperature : float
        T of both models.
    max_new_tokens : int
        Tokens generated per prompt.
    seed : int
        Run seed.
    exact_context, bounds, top_m
        As in :func:`measure_run`.
    progress : bool
        Show a progress bar.

    Returns
    -------
    list of EndToEndRow
        One per (verifier, K, L) that could run, L outermost.

    Raises
    ------
    InvalidInputError
        Bad input to :func:`otbound.lm.speculative_sample` (plain sampling) or :func:`measure_run`.

    Examples
    --------
    >>> from otbound.lm import tiny_pair
    >>> from otbound.report import end_to_end_rows
    >>> rows = end_to_end_rows(tiny_pair(4), [[1, 2]], verifiers=["rrs"], max_new_tokens=4,
    ...                        exact_context=False, bounds=False, progress=False)
    >>> [(r.verifier, r.num_drafts, r.block_len, r.iterations, r.mean_accepted, round(r.given_drafts, 3))
    ...  for r in rows]
    [('rrs', 2, 2, 2, 1.0, 1.005)]
    """
    from tqdm.auto import tqdm

    prompts = [list(p) for p in prompts]
    plain_s, plain_n = 0.0, 0
    for j, pr in enumerate(prompts):
        r = speculative_sample(
            pair, pr, block_len=0, temperature=temperature, max_new_tokens=max_new_tokens, seed=[seed, j]
        )
        plain_s += r.seconds
        plain_n += len(r.tokens)
    plain = plain_s / max(plain_n, 1)
    cells = [(name, k, length) for length in block_lens for k in num_drafts for name in verifiers]
    rows = []
    for name, k, length in tqdm(cells, desc="end-to-end", disable=not progress):
        try:
            runs = [
                speculative_sample(
                    pair,
                    pr,
                    verifier=name,
                    num_drafts=k,
                    block_len=length,
                    temperature=temperature,
                    max_new_tokens=max_new_tokens,
                    seed=[seed, j],
                    keep_laws=True,
                )
                for j, pr in enumerate(prompts)
            ]
        except InvalidInputError:
            continue
        meas, clusters = [], []
        for j, r in enumerate(runs):
            ms = measure_run(r, pair, exact_context=exact_context, bounds=bounds, top_m=top_m)
            meas += ms
            clusters += [j] * len(ms)
        rows.append(_row(runs, meas, clusters, plain, length))
    return rows


def _row(runs, meas, clusters, plain_seconds_per_token, length):
    tau = np.array([m.num_accepted for m in meas], dtype=np.float64)
    given = np.array([m.given_drafts for m in meas])
    mean, ci = cluster_mean_ci(tau, clusters)
    res, res_ci = cluster_mean_ci(tau - given, clusters)
    pl = [m.per_level for m in meas]
    ca = [m.causal for m in meas]
    levels = [m.causal_levels for m in meas]
    tokens = sum(len(r.tokens) for r in runs)
    seconds = sum(r.seconds for r in runs)
    r0 = runs[0]
    engine = engine_metrics(tau, [m.drafted_tokens for m in meas], length, clusters)
    return EndToEndRow(
        verifier=r0.verifier,
        sampling=r0.sampling,
        num_drafts=r0.num_drafts,
        block_len=length,
        iterations=len(meas),
        mean_accepted=mean,
        accepted_ci=ci,
        given_drafts=float(given.mean()),
        residual=res,
        residual_ci=res_ci,
        given_context=_mean_or_none(m.given_context for m in meas),
        acceptance_sum=_mean_or_none(m.acceptance_sum for m in meas) if meas[0].alpha_sum is not None else None,
        alpha_sum=_mean_or_none(m.alpha_sum for m in meas),
        per_level_lower=_mean_or_none(None if b is None else b[0] for b in pl),
        per_level_upper=_mean_or_none(None if b is None else b[1] for b in pl),
        causal_lower=_mean_or_none(None if b is None else b[0] for b in ca),
        causal_upper=_mean_or_none(None if b is None else b[1] for b in ca),
        mean_acceptance_length=engine["mean_acceptance_length"],
        mean_acceptance_length_ci=ci,
        acceptance_rate=engine["acceptance_rate"],
        per_position_acceptance=engine["per_position_acceptance"],
        acceptance_length_histogram=engine["acceptance_length_histogram"],
        position_bound=None if any(x is None for x in levels) else np.mean(levels, axis=0).tolist(),
        tokens_per_call=tokens / max(sum(r.target_calls for r in runs), 1),
        seconds_per_token=seconds / max(tokens, 1),
        speedup=plain_seconds_per_token / (seconds / max(tokens, 1)),
    )


def end_to_end_markdown(rows, meta: dict) -> str:
    """The report section: one table row per (verifier, K, L).

    Parameters
    ----------
    rows : list of EndToEndRow
        Rows of :func:`end_to_end_rows`.
    meta : dict
        The run's settings, written as ``key: value`` under the heading.

    Returns
    -------
    str
        Markdown: the heading, the settings, the legend and the table, ending with a newline.

    Examples
    --------
    >>> from otbound.report import EndToEndRow, end_to_end_markdown
    >>> row = EndToEndRow(
    ...     verifier="rrs", sampling="with_replacement", num_drafts=2, block_len=1, iterations=10,
    ...     mean_accepted=0.8, accepted_ci=0.1, given_drafts=0.79, residual=0.01, residual_ci=0.05,
    ...     given_context=0.78, acceptance_sum=0.78, alpha_sum=0.85, per_level_lower=None, per_level_upper=None,
    ...     causal_lower=0.86, causal_upper=0.86, mean_acceptance_length=1.8, mean_acceptance_length_ci=0.1,
    ...     acceptance_rate=0.4, per_position_acceptance=[0.8], acceptance_length_histogram=[0.2, 0.8],
    ...     position_bound=[0.86], tokens_per_call=1.8, seconds_per_token=0.01, speedup=1.5)
    >>> text = end_to_end_markdown([row], {"pair": "demo", "T": 1.0})
    >>> text.splitlines()[2]
    'pair: demo, T: 1.0'
    >>> print(text.splitlines()[-1])  # doctest: +NORMALIZE_WHITESPACE
    | rrs | with_replacement | 2 | 1 | 10 | 0.800 ± 0.100 | 0.790 | +0.010 ± 0.050 | 0.780 | 0.780 | 0.850 | — |
    0.860 | 1.800 ± 0.100 | 0.400 | 0.80 | 0.20, 0.80 | 1.80 | 1.50 |
    """

    def f(x, nd=3):
        return "—" if x is None else f"{x:.{nd}f}"

    def br(lo, hi):
        if lo is None:
            return "—"
        return f(hi) if abs(hi - lo) < 1e-9 else f"[{f(lo)}, {f(hi)}]"

    lines = [
        "## End to end: verifiers run as speculative decoders, against the bounds at the visited contexts",
        "",
        ", ".join(f"{k}: {v}" for k, v in meta.items()),
        "",
        "τ = accepted draft tokens per iteration (bonus excluded). E[τ|drafts]: the verifier's exact expectation "
        "given the drafted tree (τ − E[τ|drafts] has mean 0: the residual interval must contain 0); E[τ|ctx]: exact "
        "given the context (enumerated; — where too large); Σα_V / Σα*: the verifier's exact acceptance / the "
        "optimum α* of its draft law summed over the nodes it verified (E[τ] = E[Σα_V] ≤ E[Σα*]); per-level, "
        "causal: block bounds for K i.i.d. blocks (brackets where truncated; — for non-i.i.d. draft laws), "
        "except law univer_tree: UniVer's own tree (K branches per node, K^L paths) and causal = U_causal of "
        "that tree law (exact where its trees can be enumerated, else —).",
        "",
        "Engine metrics (docs/guide/metrics.md): mean acceptance length = 1 + τ per target call (vLLM, "
        "SGLang spec_accept_length, EAGLE), acceptance rate = accepted / drafted tokens (tree nodes), "
        "per-position acceptance P(τ ≥ ℓ) (vLLM num_accepted_tokens_per_pos / num_drafts), acceptance-length "
        "histogram: fraction of calls with acceptance length 1..L+1 (SGLang, TensorRT-LLM).",
        "",
        "| verifier | law | K | L | iters | τ ± 95% | E[τ|drafts] | residual ± 95% | E[τ|ctx] | Σα_V | Σα* "
        "| per-level | causal | mean acceptance length | acceptance rate | per-position acceptance, ℓ=1..L "
        "| acceptance-length histogram, 1..L+1 | tokens/call | speed-up |",
        "|---" * 19 + "|",
    ]
    for r in rows:
        pos = ", ".join(f"{x:.2f}" for x in r.per_position_acceptance)
        hist = ", ".join(f"{x:.2f}" for x in r.acceptance_length_histogram)
        lines.append(
            f"| {r.verifier} | {r.sampling} | {r.num_drafts} | {r.block_len} | {r.iterations} | "
            f"{r.mean_accepted:.3f} ± {r.accepted_ci:.3f} | {r.given_drafts:.3f} | "
            f"{r.residual:+.3f} ± {r.residual_ci:.3f} | {f(r.given_context)} | "
            f"{f(r.acceptance_sum)} | {f(r.alpha_sum)} | {br(r.per_level_lower, r.per_level_upper)} | "
            f"{br(r.causal_lower, r.causal_upper)} | "
            f"{r.mean_acceptance_length:.3f} ± {r.mean_acceptance_length_ci:.3f} | "
            f"{r.acceptance_rate:.3f} | {pos} | {hist} | {r.tokens_per_call:.2f} | {r.speedup:.2f} |"
        )
    return "\n".join(lines) + "\n"


def end_to_end_figure(rows, path):
    """Left: empirical mean τ (95% interval) per verifier beside its bounds (causal, Σα*) for the
    largest K and L. Right: P(τ ≥ ℓ) per draft position ℓ for each verifier, the causal optimum's
    levels dashed.

    Parameters
    ----------
    rows : list of EndToEndRow
        Rows of :func:`end_to_end_rows`.
    path : str or pathlib.Path
        Where the figure goes, without suffix (``path.png``).

    Returns
    -------
    pathlib.Path
        ``path`` with the suffix ``.png``, written.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otbound.report import EndToEndRow, end_to_end_figure
    >>> row = EndToEndRow(
    ...     verifier="rrs", sampling="with_replacement", num_drafts=2, block_len=1, iterations=10,
    ...     mean_accepted=0.8, accepted_ci=0.1, given_drafts=0.79, residual=0.01, residual_ci=0.05,
    ...     given_context=0.78, acceptance_sum=0.78, alpha_sum=0.85, per_level_lower=None, per_level_upper=None,
    ...     causal_lower=0.86, causal_upper=0.86, mean_acceptance_length=1.8, mean_acceptance_length_ci=0.1,
    ...     acceptance_rate=0.4, per_position_acceptance=[0.8], acceptance_length_histogram=[0.2, 0.8],
    ...     position_bound=[0.86], tokens_per_call=1.8, seconds_per_token=0.01, speedup=1.5)
    >>> with tempfile.TemporaryDirectory() as out:
    ...     png = end_to_end_figure([row], Path(out) / "end_to_end")
    ...     print(isinstance(png, Path), png.name, png.exists())
    True end_to_end.png True
    """

    k = max(r.num_drafts for r in rows)
    length = max(r.block_len for r in rows)
    sel = [r for r in rows if r.num_drafts == k and r.block_len == length]
    fig, axes = plots.figure(ncols=2, height=2.8)
    ax = axes[0, 0]
    x = np.arange(len(sel))
    ax.errorbar(
        x, [r.mean_accepted for r in sel], yerr=[r.accepted_ci for r in sel], fmt="o", label="empirical τ (95%)"
    )
    ax.plot(x, [np.nan if r.given_context is None else r.given_context for r in sel], "x", label="exact E[τ | context]")
    ax.plot(
        x,
        [np.nan if r.causal_upper is None else r.causal_upper for r in sel],
        "_",
        ms=12,
        mew=2,
        color="k",
        label="causal bound",
    )
    ax.plot(
        x,
        [np.nan if r.alpha_sum is None else r.alpha_sum for r in sel],
        "_",
        ms=12,
        mew=2,
        color="C3",
        label="Σ α* at visited nodes",
    )
    ax.set_xticks(x, [r.verifier for r in sel], rotation=60, ha="right")
    ax.set_ylabel("accepted tokens per iteration")
    ax.set_title(f"K = {k}, L = {length}")
    ax.legend(frameon=False)
    ax = axes[0, 1]
    ells = np.arange(1, length + 1)
    for r in sel:
        ax.plot(ells, r.per_position_acceptance, "-o", color=plots.color(r.verifier), label=r.verifier, alpha=0.8)
    bound = next((r.position_bound for r in sel if r.position_bound is not None), None)
    if bound is not None:
        ax.plot(ells, bound, "k--", label="causal optimum")
    ax.set_xlabel("draft position ℓ")
    ax.set_ylabel("per-position acceptance P(τ ≥ ℓ)")
    ax.set_xticks(ells)
    ax.legend(frameon=False, ncol=2, fontsize=5)
    return plots.save(fig, path)[0]


#: the tiny pair's vocabulary in the default section
TINY_VOCAB = 12


def end_to_end_section(out, *, pair: str = "tiny", num_prompts: int = 4, verifiers=None, num_drafts=(2,),
                       block_lens=(2,), max_new_tokens: int = 12, temperature: float = 1.0, seed: int = 0,
                       datasets=("humaneval", "mtbench"), device: str = "auto", dtype: str = "auto"):
    """``(rows as dicts with block_len, markdown, figure path)`` of the end-to-end section
    (``python -m otbound.compare --end-to-end``).

    ``pair == "tiny"``: :func:`otbound.lm.tiny_pair` with V = 12 and :func:`otbound.lm.tiny_prompts`,
    with exact ``E[τ | context]``; otherwise the pair named (or ``"draft,target"``) loaded on
    ``device`` / ``dtype``, its prompts spread over ``datasets``, without it.

    Parameters
    ----------
    out : pathlib.Path
        Folder of the figure (``end_to_end.png``).
    pair : str
        ``"tiny"``, a registered pair or ``"draft,target"`` model ids or paths.
    num_prompts : int
        Prompts decoded (a real pair: spread evenly over ``datasets``, at least one each).
    verifiers : sequence of str, optional
        Token and block verifier names (None: every registered verifier).
    num_drafts, block_lens : sequence of int
        The K and block length L values.
    max_new_tokens : int
        Tokens generated per prompt.
    temperature : float
        Sampling temperature of both models.
    seed : int
        Seed of the tiny pair, its prompts and the decoding.
    datasets : sequence of str
        Prompt sets of a real pair.
    device, dtype : str
        Where and in which precision a real pair runs (``"auto"``: see :func:`otbound.lm.load_pair`).

    Returns
    -------
    rows : list of dict
        :meth:`EndToEndRow.as_dict` of each row, with ``section = "end_to_end"``.
    markdown : str
        :func:`end_to_end_markdown`.
    figure : pathlib.Path
        :func:`end_to_end_figure`.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otbound.report import end_to_end_section
    >>> with tempfile.TemporaryDirectory() as out:
    ...     rows, text, png = end_to_end_section(Path(out), pair="tiny", num_prompts=1, verifiers=["rrs"],
    ...                                          num_drafts=[2], block_lens=[1], max_new_tokens=2, seed=0)
    ...     print(png.name, png.exists())
    end_to_end.png True
    >>> [(r["section"], r["verifier"], r["num_drafts"], r["block_len"]) for r in rows]
    [('end_to_end', 'rrs', 2, 1)]
    >>> text.splitlines()[0]
    '## End to end: verifiers run as speculative decoders, against the bounds at the visited contexts'
    """
    t0 = time.perf_counter()
    if pair == "tiny":
        model_pair = tiny_pair(TINY_VOCAB, seed=seed)
        prompts = tiny_prompts(model_pair, num_prompts, seed=seed)
    else:
        from otbound.lm import encode_prompt, load_pair, load_prompts

        model_pair = load_pair(tuple(pair.split(",")) if "," in pair else pair, device=device, dtype=dtype)
        per = max(1, num_prompts // len(datasets))
        prompts = [encode_prompt(model_pair.tokenizer, p) for d in datasets for p in load_prompts(d, per)]
    names = list(verifiers) if verifiers else list(VERIFIERS) + list(BLOCK_VERIFIERS)
    real = pair != "tiny"
    rows = end_to_end_rows(
        model_pair,
        prompts,
        verifiers=names,
        num_drafts=list(num_drafts),
        block_lens=list(block_lens),
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
        exact_context=not real,
    )
    meta = {
        "pair": model_pair.name,
        "prompts": len(prompts),
        "new tokens per prompt": max_new_tokens,
        "T": temperature,
        "seed": seed,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    fig = end_to_end_figure(rows, out / "end_to_end")
    return [dict(r.as_dict(), section="end_to_end") for r in rows], end_to_end_markdown(rows, meta), fig
