"""The cost model of a speculative iteration: forward times measured on the models, verification
times measured per verifier.

One iteration of shape ``b = (b_1, ..., b_L)`` (``n_d = b_1 ⋯ b_d`` nodes at depth ``d``, ``N =
Σ_d n_d``) costs

* drafting: ``Σ_{d=1..L} c_q(n_{d−1})`` (``n_0 = 1``) — one draft forward per depth over the
  current frontier with the KV cache;
* scoring: ``c_p(N + 1)`` — one target forward over the root and every node;
* verification: ``Σ_{d=1..L} P(τ ≥ d − 1) · c_V(b_d)`` — the verifier runs at depth ``d`` when
  the walk gets there;

and plain decoding costs ``c_p(1)`` per token, so the predicted speed-up is
``mean_acceptance_length · c_p(1) / (drafting + scoring + verification)``. ``c_q(n)`` / ``c_p(n)``:
forward time with ``n`` new tokens on a KV cache (a tree of ``n`` nodes costs as ``n`` new
tokens: the same matrix products, another attention mask), measured by :func:`measure_forward_costs`
on the models and device, fitted non-decreasing and interpolated piecewise linearly (extrapolated
along the last segment),
or given for hardware measured elsewhere (:meth:`CostCurve.parse`). ``c_V(m)``: the median time of
``verifier.sample`` on ``m`` drafts at the traces' vocabulary (:func:`measure_verify_costs`).

A measured curve records the machine's load while it was measured (``timing``: the 1-minute load
average before and after, the CPU count, and per size the relative spread ``(max − min) / median``
of the repeated timings); it is flagged unstable, with a warning, when a spread exceeds
:data:`UNSTABLE_SPREAD` or the load exceeds the CPU count. A stored ``cost.json`` carries its
SHA-256 and is refused when edited (:func:`load_cost`).
"""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from otbound._integrity import CorruptFileError, content_key
from otbound._validation import InvalidInputError
from otbound.lm import forward

#: a measured curve is unstable when the relative spread ``(max − min) / median`` of the repeated
#: timings of one size exceeds this (or the 1-minute load average exceeds the CPU count)
UNSTABLE_SPREAD = 0.25


class UnstableTimingWarning(UserWarning):
    """Forward times measured on a loaded machine or with a large spread between repeats."""


@dataclass
class CostCurve:
    """Seconds of one forward against the number of new tokens ``n``: points ``(sizes, seconds)``
    (medians as measured, or given), fitted by the non-decreasing least-squares sequence through
    them (``fitted``: pool-adjacent-violators; a forward over more tokens never takes less time,
    so a dip is timing noise), interpolated piecewise linearly and extrapolated along the last
    segment (the first one below).

    Examples
    --------
    >>> c = CostCurve.parse("1:0.02,8:0.021,64:0.03")
    >>> round(c(1), 4), round(c(36), 4), round(c(128), 5)
    (0.02, 0.0255, 0.04029)
    >>> CostCurve([1, 4, 16], [4.0, 3.0, 6.0]).fitted  # the dip pooled
    [3.5, 3.5, 6.0]
    """

    sizes: list
    seconds: list
    source: str = "given"
    timing: dict = field(default_factory=dict)

    def __post_init__(self):
        n = np.asarray(self.sizes, dtype=np.float64)
        s = np.asarray(self.seconds, dtype=np.float64)
        if n.ndim != 1 or n.size == 0 or n.shape != s.shape:
            raise InvalidInputError(f"a cost curve needs matching sizes and seconds, got {self.sizes}, {self.seconds}")
        if not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise InvalidInputError(f"cost curve times must be positive seconds, got {s.tolist()}")
        if np.any(n < 1) or np.any(np.diff(n) <= 0):
            raise InvalidInputError(f"cost curve sizes must be increasing token counts ≥ 1, got {n.tolist()}")
        self.sizes, self.seconds = n.tolist(), s.tolist()
        self.fitted = _non_decreasing(s).tolist()

    @classmethod
    def parse(cls, text: str, source: str = "given") -> CostCurve:
        """A curve from ``"n:seconds,n:seconds,..."`` (one point: a constant time)."""
        try:
            pts = [tuple(float(x) for x in part.split(":")) for part in str(text).split(",") if part.strip()]
            if not pts or any(len(p) != 2 for p in pts):
                raise ValueError
        except ValueError:
            raise InvalidInputError(f"cost curve must read 'n:seconds,n:seconds,...', got {text!r}") from None
        pts.sort()
        return cls([p[0] for p in pts], [p[1] for p in pts], source)

    def __call__(self, n) -> float:
        x, y = np.asarray(self.sizes), np.asarray(self.fitted)
        n = float(n)
        if x.size == 1:
            return float(y[0])
        if n > x[-1]:
            return float(y[-1] + max(y[-1] - y[-2], 0.0) / (x[-1] - x[-2]) * (n - x[-1]))
        if n < x[0]:
            return float(max(y[0] + (y[1] - y[0]) / (x[1] - x[0]) * (n - x[0]), 1e-12))
        return float(np.interp(n, x, y))

    def as_dict(self) -> dict:
        out = {"sizes": self.sizes, "seconds": self.seconds, "fitted": self.fitted, "source": self.source}
        return dict(out, timing=self.timing) if self.timing else out


