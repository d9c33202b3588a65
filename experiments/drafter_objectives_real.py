"""Real-model ablation of block-drafter objectives: L parallel heads on a frozen draft LM.

The drafter is ``L`` parallel heads on the frozen draft model's last hidden state ``h_t`` (after
the final norm): head ``k`` predicts token ``t + k`` as ``softmax(W (h_t + U_k SiLU(V_k h_t)))``,
with ``W`` the draft model's own frozen LM head restricted to a candidate vocabulary (see below),
``V_k`` (d×r) random and ``U_k`` (r×d) zero at start, so every head starts as the draft model's
next-token law (Medusa-style residual heads, Cai et al. 2401.10774). Each objective of
:data:`otbound.objectives.ABLATION` trains its own heads from the same start on the same batches.

Pipeline (every stage cached under ``--work``; rerunning resumes; progress bars on stderr):

1. streams — the target's greedy continuation (``--new-tokens``) of each prompt; the first
   ``--train-prompts`` prompts of ``--dataset`` train, the last ``--eval-prompts`` are held out.
2. features — one forward of each model per sequence: the draft's hidden states and the target's
   temperature-1 law at every position (top ``--store-top`` tokens kept): text labelled by the target.
3. heads — training on every position ``t ≥ --min-pos`` of the training sequences: soft labels =
   the target's stored laws along the text (renormalised; CE, focal and chain terms), the exact
   term on the target's top ``--exact-top`` tokens per position (a lower bound,
   ``subset=True``), block verification, target laws taken along the text (context-free per
   position: the approximation of docs/theory/drafter-objectives.md).
4. evaluation on the held-out continuations, every position ``t`` whose next ``L`` tokens exist:
   * greedy ``τ``: the heads' argmax block against the target's greedy continuation, which *is*
     the stream (exact; temperature 0 on both sides);
   * temperature 1, exact verification: at every ``--eval-stride``-th position one block ``X ~ q``
     per objective, one target forward over ``X`` (KV cache of the context), and
     :func:`otbound.objectives.conditional_accepted_length` (``E[τ | X_{<L}]``, unbiased for
     ``E[τ]`` with the real, prefix-dependent target) under token-level and block verification;
   * the training proxy: :func:`~otbound.objectives.expected_accepted_length` from the stored
     target laws along the stream (context-free approximation, top-``--exact-top`` lower bound).

``E[τ]`` excludes the bonus token. Candidate vocabulary: the union of the target's stored top
tokens and the tokens over the training sequences; the heads cannot propose anything else (the
held-out target mass inside it is reported). This keeps training at CPU scale (the full
151,936-row head costs ~35 GFLOP per batch of 64×4); all objectives share it.

    python experiments/drafter_objectives_real.py            # Qwen2.5-Coder 0.5B -> 1.5B (otbound.lm)
    python experiments/drafter_objectives_real.py --tiny     # tiny random Qwen2 models, seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

from otbound.objectives import ABLATION, DrafterObjective, conditional_accepted_length, expected_accepted_length  # noqa: E402

TINY_DRAFT = dict(
    num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64
)
TINY_TARGET = dict(
    num_hidden_layers=2, hidden_size=48, num_attention_heads=2, num_key_value_heads=1, intermediate_size=96
)


# ------------------------------------------------------------------------------------------------
# setup and caching
# ------------------------------------------------------------------------------------------------


def save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_models_and_prompts(args):
    from otbound.lm import Prompt, encode_prompt, load_pair, load_prompts, random_pair

    if args.tiny:
        pair = random_pair(TINY_DRAFT, TINY_TARGET, vocab_size=args.tiny_vocab, device="cpu", seed=args.seed)
        gen = np.random.default_rng(args.seed)
        prompts = [
            Prompt(f"tiny/{i}", "tiny", "", tuple(int(x) for x in gen.integers(0, args.tiny_vocab, 24)))
            for i in range(args.train_prompts + args.eval_prompts)
        ]
        stop = []
    else:
        pair = load_pair(args.pair, device="cpu", dtype="float32")
        prompts = load_prompts(args.dataset)
        from otbound.lm import stop_token_ids

        stop = stop_token_ids(pair.tokenizer, pair.target)
    if len(prompts) < args.train_prompts + args.eval_prompts:
        raise SystemExit(f"{args.dataset} has {len(prompts)} prompts, fewer than --train-prompts + --eval-prompts")
    ids = [encode_prompt(pair.tokenizer, p) for p in prompts]
    split = {"train": ids[: args.train_prompts], "eval": ids[len(ids) - args.eval_prompts :]}
    return pair, split, stop


def greedy_streams(model, split, new_tokens: int, stop, batch: int, path: Path) -> dict:
    """Per split, prompt + the model's greedy continuation (``new_tokens``, cut after the first
    stop token), batched (left padding); saved to ``path`` after every batch."""
    from transformers import GenerationConfig

    from otbound.lm import left_pad

    streams = json.loads(path.read_text()) if path.exists() else {}
    dev = next(model.parameters()).device
    cfg = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=0, pad_token_id=0,
                           eos_token_id=list(stop) or None, repetition_penalty=1.0)
    for name, prompts in split.items():
        out = streams.setdefault(name, [])
        for start in tqdm(range(len(out), len(prompts), batch), desc=f"greedy streams {name}", file=sys.stderr):
            chunk = prompts[start : start + batch]
            ids, mask, _ = left_pad(chunk, dev)
            with torch.no_grad():
                gen = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
            for p, row in zip(chunk, gen[:, ids.shape[1] :].tolist()):
                cont = []
                for tok in row:
                    cont.append(tok)
                    if tok in stop:
                        break
                out.append(list(p) + cont)
            _common.write_json(path, streams)
    return streams


def features(pair, seqs, path: Path, store_top: int) -> dict:
    """Per sequence: draft hidden states ``(n, d)``, the target's temperature-1 law at every position
    (top ``store_top`` ids and probabilities) and its argmax. Saved after every sequence."""
    feats = torch.load(path) if path.exists() else {"h": [], "top_idx": [], "top_p": [], "argmax": []}
    vocab = pair.vocab_size
    for i in tqdm(range(len(feats["h"]), len(seqs)), desc=f"features {path.stem}", file=sys.stderr):
        ids = torch.tensor([seqs[i]])
        with torch.no_grad():
            h = pair.draft.model(input_ids=ids).last_hidden_state[0].float()
            logits = pair.target(input_ids=ids).logits[0, :, :vocab].float()
        probs = torch.softmax(logits, -1)
        top = probs.topk(store_top, -1)
        feats["h"].append(h.clone())
        feats["top_idx"].append(top.indices.int())
        feats["top_p"].append(top.values.clone())
        feats["argmax"].append(logits.argmax(-1))
        save_atomic(feats, path)
    return feats


# ------------------------------------------------------------------------------------------------
# heads and training
# ------------------------------------------------------------------------------------------------


class ParallelHeads(torch.nn.Module):
    """``logits_k = (h + U_k SiLU(V_k h)) W_c^T`` for ``k = 1..L``; ``W_c`` frozen."""

    def __init__(self, out_weight: torch.Tensor, length: int, rank: int, seed: int):
        super().__init__()
        hidden = out_weight.shape[1]
        gen = torch.Generator().manual_seed(seed)
        self.down = torch.nn.Parameter(torch.randn(length, hidden, rank, generator=gen) / math.sqrt(hidden))
        self.up = torch.nn.Parameter(torch.zeros(length, rank, hidden))
        self.register_buffer("out", out_weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        act = torch.nn.functional.silu(torch.einsum("bd,ldr->blr", h, self.down))
        return (h[:, None, :] + torch.einsum("blr,lrd->bld", act, self.up)) @ self.out.T


def training_set(feats, seqs, lookup: torch.Tensor, length: int, min_pos: int, exact_top: int):
    """Rows ``(h_t, target ids/probs at positions t..t+L-1 in candidate indices)``."""
    hs, idx, prob = [], [], []
    for h, ti, tp, seq in zip(feats["h"], feats["top_idx"], feats["top_p"], seqs):
        ts = torch.arange(min(min_pos, len(seq) - length), len(seq) - length + 1)
        if len(ts) == 0:
            continue
        rows = ts[:, None] + torch.arange(length)
        hs.append(h[ts])
        idx.append(lookup[ti[rows].long()])
        prob.append(tp[rows])
    data = {"h": torch.cat(hs), "idx": torch.cat(idx), "p": torch.cat(prob)}
    assert bool((data["idx"] >= 0).all()), "candidate vocabulary misses a stored target token"
    data["exact_idx"] = data["idx"][..., :exact_top]  # stored top tokens are sorted by probability
    return data


def train_heads(obj: DrafterObjective, data, out_weight, args, vocab_c: int) -> tuple[ParallelHeads, dict]:
    heads = ParallelHeads(out_weight, args.length, args.rank, args.seed)
    opt = torch.optim.Adam([heads.down, heads.up], lr=args.lr)
    order = torch.Generator().manual_seed(args.seed + 1)
    n = len(data["h"])
    t0 = time.perf_counter()
    last = {}
    with torch.enable_grad():
        for _ in tqdm(range(args.steps), desc=f"train {obj.name}", file=sys.stderr, leave=False):
            b = torch.randint(0, n, (args.batch,), generator=order)
            dense = torch.zeros(args.batch, args.length, vocab_c).scatter_(-1, data["idx"][b], data["p"][b])
            terms = obj(heads(data["h"][b]), None, dense, subset=True, exact_ids=data["exact_idx"][b])
            opt.zero_grad()
            terms.total.backward()
            opt.step()
            last = {k: float(getattr(terms, k).detach()) for k in ("total", "ce", "focal", "chain", "exact")}
    return heads, {"seconds": time.perf_counter() - t0, "final_batch_terms": last}


# ------------------------------------------------------------------------------------------------
# evaluation
# ------------------------------------------------------------------------------------------------


def eval_positions(seq, prompt_len: int, length: int) -> torch.Tensor:
    """Contexts ending at ``t`` (0-based) inside the continuation whose next L stream tokens exist."""
    return torch.arange(prompt_len - 1, len(seq) - length)


def greedy_and_proxy(heads_by_obj, feats, seqs, prompt_lens, cand, lookup, args) -> dict:
    """Greedy τ at every eval position and the context-free proxy; also the held-out target mass
    inside the candidate vocabulary (stored top tokens only: a lower bound)."""
    out = {name: {"greedy": [], "proxy_token": [], "proxy_block": []} for name in heads_by_obj}
    coverage = []
    L = args.length
    for h, ti, tp, seq, plen in zip(feats["h"], feats["top_idx"], feats["top_p"], seqs, prompt_lens):
        ts = eval_positions(seq, plen, L)
        if len(ts) == 0:
            continue
        nxt = torch.tensor(seq)[ts[:, None] + 1 + torch.arange(L)]
        rows = ts[:, None] + torch.arange(L)
        sub_ids = lookup[ti[rows][..., : args.exact_top].long()]  # (T, L, m); -1 outside candidates
        sub_p = tp[rows][..., : args.exact_top].double()
        coverage.append((tp[rows[:, 0]] * (lookup[ti[rows[:, 0]].long()] >= 0)).sum(-1))
        for name, heads in heads_by_obj.items():
            with torch.no_grad():
                q = torch.softmax(heads(h[ts]).double(), -1)
            match = (cand[q.argmax(-1)] == nxt).long()
            out[name]["greedy"].append(torch.cumprod(match, -1).sum(-1).double())
            q_sub = torch.where(sub_ids >= 0, q.gather(-1, sub_ids.clamp(min=0)), torch.zeros_like(sub_p))
            for v in ("token", "block"):
                out[name][f"proxy_{v}"].append(expected_accepted_length(sub_p, q_sub, v, subset=True))
    res = {name: {k: torch.cat(v).tolist() for k, v in d.items()} for name, d in out.items()}
    return res, float(torch.cat(coverage).mean())


def exact_t1(pair, heads_by_obj, feats, seqs, prompt_lens, cand, args, path: Path) -> list[dict]:
    """Temperature-1 exact verification at every ``eval_stride``-th eval position; one JSON line per
    position (appended as it is computed; existing lines are kept on resume)."""
    from otbound.lm import cache_prefix, forward, prefix_cache

    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            done[(row["seq"], row["t"])] = row
    names = list(heads_by_obj)
    jobs = [(i, int(t)) for i, (seq, plen) in enumerate(zip(seqs, prompt_lens))
            for t in eval_positions(seq, plen, args.length)[:: args.eval_stride]]
    vocab, L = pair.vocab_size, args.length
    with open(path, "a") as fh:
        layers, cached_seq = None, None
        for i, t in tqdm(jobs, desc="exact T=1 eval", file=sys.stderr):
            if (i, t) in done:
                continue
            if cached_seq != i:
                layers, cached_seq = prefix_cache(pair.target, seqs[i]), i
            with torch.no_grad():
                q_c = torch.stack(
                    [torch.softmax(heads_by_obj[n](feats["h"][i][t : t + 1]).double(), -1)[0] for n in names]
                )
            q = torch.zeros(len(names), L, vocab, dtype=torch.float64).scatter_(-1, cand.expand(len(names), L, -1), q_c)
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + i * 10_007 + t)
            x = cand[torch.multinomial(q_c.reshape(-1, q_c.shape[-1]), 1, generator=gen).reshape(len(names), L)]
            ids = torch.cat([torch.full((len(names), 1), seqs[i][t]), x[:, : L - 1]], dim=1)
            cache = cache_prefix(pair.target, layers, t, len(names))
            mask = torch.ones(len(names), t + L, dtype=torch.long)
            pos = torch.arange(t, t + L).expand(len(names), L)
            with torch.no_grad():
                logits = forward(pair.target, ids, mask, pos, cache)[..., :vocab]
            p = torch.softmax(logits.double(), -1)
            row = {"seq": i, "t": t}
            for v in ("token", "block"):
                row[v] = conditional_accepted_length(p, q, x, v).tolist()
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            done[(i, t)] = row
    return [done[j] for j in jobs]


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def stats(values) -> dict:
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "se": float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0, "n": len(a)}


def prepare(args) -> SimpleNamespace:
    """Stages 1–2 (cached under ``args.work``) and the training set: ``pair``, ``streams``,
    ``prompt_lens``, ``feats``, the candidate vocabulary ``cand`` with its ``lookup`` (token id →
    candidate index, −1 outside), the heads' frozen ``out_weight`` and the training ``data``."""
    work = args.work
    (work / "heads").mkdir(parents=True, exist_ok=True)
    pair, split, stop = load_models_and_prompts(args)
    streams = greedy_streams(pair.target, split, args.new_tokens, stop, args.gen_batch, work / "streams.json")
    prompt_lens = {s: [len(p) for p in split[s]] for s in split}
    feats = {s: features(pair, streams[s], work / f"features_{s}.pt", args.store_top) for s in ("train", "eval")}
    cand = torch.unique(torch.cat([t.reshape(-1).long() for t in feats["train"]["top_idx"]]
                                  + [torch.tensor(s) for s in streams["train"]]))
    lookup = torch.full((pair.vocab_size,), -1, dtype=torch.long)
    lookup[cand] = torch.arange(len(cand))
    out_weight = pair.draft.get_output_embeddings().weight.detach()[cand].float().clone()
    data = training_set(feats["train"], streams["train"], lookup, args.length, args.min_pos, args.exact_top)
    return SimpleNamespace(pair=pair, streams=streams, prompt_lens=prompt_lens, feats=feats, cand=cand, lookup=lookup,
                           out_weight=out_weight, data=data)


