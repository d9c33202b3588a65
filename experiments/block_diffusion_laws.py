"""Block-diffusion drafters: the bounds of their block draft laws, the best verifier, and what a
training objective can gain at most per law.

    python experiments/block_diffusion_laws.py [--contexts 6] [--block-len 3]

A block-diffusion drafter emits per-position marginals in one pass; the drafted block's law is one of
:data:`otbound.block.BLOCK_DRAFT_LAWS` — the product of the marginals (independent sampling), the
argmax chain, or a top-k Markov path selector (k = 2, neighbour transitions). Two drafters per target:

* **perfect** — the target's own marginals and transitions (:func:`otbound.block.block_marginals`):
  what per-position cross-entropy converges to with unlimited capacity;
* **noisy** — the marginals of a draft model mixing the target half and half with an independent one.

Per law (:func:`otbound.block.block_draft_law_bounds`): U_causal, U_joint, block verification's
exact E[τ] (the best verifier, = U_causal) and token-by-token speculative sampling's. Then
:func:`otbound.objectives.block_law_gains`: E[τ] at the cross-entropy optimum against each family's
ceiling (exact for the argmax chain, local search otherwise), the most any objective can add.

Targets: Dirichlet models (V = 4, concentration 0.5, ``--contexts`` seeds) and the tiny random Qwen2
pair (:func:`otbound.lm.tiny_pair`, V = 6) at as many random contexts; L = ``--block-len``. Values are
E[τ] (accepted draft tokens, bonus excluded; at most L), means over targets. Writes
``figures/block_diffusion_laws.png`` and ``.md``, results in ``data/results/block_diffusion_laws.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LAW_NAMES = ("marginal_product", "argmax_chain", "topk_markov")


def targets(kind: str, contexts: int):
    """``[(target, noisy draft model)]`` for ``kind`` in {"dirichlet", "tiny"}."""
    from otbound.block import dirichlet_model, mixture_model

    if kind == "dirichlet":
        out = []
        for s in range(contexts):
            tg = dirichlet_model(4, concentration=0.5, seed=2 * s, name="target")
            out.append((tg, mixture_model(tg, dirichlet_model(4, concentration=0.5, seed=2 * s + 1), 0.5)))
        return out
    from otbound.lm import lm_block_models, tiny_pair, tiny_prompts

    pair = tiny_pair(vocab_size=6)
    return [lm_block_models(pair, ctx, 1.0) for ctx in tiny_prompts(pair, contexts, length=4, seed=2)]


def measure(kind: str, contexts: int, length: int, steps: int) -> dict:
    from otbound.block import BLOCK_DRAFT_LAWS, TopKMarkov, block_draft_law_bounds, block_marginals
    from otbound.objectives import block_law_gains

    laws = [BLOCK_DRAFT_LAWS["marginal_product"], BLOCK_DRAFT_LAWS["argmax_chain"], TopKMarkov(2)]
    cells = {f"{who}/{law.name}": [] for who in ("perfect", "noisy") for law in laws}
    gains = []
    for i, (target, noisy) in enumerate(targets(kind, contexts)):
        for who, source in (("perfect", target), ("noisy", noisy)):
            m, t = block_marginals(source, length)
            for law in laws:
                b = block_draft_law_bounds(target, law, m, t)
                cells[f"{who}/{law.name}"].append([b.causal, b.joint, b.verifier_acceptance, b.token_acceptance])
        g = block_law_gains(target, length, steps=steps, restarts=2, seed=i)
        gains.append([g.ce.tolist(), g.ceiling.tolist()])
        print(f"block_diffusion_laws: {kind} {i + 1}/{contexts}", file=sys.stderr)
    mean = {k: dict(zip(("causal", "joint", "block", "token"), np.mean(v, axis=0).tolist())) for k, v in cells.items()}
    g = np.array(gains)  # (n, 2, 3)
    return {"bounds": mean, "ce": g[:, 0].mean(0).tolist(), "ceiling": g[:, 1].mean(0).tolist(),
            "gain_max": (g[:, 1] - g[:, 0]).max(0).tolist()}


def table(name: str, rows: dict, length: int) -> str:
    lines = [f"### {name} (L = {length})", "",
             "| drafter | law | U_causal = block verifier | U_joint | token verifier |", "|---|---|---|---|---|"]
    for key, v in rows["bounds"].items():
        who, law = key.split("/")
        lines.append(f"| {who} | {law} | {v['causal']:.4f} (block {v['block']:.4f}) | {v['joint']:.4f} | "
                     f"{v['token']:.4f} |")
    lines += ["", "| law | E[τ] at the CE optimum | family ceiling | mean gain | largest gain |",
              "|---|---|---|---|---|"]
    for i, law in enumerate(LAW_NAMES):
        lines.append(f"| {law} | {rows['ce'][i]:.4f} | {rows['ceiling'][i]:.4f} | "
                     f"{rows['ceiling'][i] - rows['ce'][i]:.4f} | {rows['gain_max'][i]:.4f} |")
    return "\n".join(lines + [""])


def draw(panels: dict, length: int, path: Path) -> None:
    from otbound.report import plots

    fig, axes = plots.figure(ncols=2, height=2.6)
    ax0, ax1 = axes.ravel()
    x = np.arange(len(LAW_NAMES))
    width = 0.2
    for j, (name, rows) in enumerate(panels.items()):
        for w, who in enumerate(("perfect", "noisy")):
            vals = [rows["bounds"][f"{who}/{law}"]["causal"] for law in LAW_NAMES]
            joint = [rows["bounds"][f"{who}/{law}"]["joint"] for law in LAW_NAMES]
            off = (2 * j + w - 1.5) * width
            ax0.bar(x + off, vals, width, label=f"{name.split(' (')[0]}, {who} drafter")
            ax0.plot(x + off, joint, "k_", ms=6)
        ax1.plot(x + 0.08 * j, rows["ce"], marker="o", ls="none", label=f"{name.split(' (')[0]}: CE optimum")
        ax1.plot(x + 0.08 * j, rows["ceiling"], marker="^", ls="none", mfc="none",
                 label=f"{name.split(' (')[0]}: family ceiling")
    for ax in (ax0, ax1):
        ax.set_xticks(x, ["product", "argmax", "top-2 Markov"])
        ax.axhline(length, color="grey", lw=0.8, ls=":")
        ax.set_ylim(0, length + 1.3)
    ax0.set_ylabel("E[τ]: U_causal (bars), U_joint (—)")
    ax0.legend(fontsize=5, loc="upper right", ncol=2)
    ax1.set_ylabel("E[τ] under block verification")
    ax1.legend(fontsize=5, loc="upper right", ncol=2)
    plots.save(fig, path.with_suffix(""), ("png",))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, default=6)
    ap.add_argument("--block-len", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200, help="Adam steps of each ceiling search (default 200)")
    ap.add_argument("--out", default=str(ROOT / "figures"))
    ap.add_argument("--results", default=str(ROOT / "data" / "results"))
    args = ap.parse_args(argv)
    if args.contexts < 1 or args.block_len < 1 or args.steps < 1:
        ap.error("--contexts, --block-len and --steps must be positive")
    start = time.time()
    panels = {"Dirichlet targets (V = 4)": measure("dirichlet", args.contexts, args.block_len, args.steps),
              "tiny random Qwen2 pair (V = 6)": measure("tiny", args.contexts, args.block_len, args.steps)}
    results = {"meta": {"command": "python experiments/block_diffusion_laws.py " + " ".join(argv or sys.argv[1:]),
                        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                        "wall_s": round(time.time() - start, 1), "block_len": args.block_len}, "panels": panels}
    from otbound import content_key, write_text_atomic

    results["meta"]["sha256"] = content_key(panels)  # checksum of the stored values
    out, res = Path(args.out), Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    res.mkdir(parents=True, exist_ok=True)
    write_text_atomic(res / "block_diffusion_laws.json", json.dumps(results, indent=1) + "\n")
    text = "\n".join(table(k, v, args.block_len) for k, v in panels.items())
    (out / "block_diffusion_laws.md").write_text(text)
    draw(panels, args.block_len, out / "block_diffusion_laws.png")
    print(text)
    return results


if __name__ == "__main__":
    main()