def _non_decreasing(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit of ``y`` (pool adjacent violators, equal weights)."""
    blocks = []  # [mean, count]
    for v in np.asarray(y, dtype=np.float64):
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.concatenate([np.full(c, m) for m, c in blocks])


@dataclass
class CostModel:
    """Draft and target forward curves, verification seconds ``verify[name][m]`` and the machine.

    Examples
    --------
    >>> cm = CostModel(CostCurve([1], [0.01]), CostCurve([1, 9], [0.1, 0.1]))
    >>> round(cm.iteration_seconds((2, 1), [0.5, 0.25], None), 4)  # 2 draft + 1 target forward
    0.12
    >>> round(cm.speedup((2, 1), [0.5, 0.25], None), 4)  # 1.75 tokens per 0.12 s vs 0.1 s per token
    1.4583
    """

    draft: CostCurve
    target: CostCurve
    verify: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)

    def iteration_seconds(self, branching, levels, verifier) -> float:
        """Seconds of one iteration of ``branching`` whose levels are ``levels[ℓ−1] = P(τ ≥ ℓ)``."""
        widths = np.cumprod([1] + [int(b) for b in branching])
        drafting = sum(self.draft(w) for w in widths[:-1])
        scoring = self.target(int(widths[1:].sum()) + 1)
        reach = np.concatenate([[1.0], np.asarray(levels, dtype=np.float64)[:-1]])
        per = self.verify.get(verifier, {}) if verifier is not None else {}
        verification = float(sum(r * per.get(int(b), 0.0) for r, b in zip(reach, branching, strict=True)))
        return drafting + scoring + verification

    def speedup(self, branching, levels, verifier) -> float:
        """Predicted speed-up over plain decoding (module docstring)."""
        mal = 1.0 + float(np.sum(levels))
        return mal * self.target(1) / self.iteration_seconds(branching, levels, verifier)

    def as_dict(self) -> dict:
        return {"draft": self.draft.as_dict(), "target": self.target.as_dict(),
                "verify": {n: {str(m): s for m, s in d.items()} for n, d in self.verify.items()},
                "machine": self.machine}


def machine_description(device=None) -> dict:
    """Where costs were measured: platform, processor, CPU count, torch and the device's name."""
    out = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
           "cpus": os.cpu_count(), "python": platform.python_version(),
           "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        import torch

        out["torch"] = torch.__version__
        if device is not None and str(device).startswith("cuda"):
            out["device"] = torch.cuda.get_device_name(torch.device(device))
        else:
            out["device"] = str(device or "cpu")
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return out


def timing_stability(times_per_size, load_before, load_after, cpus) -> dict:
    """The ``timing`` record of a measured curve (module docstring): loads, CPU count, the relative
    spread ``(max − min) / median`` per size, and ``unstable`` (the reason, or ``None``).

    Examples
    --------
    >>> t = timing_stability([[1.0, 1.1, 1.0], [2.0, 3.0, 2.0]], 0.5, 0.7, 4)
    >>> t["relative_spread"], t["unstable"]
    ([0.1, 0.5], 'the repeated timings spread by up to 50% of their median (above 25%)')
    >>> timing_stability([[1.0, 1.0]], 9.0, 1.0, 4)["unstable"]
    'the load average reached 9.00 on 4 CPUs'
    """
    spread = [float((max(t) - min(t)) / np.median(t)) for t in times_per_size]
    load = max(load_before, load_after)
    reasons = []
    if spread and max(spread) > UNSTABLE_SPREAD:
        reasons.append(f"the repeated timings spread by up to {max(spread):.0%} of their median "
                       f"(above {UNSTABLE_SPREAD:.0%})")
    if load > cpus:
        reasons.append(f"the load average reached {load:.2f} on {cpus} CPUs")
    return {"load_before": float(load_before), "load_after": float(load_after), "cpus": int(cpus),
            "relative_spread": [round(s, 6) for s in spread], "unstable": "; ".join(reasons) or None}


def load_cost(path) -> tuple[CostCurve, CostCurve, dict]:
    """The draft and target curves and the machine of a ``cost.json`` written by ``python -m
    otbound.plan --device`` (its ``sha256`` checked, and each curve's stored ``fitted`` against
    the fit of its ``seconds``).

    Raises
    ------
    InvalidInputError
        An unreadable file or one without the fields of a cost model.
    otbound._integrity.CorruptFileError
        A checksum that does not match, or a ``fitted`` field that disagrees with its ``seconds``
        (the file was edited).
    """
    try:
        stored = json.loads(Path(path).read_text())
        digest = stored.pop("sha256", None)
        curves = [CostCurve(stored[k]["sizes"], stored[k]["seconds"], stored[k].get("source", "stored"),
                            stored[k].get("timing", {})) for k in ("draft", "target")]
        fitted = [stored[k].get("fitted") for k in ("draft", "target")]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(f"{path}: not a readable cost.json ({exc})") from None
    if digest is None:
        raise CorruptFileError(f"{path}: no sha256 field (a cost.json is written by --device; give curves measured "
                               "elsewhere with --draft-cost and --target-cost)")
    if digest != content_key(stored):
        raise CorruptFileError(f"{path}: checksum mismatch (the file was altered or damaged)")
    for k, c, f in zip(("draft", "target"), curves, fitted, strict=True):
        if f is None or len(f) != len(c.fitted) or not np.allclose(f, c.fitted, rtol=1e-12, atol=0.0):
            raise CorruptFileError(f"{path}: the {k} curve's fitted field {f} is not the fit of its seconds "
                                   f"{c.seconds} ({c.fitted}); the file was altered")
    return curves[0], curves[1], stored.get("machine", {})


def measure_forward_costs(model, *, vocab_size: int, device, sizes=(1, 2, 4, 8, 16, 32, 64), context: int = 128,
                          repeats: int = 5, seed: int = 0, source: str = "measured") -> CostCurve:
    """Median seconds of one forward of ``model`` (a causal LM of transformers) with ``n`` new
    tokens on a KV cache of ``context`` tokens, for each ``n`` in ``sizes``: the call the decoders
    make (:func:`otbound.lm.forward`, logits of every new token); the cache is cropped back to
    ``context`` between calls. Random token ids (the cost does not depend on them). The machine's
    load and the spread of the repeats are recorded in the curve's ``timing`` (module docstring);
    an unstable measurement warns (:class:`UnstableTimingWarning`).

    A llama.cpp model (``pair.draft`` / ``pair.target`` of a pair loaded with
    ``backend="llama.cpp"``) is timed the same way on its own kernels: ``n`` new tokens decoded on a
    KV cache of ``context`` tokens, logits of every new token, the cache truncated back between calls."""
    if getattr(model, "backend", None) == "llama.cpp":
        return _measure_llama_forward(model, vocab_size=vocab_size, sizes=sizes, context=context, repeats=repeats,
                                      seed=seed, source=source)
    import torch
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (1, context), generator=gen).to(device)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    all_times = []
    load_before = os.getloadavg()[0]
    cache = DynamicCache(config=model.config)
    forward(model, ids, cache=cache)
    for n in sizes:
        new = torch.randint(0, vocab_size, (1, int(n)), generator=gen).to(device)
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            extra = cache.get_seq_length() - context
            if extra > 0:
                cache.crop(-extra)  # back to the context
            sync()
            t0 = time.perf_counter()
            forward(model, new, cache=cache)
            sync()
            times.append(time.perf_counter() - t0)
        all_times.append(times[1:])
    return _timed_curve(sizes, all_times, load_before, source)


