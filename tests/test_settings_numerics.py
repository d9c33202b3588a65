"""The sampling settings at their numerical edges: overflow gives the exact law (never NaN), complex
input is refused by name at every public entry, and the cuts are decided by one stated rule that
numpy, torch and transformers' warpers agree on — exactly where the cut lands exactly."""

import warnings

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import otbound as ob
from otbound import InvalidInputError, SamplingParams, laws_from_logits


def both(s: SamplingParams, logits, context=None):
    """``(numpy law, torch law as numpy)`` of the same logits, with every warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = s.laws(np.array(logits, dtype=np.float64), context)
        b = s.laws(torch.tensor(logits, dtype=torch.float64), None if context is None else torch.tensor(context))
    return a, b.numpy()


def softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


# -- overflow: the exact law ------------------------------------------------------------------------

OVERFLOW = [
    # (settings, logits, context, the exact law by hand)
    (SamplingParams(temperature=1e-310), [-1.0, -2.0], None, [1.0, 0.0]),  # z/T = -1e310: the greedy limit
    (SamplingParams(temperature=0.5), [1e308, 0.0], None, [1.0, 0.0]),  # z/T = 2e308
    (SamplingParams(temperature=0.5), [1e308, 1e308, -1e308], None, [0.5, 0.5, 0.0]),  # tied maxima: uniform
    # T tiny and the logits as tiny: z/T = [0, -1] exactly, though a third logit overflows
    (SamplingParams(temperature=1e-310), [0.0, -1e-310, -1.0], None, list(softmax([0.0, -1.0])) + [0.0]),
    # penalty 1e308: token 0 (positive) → 1e-308 ≈ 0, token 1 → -2e308, token 2 outside the context
    (SamplingParams(repetition_penalty=1e308), [1.0, -2.0, 0.5], [0, 1],
     [softmax([0.0, 0.5])[0], 0.0, softmax([0.0, 0.5])[1]]),
    (SamplingParams(repetition_penalty=1e308), [-1.0, -2.0], [0, 1], [1.0, 0.0]),
    # z·r = -2e308 overflows, but /T = 1e308 brings it back: processed logits [-2, 0]
    (SamplingParams(temperature=1e308, repetition_penalty=1e308), [-2.0, 0.0], [0], list(softmax([-2.0, 0.0]))),
    # every processed logit overflows (-1e616/5e-324 and -5e308/5e-324): the least negative wins
    (SamplingParams(temperature=5e-324, repetition_penalty=1e308), [-1e308, -1e308, -5.0], [0, 1, 2],
     [0.0, 0.0, 1.0]),
    # with the truncations after: top-k keeps two, min-p and top-p keep both
    (SamplingParams(temperature=1e-310, top_k=2, top_p=0.9, min_p=0.1), [0.0, -1e-310, -1.0], None,
     list(softmax([0.0, -1.0])) + [0.0]),
]


@pytest.mark.parametrize("s, logits, context, expected", OVERFLOW)
def test_overflowing_settings_give_the_exact_law_in_numpy_and_torch(s, logits, context, expected):
    a, b = both(s, logits, context)
    np.testing.assert_allclose(a, expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(b, expected, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(a > 0, b > 0)


def test_overflow_through_laws_from_logits_and_batches():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(laws_from_logits([-1.0, -2.0], 1e-310), [1.0, 0.0])
        # a batch: the overflowing row scaled, the ordinary row exactly as before (bit for bit)
        rows = np.array([[1e308, 0.0, -3.0], [0.3, -0.2, 1.1]])
        law = laws_from_logits(rows, 0.5)
    np.testing.assert_array_equal(law[0], [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(law[1], softmax(rows[1] / 0.5))


# -- complex input: refused by name ----------------------------------------------------------------

P, Q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
JOINT = ob.draft_joint(Q, 2)
COMPLEX_CALLS = {
    "p": [lambda: ob.optimal_acceptance(P + 0.1j, Q, 2),
          lambda: ob.optimal_acceptance_lp(P + 0.1j, JOINT),
          lambda: ob.VERIFIERS["rrs"].acceptance(P + 0.1j, Q, 2)],
    "q": [lambda: ob.optimal_acceptance(torch.tensor(P), torch.tensor(Q) + 0.1j, 2),
          lambda: ob.relaxation_bounds(P, Q + 0.1j, 2),
          lambda: ob.draft_joint(Q + 0.1j, 2),
          lambda: ob.sample_drafts(Q + 0.1j, 2),
          lambda: ob.subset_mass(Q + 0.1j, [0], 2),
          lambda: ob.greedy_split(list(Q + 0.1j), 2),
          lambda: ob.VERIFIERS["nss"].sample(P, Q + 0.1j, 2)],
    "draft_joint": [lambda: ob.optimal_acceptance_lp(P, JOINT + 0.1j),
                    lambda: ob.optimal_acceptance_brute_force(P, JOINT + 0.1j)],
    "logits": [lambda: laws_from_logits(P + 0.1j, 1.0),
               lambda: SamplingParams(top_p=0.9).laws(P + 0.1j),
               lambda: SamplingParams().laws(torch.tensor(P) + 0.1j)],
    "law": [lambda: ob.context_free_model(P + 0.1j)],
}


def _measure_laws(p, q):
    from otbound.report import measure_laws

    return measure_laws(p, q, (2,), verifiers=["rrs"])


COMPLEX_CALLS["p"].append(lambda: _measure_laws(P[None] + 0.1j, Q[None]))
COMPLEX_CALLS["q"].append(lambda: _measure_laws(torch.tensor(P[None]), torch.tensor(Q[None]) + 0.1j))


@pytest.mark.parametrize("name, call", [(n, c) for n, calls in COMPLEX_CALLS.items() for c in calls])
def test_complex_input_is_refused_naming_the_argument(name, call):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning on the way: refused before any cast
        with pytest.raises(InvalidInputError, match=f"^{name} must hold real numbers, got complex"):
            call()


def test_every_verifier_refuses_complex_laws():
    for v in ob.VERIFIERS.values():
        with pytest.raises(InvalidInputError, match="^p must hold real numbers"):
            v.acceptance(P + 0.1j, Q, 2)
        with pytest.raises(InvalidInputError, match="^q must hold real numbers"):
            v.sample(P, Q + 0.1j, 2)


# -- the cuts: one rule, three implementations -----------------------------------------------------


def transformers_law(s: SamplingParams, logits, on_cut: bool):
    """transformers' warpers in float64 (temperature, top-k, top-p, min-p), then softmax. ``on_cut``:
    top-p and min-p lowered by 1e-12, which puts a mass on a cut on the side the stated rule gives it
    (removed at top-p, kept at min-p) whatever transformers' rounding does."""
    nudge = 1e-12 if on_cut else 0.0
    procs = LogitsProcessorList([TemperatureLogitsWarper(s.temperature)])
    if s.top_k is not None:
        procs.append(TopKLogitsWarper(top_k=s.top_k))
    if s.top_p is not None:
        procs.append(TopPLogitsWarper(top_p=max(s.top_p - nudge, 0.0)))
    if s.min_p is not None:
        procs.append(MinPLogitsWarper(min_p=max(s.min_p - nudge, 0.0)))
    z = torch.tensor(np.atleast_2d(logits), dtype=torch.float64)
    return torch.softmax(procs(torch.zeros((z.shape[0], 0), dtype=torch.long), z), -1).numpy().reshape(np.shape(logits))


