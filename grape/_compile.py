"""grape.compile: the Python face of the C++ runtime (csrc/torch/runtime.cpp).

A call of a compiled function is one C++ call (flatten, key, look up, replay). Python code here
runs only to build the object, to report fallbacks, and for stats.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
import warnings
from typing import Any, Callable, Optional, Union

import torch

from grape import _C, _distributed, _predicate, _rewrite

# A branch the rewriter cannot predicate, or a collective in a predicated body, is the user's to
# fix: the error reaches the caller (on every rank alike, since every rank captures the same body).
_C._set_propagated_errors((_rewrite.RewriteError, _predicate.PredicateError))

__all__ = ["CompiledFunction", "FallbackWarning", "compile", "stats"]

log = logging.getLogger("grape")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


class FallbackWarning(UserWarning):
    """A call signature of a compiled function runs eagerly; the message says why and where."""


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


def _explain(reason: str) -> str:
    if "synchroniz" in reason or "stream is capturing" in reason or "cudaErrorStreamCapture" in reason:
        return (
            f"{reason} (a host synchronization such as .item(), .cpu(), .tolist() or a "
            "data-dependent shape inside the function cannot be captured)"
        )
    return reason


# Characters of a call signature that a fallback warning shows: a model's KV cache makes
# signatures of thousands; grape.stats() keeps them whole.
_WARNED_SIGNATURE_CHARS = 240


def _abbreviated(signature: str) -> str:
    if len(signature) <= _WARNED_SIGNATURE_CHARS:
        return signature
    rest = len(signature) - _WARNED_SIGNATURE_CHARS
    return f"{signature[:_WARNED_SIGNATURE_CHARS]}... ({rest} more characters in grape.stats())"


# Device memory a function's executables beyond one per topology may take (Note [Executable
# slots]): GPT-2's 128 decode lengths (~0.6 MB each), or about 50 of GPT-J's (~5 MB each).
DEFAULT_EXECUTABLE_CACHE = 256 << 20


class CompiledFunction(_C.Runtime):
    """A function (or module forward) whose calls replay CUDA graphs, one per call signature.

    Build it with :func:`grape.compile`. Calling it runs the function: the first ``warmup``
    calls of a new signature run eagerly, the next one captures a graph, and every later call
    with that signature replays it. All graphs share one memory pool.
    """

    def __init__(self, fn: Callable, *, warmup: int = 1, warmup_each_signature: bool = True,
                 module: Optional[torch.nn.Module] = None,
                 name: Optional[str] = None, alias_prediction: bool = True, rewrite: bool = True,
                 on_unsupported: str = "error", share_executables: Union[bool, str] = True,
                 executable_cache: Optional[int] = DEFAULT_EXECUTABLE_CACHE,
                 memory_budget: Optional[int] = None):
        run, why = _rewrite.rewrite(fn, on_unsupported) if rewrite else (fn, "rewrite=False")
        sharing = {False: "none", True: "near"}.get(share_executables, share_executables)
        super().__init__(run, warmup, warmup_each_signature, module, alias_prediction, sharing,
                         -1 if executable_cache is None else executable_cache,
                         -1 if memory_budget is None else memory_budget)
        # Whether tensor-dependent control flow in fn is predicated (docs/semantics.md); else why not.
        self.rewritten = run is not fn
        self.rewrite_note = why
        self.__wrapped__ = fn
        self.__name__ = name or getattr(fn, "__name__", type(fn).__name__)
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self._fallbacks: list[dict] = []
        self._capture_points = _distributed.CapturePoints(self.__qualname__)

    def __repr__(self) -> str:
        return f"<grape.CompiledFunction {self.__qualname__}>"

    def __get__(self, instance, owner=None):
        # @grape.compile on a method: bind like a function does.
        if instance is None:
            return self
        return functools.partial(self, instance)

    def _report_fallback(self, signature: str, reason: str, error: Optional[BaseException]) -> None:
        """Called by the runtime once per signature that falls back to eager."""
        frame = _user_frame()
        call_site = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "<unknown>"
        reason = _explain(reason)
        if error is not None:
            site = _error_site(error)
            if site is not None:
                reason = f"{reason} at {site}"
        self._fallbacks.append({"signature": signature, "reason": reason, "call_site": call_site})
        message = (
            f"grape: {self.__qualname__}{_abbreviated(signature)} runs eagerly: {reason} "
            f"(called from {call_site})"
        )
        log.debug(message)
        if frame is not None:
            warnings.warn_explicit(message, FallbackWarning, frame.f_code.co_filename, frame.f_lineno,
                                   module=frame.f_globals.get("__name__"), registry=frame.f_globals.setdefault("__warningregistry__", {}))
        else:
            warnings.warn(message, FallbackWarning, stacklevel=2)

    def _agree(self, signature: str, reason: str, out_of_memory: bool):
        """Called by the runtime at each capture point: under torch.distributed, every rank's
        outcome made common (grape/_distributed.py); None in a process of its own."""
        return self._capture_points.agree(signature, reason, out_of_memory)

    def stats(self) -> dict:
        """Counters of this function; see :func:`grape.stats`."""
        s = self._runtime_stats()
        s["name"] = self.__qualname__
        s["fallbacks"] = list(self._fallbacks)
        s["entries"] = self._entries()
        return s


_default_memory_budget: Optional[int] = None


def set_memory_budget(nbytes: Optional[int]) -> None:
    """The ``memory_budget`` of functions compiled from now on that do not give one (None: no
    budget). See :func:`grape.compile`."""
    global _default_memory_budget
    _default_memory_budget = _check_bytes("memory_budget", nbytes)


def _check_bytes(name: str, nbytes):
    if nbytes is None:
        return None
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"grape: {name} must be an int (bytes) or None, got {type(nbytes).__name__}")
    if nbytes < 0:
        raise ValueError(f"grape: {name} must be >= 0 bytes, got {nbytes}")
    return nbytes


_UNSET = object()


def compile(fn: Optional[Callable] = None, *, warmup: int = 1, warmup_each_signature: bool = True,
            alias_prediction: bool = True,
            rewrite: bool = True, on_unsupported: str = "error",
            share_executables: Union[bool, str] = True,
            executable_cache: Optional[int] = DEFAULT_EXECUTABLE_CACHE, memory_budget: Any = _UNSET):
    """Compiles ``fn`` (a function or an ``nn.Module``) into CUDA graphs, one per call signature.

    * ``grape.compile(fn)`` and ``@grape.compile`` return a :class:`CompiledFunction`;
      ``@grape.compile(warmup=2)`` takes options.
    * ``grape.compile(module)`` compiles ``module.forward`` in place (``module(...)`` and
      ``module.generate(...)`` go through it) and returns the module. Its parameters and buffers
      are static: they are never copied; if one is moved (``.to()``, ``.data = ...``) the graphs
      that read it are captured again.

    ``warmup``: eager calls of a new signature before it is captured (lazy initialization, such as
    cuBLAS handles, must not happen inside a capture). ``warmup_each_signature=False``: only the
    function's first ``warmup`` calls run eagerly, and a later new signature is captured at its
    first call, so that a pass over new shapes (an epoch) captures them rather than warming them
    up; a signature whose capture then fails (other than for want of memory) runs that call
    eagerly, as its warm-up, and is captured again at its next call (a second failure falls back
    to eager, with the reason).

    ``alias_prediction``: when an argument is an output of an earlier replay that nothing else
    references (a KV cache or a token fed back), capture the next graph to read it in place, so a
    loop that feeds outputs back copies nothing; and when your code allocates an argument between
    calls at a code position that allocated an earlier call's argument (``torch.cat``, ``.to("cuda")``),
    hand that allocation memory the graphs read in place. Off: every input is copied into a
    placeholder. See docs/semantics.md, "Liveness of outputs".

    ``rewrite``: turn ``if``/``elif``/``else``, ``break`` and ``continue`` whose condition is a CUDA
    tensor into predication (grape.Predicate blocks whose rebound names are merged with
    torch.where), so such functions capture without host syncs; Python conditions keep Python
    semantics. Needs the function's source. ``on_unsupported``: what a branch that cannot be
    predicated (a ``return`` inside it, say) does under capture: ``"error"`` raises
    ``grape.RewriteError`` naming the file and line; ``"sync"`` warns and reads the condition on
    the host, so that signature runs eagerly. See docs/semantics.md, "The predication rewriter".

    ``share_executables``: graphs share instantiated executables, patched to a shape's kernel
    parameters when it is replayed; the parameters are kept compressed on the host. By default
    (True) graphs of one topology (typically every shape of the function) share one, and so do
    graphs of near topologies (a kernel or memset more or less, as cuDNN picks algorithms per
    shape): a union of their graphs, in which each shape runs the nodes it lacks as no-ops
    (docs/design.md, "Near topologies"). ``"topology"``: only graphs of one topology share.
    False: one executable per graph (more device memory, no patching).
    ``executable_cache``: bytes of device memory for executables beyond one per
    topology, so that the shapes holding one replay without patching (about 4 KB per kernel of a
    graph; default 256 MiB); a shape gets one only where it replays while the GPU waits for the
    host (elsewhere patching overlaps queued work); 0: one executable per topology, the least
    memory; None: no limit.
    ``memory_budget``: bytes of device memory for the function's graph memory (its
    arena and resident executables); over it, least recently used executables are freed (and
    rebuilt when needed), and a capture that does not fit runs eagerly, with the reason. None (the
    default, see :func:`grape.set_memory_budget`): no budget. See docs/semantics.md, "Graph memory".
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int):
        raise TypeError(f"grape.compile: warmup must be an int, got {type(warmup).__name__}")
    if warmup < 0:
        raise ValueError(f"grape.compile: warmup must be >= 0, got {warmup}")
    if not isinstance(warmup_each_signature, bool):
        raise TypeError("grape.compile: warmup_each_signature must be a bool, got "
                        f"{type(warmup_each_signature).__name__}")
    if not isinstance(alias_prediction, bool):
        raise TypeError("grape.compile: alias_prediction must be a bool, got "
                        f"{type(alias_prediction).__name__}")
    if not isinstance(rewrite, bool):
        raise TypeError(f"grape.compile: rewrite must be a bool, got {type(rewrite).__name__}")
    if on_unsupported not in ("error", "sync"):
        raise ValueError(f"grape.compile: on_unsupported must be 'error' or 'sync', got {on_unsupported!r}")
    if not isinstance(share_executables, bool) and share_executables not in ("topology", "near"):
        raise TypeError("grape.compile: share_executables must be a bool, 'topology' or 'near', got "
                        f"{share_executables!r}")
    if memory_budget is _UNSET:
        memory_budget = _default_memory_budget
    options = dict(warmup=warmup, warmup_each_signature=warmup_each_signature,
                   alias_prediction=alias_prediction, rewrite=rewrite,
                   on_unsupported=on_unsupported, share_executables=share_executables,
                   executable_cache=_check_bytes("executable_cache", executable_cache),
                   memory_budget=_check_bytes("memory_budget", memory_budget))
    if fn is None:
        return functools.partial(compile, **options)
    if isinstance(fn, CompiledFunction):
        raise TypeError("grape.compile: this function is already compiled")
    if isinstance(fn, torch.nn.Module):
        module = fn
        if isinstance(module.__dict__.get("forward"), CompiledFunction):
            raise TypeError(f"grape.compile: {type(module).__name__} is already compiled")
        module.forward = CompiledFunction(module.forward, module=module,
                                          name=f"{type(module).__name__}.forward", **options)
        return module
    if not callable(fn):
        raise TypeError(f"grape.compile expects a function or an nn.Module, got {type(fn).__name__}")
    return CompiledFunction(fn, **options)


