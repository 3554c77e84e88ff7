"""Device tensors made from host values inside a captured function.

``torch.tensor(0.0, device="cuda")`` builds the value on the host and copies it from pageable
memory, which a capture refuses (Hugging Face builds attention-mask fill values this way), and so
do ``t.to("cuda")`` of a CPU tensor (a Hugging Face sliding-window cache moves its 0-dim window
size to the device at its first update, inside the prompt's forward) and indexing a CUDA tensor
with a list of ints or a CPU index tensor (Falcon splits its fused keys and values with
``qkv[:, :, :, [-2]]``: PyTorch builds the index on the host and copies it over; a function mode
does not see the indexing of a plain tensor in every release, so the mode wraps ``Tensor``'s
indexing while it is entered). While capturing,
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

import threading

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["PinnedHostConstants"]


class PinnedHostConstants(TorchFunctionMode):
    """While entered (around a capture): ``torch.tensor(data, device=<cuda>)`` and
    ``torch.as_tensor(data, device=<cuda>)`` of Python data, ``t.to(<cuda>)`` and ``t.cuda()``
    of a pageable CPU tensor ``t`` that needs no gradient, and the host-built parts of an index
    into a CUDA tensor (``_device_index``, through ``_IndexingWrap``) go through pinned host
    memory; ``kept`` holds those host tensors for the graph's lifetime."""

    def __init__(self):
        super().__init__()
        self.kept: list[torch.Tensor] = []
        self._outer: PinnedHostConstants | None = None

    def __enter__(self):
        super().__enter__()
        self._outer = getattr(_this_thread, "mode", None)
        _this_thread.mode = self
        _IndexingWrap.enter()
        return self

    def __exit__(self, *exc):
        _IndexingWrap.exit()
        _this_thread.mode = self._outer
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor):
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda":
                requires_grad = kwargs.pop("requires_grad", False)
                host = func(*args, **{**kwargs, "device": "cpu"})
                return self._through_pinned(host, device).requires_grad_(requires_grad)
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


_this_thread = threading.local()  # .mode: the PinnedHostConstants this thread captures under


class _IndexingWrap:
    """``Tensor.__getitem__`` and ``__setitem__`` wrapped while any thread has the mode entered:
    where the entering thread indexes a CUDA tensor, the index's host-built parts go through
    pinned memory (``_device_index``). A wrap on the class, because PyTorch's indexing asks
    function modes only for tensor subclasses in some releases. Other threads, and torch.compile's
    tracing, reach PyTorch's indexing unchanged."""

    _lock = threading.Lock()
    _entered = 0  # modes entered, over all threads
    _own = {name: torch.Tensor.__dict__.get(name) for name in ("__getitem__", "__setitem__")}

    @classmethod
    def enter(cls) -> None:
        with cls._lock:
            if cls._entered == 0:
                for name in cls._own:
                    setattr(torch.Tensor, name, _through_pinned_index(getattr(torch.Tensor, name)))
            cls._entered += 1

    @classmethod
    def exit(cls) -> None:
        with cls._lock:
            cls._entered -= 1
            if cls._entered == 0:
                for name, own in cls._own.items():
                    if own is None:
                        delattr(torch.Tensor, name)
                    else:
                        setattr(torch.Tensor, name, own)


def _through_pinned_index(indexing):
    """`indexing` (PyTorch's ``__getitem__`` or ``__setitem__``), moving the index's host-built
    parts through pinned memory where this thread has the mode entered."""
    def through_pinned(self, index, *value):
        mode = getattr(_this_thread, "mode", None)
        if mode is not None and self.is_cuda and not torch.compiler.is_compiling():
            device = self.device
            index = _device_index(index, lambda host: mode._through_pinned(host, device))
            if value and type(value[0]) in (bool, int, float):
                # PyTorch 2.11 copies an assigned Python number from the host for an advanced
                # index; made on the device, it is the same value of the tensor's dtype.
                value = (torch.full((), value[0], dtype=self.dtype, device=device),)
        return indexing(self, index, *value)

    return through_pinned


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