def run(args) -> dict:
    work = args.work
    t_start = time.perf_counter()
    st = prepare(args)
    pair, streams, prompt_lens, feats, cand, lookup, out_weight, data = (
        st.pair, st.streams, st.prompt_lens, st.feats, st.cand, st.lookup, st.out_weight, st.data)

    heads_by_obj, train_info = {}, {}
    for k, obj in enumerate(ABLATION):
        path = work / "heads" / f"{k}_{slug(obj.name)}.pt"
        if path.exists():
            saved = torch.load(path)
            heads = ParallelHeads(out_weight, args.length, args.rank, args.seed)
            heads.load_state_dict(saved["state"])
            info = saved["info"]
        else:
            heads, info = train_heads(obj, data, out_weight, args, len(cand))
            save_atomic({"state": heads.state_dict(), "info": info}, path)
        heads_by_obj[obj.name], train_info[obj.name] = heads.eval(), info

    per_pos, coverage = greedy_and_proxy(
        heads_by_obj, feats["eval"], streams["eval"], prompt_lens["eval"], cand, lookup, args
    )
    t1_rows = exact_t1(
        pair, heads_by_obj, feats["eval"], streams["eval"], prompt_lens["eval"], cand, args, work / "exact_t1.jsonl"
    )

    names = list(heads_by_obj)
    base = names[0]
    rows = {}
    for j, name in enumerate(names):
        r = {"train": train_info[name]}
        for key in ("greedy", "proxy_token", "proxy_block"):
            r[key] = stats(per_pos[name][key])
            r[key]["paired_diff_vs_baseline"] = stats(np.subtract(per_pos[name][key], per_pos[base][key]))
        for v in ("token", "block"):
            r[f"t1_{v}"] = stats([row[v][j] for row in t1_rows])
            r[f"t1_{v}"]["paired_diff_vs_baseline"] = stats([row[v][j] - row[v][0] for row in t1_rows])
        for key in ("greedy", "proxy_token", "proxy_block", "t1_token", "t1_block"):
            ref = (rows[base] if rows else r)[key]["mean"]
            r[key]["gain_pct"] = 100.0 * (r[key]["mean"] / ref - 1.0) if ref > 0 else None
        rows[name] = r
    return {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pair": pair.name,
        "sources": pair.sources,
        "candidate_vocab": len(cand),
        "train_examples": len(data["h"]),
        "eval_positions_greedy": len(per_pos[base]["greedy"]),
        "eval_positions_t1": len(t1_rows),
        "heldout_target_mass_in_candidates": coverage,
        "objectives": rows,
        "seconds": time.perf_counter() - t_start,
    }