def stats(fn: Any) -> dict:
    """What a compiled function (or compiled module) did so far.

    Keys: ``calls``, ``replays``, ``captures``, ``warmup_calls`` (and ``warmup_each_signature``),
    ``eager_calls``, ``graphs``,
    ``signatures``, ``recaptures`` and ``last_recapture_reason`` (graphs captured again because
    static state changed: a parameter moved, a gradient, an optimizer setting), ``capture_seconds``, ``bytes_copied_in`` / ``bytes_copied_back`` (input copies),
    ``bytes_evacuated`` and ``evacuations`` (live outputs moved out of the pool),
    ``inputs_moved`` / ``inputs_in_place``, ``pool_bytes`` (device memory of the shared pool:
    ``arena_bytes`` of mapped arena lanes, per lane in ``arena_lane_bytes``, plus the private
    pool; ``arena_lane_peak_bytes``, the most each lane held allocated at once;
    ``replanned_captures`` and ``replans_diverged``, captures taken again along a planned layout),
    ``alias_prediction`` and its counters ``alias_predictions`` (placeholders that are an
    earlier output or an input buffer), ``alias_hits`` / ``alias_misses`` (predicted inputs found in
    place at a replay, or copied), ``bytes_avoided`` and ``chain_variants``; allocation-site
    prediction's ``input_sites`` (code positions learned), ``site_allocations`` (allocations served
    from input buffers), ``site_buffers_busy`` (served by PyTorch because both buffers were held)
    and ``input_buffer_bytes``; graph memory's ``shapes`` (graphs held), ``topology_groups``,
    ``unshareable_groups`` / ``unshareable_reason``, ``graphs_joined`` (``graphs_joined_near``
    of another, near topology; ``topology_unions``), ``resident_executables``,
    ``executable_bytes`` (``cached_executable_bytes`` of them beyond one per topology, within
    ``executable_cache``), ``instantiations``, ``evictions``, ``executable_switches``,
    ``nodes_patched``, ``patch_seconds``, ``params_bytes`` / ``params_raw_bytes`` (parameters kept,
    compressed and raw), ``capture_oom_retries``, ``pinned_host_constants`` and ``memory_budget``;
    ``live_outputs``, ``fallbacks`` (signature, reason, call site) and ``entries`` (per signature).
    See docs/semantics.md, "grape.stats".
    """
    target = fn
    if isinstance(fn, torch.nn.Module):
        target = fn.__dict__.get("forward")
    if not isinstance(target, CompiledFunction):
        raise TypeError(f"grape.stats expects a compiled function or module, got {type(fn).__name__}")
    return target.stats()
