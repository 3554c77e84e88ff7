"""grape.compile: the Python face of the C++ runtime (csrc/torch/runtime.cpp).

A call of a compiled function is one C++ call (flatten, key, look up, replay). Python code here
runs only to build the object, to report fallbacks, and for stats.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Union

import torch

from grape import _C, _attention, _graph_cache, _hooks, _rewrite, _stats
from grape._hooks import FallbackWarning

__all__ = ["CompiledFunction", "FallbackWarning", "compile", "save_graph_cache", "stats"]


# Device memory a function's executables beyond one per topology may take (Note [Executable
# slots]): enough for the decode lengths of a small language model; docs/results.md gives what
# executables of the benchmarked models take.
DEFAULT_EXECUTABLE_CACHE = 256 << 20


class CompiledFunction(_C.Runtime):
    """A function (or module forward) whose calls replay CUDA graphs, one per call signature.

    Build it with :func:`grape.compile`. Calling it runs the function: the first ``warmup``
    calls of a new signature run eagerly, the next one captures a graph, and every later call
    with that signature replays it. All graphs share one memory pool.
    """

    def __init__(self, fn: Callable, *, warmup: int = 1, warmup_each_signature: bool = False,
                 module: Optional[torch.nn.Module] = None,
                 name: Optional[str] = None, alias_prediction: bool = True, rewrite: bool = True,
                 on_unsupported: str = "error", share_executables: Union[bool, str] = True,
                 executable_cache: Optional[int] = DEFAULT_EXECUTABLE_CACHE,
                 memory_budget: Optional[int] = None, plan_free_attention: bool = False,
                 cache_dir: Any = None):
        run, why = _rewrite.rewrite(fn, on_unsupported) if rewrite else (fn, "rewrite=False")
        # Whether tensor-dependent control flow in fn is predicated (docs/semantics.md); else why not.
        self.rewritten = run is not fn
        self.rewrite_note = why
        if plan_free_attention:
            run = _attention.calling_plan_free(run)
        sharing = {False: "none", True: "near"}.get(share_executables, share_executables)
        name = name or getattr(fn, "__name__", type(fn).__name__)
        qualname = getattr(fn, "__qualname__", name)
        # The runtime reaches Python through this object alone (grape/_hooks.py).
        self._hooks = _hooks.RuntimeHooks(qualname, plan_free_attention)
        super().__init__(run, warmup, warmup_each_signature, module, alias_prediction, sharing,
                         executable_cache, memory_budget, self._hooks)
        self.__wrapped__ = fn
        self.__name__ = name
        self.__qualname__ = qualname
        self.__doc__ = getattr(fn, "__doc__", None)
        directory = _graph_cache.cache_directory(cache_dir)
        if directory is not None:
            self._hooks.cache_file = _graph_cache.CacheFile(
                fn, directory, qualname, {"plan_free_attention": plan_free_attention})
            _graph_cache.register(self)

    def __repr__(self) -> str:
        return f"<grape.CompiledFunction {self.__qualname__}>"

    def __get__(self, instance, owner=None):
        # @grape.compile on a method: bind like a function does.
        if instance is None:
            return self
        return functools.partial(self, instance)

    def __del__(self):
        # A function that goes away before the process exits keeps its graphs too.
        if getattr(self, "_hooks", None) is not None and self._hooks.cache_file is not None:
            _graph_cache.save_quietly(self)

    def save_graph_cache(self) -> str:
        """Writes what this function captured to its graph cache file now (it is also written
        when the process exits); returns what was done. Without a cache directory, does
        nothing and returns "". See docs/semantics.md, "The graph cache"."""
        if self._hooks.cache_file is None:
            return ""
        return self._save_graph_cache()

    def stats(self) -> _stats.Stats:
        """Counters of this function; see :func:`grape.stats`."""
        s = _stats.Stats(self._runtime_stats())
        s["name"] = self.__qualname__
        s["fallbacks"] = list(self._hooks.fallbacks)
        s["plan_free_attention"] = self._hooks.plan_free_attention
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


def compile(fn: Any = _UNSET, *, warmup: int = 1, warmup_each_signature: bool = False,
            alias_prediction: bool = True,
            rewrite: bool = True, on_unsupported: str = "error",
            share_executables: Union[bool, str] = True,
            executable_cache: Optional[int] = DEFAULT_EXECUTABLE_CACHE, memory_budget: Any = _UNSET,
            plan_free_attention: bool = False, cache_dir: Any = None):
    """Compiles ``fn`` (a function or an ``nn.Module``) into CUDA graphs, one per call signature.

    * ``grape.compile(fn)`` and ``@grape.compile`` return a :class:`CompiledFunction`;
      ``@grape.compile(warmup=2)`` takes options.
    * ``grape.compile(module)`` compiles ``module.forward`` in place (``module(...)`` and
      ``module.generate(...)`` go through it) and returns the module. Its parameters and buffers
      are static: they are never copied; if one is moved (``.to()``, ``.data = ...``) the graphs
      that read it are captured again.

    ``warmup``: eager calls of the function before its first capture (lazy initialization, such
    as cuBLAS handles or an optimizer's state, must not happen inside a capture). A later new
    signature is captured at its first call, so a new shape replays from its next call on. A
    signature whose capture at first sight fails (other than for want of memory) runs that call
    eagerly, as its warm-up, and is captured again at its next call (a second failure falls back
    to eager, with the reason); after two such failures the function warms up each new signature
    first, as ``warmup_each_signature=True`` does from the start: ``warmup`` eager calls of every
    signature before its capture (for shapes that need lazy initialization of their own, such as
    cuDNN's autotuning under ``torch.backends.cudnn.benchmark``).

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
    topology, so that the shapes holding one replay without patching (an executable's memory grows
    with its kernel count, docs/results.md; default 256 MiB); a shape gets one only where it replays while the GPU waits for the
    host (elsewhere patching overlaps queued work); 0: one executable per topology, the least
    memory; None: no limit.
    ``memory_budget``: bytes of device memory for the function's graph memory (its
    arena and resident executables); over it, least recently used executables are freed (and
    rebuilt when needed), and a capture that does not fit runs eagerly, with the reason. None (the
    default, see :func:`grape.set_memory_budget`): no budget. See docs/semantics.md, "Graph memory".

    ``plan_free_attention``: every call (warm-ups and eager calls too) runs
    scaled_dot_product_attention without cuDNN's backend, on those that build no per-shape plan
    (flash, memory-efficient, math, as far as the caller allows them), so that capturing a new
    shape, such as each decode length of a Hugging Face ``generate``, pays no library planning.
    The calls may then run another attention kernel than eager, with other rounding; off by
    default. See docs/semantics.md, "Attention without plans".

    ``cache_dir``: a directory where the function keeps what it captured (default: the
    ``GRAPE_CACHE_DIR`` environment variable, else none), written at exit and by
    :func:`grape.save_graph_cache`; a later process restores from it instead of capturing every
    shape again (one live capture per group of shapes validates the rest); False: no cache,
    whatever the environment says. The key covers the
    code, the modules' structure and the library versions; a file of another key or a damaged
    one is ignored with a warning. Trust the directory as you would a model file. See
    docs/semantics.md, "The graph cache".
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
    if not isinstance(plan_free_attention, bool):
        raise TypeError("grape.compile: plan_free_attention must be a bool, got "
                        f"{type(plan_free_attention).__name__}")
    if memory_budget is _UNSET:
        memory_budget = _default_memory_budget
    options = dict(warmup=warmup, warmup_each_signature=warmup_each_signature,
                   alias_prediction=alias_prediction, rewrite=rewrite,
                   on_unsupported=on_unsupported, share_executables=share_executables,
                   executable_cache=_check_bytes("executable_cache", executable_cache),
                   memory_budget=_check_bytes("memory_budget", memory_budget),
                   plan_free_attention=plan_free_attention,
                   cache_dir=cache_dir)
    _graph_cache.cache_directory(cache_dir)  # a wrong type raises here, before anything is built
    if fn is _UNSET:  # @grape.compile(...) with options; an explicit None is a mistake, below
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
    """What a compiled function (or compiled module) did so far, as a dict; printed, a short
    summary (calls, graphs, memory, fallbacks with reasons). See docs/semantics.md,
    "grape.stats". Keys:

"""
    target = fn
    if isinstance(fn, torch.nn.Module):
        target = fn.__dict__.get("forward")
    if not isinstance(target, CompiledFunction):
        raise TypeError(f"grape.stats expects a compiled function or module, got {type(fn).__name__}")
    return target.stats()


def save_graph_cache(fn: Any) -> str:
    """Writes a compiled function's (or compiled module's) graph cache now; see
    :meth:`CompiledFunction.save_graph_cache`."""
    target = fn.__dict__.get("forward") if isinstance(fn, torch.nn.Module) else fn
    if not isinstance(target, CompiledFunction):
        raise TypeError("grape.save_graph_cache expects a compiled function or module, got "
                        f"{type(fn).__name__}")
    return target.save_graph_cache()


if stats.__doc__:  # None under python -OO
    stats.__doc__ += _stats.docstring()
