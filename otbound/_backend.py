"""numpy / torch interoperability: functions take either and answer in the caller's type.

Bound arithmetic is always float64 numpy; a torch input (CPU or CUDA) gets a float64 torch tensor
back on the same device.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np


def is_torch(x) -> bool:
    """Whether ``x`` is a torch tensor (checked without importing torch).

    Examples
    --------
    >>> import numpy as np
    >>> from otbound._backend import is_torch
    >>> is_torch(np.zeros(2)), is_torch([0.5, 0.5])
    (False, False)
    """
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "detach")


def to_numpy(x):
    """Return ``(array, device)``: a torch tensor as a float64 numpy array on the CPU and its device;
    anything else unchanged with ``device`` None.

    Parameters
    ----------
    x : array_like or torch.Tensor

    Returns
    -------
    tuple
        ``(x as numpy float64 or as given, torch.device or None)``.

    Examples
    --------
    >>> import torch
    >>> from otbound._backend import to_numpy
    >>> to_numpy(torch.tensor([0.5, 0.5], dtype=torch.float32))
    (array([0.5, 0.5]), device(type='cpu'))
    >>> to_numpy([0.5, 0.5])
    ([0.5, 0.5], None)
    """
    if is_torch(x):
        x_cpu = x.detach().to("cpu")
        # a complex tensor stays complex, for the caller's check to refuse by name (a cast would drop it)
        return (x_cpu.numpy() if x_cpu.is_complex() else x_cpu.double().numpy()), x.device
    return x, None


def wrap_like(value, device):
    """Return ``value`` (numpy array or float) as the caller's type: torch on ``device`` or numpy.

    Parameters
    ----------
    value : float or numpy.ndarray
    device : torch.device or None
        From :func:`to_numpy`; None answers in numpy (a 0-d value as a Python float).

    Returns
    -------
    float, numpy.ndarray or torch.Tensor (float64)

    Examples
    --------
    >>> import numpy as np, torch
    >>> from otbound._backend import wrap_like
    >>> wrap_like(np.float64(0.25), None), wrap_like(np.array([0.25]), torch.device("cpu"))
    (0.25, tensor([0.2500], dtype=torch.float64))
    """
    if device is None:
        if np.ndim(value) == 0:
            return float(value)
        return value
    import torch

    return torch.as_tensor(np.asarray(value, dtype=np.float64), device=device)


_ACCELERATOR_PATHS = [False]  # set by accelerator_paths()


@contextlib.contextmanager
def accelerator_paths():
    """Inside the block, code written for an accelerator runs on CPU tensors too.

    Some computations take one path on the CPU (numpy on a row's memory, row by row) and another
    on an accelerator (batched torch); both must give the same numbers. CI has no accelerator, so
    the tests run the accelerator's paths on the CPU under this switch and compare them with the
    CPU's. Every such branch asks :func:`on_accelerator`.

    Examples
    --------
    >>> import torch
    >>> from otbound._backend import accelerator_paths, on_accelerator
    >>> x = torch.zeros(2)
    >>> with accelerator_paths():
    ...     inside = on_accelerator(x)
    >>> inside, on_accelerator(x)
    (True, False)
    """
    before = _ACCELERATOR_PATHS[0]
    _ACCELERATOR_PATHS[0] = True
    try:
        yield
    finally:
        _ACCELERATOR_PATHS[0] = before


def on_accelerator(x) -> bool:
    """Whether a torch tensor takes the accelerator's path: it is on a device other than the CPU, or
    the caller is inside :func:`accelerator_paths`.

    Examples
    --------
    >>> import torch
    >>> from otbound._backend import on_accelerator
    >>> on_accelerator(torch.zeros(2))
    False
    """
    return _ACCELERATOR_PATHS[0] or x.device.type != "cpu"


def retain_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse in this process (an explicit opt-in; the
    command line ``python -m otbound.compare`` calls it, library calls never do).

    The batched kernel's working set is a dozen (B, V) float64 arrays (≈ 20 MB each for 16 rows at
    V = 151,936), which glibc maps afresh and returns to the OS on every call: the page faults cost
    about a quarter of a measurement's CPU time. This serves allocations up to 32 MiB (glibc's
    largest threshold) from the heap instead of fresh mappings and keeps up to 1 GiB of freed heap
    (``mallopt(M_MMAP_THRESHOLD)``, ``mallopt(M_TRIM_THRESHOLD)``; what ``MALLOC_MMAP_THRESHOLD_``
    / ``MALLOC_TRIM_THRESHOLD_`` in the environment, or jemalloc, would do). The process keeps its
    peak heap. ``OTBOUND_KEEP_FREED_MEMORY=0`` in the environment makes it a no-op.

    Returns
    -------
    bool
        Whether the setting applied (False off Linux/glibc or when opted out).

    Examples
    --------
    >>> import otbound as ob
    >>> ob.retain_freed_memory() in (True, False)
    True
    """
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux") or os.environ.get("OTBOUND_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_trim_threshold, 1 << 30)) and bool(mallopt(m_mmap_threshold, 32 << 20))


