"""Route the randomness of unmodified torch / numpy code into the kit's ``coin`` / ``draw`` (implementation).

Exact mode enumerates a verifier's choice tree through two primitives, ``coin(prob) -> bool`` and
``draw(law) -> int`` (:func:`otbound.conformance.enumerate_outcomes`). Engine code does not call
them: it draws uniforms and compares them with thresholds, samples with ``torch.multinomial``, or
takes the argmax of an exponential race. :func:`route_randomness` replaces those calls, for the
duration of a ``with`` block, by versions that answer through ``coin`` and ``draw``:

* ``torch.rand``, ``torch.rand_like``, ``Tensor.uniform_`` (its return value), numpy's
  ``random`` / ``uniform``, Python's ``random.random`` return :class:`LazyUniform` — uniforms
  that are never materialised. A comparison ``u < t`` (``<=``, ``>``, ``>=``, ``torch.lt`` …,
  either side) asks, element by element in C order, ``coin(P(u < t | what earlier comparisons of
  that element revealed))``: a uniform is known to lie in an interval ``(lo, hi]`` and
  ``P(u < t) = clip((t − lo) / (hi − lo), 0, 1)``, so a uniform compared twice (a shared uniform)
  stays exact. The result is an ordinary bool tensor / array.
* ``torch.multinomial`` (with or without replacement), ``Tensor.multinomial``,
  ``torch.distributions.Categorical.sample``, numpy's ``choice`` call ``draw`` on each row's
  normalised weights; ``torch.bernoulli`` calls ``coin`` per element.
* the exponential race ``argmax(probs / E)``, ``E`` i.i.d. Exp(1) (vLLM's ``random_sample``), is a
  draw from ``probs / Σ probs``: replace the engine's function by :func:`exponential_race` (same
  semantics, routed under the router, sampled with torch outside it).
* any other use of a routed uniform (arithmetic before the comparison, ``log``, ``.item()``,
  conversion to numpy) and the calls the router cannot express (``Tensor.exponential_``,
  ``torch.randn``, ``torch.randint``, ``torch.randperm``, ``torch.normal``, every other function of
  ``np.random`` such as ``np.random.multinomial``, every other function of Python's ``random``
  such as ``random.choices``) raise :class:`~otbound.conformance.ConformanceError` naming the call.
* a generator that was made before the block and draws inside it (a numpy ``Generator``,
  ``RandomState`` or bit generator, a ``random.Random``, a ``torch.Generator`` held by a variable of
  any calling frame or an attribute of one, and the global generators of numpy, ``random`` and
  torch) is found by its state: the states are recorded on entry and compared on exit; a change
  raises a ``ConformanceError`` naming the generator and
  the variable holding it. The error is also recorded, so that a verifier that catches it gets no
  verdict (the kit raises it again when the verifier returns). Generators held by ``coin`` and
  ``draw`` themselves (:func:`otbound.conformance.as_sampler` samples them from one) are not
  watched.

Inside the block torch runs on one intra-op thread (restored on exit): the tensors of an enumerated
instance are tiny, and waking a thread pool costs far more than such an op (measured 30 ms against
1 µs for a (1, 3, 2) softmax on a loaded 2-core machine). Under the router ``generator=`` arguments
are ignored (the randomness comes from ``coin`` / ``draw``).
The patches are process-wide for the duration of the block: do not run routed code in several
threads at once.
Code holding its own reference to a patched function (``from torch import rand`` at import time) is
not routed; engine code calling ``torch.rand(...)`` is.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np

from otbound.conformance._tree import ConformanceError, violation

_OPS = {  # name of the comparison -> (operator, is it "u below t")
    "lt": "<", "less": "<", "__lt__": "<",
    "le": "<=", "less_equal": "<=", "__le__": "<=",
    "gt": ">", "greater": ">", "__gt__": ">",
    "ge": ">=", "greater_equal": ">=", "__ge__": ">=",
}  # fmt: skip
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
#: no-op methods allowed on a routed uniform (dtype / device / layout moves)
_PASSTHROUGH = {"to", "float", "double", "half", "cpu", "cuda", "contiguous", "clone", "detach", "squeeze",
                "unsqueeze", "view", "reshape", "flatten"}  # fmt: skip

_ACTIVE: list = []


class _Router:
    """The state of one ``with route_randomness(...)`` block: the interval known for every uniform."""

    def __init__(self, coin, draw, watched=()):
        self._coin, self._draw = coin, draw
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.watched = list(watched)  # (label, state getter)
        self.states = [get() for _, get in self.watched]

    def check_generators(self, where: str) -> None:
        """Raise (and record) if a watched generator drew since the last check."""
        for i, (label, get) in enumerate(self.watched):
            if not _same_state(get(), self.states[i]):
                raise violation(
                    f"{label} drew random numbers under route_randomness (seen {where}): a generator made before "
                    "the block cannot be routed to coin / draw; draw from torch.rand / np.random.default_rng() "
                    "inside the block or from the rng it yields")

    def coin(self, prob):
        return self._coin(prob)

    def draw(self, law):
        return self._draw(law)

    def new(self, shape, low=0.0, high=1.0, kind="torch", origin="torch.rand") -> LazyUniform:
        low, high = float(low), float(high)
        if not low < high:
            raise ConformanceError(f"{origin}: a uniform needs low < high, got [{low}, {high})")
        n = int(np.prod(shape, dtype=np.int64))
        ids = np.arange(len(self.lo), len(self.lo) + n).reshape(shape)
        self.lo.extend([low] * n)
        self.hi.extend([high] * n)
        return LazyUniform(self, ids, kind, origin)

    def compare(self, ids: np.ndarray, op: str, t: np.ndarray) -> np.ndarray:
        ids, t = np.broadcast_arrays(ids, t)
        out = np.empty(ids.shape, dtype=bool)
        for pos in np.ndindex(ids.shape):
            i, x = int(ids[pos]), float(t[pos])
            if np.isnan(x):
                out[pos] = False  # as IEEE comparison with NaN
                continue
            lo, hi = self.lo[i], self.hi[i]
            below = self.coin(min(1.0, max(0.0, (x - lo) / (hi - lo))))  # u < x (= u <= x: continuous)
            if below:
                self.hi[i] = min(hi, x)
            else:
                self.lo[i] = max(lo, x)
            out[pos] = below if op in ("<", "<=") else not below
        return out

    def categorical(self, weights, origin: str) -> int:
        w = np.asarray(weights, dtype=np.float64)
        s = float(w.sum()) if np.all(np.isfinite(w)) and np.all(w >= 0) else -1.0
        if s <= 0:
            raise ConformanceError(f"{origin} got weights that are negative, not finite, or all zero")
        return int(self.draw(w / s))


class LazyUniform:
    """Uniforms drawn under :func:`route_randomness`, resolved only by comparison with thresholds.

    Supports comparisons (``<``, ``<=``, ``>``, ``>=`` and ``torch.lt`` / ``le`` / ``gt`` / ``ge``,
    with a number, a numpy array or a tensor, on either side), indexing, ``len`` / iteration,
    ``shape`` / ``size()`` / ``dim()`` / ``numel()``, ``uniform_()`` on not yet compared uniforms,
    and dtype / device moves (no-ops). Anything else raises
    :class:`~otbound.conformance.ConformanceError` naming the operation and the call that drew the
    uniform.

    Examples
    --------
    >>> import torch
    >>> from otbound.conformance import enumerate_outcomes, route_randomness
    >>> def two_thresholds(coin, draw):
    ...     with route_randomness(coin, draw):
    ...         u = torch.rand(())
    ...         return bool(u < 0.5), bool(u < 0.75)  # the same uniform: consistent answers
    >>> sorted(enumerate_outcomes(two_thresholds))
    [(0.25, (False, False)), (0.25, (False, True)), (0.5, (True, True))]
    """

    __array_ufunc__ = None  # numpy defers to the reflected comparison
    __slots__ = ("_router", "_ids", "_kind", "_origin")

    def __init__(self, router: _Router, ids: np.ndarray, kind: str, origin: str):
        self._router, self._ids, self._kind, self._origin = router, ids, kind, origin

    # -- shape --------------------------------------------------------------------------------
    @property
    def shape(self):
        if self._kind == "torch":
            import torch

            return torch.Size(self._ids.shape)
        return self._ids.shape

    def size(self, dim=None):
        return self.shape if dim is None else self._ids.shape[dim]

    def dim(self) -> int:
        return self._ids.ndim

    ndim = property(dim)

    def numel(self) -> int:
        return int(self._ids.size)

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index):
        return LazyUniform(self._router, self._ids[_np_index(index)], self._kind, self._origin)

    def uniform_(self, *args, **kwargs):
        fresh = all(
            (self._router.lo[i], self._router.hi[i]) == (0.0, 1.0) for i in np.asarray(self._ids).ravel().tolist()
        )
        if not fresh or args or set(kwargs) - {"generator"}:
            raise ConformanceError(
                f"uniform_() on routed uniforms from {self._origin} that were already compared, or with a range: "
                "cannot be routed"
            )
        return self

    def __getattr__(self, name):
        if name in _PASSTHROUGH:
            return lambda *a, **k: self
        if name.startswith("__"):  # protocol probes (numpy's __array_interface__, …): absent, as usual
            raise AttributeError(name)
        raise self._unroutable(f".{name}")

    # -- comparisons --------------------------------------------------------------------------
    def _compare(self, op: str, other):
        if isinstance(other, LazyUniform):
            raise self._unroutable(f"a comparison of two routed uniforms ({op})")
        torch_out, t, device = _threshold(other)
        out = self._router.compare(self._ids, op, t)
        if torch_out or self._kind == "torch":
            import torch

            return torch.from_numpy(out).to(device) if device is not None else torch.from_numpy(out)
        return out if out.ndim else bool(out)

    def __lt__(self, other):
        return self._compare("<", other)

    def __le__(self, other):
        return self._compare("<=", other)

    def __gt__(self, other):
        return self._compare(">", other)

    def __ge__(self, other):
        return self._compare(">=", other)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        lazy = [a for a in args if isinstance(a, LazyUniform)]
        if name in _OPS and len(args) == 2 and not kwargs:
            a, b = args
            if isinstance(a, LazyUniform):
                return a._compare(_OPS[name], b)
            return b._compare(_FLIP[_OPS[name]], a)
        if name in _PASSTHROUGH and isinstance(args[0], LazyUniform):
            return args[0]
        raise lazy[0]._unroutable(f"torch.{name}" if not name.startswith("__") else name)

    def _unroutable(self, what: str) -> ConformanceError:
        return violation(
            f"{what} was applied to a uniform drawn by {self._origin} under route_randomness before any comparison "
            "with a threshold; only u < t, u <= t, u > t, u >= t can be routed to coin (compare the uniform "
            "itself, e.g. write u * a < b as u < b / a, or route the draw with draw())"
        )

    def __repr__(self) -> str:
        return f"LazyUniform(shape={tuple(self._ids.shape)}, from {self._origin})"

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        raise self._unroutable("==")

    def __ne__(self, other):
        raise self._unroutable("!=")


def _refuse(what):
    def op(self, *args, **kwargs):
        raise self._unroutable(what)

    return op


for _name, _what in {
    "__add__": "+", "__radd__": "+", "__sub__": "-", "__rsub__": "-", "__mul__": "*", "__rmul__": "*",
    "__truediv__": "/", "__rtruediv__": "/", "__floordiv__": "//", "__rfloordiv__": "//", "__pow__": "**",
    "__rpow__": "**", "__neg__": "unary -", "__abs__": "abs()", "__float__": "float()", "__int__": "int()",
    "__index__": "index()", "__bool__": "bool()", "__array__": "numpy conversion", "__mod__": "%",
    "__matmul__": "@", "__rmatmul__": "@",
}.items():  # fmt: skip
    setattr(LazyUniform, _name, _refuse(_what))


def _np_index(index):
    def conv(i):
        if hasattr(i, "detach"):  # a tensor index
            return i.detach().cpu().numpy()
        return i

    return tuple(conv(i) for i in index) if isinstance(index, tuple) else conv(index)


def _threshold(other):
    """``(is it a tensor, float64 array, its device)`` of a comparison's other side."""
    if hasattr(other, "detach") and hasattr(other, "device"):
        dev = other.device
        return True, other.detach().cpu().double().numpy(), (dev if dev.type != "cpu" else None)
    try:
        return False, np.asarray(other, dtype=np.float64), None
    except (TypeError, ValueError):
        raise ConformanceError(f"a routed uniform was compared with {type(other).__name__}, not a number") from None