def _measure_llama_forward(model, *, vocab_size, sizes, context, repeats, seed, source) -> CostCurve:
    """:func:`measure_forward_costs` on a llama.cpp model (:class:`otbound.lm._llama_backend.LlamaCppModel`)."""
    rng = np.random.default_rng(seed)
    model.logits(rng.integers(0, vocab_size, context).tolist(), context - 1)  # the context, in the KV cache
    all_times = []
    load_before = os.getloadavg()[0]
    for n in sizes:
        new = rng.integers(0, vocab_size, int(n)).tolist()
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            model.truncate(context)
            t0 = time.perf_counter()
            model.extend_all(new)
            times.append(time.perf_counter() - t0)
        all_times.append(times[1:])
    return _timed_curve(sizes, all_times, load_before, source)


def _timed_curve(sizes, all_times, load_before, source) -> CostCurve:
    """The cost curve of the repeats ``all_times`` (one list per size, warm-up dropped): the median per
    size, with the machine's load and the repeats' spread in ``timing``; an unstable measurement warns."""
    timing = timing_stability(all_times, load_before, os.getloadavg()[0], os.cpu_count() or 1)
    if timing["unstable"]:
        warnings.warn(f"forward times of {source} are unstable: {timing['unstable']}; the cost model may mislead "
                      "(measure on an idle machine, or with more --cost-repeats)", UnstableTimingWarning, stacklevel=3)
    return CostCurve(list(sizes), [float(np.median(t)) for t in all_times], source, timing)


def measure_verify_costs(drafts_of, laws_at, *, repeats: int = 5, seed: int = 0) -> dict:
    """``{name: {m: seconds}}``: median time of ``VERIFIERS[name].sample(p, q, drafts)`` on one
    draft tuple of ``m`` drafts of its law, for each ``(name, ms)`` in ``drafts_of.items()``;
    ``laws_at``: a list of ``(p, q)`` positions cycled through. One untimed call first; a timed
    call over one second is not repeated."""
    from otbound.token import sample_drafts
    from otbound.token.verifiers import VERIFIERS

    rng = np.random.default_rng(seed)
    out = {}
    for name, ms in drafts_of.items():
        v = VERIFIERS[name]
        for m in ms:
            times = []
            for r in range(repeats + 1):  # the first call warms up (caches, lazy imports)
                p, q = laws_at[r % len(laws_at)]
                drafts = sample_drafts(q, m, v.sampling, 1, rng)
                t0 = time.perf_counter()
                v.sample(p, q, drafts, rng)
                times.append(time.perf_counter() - t0)
                if r > 0 and times[-1] > 1.0:
                    break
            times = times[1:]
            out.setdefault(name, {})[int(m)] = float(np.median(times))
    return out
