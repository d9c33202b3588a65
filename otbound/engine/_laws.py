"""Where the audit gets the models' laws: a pluggable source.

The audit needs, at a context (a list of token ids):

* the **target's post-sampling law** at the served sampling settings — the law the engine's
  verifier samples from (:meth:`LawSource.target`);
* the **draft's choice** under llama.cpp's draft-simple scheme — the draft's top token after its
  top-k 10 sampler at temperature 1, and that token's probability renormalised over the top 10,
  which ``--spec-draft-p-min`` is compared with (``common/speculative.cpp``: ``top_k = 10``,
  ``samplers = {TOP_K}``, then ``cur_p->data[0]``) (:meth:`LawSource.draft_choice`);
* the **draft's law** at the served sampling settings, for the sampled-draft alternatives the
  planner compares (:meth:`LawSource.draft`).

:class:`ServerLaws` reads them from llama.cpp servers (``n_probs`` with ``post_sampling_probs``;
with ``n_predict = 1`` no draft is ever made, so a speculative server gives the target's law with
speculation off). :class:`TinyLaws` computes them independently from the weights of a tiny GGUF
pair (:func:`otbound.lm._tiny_gguf.tiny_gguf_logits`) and llama.cpp's sampler formulas. Another
source (full logits through the bindings, stored traces) plugs in by implementing the three methods.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from otbound._validation import InvalidInputError
from otbound.engine._client import EngineError, completion
from otbound.lm import tiny_gguf_logits

#: llama.cpp's draft-simple sampler: top-k 10, nothing else (``common/speculative.cpp``)
DRAFT_TOP_K = 10
#: sent with every sampled request and every law asked for at served settings: the end-of-text
#: tokens get probability 0, so every continuation has the length asked for (the law tested is the
#: target's with end of text excluded, the same on both sides)
IGNORE_EOS = {"ignore_eos": True}
#: seeds tried for one law (module docstring of :class:`ServerLaws`)
_SEED_TRIES = 32


@dataclass(frozen=True)
class Sampling:
    """Sampling settings sent with every request (llama.cpp's ``/completion`` parameters).

    ``params`` holds only what is set; the server's defaults (llama.cpp: top-k 40, top-p 0.95,
    min-p 0.05, repetition penalty 1.0, temperature 0.8) apply to the rest.

    Examples
    --------
    >>> from otbound.engine import Sampling
    >>> Sampling.named("qwen").params
    {'temperature': 0.7, 'top_k': 20, 'top_p': 0.8, 'repeat_penalty': 1.05}
    >>> Sampling.named("default", temperature=1.0).params
    {'temperature': 1.0}
    """

    name: str
    params: dict = field(default_factory=dict)

    @staticmethod
    def named(name: str, temperature: float | None = None) -> Sampling:
        presets = {
            # llama.cpp's default sampler chain at temperature T
            "default": {},
            # Qwen's recommended settings for its instruct models
            "qwen": {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repeat_penalty": 1.05},
            # the synthetic audit's: a support of four tokens, so that every law is enumerated exactly
            "topk4": {"temperature": 1.0, "top_k": 4, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0},
        }
        if name not in presets:
            raise InvalidInputError(f"unknown sampling preset {name!r}; expected one of {', '.join(presets)}")
        params = dict(presets[name])
        if temperature is not None:
            if not (np.isfinite(temperature) and temperature > 0):
                raise InvalidInputError(f"temperature must be positive, got {temperature}")
            params["temperature"] = float(temperature)
        label = name if temperature is None or name != "default" else f"default T={temperature:g}"
        return Sampling(label, params)

    def key(self) -> tuple:
        return tuple(sorted(self.params.items()))


class LawSource:
    """The interface of a law source (module docstring): subclasses implement :meth:`target`,
    :meth:`draft` and :meth:`draft_choice`.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.engine import LawSource
    >>> class Uniform(LawSource):
    ...     name = "uniform over 4 tokens"
    ...     def target(self, context, sampling, n):
    ...         return np.arange(4)[:n], np.full(4, 0.25)[:n]
    >>> Uniform().target([1, 2], None, 2), Uniform().describe()
    ((array([0, 1]), array([0.25, 0.25])), {'source': 'uniform over 4 tokens'})
    """

    name = "abstract"

    def target(self, context, sampling: Sampling, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, probs)``: the target's post-sampling law at ``context``, its ``n`` most likely tokens."""
        raise NotImplementedError

    def draft(self, context, sampling: Sampling, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, probs)``: the draft's post-sampling law at ``context`` (``n`` most likely tokens)."""
        raise NotImplementedError

    def draft_choice(self, context) -> tuple[int, float]:
        """``(token, p)``: draft-simple's drafted token at ``context`` and its top-10 probability."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"source": self.name}


def _probs_of(reply: dict) -> tuple[np.ndarray, np.ndarray]:
    entries = reply.get("completion_probabilities") or []
    if not entries:
        raise EngineError("the server returned no probabilities (n_probs with post_sampling_probs unsupported?)")
    top = entries[0].get("top_probs")
    if top is None:
        raise EngineError("the server's probabilities have no 'top_probs' (not a llama.cpp server?)")
    ids = np.array([int(t["id"]) for t in top], dtype=np.int64)
    probs = np.array([float(t["prob"]) for t in top], dtype=np.float64)
    return ids, probs


class ServerLaws(LawSource):
    """Laws read from llama.cpp servers: ``target_url`` serves the target, ``draft_url`` the draft as its
    main model (either may be None where its laws are not needed). Each context is asked once.

    Examples
    --------
    >>> from otbound.engine import EngineError, Sampling, ServerLaws
    >>> laws = ServerLaws("http://127.0.0.1:9")
    >>> try:
    ...     laws.target([1, 2, 3], Sampling.named("qwen"), n=20)
    ... except EngineError:
    ...     print("no server at", laws.target_url)
    no server at http://127.0.0.1:9
    """

    name = "llama-server n_probs (post_sampling_probs)"

    def __init__(self, target_url: str | None, draft_url: str | None = None, timeout: float = 120.0):
        self.target_url, self.draft_url, self.timeout = target_url, draft_url, timeout
        self._cache: dict = {}
        self.queries = 0

    def _ask(self, url: str | None, role: str, context, params: dict, n: int):
        if url is None:
            raise InvalidInputError(f"the {role}'s laws are needed but no {role} server is given")
        key = (role, tuple(int(t) for t in context), json.dumps(params, sort_keys=True), int(n))
        if key not in self._cache:
            # llama-server reports no probabilities when the sampled token leaves incomplete UTF-8 text
            # (a byte of a longer character): the law does not depend on the seed, so another is tried
            for seed in range(1, _SEED_TRIES + 1):
                body = {"prompt": [int(t) for t in context], "n_predict": 1, "n_probs": int(n),
                        "post_sampling_probs": True, "seed": seed, "cache_prompt": True, **params}
                self.queries += 1
                reply = completion(url, body, timeout=self.timeout)
                if reply.get("completion_probabilities"):
                    break
            self._cache[key] = _probs_of(reply)
        return self._cache[key]

    def target(self, context, sampling, n):
        return self._ask(self.target_url, "target", context, {**sampling.params, **IGNORE_EOS}, n)

    def draft(self, context, sampling, n):
        return self._ask(self.draft_url, "draft", context, {**sampling.params, **IGNORE_EOS}, n)

    def draft_choice(self, context):
        ids, probs = self._ask(self.draft_url, "draft", context,
                               {"samplers": ["top_k"], "top_k": DRAFT_TOP_K, "temperature": 1.0}, DRAFT_TOP_K)
        return int(ids[0]), float(probs[0])

    def describe(self):
        return {"source": self.name, "target_url": self.target_url, "draft_url": self.draft_url,
                "queries": self.queries}


def llama_sampler_law(logits, params: dict) -> np.ndarray:
    """The post-sampling law of llama.cpp's default chain for the settings it is given: top-k, then
    top-p and min-p on the softmax at temperature 1, then the temperature (llama.cpp's order:
    ``penalties; dry; top_n_sigma; top_k; typ_p; top_p; min_p; xtc; temperature``). Repetition
    penalties, DRY, typical and XTC are refused (not modelled here).

    Parameters
    ----------
    logits : array_like, shape (V,)
    params : dict
        ``temperature`` (default 0.8), ``top_k`` (40; ≤ 0 off), ``top_p`` (0.95), ``min_p`` (0.05).

    Returns
    -------
    numpy.ndarray
        (V,) float64 probabilities, zero outside the kept tokens.

    Examples
    --------
    >>> import numpy as np
    >>> from otbound.engine._laws import llama_sampler_law
    >>> law = llama_sampler_law(np.log([0.5, 0.3, 0.15, 0.05]), {"temperature": 1.0, "top_k": 2, "min_p": 0})
    >>> np.round(law, 4).tolist()
    [0.625, 0.375, 0.0, 0.0]
    """
    known = {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "samplers", "ignore_eos"}
    extra = set(params) - known
    if extra or float(params.get("repeat_penalty", 1.0)) != 1.0:
        raise InvalidInputError(f"this law source models temperature, top-k, top-p and min-p only; got {params}")
    z = np.asarray(logits, dtype=np.float64)
    samplers = params.get("samplers", ["top_k", "top_p", "min_p", "temperature"])
    keep = np.ones(z.size, dtype=bool)
    order = np.argsort(-z, kind="stable")
    if "top_k" in samplers:
        k = int(params.get("top_k", 40))
        if 0 < k < z.size:
            keep[:] = False
            keep[order[:k]] = True

    def soft(mask):
        p = np.where(mask, np.exp(z - z[mask].max()), 0.0)
        return p / p.sum()

    if "top_p" in samplers:
        top_p = float(params.get("top_p", 0.95))
        if top_p < 1.0:
            p = soft(keep)
            kept = [i for i in order if keep[i]]
            cum, cut = 0.0, len(kept)
            for j, i in enumerate(kept):
                cum += p[i]
                if cum >= top_p:
                    cut = j + 1
                    break
            keep[:] = False
            keep[kept[:cut]] = True
    if "min_p" in samplers:
        min_p = float(params.get("min_p", 0.05))
        if min_p > 0:
            p = soft(keep)
            keep &= p >= min_p * p.max()
    t = float(params.get("temperature", 0.8)) if "temperature" in samplers else 1.0
    z = z / t if t > 0 else z
    return soft(keep)


class TinyLaws(LawSource):
    """Laws computed from a tiny GGUF pair's weights (:class:`otbound.lm.TinyGGUFPair`) by an
    independent float64 forward and :func:`llama_sampler_law`: a check of what llama.cpp reports.

    Examples
    --------
    >>> import tempfile
    >>> from otbound.engine import Sampling, TinyLaws
    >>> from otbound.lm import write_tiny_gguf_pair
    >>> laws = TinyLaws(write_tiny_gguf_pair(tempfile.mkdtemp()))
    >>> ids, probs = laws.target([72, 101], Sampling.named("topk4"), n=10)
    >>> len(ids), round(float(probs.sum()), 12)
    (4, 1.0)
    >>> token, p = laws.draft_choice([72, 101])
    >>> 0.1 <= p <= 1.0
    True
    """

    name = "numpy forward of the tiny GGUF pair"

    def __init__(self, pair):
        self.pair, self._forward = pair, tiny_gguf_logits
        self._cache: dict = {}

    def _logits(self, role: str, context):
        key = (role, tuple(int(t) for t in context))
        if key not in self._cache:
            weights = self.pair.target_weights if role == "target" else self.pair.draft_weights
            self._cache[key] = self._forward(weights, self.pair.config, list(context))[-1]
        return self._cache[key]

    def _top(self, law: np.ndarray, n: int):
        order = np.argsort(-law, kind="stable")[: int(n)]
        order = order[law[order] > 0]
        return order.astype(np.int64), law[order]

    def _no_eos(self, logits):
        out = np.array(logits, dtype=np.float64)
        out[self.pair.eos_id] = -np.inf  # IGNORE_EOS: llama.cpp biases end-of-text tokens by -inf
        return out

    def target(self, context, sampling, n):
        return self._top(llama_sampler_law(self._no_eos(self._logits("target", context)), sampling.params), n)

    def draft(self, context, sampling, n):
        return self._top(llama_sampler_law(self._no_eos(self._logits("draft", context)), sampling.params), n)

    def draft_choice(self, context):
        law = llama_sampler_law(self._logits("draft", context),
                                {"samplers": ["top_k"], "top_k": DRAFT_TOP_K, "temperature": 1.0})
        i = int(np.argmax(law))
        return i, float(law[i])