def table(res: dict) -> str:
    cfg = res["config"]
    lines = [
        f"\n{res['pair']}  L={cfg['length']}  train examples={res['train_examples']}  "
        f"candidate vocab={res['candidate_vocab']} "
        f"(held-out target mass inside ≥ {res['heldout_target_mass_in_candidates']:.3f})",
        f"greedy τ over {res['eval_positions_greedy']} held-out positions; T=1 exact over {res['eval_positions_t1']}; "
        "E[τ] excludes the bonus token; ± = standard error",
        f"{'objective':<20} {'greedy τ':>15} {'gain':>7} {'T=1 token E[τ]':>17} {'gain':>7} "
        f"{'T=1 block E[τ]':>17} {'gain':>7} {'proxy block':>11}",
    ]
    for name, r in res["objectives"].items():
        cells = [
            f"{r[k]['mean']:7.3f} ± {r[k]['se']:.3f} "
            + (f"{r[k]['gain_pct']:+6.1f}%" if r[k]["gain_pct"] is not None else "    n/a")
            for k in ("greedy", "t1_token", "t1_block")
        ]
        lines.append(f"{name:<20} " + " ".join(f"{c:>25}" for c in cells) + f" {r['proxy_block']['mean']:11.3f}")
    return "\n".join(lines)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny random Qwen2 models and random prompts (seconds)")
    ap.add_argument("--pair", default="qwen2.5-coder")
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--train-prompts", type=int, default=48)
    ap.add_argument("--eval-prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=4, help="block length L")
    ap.add_argument("--store-top", type=int, default=16)
    ap.add_argument("--exact-top", type=int, default=8)
    ap.add_argument("--min-pos", type=int, default=32, help="first training position (skips the chat preamble)")
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-stride", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny-vocab", type=int, default=96)
    ap.add_argument("--work", type=Path, default=None, help="cache folder (default out/objectives_real[_tiny])")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.tiny:
        for k, v in dict(train_prompts=6, eval_prompts=2, new_tokens=12, gen_batch=8, store_top=12, exact_top=4,
                         min_pos=4, rank=8, steps=12, batch=16, eval_stride=3, lr=1e-2).items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    tag = "objectives_real_tiny" if args.tiny else "objectives_real"
    args.work = args.work or _common.ROOT / "out" / tag
    args.out = args.out or (args.work / f"{tag}.json" if args.tiny else _common.RESULTS / f"{tag}.json")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    res = run(args)
    _common.write_json(args.out, res)
    print(table(res))
    print(f"wrote {args.out} ({res['seconds']:.0f} s)")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
