"""Khisti et al. (2410.18234) toy families: the optimum against SpecTr, SpecInfer and IS as q₂ varies.

Khisti et al.'s Figure 2 (K = 2 i.i.d. drafts, alphabet {1, 2, 3}) sets p = [1/3, 1/3, 1/3] and
q = [1/3, q₂, 2/3 − q₂] (family A) or q = [1/6, q₂, 5/6 − q₂] (family B). In their notation (that
of SpecTr, 2310.15141) p is the *draft* and q the *target*, the reverse of otbound's; the issue that
asked for this figure states it in theirs. Both readings are drawn:

* ``paper`` (top row): draft uniform, target ``[1/3, q₂, 2/3 − q₂]`` / ``[1/6, q₂, 5/6 − q₂]`` —
  the paper's figure;
* ``swapped`` (bottom row): target uniform, draft ``[...]`` — the same families with the roles
  exchanged.

Every value is exact: the optimum α* by the dual prefix form (:func:`otbound.optimal_acceptance`),
each verifier by its exact acceptance (``VERIFIERS[name].acceptance``): SpecTr = ``kseq`` (K-SEQ at
ρ*), SpecInfer = ``rrs`` (recursive rejection sampling), IS = ``khisti_is`` (self-normalised
importance-sampling selection with weights target/draft, then speculative sampling — the plain-IS
rule) and IS with the LP-optimal selection weights = ``khisti_lp`` (the paper's optimised
selection; markers every few points). The paper's figure has no IS curve.

Usage: ``python experiments/fig_khisti_toy.py [--recompute] [--quick] [--out figures/]``.
"""

from __future__ import annotations

import sys

import _common
import numpy as np

NAME = "fig_khisti_toy"
FAMILIES = {"A": (1 / 3, 2 / 3), "B": (1 / 6, 5 / 6)}  # law = [first, q2, total - q2]
READINGS = ("paper", "swapped")
VERIFIER_LABELS = {"kseq": "SpecTr (K-SEQ)", "rrs": "SpecInfer (RRS)", "khisti_is": "IS (weights target/draft)",
                   "khisti_lp": "IS, LP-optimal weights"}


def laws(case: str, q2: float) -> tuple[np.ndarray, np.ndarray]:
    """``(target p, draft q)`` in otbound's notation for ``case`` = ``"<reading>/<family>"``."""
    reading, family = case.split("/")
    first, total = FAMILIES[family]
    varied, uniform = np.array([first, q2, total - q2]), np.full(3, 1 / 3)
    return (varied, uniform) if reading == "paper" else (uniform, varied)


def compute(params, checkpoint) -> dict:
    from otbound import optimal_acceptance
    from otbound.token.verifiers import VERIFIERS

    k = params["num_drafts"]
    out = {}
    for case in params["cases"]:
        total = FAMILIES[case.split("/")[1]][1]
        grid = np.linspace(0.0, total, params["points"])
        curves = {"q2": grid.tolist(), "optimal": []}
        for name in params["verifiers"]:
            curves[name] = []
        for q2 in grid:
            p, q = laws(case, q2)
            curves["optimal"].append(float(optimal_acceptance(p, q, k)))
            for name in params["verifiers"]:
                curves[name].append(float(VERIFIERS[name].acceptance(p, q, k)))
        out[case] = curves
    return out


def draw(results, out, formats) -> list:
    from otbound.report import plots

    res = results["results"]
    fig, axes = plots.figure(nrows=len(READINGS), ncols=len(FAMILIES), sharey=True)
    styles = {
        "optimal": ("k-", "optimum α*"),
        "khisti_is": ("C2-.", None),
        "kseq": ("C0--", None),
        "rrs": ("C3:", None),
        "khisti_lp": ("C1o", None),
    }
    k = results["params"]["num_drafts"]
    for i, reading in enumerate(READINGS):
        for j, fam in enumerate(FAMILIES):
            ax, c = axes[i, j], res[f"{reading}/{fam}"]
            for name in ["optimal"] + [n for n in c if n not in ("q2", "optimal")]:
                style, label = styles.get(name, ("-", None))
                every = max(1, len(c["q2"]) // 12) if name == "khisti_lp" else 1  # markers on the optimum's line
                ax.plot(
                    c["q2"][::every],
                    c[name][::every],
                    style,
                    markersize=3,
                    label=label or VERIFIER_LABELS.get(name, name),
                )
            first, total = FAMILIES[fam]
            varied = f"[{_frac(first)}, q₂, {_frac(total)} − q₂]"
            role = ("target", "draft") if reading == "paper" else ("draft", "target")
            ax.set_title(f"{role[0]} {varied}, {role[1]} uniform, K = {k}", fontsize=7)
            ax.set_xlabel(f"{role[0]} probability q₂")
        axes[i, 0].set_ylabel("acceptance α")
    axes[0, 0].legend(frameon=False, loc="lower center")
    return plots.save(fig, f"{out}/{NAME}", formats=formats)


def _frac(x: float) -> str:
    for d in (3, 6):
        n = round(x * d)
        if abs(n / d - x) < 1e-12:
            return f"{n}/{d}"
    return f"{x:g}"


def summary(results) -> str:
    """Markdown: the largest gap optimum − verifier per family, with the q₂ where it occurs."""
    lines = ["| reading/family | verifier | max(α* − α) | at q₂ |", "|---|---|---|---|"]
    for fam, c in results["results"].items():
        opt = np.array(c["optimal"])
        for name in (n for n in c if n not in ("q2", "optimal")):
            gap = opt - np.array(c[name])
            i = int(np.argmax(gap))
            lines.append(f"| {fam} | {name} | {gap[i]:.4f} | {c['q2'][i]:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> list:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    params = {
        "cases": [f"{r}/{f}" for r in READINGS for f in FAMILIES],
        "num_drafts": 2,
        "points": 13 if args.quick else 201,
        "verifiers": list(VERIFIER_LABELS),
    }
    results = _common.load_or_compute(args, NAME, params, compute)
    return _common.finish(NAME, results, args, draw, summary)


if __name__ == "__main__":
    main(sys.argv[1:])
