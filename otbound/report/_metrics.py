"""Block-level acceptance in the metrics serving engines report (docs/guide/metrics.md).

One speculative iteration ("draft", "step") drafts tokens, calls the target once and accepts
``τ ∈ {0, ..., L}`` draft tokens before the correction or bonus token. Over ``N`` target calls with
accepted counts ``τ_i`` and ``d_i`` draft tokens sent to verification:

* ``mean_acceptance_length`` = ``1 + Σ τ_i / N`` — tokens emitted per target call, the bonus
  token included: vLLM's "mean acceptance length" (``vllm/v1/spec_decode/metrics.py``), SGLang's
  ``spec_accept_length`` (``python/sglang/srt/managers/scheduler_metrics_mixin.py``), EAGLE's
  acceptance length;
* ``acceptance_rate`` = ``Σ τ_i / Σ d_i`` — accepted over drafted tokens, bonus excluded: vLLM's
  draft acceptance rate (``num_accepted_tokens / num_draft_tokens``);
* ``per_position_acceptance[ℓ−1]`` = ``P(τ ≥ ℓ)``, ``ℓ = 1..L`` — vLLM's
  ``num_accepted_tokens_per_pos`` divided by ``num_drafts``;
* ``acceptance_length_histogram[a−1]`` = fraction of target calls with acceptance length
  ``a = τ + 1``, ``a = 1..L+1`` — the acceptance-length histogram of SGLang / TensorRT-LLM.

They are functions of ``P(τ ≥ ℓ)`` and the drafted-token count alone: :func:`metrics_from_levels`
is the one implementation; :func:`engine_metrics` computes the levels of observed ``τ`` and adds
the cluster-robust interval of the mean acceptance length.
"""

from __future__ import annotations

import numpy as np

from otbound._validation import InvalidInputError
from otbound.report._measure import cluster_mean_ci

#: the metric names, in report order
METRIC_NAMES = ("mean_acceptance_length", "acceptance_rate", "per_position_acceptance", "acceptance_length_histogram")


def metrics_from_levels(levels, drafted_tokens) -> dict:
    """Engine metrics of an acceptance law given by its levels ``levels[ℓ−1] = P(τ ≥ ℓ)``.

    Parameters
    ----------
    levels : array_like, shape (L,)
        Non-increasing probabilities in [0, 1] (tolerance 1e-9), ``L`` the draft depth.
    drafted_tokens : float
        Draft tokens sent to verification per target call (a chain: ``L``; a tree: its node count);
        ``> 0``.

    Returns
    -------
    dict
        ``mean_acceptance_length = 1 + Σ_ℓ levels[ℓ−1]`` (since ``E[τ] = Σ_ℓ P(τ ≥ ℓ)``),
        ``acceptance_rate = E[τ] / drafted_tokens``, ``per_position_acceptance = levels`` and
        ``acceptance_length_histogram[a−1] = P(τ = a − 1) = levels[a−2] − levels[a−1]``
        (``levels[−1] = 1``, ``levels[L] = 0``), ``a = 1..L+1``.

    Raises
    ------
    InvalidInputError
        Levels outside [0, 1], increasing, or ``drafted_tokens ≤ 0``.

    Examples
    --------
    A chain of 2 draft tokens each accepted with probability 0.5, independently:

    >>> m = metrics_from_levels([0.5, 0.25], drafted_tokens=2)
    >>> m["mean_acceptance_length"], m["acceptance_rate"], m["acceptance_length_histogram"]
    (1.75, 0.375, [0.5, 0.25, 0.25])
    """
    lv = np.asarray(levels, dtype=np.float64).reshape(-1)
    tol = 1e-9
    if lv.size and (lv.min() < -tol or lv.max() > 1 + tol or np.any(np.diff(lv) > tol)):
        raise InvalidInputError(f"levels P(τ ≥ ℓ) must be non-increasing in [0, 1], got {lv.tolist()}")
    if not float(drafted_tokens) > 0:
        raise InvalidInputError(f"drafted_tokens must be > 0, got {drafted_tokens}")
    lv = np.clip(lv, 0.0, 1.0)
    ext = np.concatenate([[1.0], lv, [0.0]])
    hist = np.maximum(ext[:-1] - ext[1:], 0.0)
    return {
        "mean_acceptance_length": float(1.0 + lv.sum()),
        "acceptance_rate": float(lv.sum() / float(drafted_tokens)),
        "per_position_acceptance": lv.tolist(),
        "acceptance_length_histogram": hist.tolist(),
    }


def engine_metrics(num_accepted, drafted_tokens, block_len: int, clusters=None, confidence: float = 0.95) -> dict:
    """Engine metrics of observed iterations (module docstring).

    Parameters
    ----------
    num_accepted : array_like of int, shape (N,)
        ``τ_i``, accepted draft tokens of each target call, in ``0..block_len``.
    drafted_tokens : array_like, shape (N,) or scalar
        Draft tokens sent to verification at each call (``d_i > 0``).
    block_len : int
        Draft depth ``L`` (length of ``per_position_acceptance``).
    clusters : array_like, shape (N,), optional
        Cluster label of each call (its prompt) for the cluster-robust interval of
        :func:`otbound.report.cluster_mean_ci`; default: every call its own cluster.

    Returns
    -------
    dict
        :func:`metrics_from_levels` of the empirical levels ``P(τ ≥ ℓ)`` with ``acceptance_rate =
        Σ τ_i / Σ d_i``, plus ``mean_acceptance_length_ci`` (half-width) and ``target_calls``.

    Raises
    ------
    InvalidInputError
        No calls, ``τ`` outside ``0..block_len``, non-positive ``d_i``.

    Examples
    --------
    >>> m = engine_metrics([0, 2, 1, 2], drafted_tokens=2, block_len=2)
    >>> m["mean_acceptance_length"], m["acceptance_rate"], m["per_position_acceptance"]
    (2.25, 0.625, [0.75, 0.5])
    >>> m["acceptance_length_histogram"], m["target_calls"]
    ([0.25, 0.25, 0.5], 4)
    """

    tau = np.asarray(num_accepted, dtype=np.float64).reshape(-1)
    length = int(block_len)
    if tau.size == 0:
        raise InvalidInputError("engine metrics need at least one target call")
    if tau.min() < 0 or tau.max() > length or np.any(tau != np.round(tau)):
        raise InvalidInputError(f"accepted counts must be integers in 0..{length}, got {np.unique(tau).tolist()}")
    drafted = np.broadcast_to(np.asarray(drafted_tokens, dtype=np.float64), tau.shape)
    if not np.all(drafted > 0):
        raise InvalidInputError("drafted tokens per target call must be > 0")
    levels = [float(np.mean(tau >= ell)) for ell in range(1, length + 1)]
    out = metrics_from_levels(levels, float(drafted.mean()))
    out["acceptance_rate"] = float(tau.sum() / drafted.sum())
    groups = np.arange(tau.size) if clusters is None else np.asarray(clusters)
    _, half = cluster_mean_ci(tau, groups, confidence)
    out["mean_acceptance_length_ci"] = half
    out["target_calls"] = int(tau.size)
    return out
