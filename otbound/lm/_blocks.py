"""Block traces: real draft trees for the block-level bounds and verifiers (docs/theory/block-bounds.md).

At a few sampled positions ``t`` of a stored trace (prefix = prompt + continuation[:t]), ``K``
i.i.d. draft blocks ``X^(k)_{1:L}`` are drawn autoregressively from the draft at the trace's
temperature, and both models' laws are recorded along every block:

* draft: ``q(· | prefix, X_{1:ℓ})`` for ℓ = 0..L−1 (the laws the block was drawn from);
* target: ``p(· | prefix, X_{1:ℓ})`` for ℓ = 0..L (ℓ = L gives the bonus token's law).

Both models reuse the prefix KV cache of one forward over the trace sequence (sliced to the
position, repeated K times along the batch). Draft tokens are drawn in float64 from the stored
(rounded) logits with :func:`otbound.sample_drafts` and a numpy generator, so the stored ``q`` is
exactly the law each token was drawn from.

Format ``otbound-blocks-1``: one safetensors file per trace at
``<out>/<dataset>/T<T>/<prompt id>.safetensors``:

=================  ===============================  ==========================================
tensor             shape, dtype                     meaning
=================  ===============================  ==========================================
``tokens``         (prompt_length + n,) int32       the trace's sequence
``positions``      (m,) int32                       sampled continuation indices t
``drafts``         (m, K, L) int32                  draft blocks
``target_logits``  (m, K, L + 1, V) float32/16      target logits along each block
``draft_logits``   (m, K, L, V) float32/16          draft logits along each block
=================  ===============================  ==========================================

Laws are those of the trace's sampling settings (both recorded in the metadata), as for traces;
the blocks are drawn from the draft's law under its settings. Size per sampled position: ``K·(2L+1)·V·4`` bytes
in float32 (K = 4, L = 4: 21.9 MB for V = 151,936).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from otbound._validation import InvalidInputError, check_num_drafts, check_positive_int
from otbound.lm import _store
from otbound.lm._decode import cache_prefix, forward, prefix_cache
from otbound.lm._traces import LogitLaws, _files, collect_at_positions, record_settings
from otbound.token import SamplingParams
from otbound.token.draft_laws import sample_drafts
from otbound.token.logits import laws_from_logits

BLOCKS_FORMAT = "otbound-blocks-1"


@dataclass
class BlockRecord(LogitLaws):
    """K draft blocks of length L at continuation position ``position`` of a trace.

    ``prefix``: token ids before the blocks. ``drafts``: (K, L). ``p``: (K, L+1, V) float64 target
    laws along each block (``p[k, ℓ]`` given prefix + drafts[k, :ℓ]); ``q``: (K, L, V) draft laws.

    Parameters
    ----------
    prompt_id, dataset : str
        The trace's prompt id and dataset.
    temperature : float
        T of the trace.
    position : int
        Continuation index t of the blocks.
    prefix : numpy.ndarray
        Token ids before the blocks (prompt + continuation[:t]).
    drafts : numpy.ndarray
        (K, L) draft blocks.
    target_logits, draft_logits : numpy.ndarray
        (K, L + 1, V) and (K, L, V) logits along each block.
    meta : dict
        The stored metadata.
    target_sampling, draft_sampling : otbound.SamplingParams, optional
        The settings defining ``p`` / ``q``.

    Examples
    --------
    A record as :func:`load_block_traces` yields it, here built by hand: K = 2 blocks of L = 1
    token over V = 2 after the prefix ``[0]`` (the laws are the logits' softmax at T).

    >>> import numpy as np
    >>> from otbound.lm import BlockRecord
    >>> tl = np.log([[[0.5, 0.5], [0.9, 0.1]], [[0.5, 0.5], [0.2, 0.8]]])   # (K, L + 1, V)
    >>> dl = np.log([[[0.3, 0.7]], [[0.3, 0.7]]])                             # (K, L, V)
    >>> rec = BlockRecord("demo/0", "demo", 1.0, 1, np.array([0]), np.array([[0], [1]]), tl, dl)
    >>> rec.num_drafts, rec.block_length, rec.p.shape, rec.q.shape
    (2, 1, (2, 2, 2), (2, 1, 2))
    >>> target, draft = rec.block_models()   # the laws along the drafted tree, by prefix
    >>> target((1,)).round(3).tolist(), draft(()).round(3).tolist()
    ([0.2, 0.8], [0.3, 0.7])
    """

    prompt_id: str
    dataset: str
    temperature: float
    position: int
    prefix: np.ndarray
    drafts: np.ndarray
    target_logits: np.ndarray = field(repr=False)
    draft_logits: np.ndarray = field(repr=False)
    meta: dict = field(default_factory=dict, repr=False)
    target_sampling: SamplingParams | None = None
    draft_sampling: SamplingParams | None = None

    def contexts(self):
        """``prefix + drafts[k, :ℓ]`` for every law along the blocks (repetition penalty)."""

        return tree_contexts(self.prefix, self.drafts, self.block_length + 1)

    @property
    def num_drafts(self) -> int:
        return int(self.drafts.shape[0])

    @property
    def block_length(self) -> int:
        return int(self.drafts.shape[1])

    def block_models(self):
        """``(target, draft)`` as :func:`otbound.block.models.tabulated_model` block models over the
        prefixes of the stored draft tree (relative to ``prefix``): block verifiers'
        ``conditional_acceptance(target, draft, drafts)`` then runs on the real tree without the
        models. A prefix off the tree is an error naming it."""
        return tree_block_models(self.drafts, self.p, self.q)


def tree_contexts(context, drafts, depths: int) -> np.ndarray:
    """``(K, depths, n + depths − 1)`` int64 token ids, ``-1`` padded: entry ``[k, ℓ]`` is
    ``context + drafts[k, :ℓ]``, the context of the law at depth ℓ of row k (repetition penalty).

    Examples
    --------
    >>> tree_contexts([7, 8], np.array([[1, 2]]), 3)[0].tolist()
    [[7, 8, -1, -1], [7, 8, 1, -1], [7, 8, 1, 2]]
    """
    context = np.asarray(list(context), dtype=np.int64)
    k = drafts.shape[0]
    n = context.size
    out = np.full((k, depths, n + max(depths - 1, 0)), -1, dtype=np.int64)
    out[:, :, :n] = context
    for ell in range(1, depths):
        out[:, ell, n : n + ell] = drafts[:, :ell]
    return out


def tree_block_models(drafts, p, q, *, default_target=None, default_draft=None):
    """``(target, draft)`` block models over the prefixes of a draft tree: ``drafts`` (K, L) token
    ids, ``p`` (K, L+1, V) target laws along each block (``p[k, ℓ]`` after ``drafts[k, :ℓ]``), ``q``
    (K, L, V) draft laws. Prefixes off the tree go to ``default_target`` / ``default_draft``
    (callables ``prefix -> law``; None: an error naming the prefix).

    Parameters
    ----------
    drafts : numpy.ndarray
        (K, L) token ids.
    p : numpy.ndarray
        (K, L + 1, V) target laws along each block.
    q : numpy.ndarray
        (K, L, V) draft laws along each block.
    default_target, default_draft : callable, optional
        Laws of the prefixes off the tree.

    Returns
    -------
    tuple of otbound.block.models.BlockModel
        ``(target, draft)``.

    Raises
    ------
    otbound.InvalidInputError
        When a model is asked a prefix off the tree and has no default.

    Examples
    --------
    >>> drafts = np.array([[0, 1]])  # K = 1 block of L = 2 tokens over V = 2
    >>> p = np.array([[[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]])
    >>> q = np.array([[[0.6, 0.4], [0.3, 0.7]]])
    >>> target, draft = tree_block_models(drafts, p, q)
    >>> target((0, 1)).tolist(), draft((0,)).tolist()
    ([0.2, 0.8], [0.3, 0.7])
    >>> try:
    ...     target((1,))
    ... except ValueError as err:
    ...     print(err)
    target has no law for prefix [1] and no default
    """
    from otbound.block.models import tabulated_model

    length = drafts.shape[1]
    target, draft = {}, {}
    for k, block in enumerate(np.asarray(drafts).tolist()):
        for ell in range(length + 1):
            target[tuple(block[:ell])] = p[k, ell]
            if ell < length:
                draft[tuple(block[:ell])] = q[k, ell]
    v = p.shape[-1]
    return (tabulated_model(target, v, default=default_target, name="target"),
            tabulated_model(draft, v, default=default_draft, name="draft"))


def lm_block_models(pair, context, temperature, *, settings=None):
    """A loaded pair's target and draft as block models (:mod:`otbound.block.models`) at a fixed
    ``context`` (token ids): ``prefix ↦ softmax(logits(context + prefix) / T)`` in float64, or
    with ``settings = (target, draft)`` :class:`otbound.SamplingParams` each model's law under its
    own settings (a repetition penalty reads context + prefix). Each
    model runs once over the context (KV cache); every new prefix is then one cached forward over
    the last context token and the prefix, keeping only the last logits (results cached per
    prefix by :class:`~otbound.block.models.BlockModel`). On a llama.cpp pair each new prefix is
    evaluated after the longest prefix it shares with the model's last sequence
    (:meth:`~otbound.lm._llama_backend.LlamaCppModel.logits_after`). For block bounds,
    truncated-tree brackets and block verifiers on the live models.

    Parameters
    ----------
    pair : otbound.lm.ModelPair
    context : sequence of int
        Token ids before the prefixes (at least one).
    temperature : float
    settings : tuple of otbound.SamplingParams, optional
        ``(target, draft)`` settings instead of plain softmax at ``temperature``.

    Returns
    -------
    tuple of otbound.block.models.BlockModel
        ``(target, draft)``.

    Examples
    --------
    >>> from otbound import block_bound
    >>> from otbound.lm import lm_block_models, tiny_pair
    >>> pair = tiny_pair(vocab_size=4)
    >>> target, draft = lm_block_models(pair, [1, 2, 3], 1.0)
    >>> law = target((0,))
    >>> law.shape, law.dtype, round(float(law.sum()), 12)
    ((4,), dtype('float64'), 1.0)
    >>> bound = block_bound(target, draft, vocab_size=4, num_drafts=2, block_len=2, kind="causal")
    >>> 0.0 < bound.value <= 2.0  # U_causal of K = 2 blocks of L = 2 tokens at this context
    True
    """
    import torch

    from otbound.block.models import BlockModel

    context = [int(t) for t in context]
    law_of = (temperature, temperature) if settings is None else tuple(settings)

    def make(model, name, how):
        if getattr(model, "backend", None) == "llama.cpp":  # one model, one sequence: the common prefix reused

            def fn(prefix):
                logits = model.logits_after(context + list(prefix))[: pair.vocab_size]  # (V,) float32
                return laws_from_logits(logits, how, context + list(prefix))

            return BlockModel(pair.vocab_size, fn, name=name)
        layers = prefix_cache(model, context)

        def fn(prefix):
            cache = cache_prefix(model, layers, len(context) - 1, 1)
            ids = torch.tensor([context[-1:] + list(prefix)], device=pair.device)
            return laws_from_logits(
                forward(model, ids, cache=cache, keep=1)[0, -1, : pair.vocab_size].float().cpu().numpy(), how,
                context + list(prefix),
            )

        return BlockModel(pair.vocab_size, fn, name=name)

    return make(pair.target, "target", law_of[0]), make(pair.draft, "draft", law_of[1])


def _draw_blocks(pair, record, t, layers_d, k, length, dtype_name, rng):
    """Draw K blocks at continuation position t from the draft's law under the trace's draft
    settings; return (drafts (K, L), draft logits (K, L, V))."""
    import torch


    start = record.prompt_length + t - 1  # cache holds tokens[:start]; tokens[start] is fed next
    v = pair.vocab_size
    cache = cache_prefix(pair.draft, layers_d, start, k)
    feed = torch.full((k, 1), int(record.tokens[start]), device=pair.device)
    drafts = np.empty((k, length), dtype=np.int64)
    stored = []
    for ell in range(length):
        logits = _store.to_store(forward(pair.draft, feed, cache=cache)[:, -1, :v], dtype_name)
        stored.append(logits)
        sq = record.sampling_params()[1]
        ctx = tree_contexts(record.tokens[:start + 1], drafts, ell + 1)[:, ell] if sq.needs_context else None
        laws = laws_from_logits(logits, sq, ctx)
        if ell == 0:  # all K rows share the prefix: K i.i.d. draws from one law
            drafts[:, 0] = sample_drafts(laws[0], k, "with_replacement", 1, rng)[0]
        else:
            drafts[:, ell] = [sample_drafts(law, 1, "with_replacement", 1, rng)[0, 0] for law in laws]
        feed = torch.as_tensor(drafts[:, ell:ell + 1], device=pair.device)
    return drafts, np.stack(stored, axis=1)


def _target_along(pair, record, t, layers_t, drafts, dtype_name):
    import torch

    start = record.prompt_length + t - 1
    k, length = drafts.shape
    cache = cache_prefix(pair.target, layers_t, start, k)
    first = np.full((k, 1), int(record.tokens[start]))
    ids = torch.as_tensor(np.concatenate([first, drafts], axis=1), device=pair.device)
    return _store.to_store(forward(pair.target, ids, cache=cache)[:, :, : pair.vocab_size], dtype_name)


def collect_block_traces(pair, traces, out, *, num_drafts: int = 4, block_length: int = 4,
                         positions_per_trace: int = 2, seed: int = 0, logits_dtype: str = "float32",
                         progress: bool = True) -> list[Path]:
    """Draw block traces at ``positions_per_trace`` positions (uniform without replacement, fixed by
    ``seed`` and the prompt id) of every trace under ``traces`` (file or folder) into ``out``.
    Resumable like :func:`collect_traces` (``pair`` may be a callable, called only if needed;
    existing files made with other settings raise instead of being mixed in).

    Parameters
    ----------
    pair : otbound.lm.ModelPair or callable
        The models (those of the traces), or a function loading them.
    traces : str or pathlib.Path
        A trace file or folder (:func:`collect_traces`).
    out : str or pathlib.Path
        The block-trace folder.
    num_drafts : int
        K blocks per position.
    block_length : int
        L tokens per block.
    positions_per_trace : int
        Positions sampled per trace (at most its length).
    seed : int
        Seed of the positions and the drafts.
    logits_dtype : {"float32", "float16"}
    progress : bool

    Returns
    -------
    list of pathlib.Path
        One file per trace.

    Raises
    ------
    otbound.InvalidInputError
        Bad arguments, or stored block traces of another configuration.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.lm import Prompt, collect_block_traces, collect_traces, load_block_traces, tiny_pair
    >>> pair = tiny_pair()
    >>> tmp = tempfile.TemporaryDirectory()
    >>> traces, blocks = f"{tmp.name}/traces", f"{tmp.name}/blocks"
    >>> _ = collect_traces(pair, [Prompt("tiny/0", "tiny", "", (10, 7, 6, 3))], traces, max_new_tokens=3,
    ...                    progress=False)
    >>> paths = collect_block_traces(pair, traces, blocks, num_drafts=2, block_length=2, positions_per_trace=1,
    ...                              progress=False)
    >>> [p.relative_to(blocks).as_posix() for p in paths]
    ['tiny/T1/tiny_0.safetensors']
    >>> [(r.prompt_id, r.drafts.shape) for r in load_block_traces(blocks)]   # read back
    [('tiny/0', (2, 2))]
    >>> from otbound import SamplingParams
    >>> hot = next(load_block_traces(blocks, target_settings=SamplingParams(2.0)))  # the target at T = 2
    >>> hot.sampling_params()[0].temperature
    2.0
    >>> tmp.cleanup()
    """
    k = check_num_drafts(num_drafts)
    block_length = check_positive_int(block_length, "block_length")
    if logits_dtype not in _store.STORE_DTYPES:
        raise InvalidInputError(f"logits_dtype must be one of {_store.STORE_DTYPES}, got {logits_dtype!r}")
    config = {"num_drafts": k, "block_length": block_length, "positions_per_trace": int(positions_per_trace),
              "seed": int(seed), "logits_dtype": logits_dtype}

    def measure(pair, record, ts, rng, layers_d, layers_t):
        drafts, dl, tl = [], [], []
        for t in ts:
            d, q_logits = _draw_blocks(pair, record, int(t), layers_d, k, block_length, logits_dtype, rng)
            drafts.append(d)
            dl.append(q_logits)
            tl.append(_target_along(pair, record, int(t), layers_t, d, logits_dtype))
        arrays = {"drafts": np.stack(drafts).astype(np.int32), "target_logits": np.stack(tl),
                  "draft_logits": np.stack(dl)}
        return arrays, {}

    return collect_at_positions(pair, traces, out, config=config, fmt=BLOCKS_FORMAT, label="block traces",
                                positions_per_trace=positions_per_trace, seed=seed, progress=progress,
                                measure=measure)


def load_block_traces(path, *, target_settings=None):
    """Yield one :class:`BlockRecord` per sampled position of every block-trace file under ``path``.

    The laws are those of the stored settings; ``target_settings`` (a :class:`otbound.SamplingParams`)
    re-measures the target's laws at other settings without the models (the draft's cannot change:
    the blocks were drawn from its stored law).

    Parameters
    ----------
    path : str or pathlib.Path
        A block-trace file or folder.
    target_settings : otbound.SamplingParams, optional

    Yields
    ------
    BlockRecord

    Raises
    ------
    otbound.InvalidInputError
        No file or folder at ``path``, a file of another format or failing its checksums.

    Examples
    --------
    The round trip (collected, read back, the target re-measured) is the example of
    :func:`collect_block_traces`. A path holding no block traces is refused, naming it:

    >>> from otbound.lm import load_block_traces
    >>> next(load_block_traces("no/such/folder"))
    Traceback (most recent call last):
        ...
    otbound._validation.InvalidInputError: no trace file or folder at no/such/folder
    """
    for file in _files(path, BLOCKS_FORMAT):
        x, meta = _store.read(file)
        plen = int(meta["prompt_length"])
        sp, sq = record_settings(meta, meta["temperature"])
        for i, t in enumerate(x["positions"]):
            yield BlockRecord(meta["prompt_id"], meta["dataset"], float(meta["temperature"]), int(t),
                              x["tokens"][: plen + int(t)].astype(np.int64), x["drafts"][i].astype(np.int64),
                              x["target_logits"][i], x["draft_logits"][i], meta, target_settings or sp, sq)
