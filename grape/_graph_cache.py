"""Where a compiled function's graph cache lives, and what it is keyed by (Note [The graph cache
in the runtime], csrc/torch/graphs/graph_cache.h; docs/semantics.md, "The graph cache").

One file per compiled function and rank in the cache directory, named by the function's
qualified name, where its code is and the torch.distributed rank, so that the same function in a
later process finds its own. Functions alive at once that share all three (an encoder's and a
decoder's `T5Stack.forward`, compiled each) keep a file each, by the order they were compiled
in: the first alive has the first file. A later process that compiles them in another order
finds the other's file, whose key then differs (a miss), or is the same (the same code and
structure, whose graphs read this function's tensors by name). The key
(grape/_cache_key.py) is computed each time the runtime asks, when it opens the file and when it
saves, so a model changed in between is a miss, never a wrong replay.
The runtime reads tensors by the names given here: the compiled module's and those of every
module the function's code reaches, prefixed by where they were found.
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import os
import re
import threading
import warnings
import weakref
from typing import Any, Callable, Optional

import torch

from grape import _C, _cache_key

__all__ = ["CacheFile", "cache_directory", "save_all", "save_quietly"]

ENVIRONMENT_VARIABLE = "GRAPE_CACHE_DIR"


def cache_directory(cache_dir: Any) -> Optional[str]:
    """The directory a function compiled with ``cache_dir`` stores its graphs in: ``cache_dir``,
    else $GRAPE_CACHE_DIR, else None (no cache); False: None, whatever the environment says."""
    if cache_dir is False:
        return None
    if cache_dir is None:
        cache_dir = os.environ.get(ENVIRONMENT_VARIABLE) or None
    if cache_dir is None:
        return None
    if isinstance(cache_dir, bool) or not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError("grape.compile: cache_dir must be a path (str or os.PathLike) or None, "
                        f"got {type(cache_dir).__name__}")
    return os.path.abspath(os.fspath(cache_dir))


def _members_of(module: torch.nn.Module, prefix: str, members: str,
                named: list[tuple[str, torch.Tensor]]) -> None:
    """Appends `module`'s tensors of `members` and its submodules', in named_modules' order."""
    for name, tensor in getattr(module, members).items():
        if tensor is not None:
            named.append((prefix + name, tensor))
    for name, child in module._modules.items():
        if child is not None:
            _members_of(child, f"{prefix}{name}.", members, named)


class CacheFile:
    """A compiled function's cache file: its path, its key now, and its modules' tensors by
    name."""

    def __init__(self, fn: Callable, directory: str, qualname: str, options: dict[str, Any]):
        self.fn = fn
        self.directory = directory
        self.options = options
        self.where = f"{_source_file(fn) or repr(type(fn))}\n{qualname}"
        self.safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", qualname)[:80]
        self.opened = False  # whether describe() has made or found the directory
        # Among live compiled functions of this `where` and directory, this one's place (register).
        self.ordinal = 0

    @property
    def path(self) -> str:
        """The file, for this rank (ranks differ in their keys, so they keep a file each)."""
        rank = (torch.distributed.get_rank() if torch.distributed.is_available()
                and torch.distributed.is_initialized() else 0)
        where = f"{self.where}\n{rank}" + (f"\n{self.ordinal}" if self.ordinal else "")
        digest = hashlib.sha256(where.encode()).hexdigest()[:16]
        return os.path.join(self.directory, f"{self.safe_name}-{digest}.grape")

    def key(self) -> str:
        lines = [f"option:{name}={value!r}\n" for name, value in sorted(self.options.items())]
        return _cache_key.cache_key(self.fn) + "".join(lines)

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """named_parameters, then named_buffers (without removing duplicates) of each module the
        function reaches, as `prefix.name`. Asked at each restored shape's first call, so walked
        by hand: Module.named_parameters costs several times more."""
        modules, _ = _cache_key.reached(self.fn)
        named: list[tuple[str, torch.Tensor]] = []
        for prefix, module in modules:
            for members in ("_parameters", "_buffers"):
                _members_of(module, f"{prefix}.", members, named)
        # Dense tensors only: a graph reads a sparse or opaque one through tensors of its own.
        return [(name, t) for name, t in named if t.layout == torch.strided]

    def describe(self) -> Optional[tuple[str, str]]:
        """What the runtime asks for: (path, key); None where the directory cannot be made (with
        a warning: the function then runs without a cache), and where it was removed since it was
        made or found (its owner is done with it: nothing is written, at exit neither)."""
        if self.opened and not os.path.isdir(self.directory):
            return None
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            warnings.warn(f"grape: the graph cache directory {self.directory} cannot be made "
                          f"({e}); graphs are not cached", stacklevel=3)
            return None
        self.opened = True
        return self.path, self.key()


