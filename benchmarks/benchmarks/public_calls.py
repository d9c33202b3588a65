"""Timings of otbound's public calls on the row families of ``experiments/bench_engine.py``.

* ``OptimalAcceptance``: ``otbound.optimal_acceptance(p, q, K, sampling)`` on one row, per draft law
  and K, at V = 100 (per-call overhead) and V = 151,936 (Qwen's vocabulary); ``track_x_np_sort`` is
  the same call as a multiple of one ``np.sort`` of the row's ratios p/q, both timed alternately in
  the benchmark's process (median of 7; at V = 100 each of the 7 times 50 calls and 50 sorts, as
  one sort of 100 entries takes microseconds): the budget figure, steadier across machines than seconds.
* ``MeasureLaws``: ``otbound.report.measure_laws(P, Q)`` with its default set on 4 rows; its
  ``track_x_np_sort`` is the time per position as a multiple of one ``np.sort`` of a row's ratios
  (median of 5, alternated as above).
* ``VerifierAcceptance``: a verifier's exact acceptance on one row (``otbound.VERIFIERS[name]``).

A law or verifier that the otbound being timed lacks is skipped (``NotImplementedError`` in setup),
so that the suite runs on earlier versions too. ``OTBOUND_ASV_REDUCED=1`` in the environment keeps
the LM-like family (``zipf_noise``) only: a run of two commits in minutes instead of an hour.
"""

import os
import statistics
import time

import numpy as np

REDUCED = os.environ.get("OTBOUND_ASV_REDUCED", "0") == "1"
FAMILIES = ("zipf_noise",) if REDUCED else ("zipf_noise", "peaked", "flat", "close", "far", "ties")
CALLS = ("with_replacement:2", "with_replacement:4", "without_replacement:2", "without_replacement:4",
         "greedy:2", "greedy:4", "deterministic:2", "deterministic:4")
VOCABS = (100, 151_936)


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rows(family, n, vocab, seed=0):
    """``(p, q)`` of shape (n, vocab) for a row family (the families of experiments/bench_engine.py)."""
    rng = np.random.default_rng(seed)
    shape = (n, vocab)
    if family == "zipf_noise":
        z = -1.1 * np.log(np.argsort(rng.random(shape), axis=1) + 1)
        return _softmax(z + rng.standard_normal(shape)), _softmax(z)
    if family == "peaked":
        z = rng.standard_normal(shape) * 6.0
        return _softmax(z + rng.standard_normal(shape)), _softmax(z)
    if family == "flat":
        z = rng.standard_normal(shape) * 0.3
        return _softmax(z + 0.3 * rng.standard_normal(shape)), _softmax(z)
    if family == "close":
        z = rng.standard_normal(shape) * 2.5
        return _softmax(z + 0.1 * rng.standard_normal(shape)), _softmax(z)
    if family == "far":
        return _softmax(rng.standard_normal(shape) * 2.5), _softmax(rng.standard_normal(shape) * 2.5)
    if family == "ties":
        return tuple(_softmax(np.round(rng.standard_normal(shape) * 2.5)) for _ in range(2))
    raise ValueError(f"unknown family {family!r}")


class OptimalAcceptance:
    """``optimal_acceptance`` on one row: seconds, and the multiple of ``np.sort`` of the row."""

    params = (FAMILIES, VOCABS, CALLS)
    param_names = ("family", "vocab", "call")
    timeout = 300

    def setup(self, family, vocab, call):
        import otbound

        self.law, k = call.split(":")
        self.k = int(k)
        if self.law not in otbound.DRAFT_LAWS:
            raise NotImplementedError(f"no draft law {self.law!r} in this otbound")
        self.call = otbound.optimal_acceptance
        p, q = rows(family, 1, vocab)
        self.p, self.q = p[0], q[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            self.ratio = np.where(self.q > 0, self.p / self.q, np.inf)
        self.call(self.p, self.q, self.k, self.law)  # warm-up

    def time_optimal_acceptance(self, family, vocab, call):
        self.call(self.p, self.q, self.k, self.law)

    def track_x_np_sort(self, family, vocab, call):
        reps = min(50, max(1, 5_000 // vocab))  # a short row's call and sort repeated: microseconds read steadily
        calls, sorts = [], []
        for _ in range(7):
            t0 = time.process_time()
            for _ in range(reps):
                self.call(self.p, self.q, self.k, self.law)
            t1 = time.process_time()
            for _ in range(reps):
                np.sort(self.ratio)
            calls.append(t1 - t0)
            sorts.append(time.process_time() - t1)
        return statistics.median(calls) / max(statistics.median(sorts), 1e-9)

    track_x_np_sort.unit = "x np.sort"


class MeasureLaws:
    """``measure_laws(P, Q)`` with its default set (3 draft laws × K = 2, 3, 4 and the verifiers)."""

    params = (FAMILIES[:1] if REDUCED else ("zipf_noise", "flat", "ties"), VOCABS)
    param_names = ("family", "vocab")
    timeout = 600

    def setup(self, family, vocab):
        from otbound.report import measure_laws

        self.measure = measure_laws
        self.p, self.q = rows(family, 4, vocab)
        self.measure(self.p[:1], self.q[:1])  # warm-up (torch's first import)

    def time_measure_laws(self, family, vocab):
        self.measure(self.p, self.q)

    def track_x_np_sort(self, family, vocab):
        ratio = self.p[0] / self.q[0]  # every family's q is a softmax: positive
        reps = min(50, max(1, 5_000 // vocab))  # sorts of a short row repeated, as in OptimalAcceptance
        calls, sorts = [], []
        for _ in range(5):
            t0 = time.process_time()
            self.measure(self.p, self.q)
            t1 = time.process_time()
            for _ in range(reps):
                np.sort(ratio)
            calls.append((t1 - t0) / len(self.p))
            sorts.append((time.process_time() - t1) / reps)
        return statistics.median(calls) / max(statistics.median(sorts), 1e-9)

    track_x_np_sort.unit = "x np.sort"


class VerifierAcceptance:
    """A verifier's exact acceptance on one row at K = 2 (``VERIFIERS[name].acceptance``)."""

    params = (("rrs", "spechub"), FAMILIES[:1] if REDUCED else ("zipf_noise", "flat", "ties"), VOCABS)
    param_names = ("verifier", "family", "vocab")
    timeout = 300

    def setup(self, verifier, family, vocab):
        import otbound

        if verifier not in otbound.VERIFIERS:
            raise NotImplementedError(f"no verifier {verifier!r} in this otbound")
        self.verifier = otbound.VERIFIERS[verifier]
        p, q = rows(family, 1, vocab)
        self.p, self.q = p[0], q[0]
        self.verifier.acceptance(self.p, self.q, 2)  # warm-up (torch's first import)

    def time_acceptance(self, verifier, family, vocab):
        self.verifier.acceptance(self.p, self.q, 2)
