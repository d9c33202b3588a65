"""Synthetic ablation of block-drafter training objectives (docs/theory/drafter-objectives.md), exact evaluation.

A factorised block drafter ``q_k(· | c) = softmax(E_c W_k + b_k)`` (per-position logits conditioned
on a context id ``c`` through a rank-``d`` bottleneck, so it cannot fit every context and position
and must trade them off) is trained on blocks sampled from a small-vocabulary target, once per
objective of :data:`otbound.objectives.ABLATION` (same data, same initialisation). Two targets:

* ``per-position``: ``p_k(· | c)`` fixed per position (context-free within the block): the exact
  objective's assumption holds.
* ``markov``: ``p(x_k | c, x_{k−1})``: the training objectives see the target law along the
  sampled block (the same approximation as with a real target), evaluation uses the exact tree.

Three kinds of training labels. ``soft``: blocks sampled from the target at temperature 1 and
every term fed the target law along the block (distillation: CE ``−Σ p log q``, first error at
``argmax q ≠ argmax p``, chain ``Π ⟨p, q⟩``). ``sampled``: the same blocks, but CE, focal and
chain terms see the sampled tokens (training on target-generated text), the exact term the laws.
``greedy``: the target's greedy block with one-hot laws (the temperature-0 setting, where the
chain term *is* the exact ``E[τ]``, so the ``+exact`` row repeats ``+chain``).

Evaluation is exact (no sampling): ``E[τ]`` (bonus excluded) under token-level and block
verification at temperature 1 (:func:`otbound.objectives.expected_accepted_length`), the greedy
accepted length (drafter argmax vs the target's greedy block), and, for one draft block, the
causal bound ``U_causal`` of docs/theory/block-bounds.md from :func:`otbound.block_bound` (block verification
reaches it for K = 1) and the per-level bound, on the first ``--bound-contexts`` contexts (one LP
each). Figures are means over contexts, then mean ± std over seeds. The default run takes about a
minute (38 s measured on a quiet 2-core machine, 68 s under load), ``--quick`` a few seconds::

    python experiments/drafter_objectives_synthetic.py            # writes data/results/objectives_synthetic.json
    python experiments/drafter_objectives_synthetic.py --quick    # reduced (used by the tests), into out/
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

import otbound  # noqa: E402
from otbound.objectives import ABLATION, DrafterObjective, expected_accepted_length  # noqa: E402

TARGETS = ("per-position", "markov")
LABELS = ("soft", "sampled", "greedy")


def make_target(kind: str, contexts: int, vocab: int, length: int, sharpness: float, gen) -> list[torch.Tensor]:
    """Target laws as tree levels: entry i is ``(C, P_i, V)``, the law at position i+1 after each
    prefix (``P_i = 1`` for the per-position target, ``V**i`` for the Markov one)."""
    base = sharpness * torch.randn(contexts, length, vocab, generator=gen, dtype=torch.float64)
    if kind == "per-position":
        return [torch.softmax(base[:, i : i + 1], -1) for i in range(length)]
    trans = sharpness * torch.randn(vocab, vocab, generator=gen, dtype=torch.float64)
    levels = [torch.softmax(base[:, :1], -1)]
    for i in range(1, length):
        last = torch.arange(vocab**i) % vocab  # previous token of each prefix (row-major order)
        levels.append(torch.softmax(base[:, i : i + 1] + trans[last][None], -1))
    return levels


def sample_blocks(levels, per_context: int, gen):
    """Sample ``per_context`` blocks per context; return ids ``(N,)``, tokens ``(N, L)`` and the
    target law along each sampled block ``(N, L, V)``."""
    contexts, vocab = levels[0].shape[0], levels[0].shape[-1]
    ctx = torch.arange(contexts).repeat_interleave(per_context)
    row = torch.zeros_like(ctx)
    ys, laws = [], []
    for lv in levels:
        law = lv[ctx, row if lv.shape[1] > 1 else 0]
        y = torch.multinomial(law, 1, generator=gen).squeeze(-1)
        ys.append(y)
        laws.append(law)
        row = row * vocab + y
    return ctx, torch.stack(ys, -1), torch.stack(laws, -2)


class FactorisedDrafter(torch.nn.Module):
    """``logits_k(c) = E_c W_k + b_k``: L per-position heads on a rank-``rank`` context embedding."""

    def __init__(self, contexts: int, vocab: int, length: int, rank: int, gen):
        super().__init__()
        self.emb = torch.nn.Parameter(torch.randn(contexts, rank, generator=gen, dtype=torch.float64))
        self.w = torch.nn.Parameter(0.1 * torch.randn(length, rank, vocab, generator=gen, dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.zeros(length, vocab, dtype=torch.float64))

    def forward(self, ctx: torch.Tensor) -> torch.Tensor:
        return torch.einsum("nr,lrv->nlv", self.emb[ctx], self.w) + self.b


def train(objective: DrafterObjective, data, shape, args, seed: int) -> FactorisedDrafter:
    ctx, y, laws = data
    model = FactorisedDrafter(*shape, args.rank, torch.Generator().manual_seed(seed))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    order = torch.Generator().manual_seed(seed + 1)
    for _ in range(args.steps):
        idx = torch.randint(0, len(ctx), (args.batch,), generator=order)
        loss = objective(model(ctx[idx]), None if y is None else y[idx], laws[idx]).total
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def greedy_block(levels) -> torch.Tensor:
    """The target's greedy block per context, ``(C, L)``."""
    contexts, vocab = levels[0].shape[0], levels[0].shape[-1]
    row = torch.zeros(contexts, dtype=torch.long)
    out = []
    for lv in levels:
        tok = lv[torch.arange(contexts), row if lv.shape[1] > 1 else 0].argmax(-1)
        out.append(tok)
        row = row * vocab + tok
    return torch.stack(out, -1)