def _source_file(fn: Callable) -> Optional[str]:
    functions = _cache_key.functions(fn)
    return _cache_key.file_of(functions[-1].__code__) if functions and hasattr(
        functions[-1], "__code__") else None


# Compiled functions with a cache, saved when the process exits; their places among namesakes are
# chosen under the lock.
_with_cache: "weakref.WeakSet[Any]" = weakref.WeakSet()
_registering = threading.Lock()


def register(compiled: Any) -> None:
    """Saves `compiled`'s cache at exit; gives it the first file its namesakes alive leave (a
    compiled module is in a cycle with its forward: one gone out of use keeps its file until the
    garbage collector has run). Starts watching kernel images."""
    watch_kernel_images()
    mine = compiled._hooks.cache_file
    with _registering:
        places = {other._hooks.cache_file.ordinal for other in _with_cache
                  if (other._hooks.cache_file.where, other._hooks.cache_file.directory)
                  == (mine.where, mine.directory)}
        mine.ordinal = next(n for n in range(len(places) + 1) if n not in places)
        _with_cache.add(compiled)


WATCH_VARIABLE = "GRAPE_WATCH_KERNEL_IMAGES"
_watch_asked = False


def cupti_libraries() -> list[str]:
    """Where libcupti may be, first found first: the loader's path, torch's CUDA wheels, the
    toolkit."""
    major = (torch.version.cuda or "").split(".")[0]
    names = [f"libcupti.so.{major}"] if major else []
    places = []
    try:
        import nvidia  # torch's CUDA wheels
        places += [os.path.join(p, "*", "lib") for p in nvidia.__path__]
    except ImportError:
        pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    places += [os.path.join(home, "extras", "CUPTI", "lib64"), os.path.join(home, "lib64")]
    found = [path for place in places for path in sorted(glob.glob(os.path.join(
        place, f"libcupti.so.{major}" if major else "libcupti.so*")))]
    return names + found


def watch_kernel_images() -> None:
    """Starts, once per process, the watch that lets generated kernels (cuDNN's attention) be
    stored (Note [Kernel images], csrc/core/kernel_images.h); GRAPE_WATCH_KERNEL_IMAGES=0 leaves
    CUPTI to other tools. Where it cannot start, grape.stats() says why under
    graph_cache.kernel_images."""
    global _watch_asked
    if _watch_asked or os.environ.get(WATCH_VARIABLE, "1").lower() in ("0", "false", "no", "off"):
        return
    _watch_asked = True
    watch = getattr(_C, "_watch_module_images", None)
    if watch is not None and torch.cuda.is_available() and watch(cupti_libraries()) == "":
        yield_to_profilers(_C._stop_watching_module_images)


PROFILER_TOOK_CUPTI = ("stopped: torch.profiler traces CUDA activities, and CUPTI serves one "
                       "subscriber")


def yield_to_profilers(stop_watch: Callable[[str], None]) -> None:
    """torch.profiler's CUDA traces need CUPTI's one subscriber, which Kineto takes as a profile
    first prepares (it gets none, and traces no kernel, where the watch holds it). Wraps
    torch.autograd.profiler's _prepare_profiler and _enable_profiler, through which every profile
    starts, so that the first asked for CUDA activities calls `stop_watch` first: the watch
    yields for good (later saves store kernels by their plain names)."""
    from torch.autograd import profiler

    def yielding(start: Callable) -> Callable:
        def start_after_the_watch(config, activities, *args, **kwargs):
            if torch.autograd.ProfilerActivity.CUDA in activities:
                stop_watch(PROFILER_TOOK_CUPTI)
            return start(config, activities, *args, **kwargs)
        start_after_the_watch.grape_yields = True
        return start_after_the_watch

    for name in ("_prepare_profiler", "_enable_profiler"):
        start = getattr(profiler, name, None)
        if start is not None and not getattr(start, "grape_yields", False):
            setattr(profiler, name, yielding(start))


def save_quietly(compiled: Any) -> None:
    """Saves `compiled`'s graph cache where nobody asked (at exit, or as it goes away): a failure
    warns instead of raising."""
    try:
        compiled.save_graph_cache()
    except Exception as e:  # noqa: BLE001 - one function's failure stops no other
        warnings.warn(f"grape: saving the graph cache of {compiled!r} failed: {e}")


@atexit.register
def save_all() -> None:
    """Saves every live compiled function's graph cache, at exit."""
    for compiled in list(_with_cache):
        save_quietly(compiled)
