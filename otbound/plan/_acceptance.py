"""Per-position acceptance measured on traces, and the acceptance of a drafting shape along them.

A drafting *shape* is a static tree with per-depth branching ``b = (b_1, ..., b_L)``: every node at
depth ``d − 1`` gets ``b_d`` drafted children, one draw of the draft law with ``K = b_d`` from the
draft's law at that node; the verifier runs at the node with those ``b_d`` drafts, and if it emits
one of them the walk moves to that child (one child: coinciding i.i.d. drafts are not merged). ``K``
chains of length ``L`` are the shape ``(K, 1, ..., 1)`` — exactly the rows of
:func:`otbound.lm.speculative_sample` for the without-replacement and greedy laws, whose ``K`` first
tokens are distinct; with i.i.d. drafts the decoder also keeps the rows of coinciding first tokens
together (more drafts below the accepted node), which the shape does not count.

Prediction along traces (positional approximation): a node at depth ``d`` of an iteration that
starts at position ``t`` of a trace accepts with the verifier's exact acceptance ``α_V(p_{t+d−1},
q_{t+d−1}, b_d)`` at the trace's position ``t + d − 1`` (the trace continues with the target's own
tokens, which is where an accepted walk goes in law), so ``P(τ ≥ ℓ | t) = Π_{d ≤ ℓ} α_V(...)`` and
``E[τ | t] = Σ_ℓ P(τ ≥ ℓ | t)``; every start ``t`` with ``t + L − 1`` inside the trace is one window.
The same product with the optimum ``α*`` of the draft law (:func:`otbound.optimal_acceptance`) at
every node bounds every lossless verifier on that law and shape: each factor is at most ``α*``.
A Monte Carlo per-position acceptance (``khisti_is`` and ``rrs_wor`` at large vocabularies) enters
unclipped, so the product along a window stays unbiased (independent draws per position); the
candidate's mean acceptance length is then clipped at its bound's (:func:`otbound.plan.evaluate`),
which only moves it towards the true value. Clipping each position at its ``α*`` instead biases the
mean low wherever the verifier attains ``α*`` (``khisti_is`` at ``K = 1``: by 0.06 on a 1 × 2 chain
of the real pair with 16 samples).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from otbound._validation import InvalidInputError
from otbound.token.draft_laws import SAMPLINGS, draft_law
from otbound.token.verifiers import VERIFIERS

#: verifiers planned by default, in registry order: those whose object says ``planned``
#: (:class:`otbound.Verifier`): the registered lossless verifiers with a fast exact acceptance, one per
#: algorithm (``nss`` ignores the drafts; ``nss_deterministic`` has ``onehot``'s acceptance;
#: ``khisti_lp`` is the LP form of the optimum at K ≤ 2). The verifiers without replacement that solve
#: a coupling per position (``ot_wor_top``, ``ot_wor_iid``, ``ot_wor``: about 0.24 s per position and
#: K at V = 151,936, five times the rest together) are planned when named in ``verifiers``, as the
#: report measures them
DEFAULT_VERIFIERS = tuple(name for name, v in VERIFIERS.items() if v.planned)


@dataclass
class AcceptanceTable:
    """Per-position acceptance on a set of traces (one cluster per trace).

    Attributes
    ----------
    clusters : list of str
        Trace ids (dataset/prompt id), one per trace.
    lengths : list of int
        Positions of each trace.
    optimal : dict
        ``optimal[law][m]``: list (one per trace) of arrays ``α*(p_t, q_t, m)``.
    acceptance : dict
        ``acceptance[verifier][m]``: list of arrays of the verifier's acceptance with ``m`` drafts.
    sampling : dict
        The draft law of each verifier.
    methods : dict
        ``methods[verifier][m]``: ``"exact"`` or ``"monte_carlo"``.
    skipped : dict
        ``skipped[verifier][m]``: why it was not measured (e.g. ``K`` above its maximum).
    source : dict
        What the table was measured on (pair, temperature, vocabulary, prompts, positions).
    """

    clusters: list
    lengths: list
    optimal: dict
    acceptance: dict
    sampling: dict
    methods: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)

    @property
    def max_drafts(self) -> int:
        return max(m for d in self.optimal.values() for m in d)

    @property
    def max_depth(self) -> int:
        """The deepest shape the traces allow: the longest trace's positions."""
        return max(self.lengths)

    def drafts_measured(self, verifier: str) -> list[int]:
        return sorted(self.acceptance.get(verifier, {}))

    def values(self, verifier: str | None, law: str, m: int) -> list[np.ndarray]:
        """Per-trace arrays of the acceptance with ``m`` drafts: the verifier's (Monte Carlo
        estimates as measured, module docstring), or the optimum α* of ``law`` when ``verifier`` is
        None."""
        if verifier is None:
            return self.optimal[law][m]
        return self.acceptance[verifier][m]

    def mean_acceptance(self, verifier: str | None, law: str) -> dict:
        """``{m: mean over positions}`` of :meth:`values` (the positional-independence input of the
        tree search)."""
        ms = sorted(self.optimal[law]) if verifier is None else self.drafts_measured(verifier)
        return {m: float(np.concatenate(self.values(verifier, law, m)).mean()) for m in ms}


