"""Candidates (draft law × shape × verifier), their predictions and bounds, and the plan's files."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from otbound._integrity import content_key
from otbound._io import atomic_path, json_text
from otbound._validation import InvalidInputError
from otbound.plan._acceptance import AcceptanceTable, window_levels
from otbound.plan._cost import CostModel
from otbound.plan._engines import engine_configurations, engines_markdown
from otbound.plan._search import best_tree, check_search_size, tree_nodes_of
from otbound.report import cluster_mean_ci, metrics_from_levels

#: node budgets of the default search
DEFAULT_BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


@dataclass
class Candidate:
    """One planned configuration: ``draft_law`` × ``shape`` × ``verifier`` (a verifier ``None``
    is the optimum ``α*`` of the law, the bound's curve).

    ``mean_acceptance_length`` ± ``mean_acceptance_length_ci`` (95%, cluster-robust over traces,
    :func:`otbound.report.cluster_mean_ci` on the per-window ``1 + E[τ | window]``),
    ``bound_mean_acceptance_length`` (the same with ``α*`` of the law at every node), the engine
    metrics of the predicted law (docs/guide/metrics.md; ``acceptance_rate`` over the shape's
    ``nodes``), ``predicted_speedup`` with the interval of the mean acceptance length carried through
    the cost model, ``bound_speedup`` (the bound's acceptance at the same cost).
    """

    draft_law: str
    shape: dict
    verifier: str | None
    method: str
    mean_acceptance_length: float
    mean_acceptance_length_ci: float
    mean_acceptance_length_interval: list
    bound_mean_acceptance_length: float
    acceptance_rate: float
    per_position_acceptance: list
    acceptance_length_histogram: list
    predicted_speedup: float
    predicted_speedup_interval: list
    bound_speedup: float
    iteration_seconds: float
    windows: int
    searched: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def chain_shape(num_drafts: int, block_len: int) -> dict:
    """``K`` chains of length ``L``: branching ``(K, 1, ..., 1)``.

    Examples
    --------
    >>> chain_shape(3, 2)
    {'kind': 'chains', 'num_drafts': 3, 'block_len': 2, 'branching': [3, 1], 'nodes': 6}
    """
    b = [int(num_drafts)] + [1] * (int(block_len) - 1)
    return {"kind": "chains", "num_drafts": int(num_drafts), "block_len": int(block_len), "branching": b,
            "nodes": tree_nodes_of(b)}


def tree_shape(branching) -> dict:
    """A uniform tree of per-depth branching ``b_1..b_L`` (a chain shape when ``b_2..b_L`` are 1)."""
    b = [int(x) for x in branching]
    if all(x == 1 for x in b[1:]):
        return chain_shape(b[0], len(b))
    return {"kind": "tree", "branching": b, "nodes": tree_nodes_of(b)}


def shape_label(shape: dict) -> str:
    if shape["kind"] == "chains":
        return f"{shape['num_drafts']}×{shape['block_len']} chains"
    return "tree " + "-".join(str(b) for b in shape["branching"])


def evaluate(table: AcceptanceTable, cost: CostModel, law: str, verifier, shape: dict,
             confidence: float = 0.95) -> Candidate:
    """Predict one candidate on ``table`` (module docstring of :mod:`otbound.plan._acceptance`)."""
    b = shape["branching"]
    levels, clusters = window_levels(table, verifier, law, b)
    bound_levels, _ = window_levels(table, None, law, b)
    mal, ci = cluster_mean_ci(1.0 + levels.sum(axis=1), clusters, confidence)
    bound = float(1.0 + bound_levels.sum(axis=1).mean())
    mean_levels = levels.mean(axis=0)
    bound_mean_levels = bound_levels.mean(axis=0)
    if mal > bound:  # only a Monte Carlo estimate can exceed its bound: clip it (towards the true value)
        mal, mean_levels = bound, bound_mean_levels
    metrics = metrics_from_levels(mean_levels, shape["nodes"])
    secs = cost.iteration_seconds(b, mean_levels, verifier)
    speed = cost.speedup(b, mean_levels, verifier)
    ci = 0.0 if not np.isfinite(ci) else ci
    lo, hi = mal - ci, mal + ci
    methods = {table.methods.get(verifier, {}).get(m, "exact") for m in set(b)} if verifier else {"exact"}
    return Candidate(
        draft_law=law, shape=shape, verifier=verifier,
        method="monte_carlo" if "monte_carlo" in methods else "exact",
        mean_acceptance_length=mal, mean_acceptance_length_ci=ci, mean_acceptance_length_interval=[lo, hi],
        bound_mean_acceptance_length=bound, acceptance_rate=metrics["acceptance_rate"],
        per_position_acceptance=metrics["per_position_acceptance"],
        acceptance_length_histogram=metrics["acceptance_length_histogram"],
        predicted_speedup=speed, predicted_speedup_interval=[speed * lo / mal, speed * hi / mal],
        bound_speedup=cost.speedup(b, bound_levels.mean(axis=0), verifier), iteration_seconds=secs,
        windows=int(levels.shape[0]))


@dataclass
class Plan:
    """The planner's result: every candidate, the optimum's candidates (``verifier = None``), the
    configuration, the table's source and the cost model."""

    candidates: list
    optimum: list
    config: dict
    source: dict
    cost_model: dict

    def best(self) -> Candidate:
        if not self.candidates:
            raise InvalidInputError("the plan has no candidate (no verifier of its draft laws)")
        return max(self.candidates, key=lambda c: c.predicted_speedup)

    def as_dict(self) -> dict:
        body = {"config": self.config, "source": self.source, "cost_model": self.cost_model,
                "candidates": [c.as_dict() for c in self.candidates], "optimum": [c.as_dict() for c in self.optimum]}
        return json.loads(json_text(body, default=float))


def make_plan(table: AcceptanceTable, cost: CostModel, *, laws=None, verifiers=None, max_depth: int = 6,
              max_chain_drafts: int | None = None, budgets=DEFAULT_BUDGETS, progress: bool = False) -> Plan:
    """All candidates on ``table``: for every draft law, its shapes — the chains ``K × L`` (``K ≤
    max_chain_drafts``, ``L ≤ max_depth``) and, for every node budget, the tree of
    :func:`otbound.plan.best_tree` on the mean acceptance of each lossless verifier of the law
    measured in ``table`` and of the optimum ``α*`` — each evaluated with every such verifier
    (where it was measured with that many drafts per node) and with the optimum (``optimum``).

    Raises
    ------
    InvalidInputError
        A budget below one node, a depth deeper than the traces allow, a law or verifier not in
        the table, a tree search too large (:func:`otbound.plan._search.check_search_size`), or no
        candidate at all (no verifier of any of the laws).

    Examples
    --------
    >>> from otbound.plan import synthetic_table, synthetic_cost_model
    >>> table = synthetic_table(num_traces=3, positions=8, max_drafts=2, verifiers=("rrs",), laws=("with_replacement",))
    >>> plan = make_plan(table, synthetic_cost_model(), max_depth=3, budgets=(1, 4))
    >>> all(1 <= c.mean_acceptance_length <= c.bound_mean_acceptance_length + 1e-9 for c in plan.candidates)
    True
    """
    budgets = [int(n) for n in budgets]
    if not budgets or min(budgets) < 1:
        raise InvalidInputError(f"every node budget must be at least one node, got {budgets}")
    max_depth = int(max_depth)
    if max_depth < 1 or max_depth > table.max_depth:
        raise InvalidInputError(
            f"max_depth {max_depth} is outside 1..{table.max_depth} (the longest trace's positions)")
    laws = list(table.optimal) if laws is None else list(laws)
    missing = [s for s in laws if s not in table.optimal]
    if missing:
        raise InvalidInputError(f"draft law(s) {missing} not measured in the table (it has {list(table.optimal)})")
    names = list(table.acceptance) if verifiers is None else list(verifiers)
    unknown = [n for n in names if n not in table.acceptance]
    if unknown:
        raise InvalidInputError(f"verifier(s) {unknown} not measured in the table (it has {list(table.acceptance)})")
    for n in budgets:
        check_search_size(n, max_depth)
    if not any(table.sampling[n] in laws for n in names):
        raise InvalidInputError(f"no candidate to plan: no verifier measured draws from the draft law(s) {laws} "
                                f"(measured: { {n: table.sampling[n] for n in names} })")
    kmax = table.max_drafts if max_chain_drafts is None else int(max_chain_drafts)
    candidates, optimum = [], []
    for law in laws:
        mine = [n for n in names if table.sampling[n] == law]
        shapes: dict = {}  # branching -> (shape, budgets whose search found it)
        for k in range(1, kmax + 1):
            for length in range(1, max_depth + 1):
                s = chain_shape(k, length)
                shapes[tuple(s["branching"])] = (s, set())
        for who in mine + [None]:
            mean = table.mean_acceptance(who, law)
            for n in budgets:
                b, _ = best_tree(mean, n, max_depth)
                shapes.setdefault(tuple(b), (tree_shape(b), set()))[1].add(n)
        for key, (s, searched) in shapes.items():
            for who in mine + [None]:
                if max(key) > max(table.drafts_measured(who) if who else table.optimal[law]):
                    continue  # more drafts per node than measured for this verifier
                c = evaluate(table, cost, law, who, s)
                c.searched = sorted(searched)
                (candidates if who else optimum).append(c)
    config = {"laws": laws, "verifiers": names, "max_depth": max_depth, "max_chain_drafts": kmax, "budgets": budgets}
    return Plan(candidates, optimum, config, dict(table.source), cost.as_dict())


def best_by_budget(cands, budgets) -> list:
    """For each budget, the candidate of highest predicted speed-up with at most that many nodes."""
    out = []
    for n in budgets:
        fit = [c for c in cands if c.shape["nodes"] <= n]
        out.append(max(fit, key=lambda c: c.predicted_speedup) if fit else None)
    return out


def pareto_front(cands) -> list:
    """Candidates not beaten by one with fewer or equal nodes and a higher predicted speed-up,
    by node count."""
    front, best = [], -np.inf
    for c in sorted(cands, key=lambda c: (c.shape["nodes"], -c.predicted_speedup)):
        if c.predicted_speedup > best + 1e-12:
            front.append(c)
            best = c.predicted_speedup
    return front


def plan_markdown(plan: Plan, top: int = 20) -> str:
    """``plan.md``: source, cost model, the best candidates, the optimum per law and what is left
    against it."""

    def iv(x):
        return f"[{x[0]:.2f}, {x[1]:.2f}]"

    src = ", ".join(f"{k}: {v}" for k, v in plan.source.items())
    cm = plan.cost_model
    mach = cm["machine"]
    lines = [
        "# Drafting plan", "",
        f"Traces: {src}.", "",
        f"Cost model: draft {cm['draft']['source']} ({_curve_text(cm['draft'])}), target {cm['target']['source']} "
        f"({_curve_text(cm['target'])}); verification measured per verifier on {mach.get('device', '?')} "
        f"({mach.get('processor', '')}, {mach.get('cpus', '?')} CPUs, {mach.get('measured', '')}).",
        "",
        *[f"**Unstable timings** of the {k} forward curve: {cm[k]['timing']['unstable']}; its predicted speed-ups "
          "may mislead.\n" for k in ("draft", "target") if (cm[k].get("timing") or {}).get("unstable")],
        "Mean acceptance length = 1 + E[τ] per target call (vLLM, SGLang spec_accept_length, EAGLE); predicted along "
        "the traces with each verifier's exact per-node acceptance (positional approximation, docs/guide/planner.md); "
        "bound: the same with α* of the draft law at every node. 95% intervals cluster-robust over traces.", "",
        f"## Best {min(top, len(plan.candidates))} candidates by predicted speed-up", "",
        "| rank | draft law | shape | nodes | verifier | mean acceptance length (95%) | bound | acceptance rate "
        "| per-position acceptance | predicted speed-up (95%) | bound speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ranked = sorted(plan.candidates, key=lambda c: -c.predicted_speedup)
    for i, c in enumerate(ranked[:top], 1):
        pos = ", ".join(f"{x:.2f}" for x in c.per_position_acceptance)
        lines.append(
            f"| {i} | {c.draft_law} | {shape_label(c.shape)} | {c.shape['nodes']} | {c.verifier} | "
            f"{c.mean_acceptance_length:.3f} ± {c.mean_acceptance_length_ci:.3f} | "
            f"{c.bound_mean_acceptance_length:.3f} | "
            f"{c.acceptance_rate:.3f} | {pos} | {c.predicted_speedup:.3f} {iv(c.predicted_speedup_interval)} | "
            f"{c.bound_speedup:.3f} |")
    lines += ["", "## Best per draft law and verifier, and the optimum of the law", "",
              "| draft law | verifier | shape | mean acceptance length | predicted speed-up | optimum's best shape "
              "| optimum's mean acceptance length | optimum's speed-up |", "|---|---|---|---|---|---|---|---|"]
    for law in plan.config["laws"]:
        opt = max((c for c in plan.optimum if c.draft_law == law), key=lambda c: c.predicted_speedup, default=None)
        for name in plan.config["verifiers"]:
            sel = [c for c in plan.candidates if c.draft_law == law and c.verifier == name]
            if not sel or opt is None:
                continue
            b = max(sel, key=lambda c: c.predicted_speedup)
            lines.append(f"| {law} | {name} | {shape_label(b.shape)} | {b.mean_acceptance_length:.3f} | "
                         f"{b.predicted_speedup:.3f} | {shape_label(opt.shape)} | {opt.mean_acceptance_length:.3f} | "
                         f"{opt.predicted_speedup:.3f} |")
    if plan.candidates:
        lines += ["", *engines_markdown(engine_configurations(plan.best(), plan))]
    return "\n".join(lines) + "\n"


def _curve_text(curve: dict) -> str:
    return ", ".join(f"{int(n)}: {s * 1e3:.3g} ms" for n, s in zip(curve["sizes"], curve["seconds"], strict=True))


def plan_figure(plan: Plan, path):
    """Left: the best predicted speed-up with at most ``N`` nodes against the node budget ``N``, per
    draft law and verifier, the optimum (α*) of each law dashed above. Right: every candidate's
    predicted speed-up against its nodes, the Pareto front drawn through. Written to ``path.png``;
    returns that path."""
    from otbound.report import plots

    return plots.save(_plan_figure(plan), path)[0]


def _plan_figure(plan: Plan):
    from otbound.report import plots

    budgets = sorted({c.shape["nodes"] for c in plan.candidates + plan.optimum})
    fig, axes = plots.figure(ncols=2, height=3.0)
    ax = axes[0, 0]
    laws = plan.config["laws"]
    for li, law in enumerate(laws):
        style = ["-", "-.", ":", (0, (3, 1, 1, 1))][li % 4]
        for vi, name in enumerate(plan.config["verifiers"]):
            sel = [c for c in plan.candidates if c.draft_law == law and c.verifier == name]
            if not sel:
                continue
            best = best_by_budget(sel, budgets)
            xs = [n for n, c in zip(budgets, best, strict=True) if c is not None]
            ax.step(xs, [c.predicted_speedup for c in best if c is not None], where="post", linestyle=style,
                    color=f"C{vi % 10}", label=f"{name} ({law})")
        opt = best_by_budget([c for c in plan.optimum if c.draft_law == law], budgets)
        xs = [n for n, c in zip(budgets, opt, strict=True) if c is not None]
        ax.step(xs, [c.predicted_speedup for c in opt if c is not None], where="post", color="k", linestyle="--",
                alpha=0.4 + 0.6 * (li + 1) / len(laws), label=f"optimum α* ({law})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("node budget N (draft tokens verified per call)")
    ax.set_ylabel("predicted speed-up over plain decoding")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False, fontsize=5)
    ax = axes[0, 1]
    for vi, name in enumerate(plan.config["verifiers"]):
        sel = [c for c in plan.candidates if c.verifier == name]
        ax.scatter([c.shape["nodes"] for c in sel], [c.predicted_speedup for c in sel], s=6, color=f"C{vi % 10}",
                   label=name, alpha=0.6)
    front = pareto_front(plan.candidates)
    ax.plot([c.shape["nodes"] for c in front], [c.predicted_speedup for c in front], "k-o", ms=3, label="Pareto front")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes")
    ax.set_ylabel("predicted speed-up")
    ax.legend(frameon=False, fontsize=5)
    return fig


def write_plan(plan: Plan, out, extra: dict | None = None) -> dict:
    """Write ``plan.json`` (with its SHA-256 and, under ``engines``, the best candidate in the serving
    engines' configuration: :func:`otbound.plan.engine_configurations`), ``plan.md`` and ``plan.png``
    under ``out``, and the JSON files of ``extra`` (``{file name: JSON-able body}``, each stored with
    its SHA-256, e.g. the measured ``cost.json``); returns their paths (keys ``json``, ``markdown``, ``figure`` and the
    stems of ``extra``).

    All of them are rendered in full under temporary names beside their targets first, then moved
    into place one after the other (:func:`otbound._io.atomic_path`): a plan that cannot be written
    (no candidate, a full disk, Ctrl-C) leaves the previous files as they were.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.plan import synthetic_table, synthetic_cost_model, make_plan
    >>> table = synthetic_table(num_traces=2, positions=4, max_drafts=1, verifiers=("rrs",), laws=("with_replacement",))
    >>> out = Path(tempfile.mkdtemp())
    >>> paths = write_plan(make_plan(table, synthetic_cost_model(), max_depth=2, budgets=(2,)), out)
    >>> sorted(p.name for p in out.iterdir())
    ['plan.json', 'plan.md', 'plan.png']
    """
    from otbound.report import plots

    out = Path(out)
    plan.best()  # a plan without candidates is refused before anything is written
    body = dict(plan.as_dict(), engines=engine_configurations(plan.best(), plan))
    texts = {"plan.json": json_text(dict(body, sha256=content_key(body)), indent=1), "plan.md": plan_markdown(plan)}
    for name, extra_body in (extra or {}).items():
        plain = json.loads(json_text(extra_body))
        texts[name] = json_text(dict(plain, sha256=content_key(plain)), indent=1)
    fig = _plan_figure(plan)
    with contextlib.ExitStack() as stack:  # every file complete under its temporary name before any replaces
        for name, text in texts.items():
            stack.enter_context(atomic_path(out / name)).write_text(text, encoding="utf-8")
        plots.save(fig, stack.enter_context(atomic_path(out / "plan.png")))
    paths = {"json": out / "plan.json", "markdown": out / "plan.md", "figure": out / "plan.png"}
    return dict(paths, **{Path(name).stem: out / name for name in extra or {}})