def block_bounds(q: torch.Tensor, levels, kind: str, contexts: int) -> float:
    """Mean over the first ``contexts`` contexts of ``otbound.block_bound(..., num_drafts=1,
    kind=kind)`` (an LP per context, hence only a few)."""
    vocab, length = q.shape[-1], q.shape[-2]
    values = []
    for c in range(contexts):
        qc = q[c].numpy()

        def target(prefix, c=c):
            row = 0
            for t in prefix:
                row = row * vocab + t
            lv = levels[len(prefix)][c]
            return lv[row if lv.shape[0] > 1 else 0].numpy()

        def draft(prefix, qc=qc):
            return qc[len(prefix)]

        values.append(
            otbound.block_bound(target, draft, vocab_size=vocab, num_drafts=1, block_len=length, kind=kind).value
        )
    return float(np.mean(values))


def evaluate(model: FactorisedDrafter, levels, bounds: int) -> dict:
    """Exact E[τ] (token, block), greedy τ, means over contexts; with ``bounds > 0`` also the
    block value and the causal / per-level bounds on the first ``bounds`` contexts."""
    with torch.no_grad():
        q = torch.softmax(model(torch.arange(levels[0].shape[0])), -1)
    greedy = greedy_block(levels)
    match = (q.argmax(-1) == greedy).long()
    block = expected_accepted_length(levels, q, "block")
    out = {
        "token": float(expected_accepted_length(levels, q, "token").mean()),
        "block": float(block.mean()),
        "greedy": float(torch.cumprod(match, -1).sum(-1).double().mean()),
    }
    if bounds:
        out["bound_contexts"] = {
            "block": float(block[:bounds].mean()),
            "causal_bound": block_bounds(q, levels, "causal", bounds),
            "per_level_bound": block_bounds(q, levels, "per_level", bounds),
        }
    return out


def training_data(levels, labels: str, per_context: int, gen):
    ctx, y, laws = sample_blocks(levels, per_context, gen)
    if labels == "soft":
        y = None
    if labels == "greedy":
        y = greedy_block(levels)[ctx]
        laws = torch.nn.functional.one_hot(y, laws.shape[-1]).to(laws.dtype)
    return ctx, y, laws


def run(args) -> dict:
    torch.set_num_threads(1)  # tiny tensors: thread start-up and contention cost more than they save
    results = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "runs": {}}
    t0 = time.perf_counter()
    for kind in args.targets:
        for labels in args.labels:
            per_seed = []
            for seed in range(args.seeds):
                gen = torch.Generator().manual_seed(1000 * seed + 17)
                levels = make_target(kind, args.contexts, args.vocab, args.length, args.sharpness, gen)
                data = training_data(levels, labels, args.per_context, gen)
                shape = (args.contexts, args.vocab, args.length)
                bounds = args.bound_contexts if seed == 0 else 0
                per_seed.append(
                    {obj.name: evaluate(train(obj, data, shape, args, seed), levels, bounds) for obj in ABLATION}
                )
            results["runs"][f"{kind}/{labels}"] = summarise(per_seed)
    results["seconds"] = time.perf_counter() - t0
    return results