def window_levels(table: AcceptanceTable, verifier: str | None, law: str, branching) -> tuple[np.ndarray, np.ndarray]:
    """``(levels, clusters)``: ``levels[w, ℓ−1] = P(τ ≥ ℓ | window w)`` of shape ``branching``
    (module docstring), one row per window (start position) of every trace long enough, and the
    window's trace index.

    Raises
    ------
    InvalidInputError
        A shape deeper than every trace, or a branching not measured for this verifier.
    """
    b = [int(x) for x in branching]
    depth = len(b)
    if depth == 0 or min(b) < 1:
        raise InvalidInputError(f"a shape needs depth ≥ 1 and branching ≥ 1 at every depth, got {b}")
    if depth > table.max_depth:
        raise InvalidInputError(
            f"shape of depth {depth} is deeper than the traces allow (longest trace: {table.max_depth} positions)")
    per_m = {}
    for m in set(b):
        try:
            per_m[m] = table.values(verifier, law, m)
        except KeyError:
            raise InvalidInputError(f"{verifier or 'optimum'} ({law}) was not measured with {m} drafts") from None
    rows, clusters = [], []
    for c, n in enumerate(table.lengths):
        w = n - depth + 1
        if w <= 0:
            continue
        prod = np.ones(w)
        lv = np.empty((w, depth))
        for d, m in enumerate(b):
            prod = prod * per_m[m][c][d:d + w]
            lv[:, d] = prod
        rows.append(lv)
        clusters.append(np.full(w, c))
    return np.concatenate(rows), np.concatenate(clusters)


def table_from_measurements(results, *, source=None) -> AcceptanceTable:
    """An :class:`AcceptanceTable` from per-trace results of :func:`otbound.report.measure_laws`
    (each with ``prompt_id``, ``dataset`` and ``positions`` added, as
    :func:`otbound.report.measure_trace` returns them)."""
    if not results:
        raise InvalidInputError("no measured traces to plan from")
    optimal, acceptance, sampling, methods, skipped = {}, {}, {}, {}, {}
    for law in results[0]["optimal"]:
        optimal[law] = {int(m): [np.asarray(r["optimal"][law][m], dtype=np.float64) for r in results]
                        for m in results[0]["optimal"][law]}
    names = sorted({n for r in results for n in r["verifiers"]})
    for name in names:
        ms = sorted(set.intersection(*[set(r["verifiers"].get(name, {})) for r in results]))
        for m in ms:
            entries = [r["verifiers"][name][m] for r in results]
            acceptance.setdefault(name, {})[int(m)] = [np.asarray(e["acceptance"], dtype=np.float64) for e in entries]
            sampling[name] = entries[0]["sampling"]
            methods.setdefault(name, {})[int(m)] = (
                "monte_carlo" if any(e["method"] == "monte_carlo" for e in entries) else "exact")
    for r in results:
        for name, d in r.get("skipped", {}).items():
            for m, why in d.items():
                skipped.setdefault(name, {})[int(m)] = why
    law0 = next(iter(optimal))
    m0 = next(iter(optimal[law0]))
    return AcceptanceTable(
        clusters=[f"{r.get('dataset', '')}/{r.get('prompt_id', i)}" for i, r in enumerate(results)],
        lengths=[int(a.size) for a in optimal[law0][m0]],
        optimal=optimal, acceptance=acceptance, sampling=sampling, methods=methods, skipped=skipped,
        source=dict(source or {}))


def _merge(res: dict, part: dict) -> None:
    """Add one :func:`otbound.report.measure_laws` result to a trace's result."""
    for law, d in part["optimal"].items():
        res["optimal"].setdefault(law, {}).update(d)
    for n, d in part["verifiers"].items():
        res["verifiers"].setdefault(n, {}).update(d)
    for n, d in part["skipped"].items():
        res["skipped"].setdefault(n, {}).update(d)


