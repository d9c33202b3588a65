"""Multi-draft speculative sampling on a model pair: every verifier run as a decoder.

One *iteration* at context ``c`` (prompt + tokens generated so far):

1. **Draft** ``K`` blocks of ``L`` tokens from the draft model at temperature ``T``, decoded as one
   batch of ``K`` rows with a KV cache (one draft forward per depth). The drafts form a tree
   (rows sharing a prefix share its node); at a node with ``m`` rows through it, the ``m`` next
   tokens are one draw of the verifier's draft law with ``K = m`` from ``q(·|node)``
   (:func:`otbound.sample_drafts`): i.i.d. (``with_replacement``, and every block verifier) gives
   ``K`` i.i.d. blocks; ``without_replacement`` / ``greedy`` give ``K`` distinct first tokens
   (then each row continues alone, a single draft from ``q``) — Jeon et al. 2402.14160, Hu et al.
   2502.18779. A block verifier with its own drafting scheme (``sampling`` other than
   ``"with_replacement"``: ``univer``) sets the number of rows (``num_rows``: ``m^L`` paths for
   branching ``m = K``) and the tokens at each node (``node_drafts``: the top ``m − 1`` draft
   tokens and one residual sample), so the drafted tree is a draw of its own tree law.
2. **Score**: one target forward over the ``K`` rows ``[uncached tail of c, block_k]`` gives
   ``p(·|c, block_k[:ℓ])`` for ``ℓ = 0..L`` at every node of the tree.
3. **Verify**: a token-level verifier of :data:`otbound.VERIFIERS` runs as multi-draft *tree*
   verification (SpecInfer 2305.09781, SpecTr 2310.15141): depth by depth, the verifier is called
   at the current node with the target law, the draft law and the ``m`` drafts through the node;
   an emitted token equal to a draft moves to that child with the rows that drafted it, any other
   token is the correction and ends the iteration; past depth ``L`` a bonus token is drawn from
   ``p``. This is :class:`otbound.block.verifiers.MultiPathVerifier` on the drafted tree. A
   block verifier of :data:`otbound.BLOCK_VERIFIERS` is called once on the tree (its target and
   draft block models are the tree's laws, :func:`tree_block_models`; prefixes off the tree —
   only ``causal_optimal`` asks for them, to solve its LP — are computed by the live models,
   one target call each, counted).
4. **Advance**: the emitted tokens (``τ`` accepted drafts, then the correction or bonus token) are
   appended; both models' KV caches keep the row of an accepted draft, cropped to the accepted
   prefix, so the next iteration only feeds the uncached tail.

Losslessness: every node's verifier is lossless for its draft law, and the ``m`` next tokens at
a node are drawn from that law given everything decided above the node; by induction over the
depth the emitted sequence continued by the target is distributed as the target (tests: G-tests
of the first tokens against the teacher-forced target law). ``block_len = 0`` is plain target
sampling through the same loop (one target call per token), the speed baseline.

Laws are ``laws_from_logits(logits, T)`` (float64) of the float32 logits of the batched forwards; rows of a
node share the law of the node's first row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from otbound._validation import InvalidInputError, check_num_drafts, check_positive_int
from otbound.block.verifiers import BLOCK_VERIFIERS, BlockVerifier, MultiPathVerifier
from otbound.lm._blocks import lm_block_models, tree_block_models, tree_contexts
from otbound.lm._decode import cache_prefix, forward, require_transformers, stop_token_ids
from otbound.lm._traces import LogitLaws
from otbound.token import SamplingParams, settings_at
from otbound.token.draft_laws import inverse_cdf, sample_drafts
from otbound.token.logits import laws_from_logits
from otbound.token.verifiers import VERIFIERS, Verifier

#: largest causal LP (variables (K − 1)·V^(2L), docs/theory/block-bounds.md) causal_optimal may solve per
#: iteration (~0.3 s)
CAUSAL_OPTIMAL_MAX_CELLS = 25_000


@dataclass
class Iteration(LogitLaws):
    """One iteration of :func:`speculative_sample`.

    context_length: tokens (prompt included) before the iteration. drafts: (K, L) drafted blocks
    (``(m^L, L)`` paths for a verifier with its own tree, ``m = K``: ``univer``).
    num_accepted: τ, draft tokens accepted. token: the correction (``bonus`` False) or bonus token;
    ``emitted`` = the τ accepted tokens then ``token``; ``num_kept`` of them were appended to the
    output (fewer at ``max_new_tokens`` or after a stop token). target_calls: target forwards (1, plus live calls of a
    verifier that leaves the tree). Times in seconds. With ``keep_laws=True``, the float32 logits along the tree:
    ``target_logits`` (K, L+1, V), ``draft_logits`` (K, L, V) (``p`` / ``q``: float64 laws).

    Parameters
    ----------
    context_length : int
    drafts : numpy.ndarray
        (K, L) drafted blocks.
    num_accepted : int
        τ.
    token : int
        The correction or bonus token.
    bonus : bool
        Whether ``token`` is the bonus token (every draft token of a path accepted).
    emitted : list of int
        The τ accepted tokens then ``token``.
    num_kept : int
        Emitted tokens appended to the output.
    temperature : float
    target_calls : int
        Target forwards of the iteration.
    draft_seconds, target_seconds, verify_seconds : float
        Time spent drafting, scoring and verifying.
    target_logits, draft_logits : numpy.ndarray, optional
        With ``keep_laws=True``: (K, L + 1, V) and (K, L, V) logits along the tree.
    target_sampling, draft_sampling : otbound.SamplingParams, optional
        Settings defining ``p`` / ``q``.
    context_tokens : list of int, optional
        The context (for a repetition penalty's laws).

    Examples
    --------
    >>> from otbound.lm import speculative_sample, tiny_pair
    >>> run = speculative_sample(tiny_pair(), [1, 2, 3], num_drafts=2, block_len=2, max_new_tokens=6, seed=0,
    ...                          keep_laws=True)
    >>> it = run.iterations[0]
    >>> tau = it.num_accepted  # the accepted tokens are a prefix of some drafted row
    >>> it.context_length, it.drafts.shape, any(row[:tau].tolist() == it.emitted[:tau] for row in it.drafts)
    (3, (2, 2), True)
    >>> len(it.emitted) == it.num_accepted + 1, it.p.shape, it.q.shape
    (True, (2, 3, 12), (2, 2, 12))
    """

    context_length: int
    drafts: np.ndarray
    num_accepted: int
    token: int
    bonus: bool
    emitted: list
    num_kept: int
    temperature: float
    target_calls: int = 1
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    verify_seconds: float = 0.0
    target_logits: np.ndarray | None = field(default=None, repr=False)
    draft_logits: np.ndarray | None = field(default=None, repr=False)
    target_sampling: SamplingParams | None = None
    draft_sampling: SamplingParams | None = None
    context_tokens: list | None = field(default=None, repr=False)

    def contexts(self):
        """Token ids before every law along the tree (a repetition penalty's input), ``-1`` padded:
        ``(K, L + 1, n + L)`` rows ``context + drafts[k, :ℓ]``; None unless recorded."""
        if self.context_tokens is None:
            return None
        return tree_contexts(self.context_tokens, self.drafts, self.drafts.shape[1] + 1)

    @property
    def node_visits(self) -> list:
        """``[(depth, rows)]``: the tree nodes at which a token was verified — depth ``d`` for
        ``d ≤ min(τ, L − 1)``, ``rows`` the draft rows through the node (the accepted prefix)."""
        length = self.drafts.shape[1]
        out = []
        for depth in range(min(self.num_accepted, length - 1) + 1 if length else 0):
            rows = np.flatnonzero((self.drafts[:, :depth] == np.asarray(self.emitted[:depth])).all(axis=1))
            out.append((depth, rows))
        return out


@dataclass
class SpecSampleRun:
    """Output of :func:`speculative_sample`: ``tokens`` generated (prompt excluded), one
    :class:`Iteration` per target-verified step, and the settings (``verifier``: its name;
    ``verifier_object``: what was passed).

    Parameters
    ----------
    prompt : list of int
    tokens : list of int
        The generated tokens.
    iterations : list of Iteration
    verifier : str
        The verifier's name ("target" for plain sampling).
    sampling : str
        The draft law.
    num_drafts, block_len : int
        K and L.
    temperature : float
    seconds : float
        Wall time of the run.
    verifier_object : object, optional
        The verifier passed.
    target_sampling, draft_sampling : otbound.SamplingParams, optional
        Each model's sampling settings.

    Examples
    --------
    >>> from otbound.lm import speculative_sample, tiny_pair
    >>> run = speculative_sample(tiny_pair(), [1, 2, 3], num_drafts=2, block_len=2, max_new_tokens=6, seed=0,
    ...                          keep_laws=True)
    >>> len(run.tokens), run.verifier, run.target_calls == len(run.iterations)
    (6, 'rrs', True)
    >>> int(run.accepted.sum() + len(run.iterations)) >= len(run.tokens)  # τ + 1 tokens per iteration
    True
    >>> run.tokens_per_call == len(run.tokens) / run.target_calls, run.context(0)
    (True, [1, 2, 3])
    """

    prompt: list
    tokens: list
    iterations: list
    verifier: str
    sampling: str
    num_drafts: int
    block_len: int
    temperature: float
    seconds: float
    verifier_object: object = field(default=None, repr=False)
    target_sampling: SamplingParams | None = None
    draft_sampling: SamplingParams | None = None

    @property
    def target_calls(self) -> int:
        return sum(it.target_calls for it in self.iterations)

    @property
    def accepted(self) -> np.ndarray:
        """τ per iteration."""
        return np.array([it.num_accepted for it in self.iterations], dtype=np.int64)

    @property
    def tokens_per_call(self) -> float:
        """Generated tokens per target call (block efficiency; 1 for plain sampling)."""
        return len(self.tokens) / max(self.target_calls, 1)

    def context(self, i: int) -> list:
        """Token ids (prompt included) before iteration ``i``."""
        n = self.iterations[i].context_length - len(self.prompt)
        return list(self.prompt) + list(self.tokens[:n])


def resolve_verifier(verifier):
    """``(block_verifier, sampling, name)`` for a name in :data:`otbound.VERIFIERS` or
    :data:`otbound.BLOCK_VERIFIERS`, a token-level :class:`~otbound.Verifier` (run as tree
    verification) or a :class:`~otbound.block.verifiers.BlockVerifier` (its ``sampling``: i.i.d.
    drafts, or its own scheme). ``sampling`` names the draft law.

    Parameters
    ----------
    verifier : str or otbound.Verifier or otbound.block.verifiers.BlockVerifier

    Returns
    -------
    tuple
        ``(block_verifier, sampling, name)``; a token-level verifier comes wrapped in
        :class:`otbound.block.verifiers.MultiPathVerifier`.

    Raises
    ------
    otbound.InvalidInputError
        An unknown name or an object of another kind.

    References
    ----------
    Miao et al., SpecInfer (arXiv:2305.09781); Sun et al., SpecTr (arXiv:2310.15141): multi-draft
    tree verification by a token-level verifier at every node.

    Examples
    --------
    >>> block, sampling, name = resolve_verifier("rrs")
    >>> type(block).__name__, sampling, name
    ('MultiPathVerifier', 'with_replacement', 'rrs')
    >>> type(resolve_verifier("spectr_gbv")[0]).__name__
    'SpecTrGBV'
    >>> try:
    ...     resolve_verifier("nope")
    ... except ValueError as err:
    ...     print(str(err)[:33])
    unknown verifier 'nope'; expected
    """
    if isinstance(verifier, str):
        if verifier in VERIFIERS:
            verifier = VERIFIERS[verifier]
        elif verifier in BLOCK_VERIFIERS:
            verifier = BLOCK_VERIFIERS[verifier]
        else:
            raise InvalidInputError(
                f"unknown verifier {verifier!r}; expected one of {sorted(VERIFIERS)} (token level, run as tree "
                f"verification) or {sorted(BLOCK_VERIFIERS)} (block level)"
            )
    if isinstance(verifier, Verifier):
        return MultiPathVerifier(verifier), verifier.sampling, verifier.name
    if isinstance(verifier, BlockVerifier):
        return verifier, verifier.sampling, verifier.name
    raise InvalidInputError(f"verifier must be a registered name, a Verifier or a BlockVerifier, got {verifier!r}")


class _CachedModel:
    """One model's KV cache over a prefix of the sequence (batch 1), as per-layer (keys, values)."""

    def __init__(self, model):
        self.model, self.layers, self.length = model, None, 0
        self.device = next(model.parameters()).device

    def run(self, rows, keep: int):
        """Forward ``rows`` (copies × n ids) after the cached prefix; returns float32 logits of the
        last ``keep`` positions and the batched cache (for :meth:`keep_row`)."""
        import torch
        from transformers import DynamicCache

        copies = len(rows)
        if self.layers is None:
            cache = DynamicCache(config=self.model.config)
        else:
            cache = cache_prefix(self.model, self.layers, self.length, copies)
        logits = forward(self.model, torch.as_tensor(rows, device=self.device), cache=cache, keep=keep)
        return logits.float(), cache

    def keep_row(self, cache, row: int, length: int):
        """Keep row ``row`` of a batched cache, cropped to ``length`` positions (at most what it holds)."""
        held = cache.layers[0].keys.shape[-2]
        self.length = min(length, held)
        self.layers = [
            (lay.keys[row : row + 1, :, : self.length], lay.values[row : row + 1, :, : self.length])
            for lay in cache.layers
        ]


def _check_run_args(pair, prompt, num_drafts, block_len, temperature, max_new_tokens):
    ids = [int(t) for t in prompt]
    if not ids:
        raise InvalidInputError("prompt must hold at least one token id")
    if min(ids) < 0 or max(ids) >= pair.vocab_size:
        raise InvalidInputError(f"prompt has a token id outside the vocabulary 0..{pair.vocab_size - 1}")
    if isinstance(block_len, bool) or not isinstance(block_len, (int, np.integer)) or block_len < 0:
        raise InvalidInputError(f"block_len must be a non-negative integer, got {block_len!r}")
    k = check_num_drafts(num_drafts)
    if not (isinstance(temperature, (int, float)) and np.isfinite(temperature) and temperature > 0):
        raise InvalidInputError(f"temperature must be a positive number, got {temperature!r}")
    return ids, k, int(block_len), float(temperature), check_positive_int(max_new_tokens, "max_new_tokens")


def resolve_settings(temperature, target_settings=None, draft_settings=None):
    """``(target, draft)`` :class:`otbound.SamplingParams` of a decoder call: ``target_settings``
    (a SamplingParams, or a dict of its fields besides the temperature) at ``temperature``;
    ``draft_settings`` a SamplingParams or a dict of the draft's own values (its unset fields are
    the target's). A SamplingParams given for the target brings its own temperature, which must
    then agree with ``temperature`` unless that is left at 1.

    Examples
    --------
    >>> t, d = resolve_settings(0.7, {"top_p": 0.8}, {"temperature": 0.9})
    >>> t.describe(), d.describe()
    ('T=0.7, top-p=0.8', 'T=0.9, top-p=0.8')
    """
    if isinstance(target_settings, SamplingParams):
        if float(temperature) not in (1.0, target_settings.temperature):
            raise InvalidInputError(
                f"temperature={temperature!r} disagrees with target_settings.temperature = "
                f"{target_settings.temperature!r}; give one of them"
            )
        target = target_settings
    else:
        target = settings_at(temperature, target_settings)[0]
    if isinstance(draft_settings, SamplingParams):
        return target, draft_settings
    return target, SamplingParams.from_dict({**target.as_dict(),
                                             **{k: v for k, v in (draft_settings or {}).items() if v is not None}})


def speculative_sample(
    pair,
    prompt,
    *,
    verifier="rrs",
    num_drafts: int = 2,
    block_len: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 32,
    seed=0,
    keep_laws: bool = False,
    target_settings=None,
    draft_settings=None,
) -> SpecSampleRun:
    """Sample a continuation of ``prompt`` (token ids) from ``pair.target`` at ``temperature`` by
    multi-draft speculative decoding (module docstring): ``num_drafts`` blocks of ``block_len``
    tokens per target call, verified by ``verifier`` (a name in :data:`otbound.VERIFIERS` — tree
    verification with its draft law — or :data:`otbound.BLOCK_VERIFIERS`, or such an object).
    ``block_len = 0``: plain target sampling (``num_drafts`` and ``verifier`` unused).

    Stops after a stop token (kept) or ``max_new_tokens``. ``seed``: numpy seed of every random
    decision (drafts and verification). ``keep_laws``: keep each iteration's logits along the tree
    (for :func:`otbound.report.measure_run`; ``K(2L+1)·V·4`` bytes per iteration).

    ``target_settings`` / ``draft_settings`` (:func:`resolve_settings`): each model's sampling
    settings (top-k, top-p, min-p, repetition penalty over the context and the drafted prefix; the
    draft's own temperature). The output is distributed as the target *under its settings*; every
    verifier reads the draft's law under the draft's settings, the law the drafts were drawn from.

    Parameters
    ----------
    pair : otbound.lm.ModelPair
    prompt : sequence of int
        Token ids.
    verifier : str or otbound.Verifier or otbound.block.verifiers.BlockVerifier
        See :func:`resolve_verifier`.
    num_drafts : int
        K.
    block_len : int
        L (0: plain target sampling).
    temperature : float
    max_new_tokens : int
    seed : int or numpy seed
    keep_laws : bool
    target_settings, draft_settings : dict or otbound.SamplingParams, optional
        See :func:`resolve_settings`.

    Returns
    -------
    SpecSampleRun

    Raises
    ------
    otbound.InvalidInputError
        Bad arguments, an unknown verifier, or a ``causal_optimal`` LP too large for one iteration.

    References
    ----------
    Leviathan et al. (arXiv:2211.17192) and Chen et al. (arXiv:2302.01318), speculative sampling;
    Miao et al., SpecInfer (arXiv:2305.09781); Sun et al., SpecTr (arXiv:2310.15141); Jeon et al.
    (arXiv:2402.14160), drafts without replacement.

    Examples
    --------
    >>> from otbound.lm import speculative_sample, tiny_pair
    >>> pair = tiny_pair()
    >>> run = speculative_sample(pair, [1, 2, 3], num_drafts=2, block_len=2, max_new_tokens=6, seed=0)
    >>> len(run.tokens), run.verifier, run.tokens_per_call >= 1.0
    (6, 'rrs', True)
    >>> plain = speculative_sample(pair, [1, 2, 3], block_len=0, max_new_tokens=4)
    >>> plain.verifier, plain.target_calls, plain.tokens_per_call
    ('target', 4, 1.0)
    """
    require_transformers(pair, "speculative_sample")
    ids, k, length, temp, limit = _check_run_args(pair, prompt, num_drafts, block_len, temperature, max_new_tokens)
    sp, sq = resolve_settings(temperature, target_settings, draft_settings)
    temp = sp.temperature
    plain = sp == SamplingParams(temp) and sq == SamplingParams(temp)
    rng = np.random.default_rng(seed)
    if length == 0:
        block, k, name, sampling = None, 1, "target", "none"
        rows, node_drafts = 1, None
    else:
        block, sampling, name = resolve_verifier(verifier)
        rows = block.num_rows(k, length)
        if sampling == block.sampling:  # a block verifier's drafting scheme (K i.i.d. blocks or its own)
            def node_drafts(law, n):
                return block.node_drafts(law, n, k, rng)
        else:  # a token-level verifier's draft law at every node
            def node_drafts(law, n):
                return sample_drafts(law, n, sampling, 1, rng)[0]
    if name == "causal_optimal" and (k - 1) * pair.vocab_size ** (2 * length) > CAUSAL_OPTIMAL_MAX_CELLS:
        raise InvalidInputError(
            f"causal_optimal solves an LP with (K - 1)·V^(2L) = {(k - 1) * pair.vocab_size ** (2 * length)} variables "
            f"per iteration (over {CAUSAL_OPTIMAL_MAX_CELLS} here: too slow)"
        )
    stops = set(stop_token_ids(pair.tokenizer, pair.target))
    v = pair.vocab_size
    target, draft = _CachedModel(pair.target), _CachedModel(pair.draft)
    seq = list(ids)
    iterations = []
    t_start = time.perf_counter()
    while len(seq) - len(ids) < limit and not (len(seq) > len(ids) and seq[-1] in stops):
        n = len(seq)
        t0 = time.perf_counter()
        drafts, q_logits, d_cache = _draft(draft, seq, rows, length, node_drafts, v, sq)
        t1 = time.perf_counter()
        tail = seq[target.length :]
        p_logits, t_cache = target.run([tail + row for row in drafts.tolist()], keep=length + 1)
        p_logits = p_logits[:, :, :v].cpu().numpy()
        t2 = time.perf_counter()
        ctx = tree_contexts(seq, drafts, length + 1) if (sp.needs_context or sq.needs_context) else None
        p = laws_from_logits(p_logits, sp, ctx)
        if length == 0:
            y = int(inverse_cdf(p[0, 0], rng.random(1))[0])
            tau, emitted, calls = 0, [y], 1
        else:
            q = laws_from_logits(q_logits, sq, None if ctx is None else ctx[:, :length, : ctx.shape[2] - 1])
            live = LiveModels(pair, seq, temp, (sp, sq))
            tm, dm = tree_block_models(drafts, p, q, default_target=live.target, default_draft=live.draft)
            out = block.sample(tm, dm, drafts, rng)
            tau = int(out.num_accepted)
            emitted = out.tokens[: tau + 1].tolist()
            calls = 1 + live.target_calls
        t3 = time.perf_counter()
        row = int(np.flatnonzero((drafts[:, :tau] == np.asarray(emitted[:tau])).all(axis=1))[0]) if length else 0
        target.keep_row(t_cache, row, n + tau)
        if length:
            draft.keep_row(d_cache, row, n + tau)
        for tok in emitted:
            if len(seq) - len(ids) == limit:
                break
            seq.append(tok)
            if tok in stops:
                break
        it = Iteration(
            context_length=n,
            drafts=drafts,
            num_accepted=tau,
            token=int(emitted[-1]),
            bonus=tau == length,
            emitted=emitted,
            num_kept=len(seq) - n,
            temperature=temp,
            target_calls=calls,
            draft_seconds=t1 - t0,
            target_seconds=t2 - t1,
            verify_seconds=t3 - t2,
        )
        if not plain:
            it.target_sampling, it.draft_sampling = sp, sq
            it.context_tokens = list(seq[:n]) if ctx is not None else None
        if keep_laws:
            it.target_logits = p_logits
            it.draft_logits = q_logits
        iterations.append(it)
    return SpecSampleRun(
        ids, seq[len(ids) :], iterations, name, sampling, k, length, temp, time.perf_counter() - t_start, verifier,
        sp, sq,
    )


def _draft(model: _CachedModel, seq, k, length, node_drafts, v, settings):
    """``k`` draft rows of ``length`` tokens (module docstring, step 1), the tokens of the rows through
    a node drawn by ``node_drafts(law, rows)`` from the draft's law under ``settings``: ``(drafts
    (k, L), draft logits (k, L, V) float32 numpy, batched cache)``."""
    drafts = np.zeros((k, length), dtype=np.int64)
    if length == 0:
        return drafts, None, None
    logits = []
    cache = None
    feed = [seq[model.length :]] * k
    for depth in range(length):
        out, cache_new = model.run(feed, keep=1) if depth == 0 else _step(model, cache, drafts[:, depth - 1 : depth])
        cache = cache_new
        lg = out[:, -1, :v].cpu().numpy()
        ctx = tree_contexts(seq, drafts, depth + 1)[:, depth] if settings.needs_context else None
        laws = laws_from_logits(lg, settings, ctx)
        keys, inverse = np.unique(drafts[:, :depth], axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        for g in range(keys.shape[0]):
            rows = np.flatnonzero(inverse == g)
            lg[rows] = lg[rows[0]]  # one law per node
            drafts[rows, depth] = node_drafts(laws[rows[0]], rows.size)
        logits.append(lg)
    return drafts, np.stack(logits, axis=1), cache


def _step(model: _CachedModel, cache, ids):
    import torch

    return forward(model.model, torch.as_tensor(ids, device=model.device), cache=cache, keep=1).float(), cache


class LiveModels:
    """Block models of the live pair at ``context`` (:func:`lm_block_models`), built on first use,
    for prefixes off a drafted tree; counts the target calls.

    Parameters
    ----------
    pair : otbound.lm.ModelPair
    context : sequence of int
        Token ids before the prefixes.
    temperature : float
    settings : tuple of otbound.SamplingParams, optional
        ``(target, draft)`` settings (see :func:`lm_block_models`).

    Examples
    --------
    >>> from otbound.lm import tiny_pair
    >>> live = LiveModels(tiny_pair(), [1, 2, 3], 1.0)
    >>> live.target((4,)).shape, live.draft(()).shape, live.target_calls
    ((12,), (12,), 1)
    """

    def __init__(self, pair, context, temperature, settings=None):
        self.pair, self.context, self.temperature = pair, list(context), temperature
        self.settings = settings
        self._models = None
        self.target_calls = 0

    def models(self):
        """``(target, draft)`` block models at the context."""
        if self._models is None:
            self._models = lm_block_models(self.pair, self.context, self.temperature, settings=self.settings)
        return self._models

    def target(self, prefix):
        self.target_calls += 1
        return self.models()[0](prefix)

    def draft(self, prefix):
        return self.models()[1](prefix)
