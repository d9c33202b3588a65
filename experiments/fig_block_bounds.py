"""Block level: the bound hierarchy (causal ≤ joint ≤ per-level) against the block verifiers, as K and L vary.

Three parts, all E[τ] = expected accepted draft tokens per iteration (bonus token excluded):

* **random small models** — target ``dirichlet_model(V, concentration=1)`` and a draft that
  mixes it half and half with an independent Dirichlet model (``mixture_model``), V = 4; for each
  (K, L) the three bounds (:func:`otbound.block_bound`, ``kind`` = per_level / joint / causal) and
  every block verifier (``BLOCK_VERIFIERS[name].acceptance``, exact by enumeration of the
  V^(KL) draft tuples, so only while V^(KL) ≤ ``max_verifier_tuples``), averaged over ``models``
  random pairs;
* **Sun et al. toy** (2403.10444): p = (1/3, 2/3), q = (2/3, 1/3) context-free, L = 2, K = 1 —
  token-level 10/9, block verification 11/9 = U_causal, U_joint = U_per-level = 12/9;
* **truncated trees** — brackets [lower, upper] of each bound on a tree truncated to the top-m
  tokens per node (merging the rest into an "other" cell raises an OT value: upper side; never
  accepting "other": lower side), for Zipf-shaped models of a large vocabulary (quick mode and
  offline) or the real pair at contexts of its traces (``--recompute`` with the models); on the
  same trees every block verifier whose ``E[τ | drafts]`` needs only the drawn draft tree, by Monte
  Carlo over ``tree_tuples`` draft tuples (``causal_optimal`` needs the complete trie: not run).

The bounds are of K i.i.d. draft blocks. ``univer`` drafts its own tree (``num_drafts`` = m branches
per node, ``m^L`` paths): it is run on that law, and on the random models it is compared with
U_causal / U_joint of *its own* tree law (``own_law_bounds``, in the table's last lines); on the
truncated trees only its Monte Carlo E[τ] on its own trees is shown (no bound of its law there).

Usage: ``python experiments/fig_block_bounds.py [--recompute] [--quick] [--out figures/]``.
"""

from __future__ import annotations

import sys

import _common
import numpy as np

NAME = "fig_block_bounds"
KINDS = ("causal", "joint", "per_level")
KIND_LABELS = {"causal": "U_causal (lossless)", "joint": "U_joint (block OT)", "per_level": "U_per-level"}


def random_pair(vocab_size, seed):
    from otbound.block.models import dirichlet_model, mixture_model

    target = dirichlet_model(vocab_size, concentration=1.0, seed=2 * seed, name="target")
    draft = mixture_model(target, dirichlet_model(vocab_size, concentration=1.0, seed=2 * seed + 1), 0.5, name="draft")
    return target, draft


#: a verifier whose exact sequence-level error exceeds this is reported as not lossless
LOSSLESS_TOL = 1e-9


def _verifier_values(target, draft, v, k, ell, skipped) -> dict:
    """{name: (E[τ], lossless error, (U_causal, U_joint) of its own draft law or None for K i.i.d.
    blocks)} for every block verifier that runs at (K, L), all exact."""
    from otbound import InvalidInputError
    from otbound.block.verifiers import BLOCK_VERIFIERS

    out = {}
    for name, ver in BLOCK_VERIFIERS.items():
        kw = dict(vocab_size=v, num_drafts=k, block_len=ell)
        try:
            own = None
            if ver.sampling != "with_replacement":
                b = ver.own_law_bounds(target, draft, **kw)
                own = (float(b.causal), float(b.joint))
            out[name] = (
                float(ver.acceptance(target, draft, **kw)),
                float(ver.lossless_error(target, draft, **kw)),
                own,
            )
        except (InvalidInputError, NotImplementedError) as exc:
            skipped.setdefault(name, f"K={k}, L={ell}: {exc}")
    return out


def compute_for(args):
    return lambda params, checkpoint: compute(args, params, checkpoint)


