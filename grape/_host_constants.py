"""Device tensors made from host values inside a captured function.

``torch.tensor(0.0, device="cuda")`` builds the value on the host and copies it from pageable
memory, which a capture refuses (Hugging Face builds attention-mask fill values this way), and so
do ``t.to("cuda")`` of a CPU tensor (a Hugging Face sliding-window cache moves its 0-dim window
size to the device at its first update, inside the prompt's forward) and indexing a CUDA tensor
with a list of ints or a CPU index tensor (Falcon splits its fused keys and values with
``qkv[:, :, :, [-2]]``: PyTorch builds the index on the host and copies it over, and so a Python
number assigned through such an index, which the mode makes on the device). While capturing,
:class:`PinnedHostConstants` copies such values into pinned memory and lets the graph copy them
from there: each replay copies the same value again, which is what the Python code would have
made (it does not run on a replay). A CPU tensor that reaches the capture is a constant of the
call's signature: an argument's 0-dim CPU tensor keys the signature by its value (Note [Host
scalars]), and one that f makes is what its Python code makes. The pinned tensors are kept with the
graph, so no later capture reuses their memory. The runtime enters the mode only for call
signatures whose capture was refused for such a copy (Note [Host constants] in
csrc/torch/graphs/capture.cpp).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["PinnedHostConstants"]


class PinnedHostConstants(TorchFunctionMode):
    """While entered (around a capture): ``torch.tensor(data, device=<cuda>)`` and
    ``torch.as_tensor(data, device=<cuda>)`` of Python data, ``t.to(<cuda>)`` and ``t.cuda()``
    of a pageable CPU tensor ``t`` that needs no gradient, and the host-built parts of an index
    into a CUDA tensor (``_device_index``) go through pinned host memory; ``kept`` holds those
    host tensors for the graph's lifetime."""

    def __init__(self):
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor):
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda":
                requires_grad = kwargs.pop("requires_grad", False)
                host = func(*args, **{**kwargs, "device": "cpu"})
                return self._through_pinned(host, device).requires_grad_(requires_grad)
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1 and \
                isinstance(args[0], torch.Tensor) and args[0].is_cuda:
            return func(*_indexing_on_device(args, self._through_pinned), **kwargs)
        moved = _moved_to_cuda(func, args, kwargs)
        if moved is not None:
            device, dtype, memory_format = moved
            return self._through_pinned(args[0], device, dtype=dtype, memory_format=memory_format)
        return func(*args, **kwargs)

    def _through_pinned(self, host: torch.Tensor, device, **to) -> torch.Tensor:
        """`host` on `device`, copied from a pinned copy of it that the graph keeps."""
        pinned = host.pin_memory()
        self.kept.append(pinned)
        return pinned.to(device, non_blocking=True, **to)


def _moved_to_cuda(func, args, kwargs):
    """(device, dtype, memory format) where func(*args, **kwargs) is ``t.to(...)`` or
    ``t.cuda(...)`` of a pageable CPU tensor ``t`` without gradient onto a CUDA device; else None."""
    if func not in (torch.Tensor.to, torch.Tensor.cuda) or not args:
        return None
    t = args[0]
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.requires_grad or \
            t.is_pinned():
        return None
    if func is torch.Tensor.cuda:
        device = args[1] if len(args) > 1 else kwargs.get("device")
        index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
        device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        return device, None, kwargs.get("memory_format", torch.preserve_format)
    device, dtype, _, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
    if device is None or device.type != "cuda":
        return None
    return device, dtype, memory_format or torch.preserve_format


def _indexing_on_device(args, through_pinned):
    """The arguments of ``Tensor.__getitem__`` or ``__setitem__`` on a CUDA tensor with the index's
    host-built parts moved through ``through_pinned(host, device)`` (``_device_index``), and a
    Python number assigned through an integer index made on the device: PyTorch (2.11) copies it
    from the host there, for the same value of the tensor's dtype. A number assigned through a
    boolean mask stays one: PyTorch then fills without a copy (``masked_fill_``), where a device
    value would take ``index_put_``, which synchronizes."""
    tensor, index, *value = args
    index = _device_index(index, lambda host: through_pinned(host, tensor.device))
    if value and _a_host_number(value[0]) and _integer_advanced(index):
        value = [torch.full((), value[0], dtype=tensor.dtype, device=tensor.device)]
    return (tensor, index, *value)


def _a_host_number(value) -> bool:
    """A Python number that PyTorch's assignment takes as it is (an int beyond 64 bits, which
    PyTorch refuses, is left to PyTorch)."""
    return type(value) in (bool, float) or (type(value) is int and -2**63 <= value < 2**63)


def _integer_advanced(index) -> bool:
    """Whether `index`, its host-built parts moved, indexes with an integer tensor of at least one
    dimension and with no boolean mask."""
    parts = index if isinstance(index, tuple) else (index,)
    tensors = [p for p in parts if isinstance(p, torch.Tensor) and p.dim() > 0]
    if any(t.dtype in (torch.bool, torch.uint8) for t in tensors):
        return False
    return any(not t.is_floating_point() and not t.is_complex() for t in tensors)


def _device_index(index, move):
    """`index` (of ``Tensor.__getitem__`` or ``__setitem__``) with each part that PyTorch would copy
    to the device from pageable host memory replaced by ``move(<that part as a CPU tensor>)``:
    a flat list of ints, or of bools (which index as the tensor of them would), and a pageable CPU
    tensor of integers or bools with at least one dimension. The same object where there is none,
    so that other indices (ints, slices, None, Ellipsis, device tensors, nested lists, which
    PyTorch reads as tuples) reach PyTorch as they were."""
    if isinstance(index, tuple):
        parts = tuple(_device_index(part, move) for part in index)
        return index if all(new is old for new, old in zip(parts, index)) else parts
    if isinstance(index, list) and index and (all(type(i) is int for i in index)
                                              or all(type(i) is bool for i in index)):
        return move(torch.tensor(index))
    if isinstance(index, torch.Tensor) and index.device.type == "cpu" and index.dim() > 0 and \
            not index.is_floating_point() and not index.is_complex() and not index.is_pinned():
        return move(index)
    return index