@contextlib.contextmanager
def one_cpu_thread():
    """Run the enclosed torch work with one intra-op CPU thread, restoring the caller's setting after.

    The batched kernel's torch operations act on rows of about 10⁵ float64 entries: too small for
    intra-op threads to pay, and on a machine whose cores are busy the threads' hand-offs stall
    (measured on 2 cores: ``measure_laws`` 10× slower with torch's default of 2 threads than with
    one, a single-row ``optimal_acceptance`` 3–40×). The public entry points of the kernel
    (:func:`otbound.optimal_acceptance`, :class:`otbound.token.LawBatch`, the verifiers'
    ``acceptance`` and :func:`otbound.report.measure_laws`) run under it; a model's forward outside
    keeps its threads. ``torch.set_num_threads`` is process-wide: another Python thread running torch
    work meanwhile runs on one thread too. Without torch imported it does nothing.

    Examples
    --------
    >>> import torch
    >>> from otbound._backend import one_cpu_thread
    >>> before = torch.get_num_threads()
    >>> with one_cpu_thread():
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def on_one_cpu_thread(fn):
    """``fn`` run under :func:`one_cpu_thread` (a decorator for the kernel's public entry points).

    Examples
    --------
    >>> import torch
    >>> from otbound._backend import on_one_cpu_thread
    >>> on_one_cpu_thread(torch.get_num_threads)()
    1
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with one_cpu_thread():
            return fn(*args, **kwargs)

    return wrapper


def positive_counts(q, minimum=None):
    """The number of entries q > 0 along the last axis of a tensor ``q`` ≥ 0, shape ``q.shape[:-1]``:
    V where a row's smallest entry is positive (one fast reduction), counted where it is not.

    Parameters
    ----------
    q : torch.Tensor, shape (..., V)
        Non-negative entries (a negative or NaN entry is not checked here).
    minimum : torch.Tensor, shape ``q.shape[:-1]``, optional
        The rows' smallest entries if the caller has them (``q.amin(-1)``), else computed here.

    Returns
    -------
    torch.Tensor
        int64, shape ``q.shape[:-1]``, on ``q``'s device.

    Examples
    --------
    >>> import torch
    >>> from otbound._backend import positive_counts
    >>> positive_counts(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])).tolist()
    [2, 3]
    """
    import torch

    counts = torch.full(q.shape[:-1], q.shape[-1], dtype=torch.int64, device=q.device)
    if q.shape[-1] == 0 or not q.numel():
        return counts.fill_(0) if q.shape[-1] == 0 else counts
    zero = (q.amin(-1) if minimum is None else minimum) <= 0  # rows holding a zero (or a bad entry, refused elsewhere)
    if bool(zero.any()):
        counts[zero] = torch.count_nonzero(q[zero], dim=-1)
    return counts