def compute(args, params, checkpoint) -> dict:
    from tqdm import tqdm

    from otbound.block.bounds import block_bound
    from otbound.block.models import context_free_model

    v = params["vocab_size"]
    skipped: dict = {}
    random_cells = []
    jobs = [(k, ell) for k in params["num_drafts"] for ell in params["block_lens"]]
    for k, ell in tqdm(jobs, desc="block cells", file=sys.stderr):
        key = f"K={k},L={ell}"
        cell = checkpoint.get(key)
        if cell is None:
            per_b, per_v = {}, {}
            for s in range(params["models"]):
                target, draft = random_pair(v, params["seed"] + s)
                for kind in KINDS:
                    per_b.setdefault(kind, []).append(
                        block_bound(target, draft, vocab_size=v, num_drafts=k, block_len=ell, kind=kind).value
                    )
                if (
                    v ** (k * ell) <= params["max_verifier_tuples"]
                ):  # verifiers' exact E[τ] enumerates the V^(KL) draft tuples
                    for name, val in _verifier_values(target, draft, v, k, ell, skipped).items():
                        per_v.setdefault(name, []).append(val)
            full = {n: x for n, x in per_v.items() if len(x) == params["models"]}
            cell = dict(num_drafts=k, block_len=ell, models=params["models"],
                        bounds={kk: float(np.mean(x)) for kk, x in per_b.items()},
                        verifiers={n: float(np.mean([a for a, _, _ in x])) for n, x in full.items()},
                        lossless_error={n: float(max(e for _, e, _ in x)) for n, x in full.items()},
                        own_bounds={n: [float(np.mean(col)) for col in zip(*[o for _, _, o in x])]
                                    for n, x in full.items() if x[0][2] is not None})
            checkpoint.put(key, cell)
        random_cells.append(cell)
    p_toy, q_toy = context_free_model([1 / 3, 2 / 3]), context_free_model([2 / 3, 1 / 3])
    toy_v = _verifier_values(p_toy, q_toy, 2, 1, 2, skipped)
    toy = dict(
        bounds={
            kind: block_bound(p_toy, q_toy, vocab_size=2, num_drafts=1, block_len=2, kind=kind).value for kind in KINDS
        },
        verifiers={n: a for n, (a, _, _) in toy_v.items()},
        lossless_error={n: e for n, (_, e, _) in toy_v.items()},
        own_bounds={n: list(o) for n, (_, _, o) in toy_v.items() if o is not None},
    )
    brackets, tree, why = _brackets(args, params, checkpoint)
    return {
        "random": random_cells,
        "sun_toy": toy,
        "brackets": brackets,
        "tree_verifiers": tree,
        "brackets_note": why,
        "skipped": skipped,
    }


def _bracket_rows(target, draft, v, params, source) -> list:
    from otbound.block.bounds import block_bound_bracket

    rows = []
    for m in params["top_m"]:
        for kind in KINDS:
            b = block_bound_bracket(
                target,
                draft,
                vocab_size=v,
                num_drafts=params["bracket_drafts"],
                block_len=params["bracket_len"],
                kind=kind,
                top_m=m,
            )
            rows.append(
                dict(
                    source=source,
                    kind=kind,
                    top_m=m,
                    num_drafts=b.num_drafts,
                    block_len=b.block_len,
                    lower=b.lower,
                    upper=b.upper,
                    truncated_target_mass=b.truncated_target_mass,
                    truncated_draft_mass=b.truncated_draft_mass,
                )
            )
    return rows


UNSEEN_MASS = 0.03  # draft mass a Monte Carlo mean may miss: (1 − 0.03)^200 = 2.3e-3 at 200 tuples


def unseen_margin(block_len: int) -> float:
    """How far a Monte Carlo mean of ``E[τ | drafts]`` may exceed the true ``E[τ]`` because of draft
    tuples never drawn, whatever its CI says: ``L · UNSEEN_MASS`` (a missed set of mass δ moves the
    mean by at most L·δ, and n tuples miss δ = 3% with probability 0.97^n)."""
    return block_len * UNSEEN_MASS


def _tree_verifier_rows(target, draft, params, source, rng) -> tuple[list, dict]:
    """Each block verifier's E[τ] where the draft tuples cannot be enumerated: the mean of its exact
    ``E[τ | drafts]`` (:meth:`~otbound.block.verifiers.BlockVerifier.conditional_acceptance`) over
    ``tree_tuples`` tuples drawn from the draft (K = ``bracket_drafts``, L = ``bracket_len``), with
    a 95% normal CI; the same K-i.i.d. tuples for every verifier but one with its own drafting
    scheme (``univer``: its own trees, drawn by ``draw_drafts``). Returns (rows, {skipped verifier: why})."""
    from otbound import InvalidInputError
    from otbound.block.models import sample_blocks
    from otbound.block.verifiers import BLOCK_VERIFIERS

    k, length, n = params["bracket_drafts"], params["bracket_len"], params["tree_tuples"]
    drafts = sample_blocks(draft, n * k, length, rng=rng).reshape(n, k, length)
    rows, skipped = [], {}
    for name, ver in BLOCK_VERIFIERS.items():
        try:
            own = drafts if ver.sampling == "with_replacement" else ver.draw_drafts(draft, n, k, length, rng)
            vals = ver.conditional_acceptance(target, draft, own)
        except InvalidInputError as exc:  # causal_optimal solves an LP over the complete draft trie
            skipped[name] = str(exc)
            continue
        rows.append(dict(source=source, verifier=name, num_drafts=k, block_len=length, tuples=n,
                         mean=float(vals.mean()), ci=float(1.96 * vals.std(ddof=1) / np.sqrt(n)),
                         sampling=ver.sampling))
    return rows, skipped


