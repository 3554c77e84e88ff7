"""Device tensors made from Python values inside a captured function.

``torch.tensor(0.0, device="cuda")`` builds the value on the host and copies it from pageable
memory, which a capture refuses (Hugging Face builds attention-mask fill values this way). While
capturing, :class:`PinnedHostConstants` builds such tensors in pinned memory and lets the graph copy
them: each replay copies the same value again, which is what the Python code would have made (it
does not run on a replay). The pinned tensors are kept with the graph, so no later capture reuses
their memory. The runtime enters it only for call signatures whose capture was refused for such a
copy (Note [Host constants] in csrc/torch/runtime.cpp).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["PinnedHostConstants"]


class PinnedHostConstants(TorchFunctionMode):
    """While entered (around a capture): ``torch.tensor(data, device=<cuda>)`` and
    ``torch.as_tensor(data, device=<cuda>)`` of Python data go through pinned host memory;
    ``kept`` holds those host tensors for the graph's lifetime."""

    def __init__(self):
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor):
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda":
                requires_grad = kwargs.pop("requires_grad", False)
                host = func(*args, **{**kwargs, "device": "cpu"}).pin_memory()
                self.kept.append(host)
                return host.to(device, non_blocking=True).requires_grad_(requires_grad)
        return func(*args, **kwargs)
