"""UniVer (2605.04543) on random models: exact E[τ] against the bounds of its own tree law, and the
i.i.d.-draft verifiers and bounds beside it for context (all exact, by enumeration / LP).

    python experiments/univer_table.py [--seeds 4]

Pairs: Dirichlet target (seed s) and draft (seed s + 100), concentration 0.7, as in the tests. For
each (V, m, L) it prints

* ``univer``  — UniVer's exact E[τ] (bonus excluded) on its tree: per node the top m − 1 draft tokens
  and one residual sample (m^L paths, 1 + m + … + m^(L−1) sampled tokens);
* ``causal*`` / ``joint*`` — U_causal and U_joint of that same tree law (LPs over every tree): the
  bounds UniVer must respect;
* ``traversal`` — traversal verification (same authors, 2505.12398) on K = m^L i.i.d. blocks (as many
  paths as UniVer's tree; "-" where the (V^L)^K tuples are too many to enumerate) and
  ``causal(K=m^L)``, the i.i.d. U_causal. Different draft laws: context, not bounds on UniVer.
"""

from __future__ import annotations

import argparse

from otbound.block.bounds import block_bound
from otbound.block.models import dirichlet_model
from otbound.block.verifiers import BLOCK_VERIFIERS, MAX_EXACT_TUPLES, UniVer

CASES = [(3, 2, 2), (3, 2, 3), (4, 2, 2), (4, 3, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args()
    univer = UniVer()
    print(f"{'V':>2} {'m':>2} {'L':>2} {'seed':>4} | {'univer':>8} {'causal*':>8} {'joint*':>8} {'gap*':>8} | "
          f"{'traversal':>9} {'causal(K=m^L)':>13}")
    for v, m, length in CASES:
        for seed in range(args.seeds):
            tg = dirichlet_model(v, seed=seed, concentration=0.7)
            dr = dirichlet_model(v, seed=seed + 100, concentration=0.7)
            kw = {"vocab_size": v, "num_drafts": m, "block_len": length}
            value = univer.acceptance(tg, dr, **kw)
            own = univer.own_law_bounds(tg, dr, **kw)
            iid_kw = {**kw, "num_drafts": m**length}
            trav = (
                f"{BLOCK_VERIFIERS['traversal'].acceptance(tg, dr, **iid_kw):9.4f}"
                if v ** (length * m**length) <= MAX_EXACT_TUPLES else f"{'-':>9}"
            )
            iid = block_bound(tg, dr, kind="causal", **iid_kw).value
            print(f"{v:>2} {m:>2} {length:>2} {seed:>4} | {value:8.4f} {own.causal:8.4f} {own.joint:8.4f} "
                  f"{own.causal - value:8.1e} | {trav} {iid:13.4f}")


if __name__ == "__main__":
    main()