def _brackets(args, params, checkpoint) -> tuple[list, list, str | None]:
    """Brackets and Monte Carlo verifier values for the synthetic large-vocabulary models and, where
    possible, the real pair: (bracket rows, verifier rows, note on what was not computed)."""
    from otbound.block.models import mixture_model, zipf_model

    rows, tree = checkpoint.get("brackets-synthetic"), checkpoint.get("tree-verifiers-synthetic")
    if rows is None or tree is None:
        v = params["zipf_vocab"]
        target = zipf_model(v, exponent=2.0, seed=params["seed"], name="target")
        draft = mixture_model(target, zipf_model(v, exponent=2.0, seed=params["seed"] + 1), 0.3, name="draft")
        source = f"synthetic Zipf (exponent 2), V = {v}"
        if rows is None:
            rows = _bracket_rows(target, draft, v, params, source)
            checkpoint.put("brackets-synthetic", rows)
        if tree is None:
            tree = _tree_verifier_rows(target, draft, params, source, np.random.default_rng([params["seed"], 1]))[0]
            checkpoint.put("tree-verifiers-synthetic", tree)
    if not params["real_contexts"]:
        return rows, tree, "quick mode: no real-pair brackets"
    real, real_tree = checkpoint.get("brackets-real"), checkpoint.get("tree-verifiers-real")
    if real is None or real_tree is None:
        from otbound.lm import ModelUnavailableError, lm_block_models, load_pair

        try:
            records = _common.real_records(args, dict(params, temperatures=[params["bracket_temperature"]]))
            pair = load_pair(_common.REAL_PAIR, device=args.device, dtype=params["model_dtype"])
        except (_common.MissingResultsError, ModelUnavailableError) as exc:  # no traces or no pair here: say so
            return rows, tree, f"real-pair brackets not computed: {type(exc).__name__}: {exc}"
        import torch

        new_real, new_tree = [], []
        with torch.no_grad():
            for i, rec in enumerate(records[::2][: params["real_contexts"]]):  # every other trace: both datasets
                t = min(params["context_position"], rec.positions - 1)
                context = rec.tokens[: rec.prompt_length + t].tolist()
                target, draft = lm_block_models(pair, context, rec.temperature)
                source = f"real pair: {rec.prompt_id} @ {t}, T = {rec.temperature:g}"
                if real is None:
                    new_real += _bracket_rows(target, draft, pair.vocab_size, params, source)
                if real_tree is None:
                    new_tree += _tree_verifier_rows(
                        target, draft, params, source, np.random.default_rng([params["seed"], 2, i])
                    )[0]
        if real is None:
            real = new_real
            checkpoint.put("brackets-real", real)
        if real_tree is None:
            real_tree = new_tree
            checkpoint.put("tree-verifiers-real", real_tree)
    return rows + real, tree + real_tree, None


def _verifier_label(name, lossy=()) -> str:
    """A verifier's legend / column label: its own draft law when it is not K i.i.d. blocks."""
    from otbound.block.verifiers import BLOCK_VERIFIERS

    ver = BLOCK_VERIFIERS.get(name)
    label = name if ver is None or ver.sampling == "with_replacement" else f"{name} (own {ver.sampling}, m = K)"
    return f"{label} (NOT lossless)" if name in lossy else label