def summarise(per_seed: list[dict]) -> dict:
    """Mean/std over seeds of each metric, and the mean over seeds of the per-seed gain (%) of
    each objective over the baseline CE."""
    out = {}
    base = next(iter(per_seed[0]))
    for name in per_seed[0]:
        row = {}
        for metric in ("token", "block", "greedy"):
            vals = np.array([s[name][metric] for s in per_seed])
            gains = np.array([100 * (s[name][metric] / s[base][metric] - 1) for s in per_seed])
            row[metric] = {"mean": float(vals.mean()), "std": float(vals.std()), "gain_pct": float(gains.mean())}
        if "bound_contexts" in per_seed[0][name]:
            row["bounds_seed0"] = per_seed[0][name]["bound_contexts"]
        out[name] = row
    return out


def table(results: dict) -> str:
    lines = []
    cfg = results["config"]
    for run_name, rows in results["runs"].items():
        kind, labels = run_name.split("/")
        lines.append(
            f"\ntarget={kind} labels={labels}  V={cfg['vocab']} L={cfg['length']} contexts={cfg['contexts']} "
            f"rank={cfg['rank']} "
            f"seeds={cfg['seeds']}  E[τ] excludes the bonus token (max {cfg['length']})"
        )
        lines.append(
            f"{'objective':<20} {'E[τ] token':>16} {'gain':>7} {'E[τ] block':>16} {'gain':>7} "
            f"{'greedy τ':>14} {'gain':>7} | {'block*':>7} {'U_causal':>8} {'U_per-lvl':>9}"
        )
        for name, r in rows.items():
            cells = []
            for m in ("token", "block", "greedy"):
                cells.append(f"{r[m]['mean']:8.4f} ± {r[m]['std']:.4f} {r[m]['gain_pct']:+6.1f}%")
            bd = r.get("bounds_seed0", {})
            fmt = lambda x: f"{x:.4f}" if isinstance(x, float) else "n/a"  # noqa: E731
            lines.append(
                f"{name:<20} " + " ".join(cells)
                + f" | {fmt(bd.get('block')):>7} {fmt(bd.get('causal_bound')):>8} {fmt(bd.get('per_level_bound')):>9}"
            )
    lines.append(
        f"(gain: mean over seeds of the per-seed change vs baseline CE; | block*, bounds: seed 0, first "
        f"{cfg['bound_contexts']} contexts, one draft block, otbound.block_bound)"
    )
    return "\n".join(lines)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    ap.add_argument("--labels", nargs="+", choices=LABELS, default=list(LABELS))
    ap.add_argument("--contexts", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=5)
    ap.add_argument("--length", type=int, default=4)
    ap.add_argument("--rank", type=int, default=2, help="context-embedding rank (drafter capacity)")
    ap.add_argument("--sharpness", type=float, default=2.0, help="scale of the target's random logits")
    ap.add_argument("--per-context", type=int, default=64, help="training blocks sampled per context")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--bound-contexts", type=int, default=2, help="contexts (seed 0) checked against otbound.block_bound; 0: none"
    )
    ap.add_argument("--quick", action="store_true", help="reduced run for tests (seconds)")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default: data/results/objectives_synthetic.json; "
        "with --quick out/objectives_synthetic_quick.json)",
    )
    args = ap.parse_args(argv)
    if args.out is None:  # a quick run never overwrites the stored full-size results
        args.out = (
            _common.ROOT / "out" / "objectives_synthetic_quick.json"
            if args.quick
            else _common.RESULTS / "objectives_synthetic.json"
        )
    if args.quick:
        args.contexts, args.vocab, args.length, args.steps, args.seeds, args.per_context = 8, 4, 3, 60, 1, 16
        args.batch, args.bound_contexts = 64, min(args.bound_contexts, 1)
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    results = run(args)
    _common.write_json(args.out, results)
    print(table(results))
    print(f"wrote {args.out} ({results['seconds']:.1f} s)")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