# probabilities 1/2, 1/4, 1/8, 1/8: exact in binary, and so is their softmax in both libraries
DYADIC = np.log([4.0, 2.0, 1.0, 1.0])
DYADIC_CASES = [
    # top-p 0.75: the ascending masses 1/8, 1/8 sum to 1/4 = 1 − 0.75 exactly: both removed (≤)
    (SamplingParams(top_p=0.75), [2 / 3, 1 / 3, 0.0, 0.0]),
    # top-p 0.875: the cut 1/8 lands inside the tie: the lower index (2) removed first
    (SamplingParams(top_p=0.875), [4 / 7, 2 / 7, 0.0, 1 / 7]),
    # min-p 1/4: 1/8 = 1/4 · 1/2 exactly is not below it: kept (<)
    (SamplingParams(min_p=0.25), [0.5, 0.25, 0.125, 0.125]),
    # min-p 1/2: 1/4 = 1/2 · 1/2 kept, 1/8 removed
    (SamplingParams(min_p=0.5), [2 / 3, 1 / 3, 0.0, 0.0]),
    # both: top-p 0.5 removes the two 1/8 (cum 1/4 ≤ 1/2) and the 1/4 (cum 1/2 ≤ 1/2)
    (SamplingParams(top_p=0.5, min_p=0.25), [1.0, 0.0, 0.0, 0.0]),
]