def _covered(old: dict, name: str, k: int) -> bool:
    """Whether a stored measurement holds ``name`` at ``k`` drafts (measured or skipped with a reason)."""
    return k in old["verifiers"].get(name, {}) or k in old["skipped"].get(name, {})


def measure_table(laws_per_trace, *, max_drafts: int, verifiers=DEFAULT_VERIFIERS, laws=None, mc_samples: int = 16,
                  seed: int = 0, max_drafts_per_verifier=None, source=None, ids=None, stored=None) -> AcceptanceTable:
    """Measure an :class:`AcceptanceTable` from ``(p, q)`` per trace (positions × V each) with
    :func:`otbound.report.measure_laws` at ``K = 1..max_drafts``.

    ``laws``: the draft laws (default :data:`otbound.SAMPLINGS`); verifiers of other laws are left
    out. ``max_drafts_per_verifier``: ``{name: K}`` caps for costly ones. Only lossless verifiers
    are planned (a verifier with ``lossless = False`` is refused). ``stored``: per trace, a
    measurement already made on it (:func:`otbound.report.stored_measurement`, e.g. a report's) or
    None; the values it holds (its K, its verifiers, all of ``laws``) are taken from it and only the
    rest is measured.
    """
    from otbound.report import measure_laws

    laws = [draft_law(s).name for s in (SAMPLINGS if laws is None else laws)]
    names = [n for n in verifiers if n in VERIFIERS and VERIFIERS[n].sampling in laws]
    bad = [n for n in verifiers if n not in VERIFIERS]
    if bad:
        raise InvalidInputError(f"unknown verifier(s) {bad}; expected names in {sorted(VERIFIERS)}")
    lossy = [n for n in names if not VERIFIERS[n].lossless]
    if lossy:
        raise InvalidInputError(f"verifier(s) {lossy} are not lossless: a plan compares lossless verifiers only")
    if max_drafts < 1:
        raise InvalidInputError(f"max_drafts must be ≥ 1, got {max_drafts}")
    caps = dict(max_drafts_per_verifier or {})
    results = []
    for i, (p, q) in enumerate(laws_per_trace):
        old = stored[i] if stored is not None else None
        if old is not None and not all(law in old["optimal"] for law in laws):
            old = None
        cached = set() if old is None else {int(k) for k in old["config"]["num_drafts"]}
        res = {"optimal": {law: {} for law in laws}, "verifiers": {}, "skipped": {}}
        groups: dict = {}
        for n in names:
            groups.setdefault(min(caps.get(n, max_drafts), max_drafts), []).append(n)

        fresh = [k for k in range(1, max_drafts + 1) if k not in cached]
        if old is not None:  # the stored values at its K for the laws and the verifiers it holds
            for law in laws:
                res["optimal"][law].update({k: v for k, v in old["optimal"][law].items() if k <= max_drafts})
            for k_max, group in groups.items():
                for n in group:
                    for k in sorted(cached):
                        if k <= k_max and k in old["verifiers"].get(n, {}):
                            res["verifiers"].setdefault(n, {})[k] = old["verifiers"][n][k]
                        elif k <= k_max and k in old["skipped"].get(n, {}):
                            res["skipped"].setdefault(n, {})[k] = old["skipped"][n][k]
        for k_max, group in sorted(groups.items(), reverse=True):
            ks = [k for k in fresh if k <= k_max]
            if ks:
                _merge(res, measure_laws(p, q, ks, verifiers=group, samplings=laws, mc_samples=mc_samples,
                                         seed=[seed, i]))
            for k in sorted(cached):
                missing = [n for n in group if k <= k_max and not _covered(old, n, k)]
                if missing:
                    _merge(res, measure_laws(p, q, [k], verifiers=missing, samplings=laws, mc_samples=mc_samples,
                                      seed=[seed, i]))
        if any(not res["optimal"][law] or set(res["optimal"][law]) != set(range(1, max_drafts + 1)) for law in laws):
            _merge(res, measure_laws(p, q, [k for k in range(1, max_drafts + 1) if k not in res["optimal"][laws[0]]],
                              verifiers=[], samplings=laws, seed=[seed, i]))
        res["prompt_id"], res["dataset"] = (ids[i] if ids else (str(i), ""))
        results.append(res)
    return table_from_measurements(results, source=source)
