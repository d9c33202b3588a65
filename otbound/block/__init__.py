"""The block layer (docs/theory/block-bounds.md): block models, the block bounds U_per-level ≥ U_joint ≥ U_causal
and the block verifiers.

* :mod:`otbound.block.models` — explicit autoregressive models (prefix → next-token law).
* :mod:`otbound.block.bounds` — :func:`block_bound`, :func:`block_bound_bracket`,
  :func:`merged_bound_bracket`; the draft trie in :mod:`otbound.block._tree`, the LPs in
  :mod:`otbound.block._lp` / :mod:`otbound.block._plain`, the top-m truncation in
  :mod:`otbound.block._truncate`.
* :mod:`otbound.block.verifiers` — block verifiers, registry :data:`BLOCK_VERIFIERS`.
* :mod:`otbound.block._static_tree` — static top-k trees (deterministic drafting): the covered
  target mass :func:`static_tree_bound` and its traversal verifier.
* :mod:`otbound.block._oracle_tree` — the best deterministic tree at a node budget
  (:func:`oracle_tree_bound`) beside the static and sampled schemes (:func:`node_budget_comparison`).
"""

from otbound.block._lp import MAX_SPLIT_VARIABLES
from otbound.block._oracle_tree import (
    MAX_ORACLE_CELLS,
    LogGrowthFit,
    NodeBudgetComparison,
    OracleTreeBound,
    fit_log_growth,
    node_budget_comparison,
    oracle_tree_bound,
    static_branchings,
)
from otbound.block._static_tree import StaticTreeBound, static_tree_bound, static_tree_paths
from otbound.block._tree import MAX_TREE_CELLS
from otbound.block.bounds import (
    KINDS,
    BlockBound,
    BlockBracket,
    JointPlanCertificate,
    PerLevelCertificate,
    SelectionCertificate,
    block_bound,
    block_bound_bracket,
    merged_bound_bracket,
)
from otbound.block.law_bounds import BlockDraftLawBounds, block_draft_law_bounds
from otbound.block.models import (
    BLOCK_DRAFT_LAWS,
    ArgmaxChain,
    BlockDraftLaw,
    BlockModel,
    MarginalProduct,
    TopKMarkov,
    as_block_model,
    block_marginals,
    context_free_model,
    dirichlet_model,
    mixture_model,
    prefix_law,
    sample_blocks,
    sequence_probability,
    shifted_model,
    tabulated_model,
    zipf_model,
)
from otbound.block.verifiers import BLOCK_VERIFIERS, BlockSample, BlockVerifier, StaticTreeTraversal, generate

__all__ = [
    "BLOCK_VERIFIERS", "BlockBound", "BlockBracket", "BlockModel", "BlockSample", "BlockVerifier", "KINDS",
    "JointPlanCertificate", "PerLevelCertificate", "SelectionCertificate",
    "MAX_SPLIT_VARIABLES", "MAX_TREE_CELLS",
    "as_block_model", "block_bound", "block_bound_bracket", "merged_bound_bracket", "context_free_model",
    "dirichlet_model", "generate",
    "mixture_model", "prefix_law", "sample_blocks", "sequence_probability", "shifted_model", "tabulated_model",
    "zipf_model", "StaticTreeBound", "StaticTreeTraversal", "static_tree_bound", "static_tree_paths",
    "MAX_ORACLE_CELLS", "LogGrowthFit", "NodeBudgetComparison", "OracleTreeBound", "fit_log_growth",
    "node_budget_comparison", "oracle_tree_bound", "static_branchings",
    "BLOCK_DRAFT_LAWS", "ArgmaxChain", "BlockDraftLaw", "MarginalProduct", "TopKMarkov", "block_marginals",
    "BlockDraftLawBounds", "block_draft_law_bounds",
]