def test_dyadic_masses_are_exact_in_both_libraries():
    # the cases below land exactly on their cuts only if the softmax is exact: check it is
    exact = [0.5, 0.25, 0.125, 0.125]
    np.testing.assert_array_equal(SamplingParams().laws(DYADIC), exact)
    np.testing.assert_array_equal(SamplingParams().laws(torch.tensor(DYADIC)).numpy(), exact)
    np.testing.assert_array_equal(torch.softmax(torch.tensor(DYADIC), -1).numpy(), exact)


@pytest.mark.parametrize("s, expected", DYADIC_CASES, ids=lambda x: x.describe() if hasattr(x, "describe") else "")
def test_dyadic_cut_numpy_torch_transformers_agree(s, expected):
    a, b = both(s, DYADIC)
    np.testing.assert_allclose(a, expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(b, expected, rtol=0, atol=1e-15)
    # transformers computes these exactly too: its own warpers, not nudged, give the same law
    np.testing.assert_allclose(transformers_law(s, DYADIC, on_cut=False), expected, rtol=0, atol=1e-15)


def test_decimal_cut_is_decided_as_in_exact_arithmetic():
    # 2/6 = (2/3)·(3/6) in exact arithmetic: on the min-p cut, kept — in both libraries alike
    a, b = both(SamplingParams(min_p=2 / 3), np.log(np.array([1.0, 2.0, 3.0]) / 6))
    np.testing.assert_allclose(a, [0.0, 0.4, 0.6], rtol=0, atol=1e-15)
    np.testing.assert_allclose(b, [0.0, 0.4, 0.6], rtol=0, atol=1e-15)
    # five equal tokens at top-p 0.8: the first mass 1/5 is 1 − 4/5, on the cut: removed (lowest index)
    a, b = both(SamplingParams(top_p=0.8), np.zeros(5))
    np.testing.assert_allclose(a, [0.0, 0.25, 0.25, 0.25, 0.25], rtol=0, atol=1e-15)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-15)


