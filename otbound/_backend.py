"""numpy / torch interoperability: functions take either and answer in the caller's type.

Bound arithmetic is always float64 numpy; a torch input (CPU or CUDA) gets a float64 torch tensor
back on the same device.
"""

from __future__ import annotations

import numpy as np


def is_torch(x) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "detach")


def to_numpy(x):
    """Return ``(array, device)``; ``device`` is None for non-torch input."""
    if is_torch(x):
        return x.detach().to("cpu").double().numpy(), x.device
    return x, None


def wrap_like(value, device):
    """Return ``value`` (numpy array or float) as the caller's type: torch on ``device`` or numpy."""
    if device is None:
        if np.ndim(value) == 0:
            return float(value)
        return value
    import torch

    return torch.as_tensor(np.asarray(value, dtype=np.float64), device=device)