def draw(results, out, formats) -> list:
    from otbound.report import plots

    res = results["results"]
    cells = res["random"]
    ks = sorted({c["num_drafts"] for c in cells})
    ls = sorted({c["block_len"] for c in cells})
    l_fix = ls[len(ls) // 2] if len(ls) > 1 else ls[0]
    k_fix = 2 if 2 in ks else ks[-1]
    fig, axes = plots.figure(ncols=2, nrows=2, height=2.5)
    verifiers = list(dict.fromkeys(n for c in cells for n in c["verifiers"]))
    lossy = not_lossless(res)
    alpha = {"causal": 1, "joint": 0.7, "per_level": 0.45}
    for ax, (xname, fixed, xs) in zip(
        axes[0], (("num_drafts", ("block_len", l_fix), ks), ("block_len", ("num_drafts", k_fix), ls))
    ):
        sel = sorted((c for c in cells if c[fixed[0]] == fixed[1]), key=lambda c: c[xname])
        x = [c[xname] for c in sel]
        for kind, st in zip(KINDS, ("-o", "--s", ":^")):
            ax.plot(x, [c["bounds"][kind] for c in sel], st, color="k", alpha=alpha[kind], label=KIND_LABELS[kind])
        for j, name in enumerate(verifiers):
            pts = [(c[xname], c["verifiers"][name]) for c in sel if name in c["verifiers"]]
            if pts:
                style = "x:" if name in lossy else "x-"
                ax.plot(*zip(*pts), style, color=f"C{j}", lw=0.8, label=_verifier_label(name, lossy))
        ax.set_xticks(xs)
        ax.set_xlabel({"num_drafts": "number of draft blocks K", "block_len": "block length L"}[xname])
        short = {"block_len": "L", "num_drafts": "K"}[fixed[0]]
        ax.set_title(
            f"random models, {short} = {fixed[1]}, V = {results['params']['vocab_size']} ({cells[0]['models']} pairs)"
        )
    axes[0, 0].set_ylabel("E[τ] (accepted draft tokens / iteration)")
    axes[0, 0].legend(frameon=False, fontsize=5.5)
    sources = list(dict.fromkeys(b["source"] for b in res["brackets"]))
    groups = [
        ("synthetic", [s for s in sources if s.startswith("synthetic")]),
        ("real pair", [s for s in sources if s.startswith("real")]),
    ]
    for ax, (_label, srcs) in zip(axes[1], groups):
        if not srcs:
            ax.text(
                0.5,
                0.5,
                res.get("brackets_note") or "no brackets",
                ha="center",
                va="center",
                wrap=True,
                fontsize=6,
                transform=ax.transAxes,
            )
            ax.set_axis_off()
            continue
        rows = [b for b in res["brackets"] if b["source"] in srcs]
        ms = sorted({b["top_m"] for b in rows})
        for j, kind in enumerate(KINDS):
            lo = [np.mean([b["lower"] for b in rows if b["kind"] == kind and b["top_m"] == m]) for m in ms]
            hi = [np.mean([b["upper"] for b in rows if b["kind"] == kind and b["top_m"] == m]) for m in ms]
            x = np.arange(len(ms)) + (j - 1) * 0.22
            ax.vlines(x, lo, hi, color="k", lw=3, alpha=alpha[kind], label=KIND_LABELS[kind])
        tree = [r for r in res.get("tree_verifiers", []) if r["source"] in srcs]
        for name in dict.fromkeys(r["verifier"] for r in tree):  # Monte Carlo E[τ]: no m dependence
            mean = np.mean([r["mean"] for r in tree if r["verifier"] == name])
            color = f"C{verifiers.index(name)}" if name in verifiers else "0.5"
            ax.axhline(mean, color=color, lw=0.9, ls=":" if name in lossy else "--", label=_verifier_label(name, lossy))
        ax.set_xticks(np.arange(len(ms)), [str(m) for m in ms])
        ax.set_xlabel("tokens kept per node m (rest merged)")
        r0 = rows[0]
        what = srcs[0] if len(srcs) == 1 else f"real pair, mean of {len(srcs)} contexts"
        ax.set_title(
            f"brackets [lower, upper] and verifiers (MC), K = {r0['num_drafts']}, L = {r0['block_len']}:\n{what}",
            fontsize=6,
        )
    axes[1, 0].set_ylabel("E[τ]: bound bracket, verifiers")
    if axes[1, 0].has_data():
        axes[1, 0].legend(frameon=False, fontsize=5, ncol=2)
    return plots.save(fig, f"{out}/{NAME}", formats=formats)


def not_lossless(res) -> set:
    """Verifiers whose exact sequence-level error exceeds LOSSLESS_TOL in some cell (or the toy)."""
    cells = res["random"] + [res["sun_toy"]]
    return {n for c in cells for n, e in c.get("lossless_error", {}).items() if e > LOSSLESS_TOL}


def table(results) -> str:
    res = results["results"]
    cells = res["random"]
    verifiers = list(dict.fromkeys(n for c in cells for n in c["verifiers"]))
    lines = [
        "| K | L | " + " | ".join(KIND_LABELS[k] for k in KINDS) + " | "
        + " | ".join(map(_verifier_label, verifiers)) + " |",
        "|---|---|" + "---|" * (len(KINDS) + len(verifiers)),
    ]
    for c in cells:
        vals = [f"{c['bounds'][k]:.4f}" for k in KINDS] + [
            f"{c['verifiers'][n]:.4f}" if n in c["verifiers"] else "—" for n in verifiers
        ]
        lines.append(f"| {c['num_drafts']} | {c['block_len']} | " + " | ".join(vals) + " |")
    toy = res["sun_toy"]
    lines += [
        "",
        "Sun et al. toy (×9): "
        + ", ".join(f"{k} {9 * v:.4f}" for k, v in {**toy["bounds"], **toy["verifiers"]}.items()),
    ]
    own = sorted({n for c in cells + [toy] for n in c.get("own_bounds", {})})
    for n in own:
        lines += [
            "",
            f"`{n}` runs on its own draft law (m = K branches per node, K^L paths), not on K i.i.d. blocks: the "
            "bound columns above are not bounds on it. U_causal / U_joint of its own law (exact LPs over its trees):",
            "",
            "| K | L | E[τ] | own U_causal | own U_joint | own U_causal − E[τ] |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {c['num_drafts']} | {c['block_len']} | {c['verifiers'][n]:.4f} | {c['own_bounds'][n][0]:.4f} "
            f"| {c['own_bounds'][n][1]:.4f} | {c['own_bounds'][n][0] - c['verifiers'][n]:.2e} |"
            for c in cells
            if n in c.get("own_bounds", {})
        ]
    lines += [f"Not run: `{n}` — {why}" for n, why in res["skipped"].items()]
    for n in sorted(not_lossless(res)):
        worst = max(c.get("lossless_error", {}).get(n, 0.0) for c in cells + [toy])
        lines.append(
            f"**`{n}` is not lossless**: exact sequence-level error up to {worst:.3g} (its E[τ] may exceed U_causal)."
        )
    if res["brackets"]:
        lines += ["", "| source | kind | m | lower | upper | P(target leaves kept tree) |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {b['source']} | {b['kind']} | {b['top_m']} | {b['lower']:.4f} | {b['upper']:.4f} "
            f"| {b['truncated_target_mass']:.3f} |"
            for b in res["brackets"]
        ]
    if res.get("tree_verifiers"):
        n_tuples = max(r["tuples"] for r in res["tree_verifiers"])
        tree_len = max(r["block_len"] for r in res["tree_verifiers"])
        lines += [
            "",
            "Verifiers on the same trees (Monte Carlo: mean of the exact E[τ | drafts] over drawn draft tuples, "
            "± 95% CI; the brackets above are for K i.i.d. blocks, not for another draft law).",
            "",
            f"The CI does not see draft tuples that were never drawn: n tuples miss a set of draft mass δ with "
            f"probability (1 − δ)^n and the mean then errs by up to L·δ. For n = {n_tuples}, δ = "
            f"{UNSEEN_MASS:.0%} is missed with probability {(1 - UNSEEN_MASS) ** n_tuples:.1e}, so a mean above "
            f"an upper bracket is evidence of loss only when it exceeds the bracket by more than "
            f"{unseen_margin(tree_len):.2f} (L = {tree_len}); smaller excesses, even with a zero-width CI (every "
            "drawn tuple gave the same value), are not.",
            "",
            "| source | K | L | verifier | draft law | E[τ] | tuples |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['source']} | {r['num_drafts']} | {r['block_len']} | {r['verifier']} "
            f"| {r.get('sampling', 'with_replacement')} | {r['mean']:.4f} ± {r['ci']:.4f} | {r['tuples']} |"
            for r in res["tree_verifiers"]
        ]
    if res.get("brackets_note"):
        lines += ["", res["brackets_note"]]
    return "\n".join(lines)


def main(argv=None) -> list:
    args = _common.parser(__doc__.splitlines()[0]).parse_args(argv)
    if args.quick:
        params = dict(vocab_size=2, num_drafts=[1, 2], block_lens=[1, 2], models=1, max_verifier_tuples=256, seed=0,
                      zipf_vocab=200, top_m=[1, 2, 4], bracket_drafts=2, bracket_len=2, tree_tuples=40, real_contexts=0)
    else:
        params = dict(
            _common.REAL_TRACES,
            vocab_size=4,
            num_drafts=[1, 2, 3, 4],
            block_lens=[1, 2, 3],
            models=4,
            max_verifier_tuples=4**6,
            zipf_vocab=1000,
            top_m=[1, 2, 4, 8],
            bracket_drafts=2,
            bracket_len=2,
            tree_tuples=200,
            real_contexts=4,
            context_position=8,
            bracket_temperature=1.0,
        )
    results = _common.load_or_compute(args, NAME, params, compute_for(args))
    return _common.finish(NAME, results, args, draw, table)


if __name__ == "__main__":
    main(sys.argv[1:])