def crafted_instances(n, seed=0):
    """``n`` (settings, logits) whose top-p or min-p cut lands exactly on a mass, in exact
    arithmetic: integer weights w (ties common), logits log w + c (a random shift, so the rounding
    differs from instance to instance) at temperature 1, top_p = 1 − (a prefix of the ascending
    masses), min_p = w_j / max w, or both; V ≤ 16 (where transformers' sort is stable)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        v = int(rng.integers(3, 17))
        w = rng.integers(1, 7, size=v).astype(np.float64)
        logits = np.log(w) + rng.uniform(-5, 5)
        asc = np.sort(w)
        kind = rng.integers(3)
        top_p = 1.0 - asc[: rng.integers(1, v)].sum() / w.sum() if kind in (0, 2) else None
        min_p = float(rng.choice(w) / w.max()) if kind in (1, 2) else None
        yield SamplingParams(top_p=top_p, min_p=min_p), logits


def test_crafted_boundary_sweep_has_no_disagreement():
    disagree_torch = disagree_transformers = on_cut_by_rounding = 0
    n = 3000
    for s, logits in crafted_instances(n):
        a, b = both(s, logits)
        ref = transformers_law(s, logits, on_cut=True)
        disagree_torch += not (np.array_equal(a > 0, b > 0) and np.allclose(a, b, rtol=0, atol=1e-14))
        disagree_transformers += not (np.array_equal(a > 0, ref > 0) and np.allclose(a, ref, rtol=0, atol=1e-12))
        plain = transformers_law(s, logits, on_cut=False)
        on_cut_by_rounding += not np.array_equal(plain > 0, ref > 0)
    assert (disagree_torch, disagree_transformers) == (0, 0)
    # the sweep does land on cuts: there transformers' own float64 answer goes by its rounding
    assert on_cut_by_rounding > 0.01 * n


def test_the_record_laws_device_path_runs_on_the_cpu_and_agrees():
    from otbound._backend import accelerator_paths
    from otbound.report._measure import _record_laws

    rng = np.random.default_rng(5)
    logits = torch.tensor(np.log(rng.integers(1, 7, size=(2, 6, 12))), dtype=torch.float32)
    ctx = np.array([[0, 3, 5], [1, 1, -1]])

    class Record:  # the fields _record_laws reads of a trace record
        target_logits, draft_logits = logits[0], logits[1]

        def __init__(self, settings):
            self.settings = settings

        def sampling_params(self):
            return self.settings

        def contexts(self):
            return np.repeat(ctx[:1], 6, 0)

    cases = [(SamplingParams(0.7),) * 2, (SamplingParams(1e-310),) * 2,
             (SamplingParams(top_p=0.8, min_p=0.5), SamplingParams(1.3, top_k=4, repetition_penalty=1.2))]
    for settings in cases:
        cpu = _record_laws(Record(settings))
        with accelerator_paths():
            device = _record_laws(Record(settings))
        assert all(isinstance(x, np.ndarray) for x in cpu) and all(isinstance(x, torch.Tensor) for x in device)
        for x, y, s, z in zip(cpu, device, settings, (logits[0], logits[1])):
            assert not np.isnan(y.numpy()).any()
            np.testing.assert_array_equal(x > 0, y.numpy() > 0)
            np.testing.assert_allclose(y.numpy(), x, rtol=0, atol=1e-15)
            # independent of both: the rows one at a time through the numpy path
            c = np.repeat(ctx[:1], 6, 0) if s.needs_context else None
            np.testing.assert_allclose(x, s.laws(z.double().numpy(), c), rtol=0, atol=1e-15)



def test_a_bare_temperature_draws_from_the_settings_law():
    """The decoder's one sampling step at a float T draws from SamplingParams(T)'s float64 law (the
    law a stored trace defines from the same logits, computed here by the numpy path): the same
    generator stream through torch.multinomial on that law gives the same tokens."""
    from otbound.lm._decode import draw_tokens

    last = torch.randn(500, 40, generator=torch.Generator().manual_seed(3)) * 3  # (500, 40) float32
    for t in (0.6, 1.0, 1.7):
        got = draw_tokens(last, t, generator=torch.Generator().manual_seed(9))
        law = SamplingParams(t).laws(last.double().numpy())  # (500, 40) float64, the numpy path
        want = torch.multinomial(torch.from_numpy(law), 1, generator=torch.Generator().manual_seed(9)).squeeze(1)
        assert torch.equal(got, want), t


def test_decoding_at_a_temperature_that_overflows_float32_draws_the_greedy_limit():
    from otbound.lm import tiny_pair
    from otbound.lm._decode import sample_continuations

    pair = tiny_pair()
    prompts = [[1, 2, 3], [4, 5], [6]]
    conts, logits = sample_continuations(pair.target, prompts, temperature=1e-300, max_new_tokens=5,
                                         vocab_size=pair.vocab_size, generator=torch.Generator().manual_seed(0))
    for cont, rows in zip(conts, logits):
        assert len(cont) == 5
        # the law at T → 0 is one-hot on the largest logit (these rows have no tie at the top)
        top2 = torch.topk(rows, 2, dim=-1).values
        assert bool((top2[:, 0] > top2[:, 1]).all())
        assert cont == rows.argmax(-1).tolist()
