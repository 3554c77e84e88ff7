"""What the C++ runtime asks of Python, in one object.

Each :class:`grape.CompiledFunction` hands its runtime (csrc/torch/runtime.cpp) a
:class:`RuntimeHooks` at construction; the runtime reaches Python only through it
(csrc/torch/python/python_hooks.h), never by importing grape's modules by name. The runtime calls
it on warm-up, capture and fallback paths, never on a replay.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
import warnings
from typing import Any, Optional

import torch

from grape import _masks, _predicate, _rewrite, _training
from grape._host_constants import PinnedHostConstants

__all__ = ["FallbackWarning", "RuntimeHooks", "advice"]

log = logging.getLogger("grape")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


class FallbackWarning(UserWarning):
    """A call signature of a compiled function runs eagerly; the message says why and where."""


# What the user can do, by the kind of a reason (Note [Typed reasons] in csrc/core/reasons.h).
_ADVICE = {
    "host_sync": "a host synchronization such as .item(), .cpu(), .tolist() or a data-dependent "
                 "shape inside the function cannot be captured",
    "pageable_copy": "a copy from pageable host memory cannot be captured: pin the CPU tensor, "
                     "or build it on the device",
    "cpu_tensor": "return CUDA tensors only, or compute CPU values outside the function",
    "legacy_stream": "the default (legacy) stream cannot join a capture: autograd runs a "
                     "parameter's gradient hook on the stream current when the hook was made, "
                     "so construct DistributedDataParallel under "
                     "`with torch.cuda.stream(torch.cuda.Stream()):`, as PyTorch's CUDA graph "
                     "recipe does",
    "out_of_memory": "raise memory_budget, or free device memory before the call",
    "unsupported_argument": "pass tensors, Python scalars, containers of them or modules",
}


def advice(kind: str, reason: str) -> str:
    """The reason, with what to do about a reason of that kind where there is advice."""
    extra = _ADVICE.get(kind)
    return f"{reason} ({extra})" if extra else reason


def _is_library_file(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE_DIR) or path.startswith(_TORCH_DIR) or filename.startswith("<frozen")


def _user_frame() -> Optional[Any]:
    """The innermost frame outside grape and torch: where the user called the function."""
    frame = sys._getframe(1)
    while frame is not None and _is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _error_site(error: BaseException) -> Optional[str]:
    """file:line of the innermost frame of the error's traceback that is user code."""
    site = None
    for summary in traceback.extract_tb(error.__traceback__):
        if not _is_library_file(summary.filename):
            site = f"{summary.filename}:{summary.lineno}"
    return site


# Characters of a call signature that a fallback warning shows: a model's KV cache makes
# signatures of thousands; grape.stats() keeps them whole.
_WARNED_SIGNATURE_CHARS = 240


def _abbreviated(signature: str) -> str:
    if len(signature) <= _WARNED_SIGNATURE_CHARS:
        return signature
    rest = len(signature) - _WARNED_SIGNATURE_CHARS
    return f"{signature[:_WARNED_SIGNATURE_CHARS]}... ({rest} more characters in grape.stats())"


class RuntimeHooks:
    """The Python side of one compiled function's runtime: fallback reports (kept in
    ``fallbacks`` for grape.stats), and the training and host-constant helpers that captures
    use."""

    # Errors a capture raises to the caller instead of falling back to eager: a branch the rewriter
    # cannot predicate, or a misused grape.Predicate, is the user's to fix.
    propagated_errors = (_rewrite.RewriteError, _predicate.PredicateError)

    def __init__(self, name: str, plan_free_attention: bool = False):
        self.name = name
        self.fallbacks: list[dict] = []
        self.plan_free_attention = plan_free_attention
        # grape._graph_cache.CacheFile of a function compiled with a cache directory, else None.
        self.cache_file = None

    # --- fallbacks --------------------------------------------------------------------------------
    def report_fallback(self, signature: str, kind: str, reason: str,
                        error: Optional[BaseException]) -> None:
        """A signature runs eagerly (or a replay was refused), of `kind`, for `reason`; `error`:
        the exception a capture raised, whose user-code line the report names."""
        frame = _user_frame()
        call_site = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "<unknown>"
        reason = advice(kind, reason)
        if error is not None:
            site = _error_site(error)
            if site is not None:
                reason = f"{reason} at {site}"
        self.fallbacks.append({"signature": signature, "kind": kind, "reason": reason,
                               "call_site": call_site})
        message = (f"grape: {self.name}{_abbreviated(signature)} runs eagerly: {reason} "
                   f"(called from {call_site})")
        log.debug(message)
        if frame is not None:
            warnings.warn_explicit(message, FallbackWarning, frame.f_code.co_filename, frame.f_lineno,
                                   module=frame.f_globals.get("__name__"),
                                   registry=frame.f_globals.setdefault("__warningregistry__", {}))
        else:
            warnings.warn(message, FallbackWarning, stacklevel=2)

    # --- captures ---------------------------------------------------------------------------------
    def capture_cause(self, error: BaseException) -> str:
        """Whether an exception the function raised while it was captured is the capture's doing,
        by what Python knows of it (Note [Exceptions under capture] in csrc/core/capture_policy.h):
        ``"compiler"`` where torch.compile raised it (it compiled inside the capture, which eager
        never does), ``"predicated_body"`` where it left a predicated body (captured whatever its
        condition, so eager may not have run it), ``""`` otherwise."""
        if _predicate.raised_in_body(error):
            return "predicated_body"
        module = type(error).__module__ or ""
        if module.startswith(("torch._dynamo", "torch._inductor")):
            return "compiler"
        return ""

    def pinned_host_constants(self) -> PinnedHostConstants:
        """The mode a capture of a signature that needs it runs under (Note [Host constants])."""
        return PinnedHostConstants()

    def capture_settings(self) -> contextlib.AbstractContextManager:
        """The context every capture of the function runs in: transformers' mask rules as in
        eager calls (Note [Masks of unpadded batches under capture]). Attention backends without
        plans apply to every call, not only captures (grape/_compile.py)."""
        return _masks.eager_mask_rules()

    # --- the graph cache (Note [The graph cache in the runtime]) ----------------------------------
    def graph_cache_file(self):
        """(path, key) of the function's graph cache, computed now; None where it has none."""
        return None if self.cache_file is None else self.cache_file.describe()

    def graph_cache_tensors(self) -> list:
        """The function's modules' tensors by name, as they are now."""
        return [] if self.cache_file is None else self.cache_file.named_tensors()

    # --- training steps (Note [Gradients of a captured step]) -------------------------------------
    def training_seen(self) -> _training.Seen:
        return _training.Seen()

    def step_watch(self, seen: _training.Seen) -> _training.StepWatch:
        return _training.StepWatch(seen)

    def leaves_of(self, arguments, seen: _training.Seen, parameters) -> list:
        return _training.leaves_of(arguments, seen, parameters)

    def prepare_backward(self, device_index: int) -> None:
        _training.prepare_backward(torch.device("cuda", device_index))

    def state_tensors(self, optimizers) -> list:
        return _training.state_tensors(optimizers)

    def device_settings(self) -> _training.DeviceSettings:
        return _training.DeviceSettings()
