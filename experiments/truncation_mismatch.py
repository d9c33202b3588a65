"""The truncation defect class, measured exactly: a verifier fed one draft law while the drafts come
from another.

* ``forward``: drafts from the draft's *truncated* law (top-k / top-p), the verifier's ratios read
  the *untruncated* ``softmax(logits / T)`` (transformers' assisted decoding took q from the raw
  logits while sampling its drafts under ``top_k = 50``);
* ``reverse``: drafts from the untruncated law, the verifier reads the truncated one (a drafted
  token outside the truncated support has ratio p/0 = inf and is always accepted, as torch's
  ``min(1, p/q)`` does).

Single-draft speculative sampling (Leviathan et al. 2211.17192; what assisted decoding runs):
accept x w.p. ``a(x) = min(1, p(x)/q_fed(x))``, else emit from ``r = norm((p − q_fed)_+)``. Exact
output law with drafts x ~ q_drafted::

    out = q_drafted · a + (1 − Σ_x q_drafted(x) a(x)) · r,

its total variation from p, the acceptance the verifier *reports* (``Σ min(p, q_fed)``, its own
closed form) and the *true* one ``Σ_x q_drafted(x) a(x)``. The target law p is the target's under
its own settings (the same truncation as the draft's, as in a deployment).

Synthetic laws: Zipf-shaped target logits over V tokens, the draft's the target's plus N(0, σ²)
noise. Real pair: the stored traces' logits (``--traces FOLDER``, collected with
``--store-logits float32``), re-measured at the given settings without the models.

    python experiments/truncation_mismatch.py                     # synthetic, top-k 50 and top-p 0.9
    python experiments/truncation_mismatch.py --traces otbound-report/traces
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from otbound import SamplingParams


def mismatch_output_law(p, q_drafted, q_fed):
    """``(out, reported, true)`` of single-draft speculative sampling fed ``q_fed`` while its draft
    is drawn from ``q_drafted`` (module docstring). Rows along the last axis (batched)."""
    p, qd, qf = (np.asarray(x, dtype=np.float64) for x in (p, q_drafted, q_fed))
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(qf > 0, np.minimum(1.0, p / np.where(qf > 0, qf, 1.0)), np.where(p > 0, 1.0, 0.0))
    resid = np.maximum(p - qf, 0.0)
    mass = resid.sum(-1, keepdims=True)
    resid = np.where(mass > 0, resid / np.where(mass > 0, mass, 1.0), p)
    true = (qd * a).sum(-1)
    out = qd * a + (1.0 - true)[..., None] * resid
    reported = np.minimum(p, qf).sum(-1)
    return out, reported, true


def measure(p_logits, q_logits, target: SamplingParams, draft: SamplingParams) -> dict:
    """Both directions on rows of logits: TV(out, p), reported and true acceptance (per row)."""
    raw = SamplingParams(draft.temperature)
    p = target.laws(p_logits)
    q_trunc, q_raw = draft.laws(q_logits), raw.laws(q_logits)
    res = {}
    for name, drafted, fed in (("forward", q_trunc, q_raw), ("reverse", q_raw, q_trunc)):
        out, reported, true = mismatch_output_law(p, drafted, fed)
        correct = np.minimum(p, drafted).sum(-1)  # the right verifier, fed the law it drafts from
        res[name] = {"tv": 0.5 * np.abs(out - p).sum(-1), "reported": reported, "true": true, "correct": correct}
    return res


def summary(res: dict) -> dict:
    return {name: {"tv_median": float(np.median(r["tv"])), "tv_max": float(np.max(r["tv"])),
                   "reported_mean": float(np.mean(r["reported"])), "true_mean": float(np.mean(r["true"])),
                   "correct_mean": float(np.mean(r["correct"])), "rows": int(r["tv"].size)}
            for name, r in res.items()}


def synthetic_logits(rows: int, vocab: int, noise: float, seed: int):
    rng = np.random.default_rng(seed)
    lp = -1.1 * np.log1p(np.argsort(rng.random((rows, vocab)), axis=1))  # the report's zipf family
    lq = lp + noise * rng.standard_normal((rows, vocab))
    return lp, lq


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=None, help="a folder of stored traces (else synthetic laws)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--noise", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    settings = {"top-k 50": dict(top_k=50), "top-p 0.9": dict(top_p=0.9)}
    if args.traces:
        from otbound.lm import load_traces

        recs = [r for r in load_traces(args.traces) if r.target_logits is not None]
        lp = np.concatenate([np.asarray(r.target_logits, dtype=np.float64) for r in recs])
        lq = np.concatenate([np.asarray(r.draft_logits, dtype=np.float64) for r in recs])
        source = f"{len(recs)} traces, {lp.shape[0]} positions, V = {lp.shape[1]}"
    else:
        lp, lq = synthetic_logits(args.rows, args.vocab, args.noise, args.seed)
        source = f"synthetic Zipf, {args.rows} rows, V = {args.vocab}, draft noise σ = {args.noise}, seed {args.seed}"
    out = {"source": source, "temperature": args.temperature}
    for label, fields in settings.items():
        s = SamplingParams(args.temperature, **fields)
        out[label] = summary(measure(lp, lq, s, s))
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
