"""The synthetic block-level section of the report: bound hierarchy vs every block verifier.

:func:`block_section` fixes one random autoregressive pair (target ``Dirichlet(α)`` at every
prefix; draft = ``(1 − w)·target + w·independent Dirichlet``) and, for every ``K`` and ``L``,
computes ``U_per-level ≥ U_joint ≥ U_causal`` (exact, :func:`otbound.block_bound`) and every
verifier's ``E[τ]`` — exact by enumeration when ``(V^L)^K ≤ max_exact_tuples``, otherwise a Monte
Carlo mean over ``mc_samples`` drawn draft tuples of the exact ``E[τ | drafts]``
(``conditional_acceptance``: Rao-Blackwellised over the verifier's own coins; method and standard
error in the row). ``E[τ]`` counts
accepted draft tokens. Every row also carries the engine metrics (:mod:`otbound.report._metrics`,
docs/guide/metrics.md): ``mean_acceptance_length = E[τ] + 1`` and ``acceptance_rate = E[τ] /
drafted_tokens`` (``K·L`` for K blocks of L; ``m + m² + ... + m^L`` tree nodes for ``univer``);
the bound rows with per-level optima (``causal``, ``per_level``) also ``per_position_acceptance``
(``P(τ ≥ ℓ)`` under the optimum) and ``acceptance_length_histogram``; None where only the mean is
known.

The three bounds are of K i.i.d. draft blocks. A verifier with its own drafting scheme (``univer``:
``num_drafts`` = the branching m of its tree, ``m^L`` paths) is run on its own draft law
(``draw_drafts`` / ``draft_tuple_law``) and its row carries ``sampling`` and ``causal_bound`` /
``joint_bound``, the bounds of *its own* law (:meth:`~otbound.block.verifiers.BlockVerifier.own_law_bounds`;
exact cells only, None under Monte Carlo); for the i.i.d. verifiers these are the cell's bounds. A
verifier whose draft law cannot be built on the pair (UniVer needs ``m`` drafted tokens of positive
probability per node) gets a row with ``method = "skipped"``, ``expected_accepted`` None and the
reason in ``note``.
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError
from otbound.block.bounds import KINDS, block_bound
from otbound.block.models import dirichlet_model, mixture_model, sample_blocks
from otbound.block.verifiers import BLOCK_VERIFIERS
from otbound.report import plots
from otbound.report._distributed import Shard, make_executor, run_shards
from otbound.report._metrics import metrics_from_levels

_STYLE = {"per_level": ("k", ":"), "joint": ("k", "--"), "causal": ("k", "-")}


def block_section(
    num_drafts_list,
    block_lens,
    vocab_size: int,
    seed: int,
    *,
    concentration: float = 1.0,
    draft_weight: float = 0.5,
    verifiers=None,
    max_exact_tuples: int = 5000,
    mc_samples: int = 20_000,
    progress: bool = True,
    engine="local",
    address=None,
    out=None,
):
    """Rows ``{kind: "bound"|"verifier", name, num_drafts, block_len, expected_accepted, method,
    stderr}`` (verifier rows also ``lossless``, the declared flag, ``sampling`` and the bounds of that
    law) and a matplotlib figure (one panel per block length, ``E[τ]`` against ``K``). One
    shard per (L, K) cell (:func:`block_cell`), run by ``engine`` and checkpointed under
    ``<out>/shards`` when ``out`` is given (see :mod:`otbound.report._distributed`).

    Parameters
    ----------
    num_drafts_list : sequence of int
        The numbers of drafts K.
    block_lens : sequence of int
        The block lengths L (one figure panel each).
    vocab_size : int
        V of the random autoregressive pair.
    seed : int
        Fixes the pair (target from ``seed``, the draft's mixed-in part from ``seed + 1``) and the
        Monte Carlo draws of every cell.
    concentration : float
        Dirichlet concentration α of the laws at every prefix.
    draft_weight : float
        ``w`` of the draft ``(1 − w)·target + w·independent``.
    verifiers : sequence of str, optional
        Names of :data:`otbound.BLOCK_VERIFIERS` (default: all of them).
    max_exact_tuples : int
        Largest ``(V^L)^K`` measured exactly by enumeration; larger cells use Monte Carlo.
    mc_samples : int
        Draft tuples of a Monte Carlo cell.
    progress : bool
        Show a progress bar.
    engine : str or executor
        ``"local"``, ``"ray"`` or an executor (:func:`otbound.report.make_executor`).
    address : str, optional
        Ray cluster address (``engine="ray"`` only).
    out : str or pathlib.Path, optional
        Folder of the shard checkpoints (none when None).

    Returns
    -------
    rows : list of dict
        The bound rows then the verifier rows of every (L, K) cell, with the engine metrics.
    figure : matplotlib.figure.Figure
        ``E[τ]`` against K, one panel per L.

    Raises
    ------
    InvalidInputError
        An unknown engine, or an address without ``engine="ray"``.
    KeyError
        A verifier name outside :data:`otbound.BLOCK_VERIFIERS`.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otbound.report import block_section
    >>> rows, fig = block_section([2], [2], 2, 0, verifiers=["token", "block"], progress=False)
    >>> for r in rows:
    ...     print(r["kind"], r["name"], r["method"], round(r["expected_accepted"], 4))
    bound per_level exact 1.9797
    bound joint exact 1.9797
    bound causal exact 1.9797
    verifier token exact 1.6968
    verifier block exact 1.7196
    >>> type(fig).__name__
    'Figure'
    """
    names = list(BLOCK_VERIFIERS) if verifiers is None else list(verifiers)
    common = dict(vocab_size=int(vocab_size), seed=int(seed), concentration=concentration, draft_weight=draft_weight,
                  verifiers=names, max_exact_tuples=max_exact_tuples, mc_samples=mc_samples)
    shards = [Shard(f"block-L{length}-K{k}", block_cell, dict(common, block_len=int(length), num_drafts=int(k)))
              for length in block_lens for k in num_drafts_list]
    cells = run_shards(shards, out, make_executor(engine, address=address), progress=progress, desc="block section",
                       unit="cells")
    rows = [r for c in cells for r in c]
    return rows, _figure(rows, block_lens, names, vocab_size)


def block_cell(block_len, num_drafts, vocab_size, seed, concentration, draft_weight, verifiers, max_exact_tuples,
               mc_samples) -> list[dict]:
    """Rows of one (L, K) cell: the three bounds and every verifier's ``E[τ]`` on the pair fixed by
    ``seed``; Monte Carlo draft tuples from ``default_rng([seed, L, K])``."""
    length, k = block_len, num_drafts
    target = dirichlet_model(vocab_size, concentration=concentration, seed=seed, name="target")
    draft = mixture_model(
        target, dirichlet_model(vocab_size, concentration=concentration, seed=seed + 1), draft_weight, name="draft"
    )
    rng = np.random.default_rng([seed, length, k])
    rows = []
    common = {"num_drafts": int(k), "block_len": int(length)}
    iid = {}
    for kind in KINDS:
        res = block_bound(target, draft, vocab_size=vocab_size, num_drafts=k, block_len=length, kind=kind)
        iid[kind] = res.value
        rows.append(_with_engine_metrics(
            {"kind": "bound", "name": kind, **common, "expected_accepted": iid[kind], "method": "exact", "stderr": 0.0},
            k * length, res.levels))
    exact = (vocab_size**length) ** k <= max_exact_tuples  # the i.i.d. tuples; every verifier is run alike
    drafts = None if exact else sample_blocks(draft, mc_samples * k, length, rng).reshape(mc_samples, k, length)
    kw = dict(vocab_size=vocab_size, num_drafts=k, block_len=length)
    for name in verifiers:
        ver = BLOCK_VERIFIERS[name]
        row = {"kind": "verifier", "name": name, **common, "sampling": ver.sampling, "lossless": bool(ver.lossless),
               "causal_bound": iid["causal"], "joint_bound": iid["joint"]}
        try:
            if exact:
                row.update(expected_accepted=ver.acceptance(target, draft, **kw), method="exact", stderr=0.0)
            else:
                iid_law = ver.sampling == "with_replacement"
                tau = ver.conditional_acceptance(
                    target, draft, drafts if iid_law else ver.draw_drafts(draft, mc_samples, k, length, rng)
                )
                row.update(expected_accepted=float(tau.mean()), method="monte_carlo",
                           stderr=float(tau.std(ddof=1) / np.sqrt(tau.size)))
            if ver.sampling != "with_replacement":
                row.update(causal_bound=None, joint_bound=None)
                if exact:
                    own = ver.own_law_bounds(target, draft, **kw)
                    row.update(causal_bound=own.causal, joint_bound=own.joint)
        except InvalidInputError as exc:  # its draft law cannot be built on this pair (e.g. UniVer, K > support)
            row.update(expected_accepted=None, method="skipped", stderr=None, causal_bound=None, joint_bound=None,
                       note=str(exc))
        nodes = k * length if ver.sampling == "with_replacement" else sum(k**d for d in range(1, length + 1))
        rows.append(_with_engine_metrics(row, nodes, None))
    return rows


def _with_engine_metrics(row: dict, drafted_tokens: int, levels) -> dict:
    """``row`` with the engine metrics of its ``expected_accepted`` (module docstring)."""
    tau = row["expected_accepted"]
    row.update(mean_acceptance_length=None, acceptance_rate=None, per_position_acceptance=None,
               acceptance_length_histogram=None, drafted_tokens=int(drafted_tokens))
    if tau is None:
        return row
    if levels is not None:
        row.update(metrics_from_levels(levels, drafted_tokens))
    else:
        row.update(mean_acceptance_length=1.0 + tau, acceptance_rate=tau / drafted_tokens)
    return row


def _figure(rows, block_lens, names, vocab_size):
    fig, axes = plots.figure(ncols=len(block_lens), height=3.0)
    for ax, length in zip(axes[0], block_lens):
        sel = [r for r in rows if r["block_len"] == length]
        for name in list(KINDS) + names:
            pts = sorted((r["num_drafts"], r["expected_accepted"], r["stderr"]) for r in sel
                         if r["name"] == name and r["method"] != "skipped")
            if not pts:
                continue
            ks, vals, errs = map(np.asarray, zip(*pts))
            if name in KINDS:
                color, ls = _STYLE[name]
                ax.plot(ks, vals, color=color, linestyle=ls, label=f"U_{name} (K i.i.d.)")
            else:
                law = next(r["sampling"] for r in sel if r["name"] == name)
                label = name if law == "with_replacement" else f"{name} (own {law}, m = K)"
                ax.errorbar(ks, vals, yerr=2 * errs, marker="o", label=label, capsize=2, color=plots.color(name))
        ax.set_title(f"L = {length}, V = {vocab_size}")
        ax.set_xlabel("number of drafts K")
        ax.set_ylabel("E[τ] (accepted, bonus excluded)")
        ax.set_xticks(sorted({r["num_drafts"] for r in sel}))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=5)
    return fig


def block_markdown(block_rows) -> str:
    """The block-level section of ``report.md``: one table row per row of :func:`block_section`
    (``E[τ]``, the declared lossless flag, the engine metrics, the draft law and the bounds of that
    law; ``—`` where a value is unknown, the reason where a verifier was skipped).

    Parameters
    ----------
    block_rows : list of dict
        Rows of :func:`block_section`.

    Returns
    -------
    str
        Markdown: a heading, the legend and the table, ending with a newline.

    Raises
    ------
    KeyError
        A row lacking a field of :func:`block_section`'s rows.

    Examples
    --------
    >>> from otbound.report import block_markdown
    >>> row = {"kind": "bound", "name": "causal", "num_drafts": 2, "block_len": 1, "expected_accepted": 0.75,
    ...        "method": "exact", "mean_acceptance_length": 1.75, "acceptance_rate": 0.375,
    ...        "per_position_acceptance": [0.75]}
    >>> print(block_markdown([row]).splitlines()[-1])
    | causal | bound | 2 | 1 | 0.7500 |  | 1.7500 | 0.3750 | 0.750 | K i.i.d. blocks | |
    """
    def f(x):
        return "—" if x is None else f"{x:.4f}"

    lines = [
        "## Block level: E[τ] (accepted draft tokens per iteration, bonus excluded)",
        "",
        "Bounds rows: K i.i.d. draft blocks. Verifier rows: E[τ] on the verifier's own draft law with U_causal / "
        "U_joint of that law (`univer`: its own tree, m = K branches per node, m^L paths; — under Monte Carlo).",
        "",
        "Lossless: the verifier's declared flag; a lossy verifier's E[τ] may exceed U_causal (it is no bound on it).",
        "",
        "Engine metrics (docs/guide/metrics.md): mean acceptance length = E[τ] + 1 per target call; acceptance rate "
        "= E[τ] / drafted tokens (K·L; univer: its tree's nodes); per-position acceptance P(τ ≥ ℓ) where known "
        "(the per-level optima of the bounds).",
        "",
        "| name | kind | K | L | E[τ] | lossless | mean acceptance length | acceptance rate | per-position acceptance "
        "| draft law | U_causal / U_joint of that law |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in block_rows:
        if r["kind"] == "bound":
            lossless, tail = "", "K i.i.d. blocks | |"
        else:
            lossless = "yes" if r["lossless"] else "**no**"
            tail = f"{r['sampling']} | {f(r['causal_bound'])} / {f(r['joint_bound'])} |"
        value = f"skipped: {r['note']}" if r["method"] == "skipped" else f(r["expected_accepted"])
        pos = r.get("per_position_acceptance")
        pos = "—" if pos is None else ", ".join(f"{x:.3f}" for x in pos)
        lines.append(f"| {r['name']} | {r['kind']} | {r['num_drafts']} | {r['block_len']} | {value} | {lossless} | "
                     f"{f(r.get('mean_acceptance_length'))} | {f(r.get('acceptance_rate'))} | {pos} | {tail}")
    return "\n".join(lines) + "\n"
