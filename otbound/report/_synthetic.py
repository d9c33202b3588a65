"""The synthetic section of the report: random target/draft laws, α* per draft law and each verifier's
acceptance on them (docs/theory/ (notation.md, token-bounds.md, token-verifiers.md)), and the token-level figure."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from otbound._validation import InvalidInputError
from otbound.report import plots
from otbound.report._distributed import Shard, make_executor, run_shards
from otbound.report._measure import cluster_mean_ci
from otbound.token import settings_at
from otbound.token.bounds import optimal_acceptance
from otbound.token.draft_laws import SAMPLINGS, inverse_cdf
from otbound.token.logits import laws_from_logits

SYNTHETIC_FAMILIES = ("dirichlet", "zipf")


def synthetic_pair(family: str, vocab_size: int, temperature: float, rng, *, target=None,
                   draft=None) -> tuple[np.ndarray, np.ndarray]:
    """A target/draft pair (p, q) from logits, temperature applied to both (docs/theory/notation.md) by
    :func:`otbound.token.laws_from_logits`; with ``target`` / ``draft`` settings (the fields of
    :func:`otbound.token._settings.settings_at`: the target's top-k / top-p / min-p / repetition
    penalty, the draft's own values) each model's law is that of its :class:`otbound.SamplingParams`.
    A repetition penalty reads a context of 16 tokens drawn from the target's untruncated law at
    ``temperature`` (drawn only when a penalty is set, so other settings see the same logits).

    dirichlet: logits = log of independent Dirichlet(0.5) draws.
    zipf: target logits −1.1·log(rank) over a random permutation; the draft's are the target's plus
    N(0, 1) noise (a draft model that mostly agrees with the target).

    Parameters
    ----------
    family : {"dirichlet", "zipf"}
        The family (:data:`SYNTHETIC_FAMILIES`).
    vocab_size : int
        V.
    temperature : float
        T of both laws.
    rng : numpy.random.Generator
        The random numbers (logits, then the context of a repetition penalty).
    target, draft : dict, optional
        Sampling settings besides T (fields of :class:`otbound.SamplingParams`).

    Returns
    -------
    p, q : numpy.ndarray
        Target and draft laws, float64 of shape (V,).

    Raises
    ------
    ValueError
        An unknown family.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.report import synthetic_pair
    >>> p, q = synthetic_pair("zipf", 4, 1.0, np.random.default_rng(0))
    >>> p.round(4), q.round(4)
    (array([0.1506, 0.5043, 0.2353, 0.1098]), array([0.2504, 0.4908, 0.1207, 0.1381]))
    >>> p, q = synthetic_pair("dirichlet", 4, 0.5, np.random.default_rng(0), target={"top_k": 2})
    >>> int(np.count_nonzero(p)), round(float(p.sum()), 12)
    (2, 1.0)
    """
    if family == "dirichlet":
        lp = np.log(rng.dirichlet(np.full(vocab_size, 0.5)) + 1e-300)
        lq = np.log(rng.dirichlet(np.full(vocab_size, 0.5)) + 1e-300)
    elif family == "zipf":
        lp = -1.1 * np.log(1.0 + rng.permutation(vocab_size))
        lq = lp + rng.standard_normal(vocab_size)
    else:
        raise ValueError(f"unknown synthetic family {family!r}; expected one of {SYNTHETIC_FAMILIES}")

    # logits shifted to a maximum of 0 (the same laws; and, to the bit, those of the stored results)
    lp, lq = lp - lp.max(), lq - lq.max()
    if target is None and draft is None:
        return laws_from_logits(lp, temperature), laws_from_logits(lq, temperature)
    sp, sq = settings_at(temperature, target, draft)
    context = None
    if sp.needs_context or sq.needs_context:
        context = inverse_cdf(laws_from_logits(lp, temperature), rng.random(16))
    return laws_from_logits(lp, sp, context), laws_from_logits(lq, sq, context)


def synthetic_rows(families, vocab_size, temperatures, num_drafts_list, instances, mc_samples, seed,
                   *, engine="local", address=None, out=None, progress=True,
                   target_settings=None, draft_settings=None):
    """Table rows on random laws, one shard per (family, T) cell (:func:`synthetic_cell`, its seed
    derived from ``seed`` and the cell), run by ``engine`` (see :func:`otbound.report.run_real_report`)
    and checkpointed under ``<out>/shards`` when ``out`` is given; returns ``(rows, skipped)``.
    ``target_settings`` / ``draft_settings``: the sampling settings besides T (see
    :func:`synthetic_pair`); the checkpoints are keyed by them.

    Parameters
    ----------
    families : sequence of str
        Names of :data:`SYNTHETIC_FAMILIES`.
    vocab_size : int
        V of every instance.
    temperatures : sequence of float
        The temperatures T.
    num_drafts_list : sequence of int
        The numbers of drafts K.
    instances : int
        Random pairs per (family, T) cell.
    mc_samples : int
        Draft tuples per instance for a verifier without an exact acceptance.
    seed : int
        Run seed (each cell's seed derives from it and the cell).
    engine : str or executor
        ``"local"``, ``"ray"`` or an executor (:func:`otbound.report.make_executor`).
    address : str, optional
        Ray cluster address (``engine="ray"`` only).
    out : str or pathlib.Path, optional
        Folder of the shard checkpoints (none when None).
    progress : bool
        Show a progress bar.
    target_settings, draft_settings : dict, optional
        Sampling settings besides T (see :func:`synthetic_pair`).

    Returns
    -------
    rows : list of dict
        Per (family, T, K, draft law, verifier): ``dataset``, ``temperature``, ``num_drafts``,
        ``sampling``, ``verifier`` (``"optimal"`` for α*), ``lossless``, ``acceptance``,
        ``acceptance_ci``, ``optimal``, ``efficiency``, ``gap`` and ``gap_ci`` (the paired gap
        acceptance − α* over the same instances), ``positions`` (instances), ``method``. Every
        ``*_ci`` is the half width of the 95% interval of :func:`otbound.report.cluster_mean_ci`
        with each (independent) instance its own cluster: ``t_{0.975, N−1} · s / √N`` over the
        ``N`` instances (NaN for a single instance), the real report's formula where its clusters
        are single positions.
    skipped : list of str
        The verifiers, K and instances not measured, with the reason.

    Raises
    ------
    InvalidInputError
        An unknown engine, or an address without ``engine="ray"``.
    ValueError
        An unknown family.

    Examples
    --------
    >>> from otbound.report import synthetic_rows
    >>> rows, skipped = synthetic_rows(["zipf"], 4, [1.0], [2], 3, 16, 0, progress=False)
    >>> for r in rows[:6]:
    ...     print(r["verifier"], r["sampling"], round(r["acceptance"], 4), r["method"])
    optimal with_replacement 0.7964 exact
    optimal without_replacement 0.897 exact
    optimal greedy 0.8797 exact
    optimal deterministic 0.6217 exact
    nss with_replacement 0.4793 exact
    rrs with_replacement 0.7481 exact
    >>> skipped
    []
    """
    extra = {}
    tag = ""
    if target_settings or draft_settings:
        extra = dict(target_settings=dict(target_settings or {}), draft_settings=dict(draft_settings or {}))
        tag = "-" + format(zlib.crc32(repr(sorted(extra.items())).encode()), "08x")
    shards = [Shard(f"synthetic-{family}-T{float(t):g}{tag}", synthetic_cell, dict(
        family=family, vocab_size=vocab_size, temperature=float(t), num_drafts_list=[int(k) for k in num_drafts_list],
        instances=instances, mc_samples=mc_samples, seed=seed, **extra),
        size=instances) for family in families for t in temperatures]
    cells = run_shards(shards, out, make_executor(engine, address=address), progress=progress, desc="synthetic laws",
                       unit="instances")
    return [r for c in cells for r in c["rows"]], sorted({s for c in cells for s in c["skipped"]})


def synthetic_cell(family, vocab_size, temperature, num_drafts_list, instances, mc_samples, seed,
                   target_settings=None, draft_settings=None) -> dict:
    """``{"rows", "skipped"}`` of one (family, T) cell, every verifier of :data:`otbound.VERIFIERS`.
    Random numbers from ``default_rng([seed, crc32("family|T")])``.

    A draft law that needs K distinct tokens (without replacement, greedy, deterministic) on an
    instance whose truncated draft law keeps fewer than K is not measured there (nor its
    verifiers): the instance is listed under ``skipped`` with the reason, never given a value."""
    from otbound.token.verifiers import VERIFIERS as verifiers
    rng = np.random.default_rng([int(seed), zlib.crc32(f"{family}|{float(temperature)!r}".encode())])
    rows, skipped, unmeasured = [], set(), {}
    pairs = [synthetic_pair(family, vocab_size, temperature, rng, target=target_settings, draft=draft_settings)
             for _ in range(instances)]
    for k in num_drafts_list:
        per = {}
        for p, q in pairs:
            bound = {}
            for law in SAMPLINGS:
                try:
                    bound[law] = optimal_acceptance(p, q, k, law)
                except InvalidInputError as err:  # too few surviving draft tokens, or denormals it cannot resolve
                    unmeasured.setdefault((law, k), []).append(str(err))
            for law, a in bound.items():
                per.setdefault((law, "optimal"), []).append((a, a, "exact"))
            for name, ver in verifiers.items():
                if ver.sampling not in bound:
                    continue
                try:
                    acc, method = ver.acceptance_or_estimate(p, q, k, mc_samples, rng)
                except InvalidInputError as err:  # too many drafts for the verifier, or its exact object too large
                    skipped.add(f"{name} at K={k}: {err}")
                    continue
                per.setdefault((ver.sampling, name), []).append((acc, bound[ver.sampling], method))
        for (law, name), vals in per.items():
            # one row per verifier: Monte Carlo when any of its instances is estimated
            method = "monte_carlo" if any(m == "monte_carlo" for *_, m in vals) else "exact"
            vals = [(a, o) for a, o, _ in vals]
            # the instances are independent: each its own cluster (the Student t interval, N − 1 dof)
            alone = np.arange(len(vals))
            acc, ci = cluster_mean_ci([a for a, _ in vals], alone)
            opt = float(np.mean([o for _, o in vals]))
            gap, gap_ci = cluster_mean_ci([a - o for a, o in vals], alone)  # paired: the same instances
            rows.append(
                dict(
                    dataset=f"{family} (V={vocab_size})",
                    temperature=temperature,
                    num_drafts=k,
                    sampling=law,
                    verifier=name,
                    **({} if name == "optimal" else {"lossless": bool(verifiers[name].lossless)}),
                    acceptance=acc,
                    acceptance_ci=ci,
                    optimal=opt,
                    efficiency=acc / opt if opt > 0 else None,
                    **({} if opt > 0 else {"efficiency_undefined": "α* = 0 in this cell: acceptance / α* is 0/0"}),
                    gap=gap,
                    gap_ci=gap_ci,
                    positions=len(vals),
                    method=method,
                )
            )
    for (law, k), errors in unmeasured.items():
        skipped.add(f"{law} at K={k}, T={temperature}: {len(errors)} of {instances} {family} instances not measured "
                    f"(e.g. {errors[0]})")
    return {"rows": rows, "skipped": sorted(skipped)}


def token_figure(rows, out: Path) -> Path:
    """One message: which draft law's optimum α* is highest, and how it grows with K. One panel per
    dataset (shared y axis), α* of each draft law against K with its 95% band, at the middle temperature;
    each law in its colour (:func:`otbound.report.plots.color`) and named at the end of its line. The
    verifiers' gaps to these bounds are the report's summary and tables (and ``paired_gaps.png``).

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`synthetic_rows` (or :func:`otbound.report.aggregate`).
    out : pathlib.Path
        Folder the figure is written to, as ``token_bounds.png``.

    Returns
    -------
    pathlib.Path
        ``out / "token_bounds.png"``, written.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from otbound.report import synthetic_rows, token_figure
    >>> rows, _ = synthetic_rows(["zipf"], 4, [1.0], [1, 2], 2, 16, 0, progress=False)
    >>> with tempfile.TemporaryDirectory() as out:
    ...     path = token_figure(rows, Path(out))
    ...     print(isinstance(path, Path), path.name, path.exists())
    True token_bounds.png True
    """
    opt = [r for r in rows if r["verifier"] == "optimal" and r.get("acceptance") is not None]
    temps = sorted({r["temperature"] for r in opt})
    t_mid = temps[len(temps) // 2]
    datasets = list(dict.fromkeys(r["dataset"] for r in opt))
    ks = sorted({r["num_drafts"] for r in opt})
    fig, axes = plots.figure(ncols=len(datasets), height=2.6, sharey=True)
    for ax, d in zip(axes[0], datasets):
        ends = []
        for law in [s for s in SAMPLINGS if any(r["sampling"] == s for r in opt)]:
            pts = sorted((r["num_drafts"], r["acceptance"], r.get("acceptance_ci") or 0.0) for r in opt
                         if r["sampling"] == law and r["dataset"] == d and r["temperature"] == t_mid)
            if not pts:
                continue
            x, y, h = (np.array(v, dtype=float) for v in zip(*pts))
            ax.plot(x, y, plots.LAW_STYLES.get(law, "-o"), color=plots.color(law))
            ax.fill_between(x, y - h, y + h, color=plots.color(law), alpha=0.15, linewidth=0)
            ends.append((law.replace("_", " "), y[-1], plots.color(law)))
        plots.integer_ticks(ax, ks)
        ax.set_xlabel("number of drafts K")
        ax.set_title(f"{d}, T = {t_mid:g}")
        ax.set_ylim(0.0, 1.02)
        plots.label_ends(ax, ends)
    axes[0, 0].set_ylabel("optimal acceptance α* (95% band)")
    return plots.save(fig, out / "token_bounds")[0]
