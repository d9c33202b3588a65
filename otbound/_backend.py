"""numpy / torch interoperability: functions take either and answer in the caller's type.

Bound arithmetic is always float64 numpy; a torch input (CPU or CUDA) gets a float64 torch tensor
back on the same device.
"""

from __future__ import annotations

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
        return x.detach().to("cpu").double().numpy(), x.device
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
