"""The block check with a drafting scheme: a count of generated instances passes over the ones the
scheme cannot draft on (also for a verifier's own law, enumerated lazily), and a failing run is
shrunk only to candidates the scheme can draft on (a top-k tree keeps its K)."""

import numpy as np

import otbound.conformance as oc
from otbound import BLOCK_VERIFIERS


def test_a_count_of_instances_skips_those_univer_cannot_draft_on():
    ver = BLOCK_VERIFIERS["univer"]
    res = oc.check_block_verifier(
        oc.block_adapter(ver), vocab_size=2, num_drafts=2, block_len=2, instances=3, drafting=ver
    )
    assert res.passed and res.sampling == "univer_tree" and len(res.instances) == 3
    labels = [r.label for r in res.instances]
    kept = [t for t in oc.block_instances(2, 2, 12, 0) if t.label in labels]
    for t in kept:  # m = 2 needs two drafted tokens of positive probability at every expanded prefix
        assert all(np.count_nonzero(q > 0) >= 2 for pre, q in t.draft.items() if len(pre) < 2)


def test_a_lossy_run_on_a_top_k_tree_shrinks_to_a_tree_it_can_draft():
    # block verification reads one row of the deterministic tree as if drawn from q: lossy
    res = oc.check_block_verifier(
        oc.block_adapter(BLOCK_VERIFIERS["block"]), vocab_size=2, num_drafts=2, block_len=2, instances=3,
        drafting=oc.top_k_tree(2),
    )
    cex = res.counterexample
    assert not res.passed and cex.num_drafts == 2 and cex.sampling == "top_2_tree"
    assert cex.lossless_error > 1e-3 and cex.block_len <= 2
