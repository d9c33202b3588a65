"""Draft trees: the draft's top-m tree at sampled positions of a stored trace, for static trees and
certified block brackets on a real vocabulary (docs/guide/sampling-settings.md, block level).

At a few sampled positions ``t`` of a stored trace (prefix = prompt + continuation[:t], the positions
of :func:`otbound.lm.collect_block_traces` for the same ``seed``), the tree of depth ``D`` whose every
node of depth ``< D`` has as children its ``m = width`` most probable draft tokens (by the draft's
logits, ties to the lower token id; the rank is the same under any temperature, top-k and top-p) is
built, and both models' laws are recorded at every internal node, *merged*: the probabilities of
the node's ``m`` children and the rest mass ``1 − Σ`` (one cell ⊥), in float64, for every
sampling-setting variant asked for (``variants``; the forward passes are shared). That is all the
node-budget comparison reads:

* the static top-k tree of any branching ``b_1..b_L`` with ``b_ℓ ≤ m``, ``L ≤ D`` — the draft's
  top ``b`` children per node — is a subtree, and its exact bound ``U_static = Σ_{w ∈ T} p(w)``
  (:func:`otbound.block.static_tree_bound`) is a sum of stored target path probabilities
  (:meth:`DraftTreeRecord.static_tree`);
* K i.i.d. draft blocks of length ``L ≤ D``: the merged models (the first ``m' ≤ m`` children per
  node kept, the rest merged into ⊥) give a certified bracket ``lower ≤ U_causal ≤ upper``
  (:func:`otbound.block.merged_bound_bracket`), ``lower`` attained by a lossless verifier of the
  real models (:meth:`DraftTreeRecord.iid_bracket`).

The models run once over the trace's sequence (prefix KV cache); the draft then runs depth by depth
over the ``m^d`` prefixes of depth ``d`` (batched, cache repeated), the target once over the
``m^{D−1}`` deepest prefixes (its logits at every depth of them). On a llama.cpp pair
(``load_pair(..., backend="llama.cpp")``) each model walks the tree depth first instead, one token
per internal node on its parent's KV cache.

Format ``otbound-trees-1``: one safetensors file per trace at
``<out>/<dataset>/<settings folder>/<prompt id>.safetensors``, checksummed, with the trace's pair,
the variants' settings and the configuration in the metadata:

=================  ===============================  ==========================================
tensor             shape, dtype                     meaning
=================  ===============================  ==========================================
``tokens``         (prompt_length + n,) int32       the trace's sequence
``positions``      (P,) int32                       sampled continuation indices t
``children``       (P, N, m) int32                  the m children (token ids, by draft rank)
                                                    of each of the N = Σ_{d<D} m^d internal nodes
``target``         (P, S, N, m + 1) float64         target probabilities of the children, rest
``draft``          (P, S, N, m + 1) float64         draft probabilities of the children, rest
=================  ===============================  ==========================================

Nodes are numbered breadth first by their children's ranks: the node of rank digits
``(r_1, …, r_d)`` is ``Σ_{e<d} m^e + Σ_i r_i m^{d−i}``. ``S`` indexes the variants.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from otbound._validation import InvalidInputError, check_positive_int
from otbound.block import StaticTreeBound, merged_bound_bracket
from otbound.block.law_bounds import merged_tuple_law_bracket
from otbound.lm import _store
from otbound.lm._decode import cache_prefix, forward
from otbound.lm._traces import _files, backend_of, collect_at_positions, record_settings
from otbound.token import SamplingParams
from otbound.token.logits import laws_from_logits

TREES_FORMAT = "otbound-trees-1"


def _offsets(width: int, depth: int) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(width ** np.arange(depth, dtype=np.int64))])


def _node(ranks, width: int) -> int:
    d = len(ranks)
    return int(sum(width**e for e in range(d)) + sum(int(r) * width ** (d - 1 - i) for i, r in enumerate(ranks)))


def top_by_rank(logits, num: int) -> np.ndarray:
    """The ``num`` largest entries of ``logits`` (1-D) by decreasing value, ties to the lower index.

    Examples
    --------
    >>> top_by_rank(np.array([0.5, 2.0, 0.5, -1.0]), 3).tolist()
    [1, 0, 2]
    """
    x = np.asarray(logits, dtype=np.float64)
    kth = np.partition(x, x.size - num)[x.size - num]
    above = np.flatnonzero(x > kth)
    sel = np.concatenate([above, np.flatnonzero(x == kth)[: num - above.size]])
    return sel[np.lexsort((sel, -x[sel]))]


@dataclass
class DraftTreeRecord:
    """The draft's top-``width`` tree of depth ``depth`` at continuation position ``position`` of a
    trace, both models' laws merged at every internal node (module docstring).

    Parameters
    ----------
    prompt_id, dataset : str
        The trace's prompt id and dataset.
    temperature : float
        T of the trace.
    position : int
        Continuation index t of the tree.
    prefix : numpy.ndarray
        Token ids before the tree (prompt + continuation[:t]).
    children : numpy.ndarray
        int64 (N, width): the children of every internal node, by draft rank.
    target, draft : numpy.ndarray
        float64 (S, N, width + 1): each variant's probabilities of the children and the rest.
    settings : list of tuple
        ``(target, draft)`` :class:`otbound.SamplingParams` of every variant.
    meta : dict
        The stored metadata.

    Examples
    --------
    >>> import tempfile
    >>> from otbound import SamplingParams
    >>> from otbound.lm import Prompt, collect_draft_trees, collect_traces, load_draft_trees, tiny_pair
    >>> pair = tiny_pair(vocab_size=6)
    >>> tmp = tempfile.TemporaryDirectory()
    >>> traces, trees = f"{tmp.name}/traces", f"{tmp.name}/trees"
    >>> _ = collect_traces(pair, [Prompt("tiny/0", "tiny", "", (1, 2, 3))], traces, max_new_tokens=3,
    ...                    progress=False)
    >>> _ = collect_draft_trees(pair, traces, trees, width=2, depth=2, positions_per_trace=1,
    ...                         variants=[{}, {"top_k": 1}], progress=False)
    >>> rec = next(load_draft_trees(trees))
    >>> rec.children.shape, rec.target.shape, rec.num_variants
    ((3, 2), (2, 3, 3), 2)
    >>> st = rec.static_tree((2, 1))          # 2 + 2 nodes: Σ of the target's path probabilities
    >>> bool(abs(st.value - st.levels.sum()) < 1e-15), st.paths.shape
    (True, (2, 2))
    >>> b = rec.iid_bracket(num_drafts=2, block_len=2)
    >>> bool(0 <= b.lower <= b.upper <= 2)
    True
    >>> tmp.cleanup()
    """

    prompt_id: str
    dataset: str
    temperature: float
    position: int
    prefix: np.ndarray
    children: np.ndarray
    target: np.ndarray = field(repr=False)
    draft: np.ndarray = field(repr=False)
    settings: list = field(default_factory=list, repr=False)
    meta: dict = field(default_factory=dict, repr=False)

    @property
    def width(self) -> int:
        return int(self.children.shape[1])

    @property
    def depth(self) -> int:
        n, m, d, total = self.children.shape[0], self.width, 0, 0
        while total < n:
            total, d = total + m**d, d + 1
        return d

    @property
    def num_variants(self) -> int:
        return int(self.target.shape[0])

    def _variant(self, variant) -> int:
        s = int(variant)
        if not 0 <= s < self.num_variants:
            raise InvalidInputError(f"variant {variant!r} out of range: the record has {self.num_variants}")
        return s

    def _check_shape(self, width, block_len) -> tuple[int, int]:
        w = self.width if width is None else check_positive_int(width, "width")
        length = check_positive_int(block_len, "block_len")
        if w > self.width:
            raise InvalidInputError(f"width {w} exceeds the stored tree's {self.width}")
        if length > self.depth:
            raise InvalidInputError(f"block_len {length} exceeds the stored tree's depth {self.depth}")
        return w, length

    def merged_models(self, block_len: int, *, variant: int = 0, width: int | None = None):
        """``(target, draft)``: callables ``prefix of child ranks -> law over width + 1 symbols`` (the
        first ``width`` children by draft rank, then the rest ⊥), the input of
        :func:`otbound.block.merged_bound_bracket`; prefixes through ⊥ are never asked.

        Parameters
        ----------
        block_len : int
            L ≤ ``depth``.
        variant : int
            Index of the sampling-setting variant.
        width : int, optional
            Children kept per node, at most the stored width (default: all).

        Returns
        -------
        tuple of callable
        """
        s = self._variant(variant)
        w, _ = self._check_shape(width, block_len)
        m = self.width

        def merged(table):
            def law(prefix):
                row = table[s, _node(prefix, m)]
                return np.append(row[:w], row[w:].sum())

            return law

        return merged(self.target), merged(self.draft)

    def static_tree(self, branching, *, variant: int = 0) -> StaticTreeBound:
        """The static top-k tree of ``branching`` (each ``b_ℓ ≤ width``, ``L ≤ depth``) and its exact
        bound ``U_static = Σ_{w ∈ T} p(w)`` from the stored target probabilities; the same value as
        :func:`otbound.block.static_tree_bound` on the models themselves.

        Parameters
        ----------
        branching : sequence of int
            ``(b_1, …, b_L)``.
        variant : int
            Index of the sampling-setting variant (the target's law; the tree is the draft's rank).

        Returns
        -------
        otbound.block.StaticTreeBound
            ``paths`` in token ids.

        Raises
        ------
        otbound.InvalidInputError
            A branching wider than the stored width or deeper than its depth.
        """
        s = self._variant(variant)
        b = tuple(check_positive_int(x, "branching entry") for x in branching)
        if not b or max(b) > self.width or len(b) > self.depth:
            raise InvalidInputError(f"branching {b} does not fit the stored tree (width {self.width}, depth "
                                    f"{self.depth})")
        m = self.width
        levels = np.zeros(len(b))
        prob = {(): 1.0}
        for d, bd in enumerate(b):
            nxt = {}
            for ranks, pr in prob.items():
                row = self.target[s, _node(ranks, m)]
                for r in range(bd):
                    nxt[ranks + (r,)] = pr * float(row[r])
            levels[d] = sum(nxt.values())
            prob = nxt
        paths = np.array([[int(self.children[_node(ranks[:d], m), ranks[d]]) for d in range(len(b))]
                          for ranks in itertools.product(*(range(x) for x in b))], dtype=np.int64)
        return StaticTreeBound(float(levels.sum()), levels, b, paths)

    def iid_bracket(self, num_drafts: int, block_len: int, *, variant: int = 0, width: int | None = None,
                    kind: str = "causal"):
        """``lower ≤ U_kind ≤ upper`` for K i.i.d. draft blocks of ``block_len`` tokens at this
        position (:func:`otbound.block.merged_bound_bracket` on :meth:`merged_models`).

        Parameters
        ----------
        num_drafts : int
            K.
        block_len : int
            L ≤ ``depth``.
        variant : int
        width : int, optional
            Children kept per node (default: the stored width).
        kind : {"causal", "joint", "per_level"}

        Returns
        -------
        otbound.block.BlockBracket
        """
        w, length = self._check_shape(width, block_len)
        target, draft = self.merged_models(length, variant=variant, width=w)
        return merged_bound_bracket(target, draft, vocab_size=w + 1, num_drafts=num_drafts, block_len=length,
                                    kind=kind)

    def greedy_law(self, num_drafts: int, block_len: int, *, variant: int = 0, width: int | None = None) -> list:
        """The greedy block law on the merged models (symbols = child ranks, ⊥ = ``width``): rows
        ``j = 0..K−2`` the deterministic greedy chains (first token of draft rank j, then the draft's
        argmax at every depth), row K one block whose first token is drawn from ``q`` without those
        K − 1 tokens (renormalised) and whose later tokens are drawn from ``q`` — Hu et al.'s greedy
        law (2502.18779) at the first token, continued as a block. As ``(prob, rows)`` pairs.

        Raises
        ------
        otbound.InvalidInputError
            When ``K − 1 ≥ width`` (the random row needs a kept token of its own) or the draft has no
            mass outside its K − 1 most probable tokens (a truncated law with fewer than K survivors).
        """
        k = check_positive_int(num_drafts, "num_drafts")
        w, length = self._check_shape(width, block_len)
        if k - 1 >= w:
            raise InvalidInputError(f"the greedy law of K = {k} needs a width above K − 1, got {w}")
        s = self._variant(variant)
        _, draft = self.merged_models(length, variant=s, width=w)
        root = draft(())
        mass = float(root[k - 1:].sum())
        if mass <= 0:
            raise InvalidInputError(
                f"the greedy law of K = {k} needs draft mass outside the draft's {k - 1} most probable tokens; "
                f"this position's draft law has none (fewer than K tokens survive its settings)")
        fixed = [(j,) + (0,) * (length - 1) for j in range(k - 1)]
        blocks = [((x,), float(root[x]) / mass) for x in range(k - 1, w + 1) if root[x] > 0]
        for _ in range(length - 1):
            nxt = []
            for pre, pr in blocks:
                if w in pre:
                    nxt.append((pre + (w,), pr))
                    continue
                law = draft(pre)
                nxt += [(pre + (y,), pr * float(law[y])) for y in range(w + 1) if law[y] > 0]
            blocks = nxt
        return [(pr, fixed + [pre]) for pre, pr in blocks]

    def greedy_bracket(self, num_drafts: int, block_len: int, *, variant: int = 0, width: int | None = None):
        """``lower ≤ U_causal ≤ upper`` of the greedy block law (:meth:`greedy_law`;
        :func:`otbound.block.law_bounds.merged_tuple_law_bracket`), ``lower`` attained by a lossless
        verifier of the real models.

        Returns
        -------
        otbound.block.BlockBracket

        Raises
        ------
        otbound.InvalidInputError
            As :meth:`greedy_law`.
        """
        w, length = self._check_shape(width, block_len)
        target, draft = self.merged_models(length, variant=variant, width=w)
        law = self.greedy_law(num_drafts, length, variant=variant, width=w)
        return merged_tuple_law_bracket(target, draft, law, vocab_size=w + 1, block_len=length)


def _variant_settings(sp: SamplingParams, sq: SamplingParams, variants) -> list:
    out = []
    for v in variants:
        if not isinstance(v, dict):
            raise InvalidInputError(f"a variant is a dict of SamplingParams fields, got {v!r}")
        try:
            out.append((dataclasses.replace(sp, **v), dataclasses.replace(sq, **v)))
        except TypeError as err:
            raise InvalidInputError(f"variant {v!r}: {err}") from None
    return out


def _merged_row(logits, children, settings, context) -> np.ndarray:
    law = laws_from_logits(logits, settings, context if settings.needs_context else None)
    rest = np.ones(law.size, dtype=bool)
    rest[children] = False
    return np.append(law[children], law[rest].sum())


def _tree_tables(record, t, width, depth, settings_count):
    """``(start, context, children, dl, tl)`` for the tree at generated position ``t`` of a trace:
    the caches hold ``tokens[:start]`` and ``tokens[start]`` is fed first; ``children`` (n, width)
    and the merged laws ``dl``, ``tl`` (settings, n, width + 1), zero, for the n internal nodes."""
    start = record.prompt_length + t - 1
    context = [int(x) for x in record.tokens[: start + 1]]
    n = int(_offsets(width, depth)[-1])
    children = np.zeros((n, width), dtype=np.int64)
    dl = np.zeros((settings_count, n, width + 1))
    tl = np.zeros((settings_count, n, width + 1))
    return start, context, children, dl, tl


def _tree_at(pair, record, t, layers_d, layers_t, width, depth, settings):
    import torch

    start, context, children, dl, tl = _tree_tables(record, t, width, depth, len(settings))
    v, m = pair.vocab_size, width
    prefixes = [()]  # token ids of the prefixes of the current depth, node order
    for d in range(depth):
        rows = len(prefixes)
        cache = cache_prefix(pair.draft, layers_d, start, rows)
        ids = torch.as_tensor([[context[-1], *pre] for pre in prefixes], device=pair.device)  # (rows, d + 1)
        logits = forward(pair.draft, ids, cache=cache, keep=1)[:, -1, :v].float().cpu().numpy()  # (rows, V)
        first = int(_offsets(m, depth)[d])
        for i, pre in enumerate(prefixes):
            kids = top_by_rank(logits[i], m)
            children[first + i] = kids
            for s, (_, sq) in enumerate(settings):
                dl[s, first + i] = _merged_row(logits[i], kids, sq, context + list(pre))
        prefixes = [pre + (int(c),) for i, pre in enumerate(prefixes) for c in children[first + i]]
    deepest = [pre[:-1] for pre in prefixes[::m]]  # the m^{D−1} prefixes of depth D − 1, node order
    cache = cache_prefix(pair.target, layers_t, start, len(deepest))
    ids = torch.as_tensor([[context[-1], *pre] for pre in deepest], device=pair.device)  # (m^{D−1}, D)
    logits = forward(pair.target, ids, cache=cache)[:, :, :v].float().cpu().numpy()  # (m^{D−1}, D, V)
    for d in range(depth):
        first = int(_offsets(m, depth)[d])
        for i in range(m**d):
            row = i * m ** (depth - 1 - d)  # the first deepest prefix through node i of depth d
            pre = list(deepest[row][:d])
            for s, (sp, _) in enumerate(settings):
                tl[s, first + i] = _merged_row(logits[row, d], children[first + i], sp, context + pre)
    return children, tl, dl


def _tree_at_llama_cpp(pair, record, t, width, depth, settings):
    """:func:`_tree_at` on a llama.cpp pair: each model walks the tree depth first
    (:meth:`otbound.lm._llama_backend.LlamaCppModel.logits_after`, one token per internal node on the
    KV cache of its parent); the same nodes, children and merged laws."""
    start, context, children, dl, tl = _tree_tables(record, t, width, depth, len(settings))
    v, m = pair.vocab_size, width

    def walk(model, table, which, ranks, path):
        node = _node(ranks, m)
        logits = model.logits_after(context + list(path))[:v]  # (V,) float32
        if which == 1:  # the draft ranks the children
            children[node] = top_by_rank(logits, m)
        for s, laws in enumerate(settings):
            table[s, node] = _merged_row(logits, children[node], laws[which], context + list(path))
        if len(ranks) + 1 < depth:
            for r in range(m):
                walk(model, table, which, ranks + (r,), path + (int(children[node, r]),))

    walk(pair.draft, dl, 1, (), ())
    walk(pair.target, tl, 0, (), ())
    return children, tl, dl


def collect_draft_trees(pair, traces, out, *, width: int = 3, depth: int = 4, positions_per_trace: int = 2,
                        seed: int = 0, variants=({},), progress: bool = True) -> list[Path]:
    """Store the draft's top-``width`` tree of depth ``depth`` at ``positions_per_trace`` positions
    of every trace under ``traces`` (module docstring), both models' laws merged per node for every
    sampling-setting variant. Resumable like :func:`collect_block_traces` (``pair`` may be a
    callable, called only if needed; files of another configuration raise).

    Parameters
    ----------
    pair : otbound.lm.ModelPair or callable
        The models of the traces, or a function loading them.
    traces : str or pathlib.Path
        A trace file or folder (:func:`collect_traces`).
    out : str or pathlib.Path
        The draft-tree folder.
    width : int
        m, children per node (by draft rank).
    depth : int
        D, the tree's depth (the longest block length it serves).
    positions_per_trace : int
        Positions per trace (uniform without replacement; the same as :func:`collect_block_traces`'s
        for the same seed).
    seed : int
        Seed of the positions.
    variants : sequence of dict
        Sampling-setting variants: each a dict of :class:`otbound.SamplingParams` fields replacing
        those of the trace's target and draft settings (``{}``: the trace's own; ``{"top_p": 0.8,
        "top_k": 20}``: the same temperature, truncated).
    progress : bool

    Returns
    -------
    list of pathlib.Path
        One file per trace.

    Raises
    ------
    otbound.InvalidInputError
        Bad arguments (a width above the vocabulary, a variant that is no dict of settings), or
        stored trees of another configuration.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.lm import Prompt, collect_draft_trees, collect_traces, tiny_pair
    >>> pair = tiny_pair(vocab_size=6)
    >>> tmp = tempfile.TemporaryDirectory()
    >>> _ = collect_traces(pair, [Prompt("tiny/0", "tiny", "", (1, 2, 3))], f"{tmp.name}/traces",
    ...                    max_new_tokens=3, progress=False)
    >>> paths = collect_draft_trees(pair, f"{tmp.name}/traces", f"{tmp.name}/trees", width=2, depth=2,
    ...                             positions_per_trace=1, progress=False)
    >>> [p.relative_to(f"{tmp.name}/trees").as_posix() for p in paths]
    ['tiny/T1/tiny_0.safetensors']
    >>> tmp.cleanup()
    """
    width = check_positive_int(width, "width")
    depth = check_positive_int(depth, "depth")
    positions_per_trace = check_positive_int(positions_per_trace, "positions_per_trace")
    variants = list(variants)
    if not variants:
        raise InvalidInputError("variants needs at least one entry ({} is the trace's own settings)")

    def check_meta(meta):
        if width > int(meta["vocab_size"]):
            raise InvalidInputError(f"width {width} exceeds the vocabulary ({meta['vocab_size']} tokens)")

    config = {"width": width, "depth": depth, "positions_per_trace": positions_per_trace, "seed": int(seed),
              "variants": [dict(sorted(v.items())) for v in variants]}

    def measure(pair, record, ts, rng, layers_d, layers_t):
        settings = _variant_settings(*record_settings(record.meta, record.meta["temperature"]), variants)
        if backend_of(pair) == "llama.cpp":
            got = [_tree_at_llama_cpp(pair, record, int(t), width, depth, settings) for t in ts]
        else:
            got = [_tree_at(pair, record, int(t), layers_d, layers_t, width, depth, settings) for t in ts]
        arrays = {"children": np.stack([g[0] for g in got]).astype(np.int32),
                  "target": np.stack([g[1] for g in got]), "draft": np.stack([g[2] for g in got])}
        return arrays, {"variant_settings": [[a.as_dict(), b.as_dict()] for a, b in settings]}

    return collect_at_positions(pair, traces, out, config=config, fmt=TREES_FORMAT, label="draft trees",
                                positions_per_trace=positions_per_trace, seed=seed, progress=progress,
                                measure=measure, check_meta=check_meta, backends=("transformers", "llama.cpp"))


def load_draft_trees(path):
    """Yield one :class:`DraftTreeRecord` per sampled position of every draft-tree file under ``path``.

    Parameters
    ----------
    path : str or pathlib.Path
        A draft-tree file or folder (:func:`collect_draft_trees`).

    Yields
    ------
    DraftTreeRecord

    Raises
    ------
    otbound.InvalidInputError
        No file or folder at ``path``, a file of another format or failing its checksums.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.lm import Prompt, collect_draft_trees, collect_traces, load_draft_trees, tiny_pair
    >>> pair = tiny_pair(vocab_size=6)
    >>> tmp = tempfile.TemporaryDirectory()
    >>> _ = collect_traces(pair, [Prompt("tiny/0", "tiny", "", (1, 2, 3))], f"{tmp.name}/traces",
    ...                    max_new_tokens=3, progress=False)
    >>> _ = collect_draft_trees(pair, f"{tmp.name}/traces", f"{tmp.name}/trees", width=2, depth=2,
    ...                         positions_per_trace=2, progress=False)
    >>> [(r.prompt_id, r.width, r.depth) for r in load_draft_trees(f"{tmp.name}/trees")]
    [('tiny/0', 2, 2), ('tiny/0', 2, 2)]
    >>> tmp.cleanup()
    """
    for file in _files(path, TREES_FORMAT):
        x, meta = _store.read(file)
        plen = int(meta["prompt_length"])
        settings = [(SamplingParams.from_dict(a), SamplingParams.from_dict(b)) for a, b in meta["variant_settings"]]
        for i, t in enumerate(x["positions"]):
            yield DraftTreeRecord(meta["prompt_id"], meta["dataset"], float(meta["temperature"]), int(t),
                                  x["tokens"][: plen + int(t)].astype(np.int64), x["children"][i].astype(np.int64),
                                  x["target"][i], x["draft"][i], settings, meta)
