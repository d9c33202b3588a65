"""Why does the exact objective alone train poorly on the real pair? (drafter_objectives_real.py)

Trains the ``exact only`` heads again on the cached features of ``drafter_objectives_real.py``
(run that first: it caches streams and features under ``out/objectives_real``) with other learning
rates and step counts, and reports the training objective (exact ``E[τ]`` on the top-8 target
tokens, block verification) on a fixed probe batch of 512 training positions and the held-out
proxy and greedy ``τ``, from the initial heads (every head = the draft model's next-token law)
onwards. Writes ``data/results/objectives_real_exact_only.json`` (about 7 min here)::

    python experiments/drafter_exact_only_diagnostic.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import drafter_objectives_real as real  # noqa: E402

from otbound.objectives import ABLATION  # noqa: E402

RUNS = ((1e-3, 300), (1e-2, 300), (1e-3, 1200))


def main(argv=None) -> dict:
    args = real.parse(argv)
    st = real.prepare(args)
    data, cand, lookup, feats, streams = st.data, st.cand, st.lookup, st.feats, st.streams
    objective = next(o for o in ABLATION if o.name == "exact only")
    probe = torch.randint(0, len(data["h"]), (512,), generator=torch.Generator().manual_seed(123))
    dense = torch.zeros(len(probe), args.length, len(cand)).scatter_(-1, data["idx"][probe], data["p"][probe])

    def measure(heads, run_args) -> dict:
        heads.eval()
        with torch.no_grad():
            train = objective(
                heads(data["h"][probe]), None, dense, subset=True, exact_ids=data["exact_idx"][probe]
            ).exact
        per_pos, _ = real.greedy_and_proxy(
            {"x": heads}, feats["eval"], streams["eval"], st.prompt_lens["eval"], cand, lookup, run_args
        )
        return {"train_exact": float(train), "heldout_proxy_block": float(np.mean(per_pos["x"]["proxy_block"])),
                "heldout_greedy": float(np.mean(per_pos["x"]["greedy"]))}

    res = {"init": measure(real.ParallelHeads(st.out_weight, args.length, args.rank, args.seed), args)}
    for lr, steps in RUNS:
        run_args = real.parse([*(argv or []), "--lr", str(lr), "--steps", str(steps)])
        t0 = time.perf_counter()
        heads, _ = real.train_heads(objective, data, st.out_weight, run_args, len(cand))
        res[f"lr={lr:g}, steps={steps}"] = dict(measure(heads, run_args), seconds=time.perf_counter() - t0)
        print(json.dumps(res, indent=1), flush=True)
    out = args.out.with_name(
        args.out.stem + "_exact_only.json"
    )  # next to the ablation's results (--tiny: in its work folder)
    _common.write_json(out, res)
    print(f"wrote {out}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