def _router(origin: str) -> _Router:
    if not _ACTIVE:
        raise ConformanceError(f"{origin} was called outside route_randomness")
    return _ACTIVE[-1]


def _shape(size) -> tuple:
    if len(size) == 1 and not isinstance(size[0], (int, np.integer)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _weights_rows(weights, origin):
    w = weights.detach().cpu().double().numpy() if hasattr(weights, "detach") else np.asarray(weights, float)
    if w.ndim not in (1, 2):
        raise ConformanceError(f"{origin} needs 1-D or 2-D weights, got shape {w.shape}")
    return w


def _multinomial(weights, num_samples, replacement=False, *, generator=None, out=None):
    import torch

    origin = "torch.multinomial"
    r = _router(origin)
    if out is not None:
        raise ConformanceError("torch.multinomial(out=...) cannot be routed")
    w = _weights_rows(weights, origin)
    rows = w.reshape(-1, w.shape[-1])
    res = np.empty((rows.shape[0], int(num_samples)), dtype=np.int64)
    for i, row in enumerate(rows):
        row = row.copy()
        if not replacement and num_samples > np.count_nonzero(row > 0):
            raise ConformanceError(f"torch.multinomial: {num_samples} samples without replacement from "
                                   f"{np.count_nonzero(row > 0)} tokens of positive weight")  # fmt: skip
        for j in range(int(num_samples)):
            res[i, j] = r.categorical(row, origin)
            if not replacement:
                row[res[i, j]] = 0.0
    res = res.reshape(w.shape[:-1] + (int(num_samples),))
    dev = weights.device if hasattr(weights, "device") else None
    return torch.from_numpy(res).to(dev) if dev is not None else torch.from_numpy(res)


def _categorical_sample(self, sample_shape=()):
    import torch

    origin = "torch.distributions.Categorical.sample"
    r = _router(origin)
    probs = self.probs.detach().cpu().double().numpy()
    rows = probs.reshape(-1, probs.shape[-1])
    n = int(np.prod(tuple(sample_shape), dtype=np.int64))
    res = np.array([[r.categorical(row, origin) for row in rows] for _ in range(n)], dtype=np.int64)
    return torch.from_numpy(res.reshape(tuple(sample_shape) + probs.shape[:-1])).to(self.probs.device)


def _bernoulli(input, p=None, *, generator=None, out=None):
    import torch

    r = _router("torch.bernoulli")
    probs = input if p is None or not isinstance(p, (int, float)) else torch.full_like(input, float(p))
    pr = probs.detach().cpu().double().numpy()
    res = np.array([r.coin(float(x)) for x in pr.ravel()], dtype=bool).reshape(pr.shape)
    return torch.from_numpy(res).to(dtype=input.dtype, device=input.device)


def exponential_race(probs, generators=None, use_fp64_gumbel: bool = False, *, dim: int = -1):
    """``argmax(probs / E, dim)`` with ``E`` i.i.d. Exp(1): a draw from ``probs`` normalised along ``dim``.

    The exponential race (Gumbel-max in another form) is how vLLM's ``random_sample`` samples from
    ``probs``: ``q = torch.empty_like(probs).exponential_(); probs.div(q).argmax(dim=-1)``. Under
    :func:`route_randomness` this drop-in replacement calls ``draw`` once per row (the exact law of
    the race), outside it samples the race with torch. The signature is that of vLLM's
    ``random_sample(probs, generators[, use_fp64_gumbel])``, so it can replace it as is (e.g. with
    ``unittest.mock.patch`` of ``vllm.v1.sample.ops.topk_topp_sampler.random_sample``).

    Parameters
    ----------
    probs : torch.Tensor (..., V)
        Non-negative weights, each row with positive sum.
    generators : dict, optional
        vLLM's per-request generators ``row -> torch.Generator``: ignored under the router, used
        outside it.
    use_fp64_gumbel : bool
        Outside the router: draw the exponentials in float64 (vLLM's option); the exact law under
        the router does not depend on it.
    dim : int
        The vocabulary dimension (only ``-1`` / the last is supported).

    Returns
    -------
    torch.Tensor (...,) int64
        The sampled index of every row.

    Examples
    --------
    >>> import torch
    >>> from otbound.conformance import enumerate_outcomes, exponential_race, route_randomness
    >>> def sample(coin, draw):
    ...     with route_randomness(coin, draw):
    ...         return int(exponential_race(torch.tensor([[0.25, 0.0, 0.75]])))
    >>> sorted(enumerate_outcomes(sample))
    [(0.25, 0), (0.75, 2)]
    """
    import torch

    if dim not in (-1, probs.dim() - 1):
        raise ConformanceError("exponential_race supports the last dimension only")
    if _ACTIVE:
        r = _ACTIVE[-1]
        w = probs.detach().cpu().double().numpy()
        rows = w.reshape(-1, w.shape[-1])
        res = np.array([r.categorical(row, "exponential_race") for row in rows], dtype=np.int64)
        return torch.from_numpy(res.reshape(w.shape[:-1])).to(probs.device)
    q = torch.empty_like(probs, dtype=torch.float64 if use_fp64_gumbel else probs.dtype).exponential_()
    if generators:
        for i, g in generators.items():
            q[i].exponential_(generator=g)
    return probs.div(q).argmax(dim=-1)


class RoutedGenerator:
    """A numpy-``Generator``-like object whose draws go through ``coin`` / ``draw``.

    Yielded by :func:`route_randomness` (``with route_randomness(coin, draw) as rng``), to hand to
    code that takes a numpy ``rng``: ``random`` / ``uniform`` return :class:`LazyUniform`,
    ``choice`` (with ``p=``, with or without replacement) and ``integers`` call ``draw``. Other
    methods raise :class:`~otbound.conformance.ConformanceError`.

    Examples
    --------
    >>> from otbound.conformance import enumerate_outcomes, route_randomness
    >>> def pick(coin, draw):
    ...     with route_randomness(coin, draw) as rng:
    ...         return int(rng.choice(3, p=[0.5, 0.0, 0.5]))
    >>> sorted(enumerate_outcomes(pick))
    [(0.5, 0), (0.5, 2)]
    """

    def __init__(self, router: _Router):
        self._r = router

    def random(self, size=None, dtype=np.float64, out=None):
        return self._r.new(() if size is None else np.atleast_1d(size).tolist(), kind="numpy", origin="rng.random")

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._r.new(() if size is None else np.atleast_1d(size).tolist(), low, high, "numpy", "rng.uniform")

    def choice(self, a, size=None, replace=True, p=None, axis=0, shuffle=True):
        pool = np.arange(a) if isinstance(a, (int, np.integer)) else np.asarray(a)
        w = np.full(len(pool), 1.0 / len(pool)) if p is None else np.array(p, dtype=np.float64)
        n = 1 if size is None else int(np.prod(size))
        picks = []
        for _ in range(n):
            j = self._r.categorical(w, "rng.choice")
            picks.append(j)
            if not replace:
                w = w.copy()
                w[j] = 0.0
        out = pool[np.array(picks)]
        return out[0] if size is None else out.reshape(size)

    def integers(self, low, high=None, size=None, endpoint=False):
        lo, hi = (0, low) if high is None else (low, high)
        hi = hi + 1 if endpoint else hi
        return self.choice(np.arange(lo, hi), size=size)

    def __getattr__(self, name):
        raise violation(f"rng.{name} cannot be routed to coin / draw (routed: random, uniform, choice, integers)")


def _unroutable_call(name: str):
    def fn(*args, **kwargs):
        raise violation(
            f"{name} was called under route_randomness: it cannot be routed to coin / draw"
            + (" (an exponential race: replace the argmax of probs / E with otbound.conformance.exponential_race)"
               if "exponential" in name else "")  # fmt: skip
        )

    return fn


#: ``np.random`` functions routed (the rest of its random functions raise under the router)
_NP_ROUTED = {"random", "random_sample", "sample", "ranf", "rand", "uniform", "choice", "default_rng"}
#: ``np.random`` names that draw nothing (classes, state handling)
_NP_INERT = {"seed", "get_state", "set_state", "get_bit_generator", "set_bit_generator", "bit_generator", "mtrand"}
#: Python ``random`` functions routed (the rest of its module-level random functions raise)
_PY_ROUTED = {"random", "uniform"}
_PY_INERT = {"seed", "getstate", "setstate"}


def _same_state(a, b) -> bool:
    if hasattr(a, "shape") and hasattr(a, "dtype"):  # a torch ByteTensor state
        return bool(a.shape == b.shape and (a == b).all())
    return a == b if not isinstance(a, dict) else _same_dict(a, b)


def _same_dict(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            if not isinstance(y, dict) or not _same_dict(x, y):
                return False
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


def _generator_types() -> tuple:
    torch = __import__("sys").modules.get("torch")
    extra = (torch.Generator,) if torch is not None else ()
    return (np.random.Generator, np.random.RandomState, np.random.BitGenerator, random.Random) + extra


def _state_getter(obj):
    """``(kind, getter of its state)`` of a random generator object, else None."""
    if isinstance(obj, np.random.Generator):
        return f"a numpy Generator ({type(obj.bit_generator).__name__})", lambda: obj.bit_generator.state
    if isinstance(obj, np.random.RandomState):
        return "a numpy RandomState", lambda: obj.get_state(legacy=False)
    if isinstance(obj, np.random.BitGenerator):
        return f"a numpy {type(obj).__name__} bit generator", lambda: obj.state
    if isinstance(obj, random.Random):
        return "a random.Random", obj.getstate
    torch = __import__("sys").modules.get("torch")
    if torch is not None and isinstance(obj, torch.Generator):
        return "a torch.Generator", obj.get_state
    return None


def _held_by(*fns) -> set:
    """ids of the generators the functions hold (closure cells, bound ``__self__`` and its attributes)."""
    types = _generator_types()
    out = set()
    for fn in fns:
        inner = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if c.cell_contents is not None]
        owner = getattr(fn, "__self__", None)
        inner += [owner, *getattr(owner, "__dict__", {}).values()] if owner is not None else []
        out |= {id(x) for x in inner if isinstance(x, types)}
    return out


def _watched_generators(frame, exclude=frozenset()) -> list:
    """The generators reachable from the calling frames (their variables, the attributes of those,
    their modules' globals) and the global ones, as ``(label, state getter)``; not those whose id
    is in ``exclude``."""
    seen: dict = {}
    types = _generator_types()

    def add(obj, where):
        if not isinstance(obj, types) or id(obj) in seen or id(obj) in exclude:
            return
        got = _state_getter(obj)
        if got is not None:
            seen[id(obj)] = (f"{got[0]} ({where})", got[1])

    add(np.random.mtrand._rand, "numpy's global generator, behind np.random.*")
    add(random._inst, "Python's global generator, behind random.*")
    torch = __import__("sys").modules.get("torch")
    if torch is not None:
        add(torch.default_generator, "torch's default generator")
    done_globals = set()
    while frame is not None:
        code = frame.f_code.co_name
        for name, value in list(frame.f_locals.items()):
            add(value, f"variable {name!r} of {code}()")
            try:  # the instance's own attributes, without running its __getattr__
                attrs = object.__getattribute__(value, "__dict__")
            except Exception:  # noqa: BLE001 — no __dict__ (slots, C objects)
                attrs = None
            if isinstance(attrs, dict) and not isinstance(value, type):
                for attr, inner in list(attrs.items())[:64]:
                    add(inner, f"{name}.{attr} in {code}()")
        g = frame.f_globals
        if id(g) not in done_globals:
            done_globals.add(id(g))
            for name, value in list(g.items()):
                add(value, f"global {name!r} of {g.get('__name__', '?')}")
        frame = frame.f_back
    return list(seen.values())


@contextlib.contextmanager
def route_randomness(coin, draw):
    """Route torch / numpy randomness of unmodified code into ``coin`` / ``draw`` for a ``with`` block.

    Enter it inside an exact-mode verifier ``verify(..., coin, draw)`` around the third-party call;
    the kit then enumerates every branch of that code exactly. Routed: ``torch.rand``,
    ``torch.rand_like``, ``Tensor.uniform_`` (lazy uniforms, resolved by comparisons with
    thresholds through ``coin``), ``torch.multinomial`` / ``Tensor.multinomial`` /
    ``Categorical.sample`` (through ``draw``), ``torch.bernoulli`` (``coin``), numpy's global
    ``np.random.random`` / ``rand`` / ``uniform`` / ``choice``, ``np.random.default_rng()`` (returns the
    routed generator), Python's ``random.random`` (EAGLE's ``evaluate_posterior`` draws its uniforms
    there), and the yielded
    :class:`RoutedGenerator` for code that takes a numpy ``rng``. The exponential race has the
    drop-in replacement :func:`exponential_race`. ``Tensor.exponential_``, ``torch.randn``,
    ``randint``, ``randperm``, ``normal`` raise a :class:`~otbound.conformance.ConformanceError`, as
    does any arithmetic on a routed uniform before its comparison (see :mod:`._routing`).

    Parameters
    ----------
    coin, draw : callable
        The kit's primitives (``coin(prob) -> bool``, ``draw(law) -> int``), e.g. those exact mode
        passes to the verifier, or those of :func:`otbound.conformance.as_sampler`.

    Yields
    ------
    RoutedGenerator
        A numpy-Generator-like object drawing through ``coin`` / ``draw``.

    Raises
    ------
    ConformanceError
        When routed code uses a uniform in a way that cannot be routed, or calls an unroutable
        random function; when routers are nested.

    Examples
    --------
    Speculative sampling written the way engines write it — ``torch.rand`` compared with the ratio,
    ``torch.multinomial`` for the residual — checked exactly, unmodified:

    >>> import numpy as np, torch
    >>> import otbound.conformance as oc
    >>> def engine_verify(p, q, x):  # third-party code: p, q (V,) tensors, x the draft token
    ...     if torch.rand(()) <= p[x] / q[x]:
    ...         return x
    ...     r = torch.clamp(p - q, min=0)
    ...     return int(torch.multinomial(r / r.sum(), 1))
    >>> def verify(p, q, drafts, coin, draw):
    ...     with oc.route_randomness(coin, draw):
    ...         return engine_verify(torch.tensor(p), torch.tensor(q), int(drafts[0]))
    >>> oc.check_token_verifier(verify, vocab_size=3, num_drafts=1, instances=6).passed
    True
    """
    if _ACTIVE:
        raise ConformanceError("route_randomness blocks cannot be nested")
    import sys

    import torch
    import torch.distributions

    r = _Router(coin, draw, _watched_generators(sys._getframe(2), exclude=_held_by(coin, draw)))

    def rand(*size, **kwargs):
        return r.new(_shape(size), origin="torch.rand")

    def rand_like(t, **kwargs):
        return r.new(tuple(t.shape), origin="torch.rand_like")

    def uniform_(self, a=0.0, b=1.0, *, generator=None):
        self.fill_(float("nan"))  # the tensor itself is never a sample: use the returned uniforms
        return r.new(tuple(self.shape), a, b, origin="Tensor.uniform_")

    def np_random(size=None):
        return r.new(() if size is None else np.atleast_1d(size).tolist(), kind="numpy", origin="np.random.random")

    def np_rand(*size):
        return r.new(tuple(int(s) for s in size), kind="numpy", origin="np.random.rand")

    def py_random():
        return r.new((), kind="numpy", origin="random.random")

    gen = RoutedGenerator(r)
    patches = [
        (torch, "rand", rand),
        (torch, "rand_like", rand_like),
        (torch.Tensor, "uniform_", uniform_),
        (torch, "multinomial", _multinomial),
        (torch.Tensor, "multinomial", _multinomial),
        (torch, "bernoulli", _bernoulli),
        (torch.Tensor, "bernoulli", _bernoulli),
        (torch.distributions.Categorical, "sample", _categorical_sample),
        (np.random, "random", np_random),
        (np.random, "random_sample", np_random),
        (np.random, "sample", np_random),
        (np.random, "ranf", np_random),
        (np.random, "rand", np_rand),
        (np.random, "uniform", gen.uniform),
        (np.random, "choice", gen.choice),
        (np.random, "default_rng", lambda *a, **k: gen),
        (random, "random", py_random),
        (random, "uniform", lambda a, b: r.new((), min(a, b), max(a, b), "numpy", "random.uniform")),
    ]
    for name in sorted(set(getattr(np.random, "__all__", ())) - _NP_ROUTED - _NP_INERT):
        if callable(getattr(np.random, name, None)) and not isinstance(getattr(np.random, name), type):
            patches.append((np.random, name, _unroutable_call(f"np.random.{name}")))
    for name in dir(random):
        fn = getattr(random, name)
        if (not name.startswith("_") and name not in _PY_ROUTED | _PY_INERT
                and getattr(fn, "__self__", None) is random._inst):
            patches.append((random, name, _unroutable_call(f"random.{name}")))
    for name in ("randn", "randn_like", "randint", "randint_like", "randperm", "normal", "poisson"):
        patches.append((torch, name, _unroutable_call(f"torch.{name}")))
    for name in ("exponential_", "normal_", "random_", "geometric_", "cauchy_", "log_normal_", "bernoulli_"):
        patches.append((torch.Tensor, name, _unroutable_call(f"Tensor.{name}")))
    _missing = object()
    saved = [(obj, name, obj.__dict__.get(name, _missing)) for obj, name, _ in patches]
    threads = torch.get_num_threads()
    _ACTIVE.append(r)
    try:
        torch.set_num_threads(1)  # the enumerated laws are tiny: intra-op threads cost ~1000x a small op
        for obj, name, fn in patches:
            setattr(obj, name, fn)
        yield gen
        r.check_generators("at the end of the block")
    finally:
        torch.set_num_threads(threads)
        for obj, name, fn in saved:
            if fn is _missing:  # inherited (torch.Tensor's C methods): drop the override
                delattr(obj, name)
            else:
                setattr(obj, name, fn)
        _ACTIVE.pop()


__all__ = ["LazyUniform", "RoutedGenerator", "exponential_race", "route_randomness"]
