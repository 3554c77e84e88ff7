"""Note [Graph cache keys]
~~~~~~~~~~~~~~~~~~~~~~~~~
A stored graph (the graph cache, docs/design.md) is right in a later process only if that process
would capture the same graph: the same code on the same structure of modules, with the same
libraries on the same GPU. The key says all of that as text, one ``name=value`` line each, so that
a miss can name what changed (csrc/core/graph_store_file.h):

- ``grape`` (a digest of its extension and Python files), ``python``, ``torch``, ``cuda``,
  ``cudnn``, ``driver``, ``gpu`` (name and compute capability), the CUDA libraries' wheels
  (``lib:nvidia-cublas-cu13``, ...), ``rank`` and ``world`` (torch.distributed, where
  initialized), and the version of every library that the function's modules come from
  (``lib:transformers``, ...);
- ``settings``: the process-wide switches that choose kernels or their rounding (TF32, cuDNN's
  benchmark mode, deterministic algorithms, SDPA's backends, the default dtype);
- ``code``: the code objects of the function and of each function beneath its decorators, with
  every nested one (bytecode, constants, names), and ``source:<file>`` for the file of each and of
  every module class reached, so that an edit in the model's file changes the key even where the
  function only calls it;
- ``value:<name>``: the plain values (numbers, strings, flags, dtypes, and containers of them) of
  its closures and of the globals its code names: a branch may compare a shape with one;
- ``module:<name>``: per module reached (the function itself where it is an ``nn.Module``, the
  bound method's owner, modules in its closures and in the globals its code names), each
  submodule's class, its parameters' and buffers' shapes, dtypes and strides (never their
  values or addresses: a stored graph reads them in place), its plain attributes and those of its
  settings objects (a transformers config and the configs in it), which can reach a graph as
  constants, and its forward hooks.

Argument signatures are not in the key: each stored shape carries its own (a file holds many).
Nothing here reads a tensor's data.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import importlib.metadata
import inspect
import os
import platform
import sys
import types
from typing import Any, Callable, Iterable, Optional

import torch

__all__ = ["cache_key", "environment_facts", "file_of", "functions", "reached"]

_PLAIN = (bool, int, float, str, type(None))


def environment_facts() -> dict[str, str]:
    """This process's libraries, GPU and rank, as the key's first lines."""
    facts = {"grape": _grape_build(), "python": platform.python_version(),
             "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    if torch.cuda.is_available():
        facts["cudnn"] = str(torch.backends.cudnn.version())
        facts["driver"] = _driver_version()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        facts["gpu"] = f"{props.name} sm_{props.major}{props.minor}"
    else:
        facts["cudnn"] = facts["driver"] = facts["gpu"] = "none"
    # The CUDA libraries' wheels (cuBLAS, cuDNN, NCCL, ...) can change without torch changing.
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.startswith("nvidia-"):
            facts[f"lib:{name}"] = dist.version
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        facts["rank"] = str(torch.distributed.get_rank())
        facts["world"] = str(torch.distributed.get_world_size())
    else:
        facts["rank"], facts["world"] = "0", "1"
    return facts


def _grape_build() -> str:
    """grape's own code, which decides what a capture records: a digest of its extension and of
    its Python files (a version number would not change between builds)."""
    from grape import _C

    package = os.path.dirname(os.path.abspath(__file__))
    files = [_C.__file__] + sorted(os.path.join(package, f) for f in os.listdir(package)
                                   if f.endswith(".py"))
    return _digest(_file_digest(f) for f in files)


def _driver_version() -> str:
    """The CUDA driver's version (cuDriverGetVersion), or "unknown"."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return str(version.value)
    except (OSError, AttributeError):
        pass
    return "unknown"


def cache_key(fn: Callable, facts: Optional[dict[str, str]] = None) -> str:
    """The key of what ``fn`` captures (Note [Graph cache keys]); ``facts``: the environment's
    lines (``environment_facts()`` where not given; tests pass their own)."""
    facts = environment_facts() if facts is None else facts
    modules, values = reached(fn)
    codes = [f.__code__ for f in functions(fn) if hasattr(f, "__code__")]
    lines = [f"{name}={value}" for name, value in facts.items()]
    lines.append(f"settings={';'.join(_torch_settings())}")
    for library in sorted(_libraries(modules)):
        lines.append(f"lib:{library}={_library_version(library)}")
    words = [w for code in codes for w in _code_words(code)] if codes else [repr(fn)]
    lines.append(f"code={_digest(words)}")
    files = {file_of(code) for code in codes}
    files |= {file_of(type(sub)) for _, m in modules for sub in m.modules()}
    for path in sorted(f for f in files if f):
        lines.append(f"source:{path}={_file_digest(path)}")
    for name, value in values:
        lines.append(f"value:{name}={value}")
    for name, module in modules:
        lines.append(f"module:{name}={_digest(_structure(module))}")
    return "".join(line.replace("\n", " ") + "\n" for line in lines)


def functions(fn: Callable) -> list[Callable]:
    """The functions ``fn`` runs: its own (a module's forward, a bound method's function) and each
    beneath its decorators."""
    f = type(fn).forward if isinstance(fn, torch.nn.Module) else fn
    f = getattr(f, "__func__", f)
    chain: list[Callable] = []
    while f is not None and all(f is not g for g in chain):
        chain.append(f)
        f = getattr(f, "__wrapped__", None)
    return chain


def _names_in(code: types.CodeType) -> set[str]:
    """The global names a code object and every code object nested in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return names


def reached(fn: Callable) -> tuple[list[tuple[str, torch.nn.Module]], list[tuple[str, str]]]:
    """What ``fn`` can read besides its arguments: the modules (by a name that says where they
    were found: ``self``, ``closure.x``, ``global.x``), and the plain values of its closures and of
    the globals its code names (a threshold a branch compares a shape with)."""
    modules: list[tuple[str, torch.nn.Module]] = []
    values: list[tuple[str, str]] = []
    seen: set[int] = set()

    def add(name: str, value: Any) -> None:
        if isinstance(value, torch.nn.Module):
            if id(value) not in seen:
                seen.add(id(value))
                modules.append((name, value))
        elif _plain(value) and not callable(value):
            values.append((name, repr(value)))

    add("self", fn)
    add("self", getattr(fn, "__self__", None))
    for f in functions(fn):
        code = getattr(f, "__code__", None)
        if code is None:
            continue
        for cell_name, cell in zip(code.co_freevars, getattr(f, "__closure__", None) or ()):
            try:
                add(f"closure.{cell_name}", cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        scope = getattr(f, "__globals__", {})
        for global_name in sorted(_names_in(code)):
            if global_name in scope:
                add(f"global.{global_name}", scope[global_name])
    return modules, values


def _torch_settings() -> list[str]:
    """Process-wide settings that choose kernels or their numerics."""
    cuda = torch.backends.cuda
    flags = [f"default_dtype={torch.get_default_dtype()}",
             f"matmul_precision={torch.get_float32_matmul_precision()}",
             f"matmul_tf32={cuda.matmul.allow_tf32}",
             f"cudnn_tf32={torch.backends.cudnn.allow_tf32}",
             f"cudnn_benchmark={torch.backends.cudnn.benchmark}",
             f"cudnn_enabled={torch.backends.cudnn.enabled}",
             f"deterministic={torch.are_deterministic_algorithms_enabled()}"]
    for backend in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled",
                    "cudnn_sdp_enabled"):
        enabled = getattr(cuda, backend, None)
        if enabled is not None:
            flags.append(f"{backend}={enabled()}")
    return flags


def _code_words(code: types.CodeType) -> list[Any]:
    """A code object's behaviour as plain values: its bytecode, names and constants, nested code
    objects included (a lambda's or comprehension's)."""
    words: list[Any] = [code.co_code, code.co_names, code.co_varnames, code.co_freevars]
    for const in code.co_consts:
        words.extend(_code_words(const) if isinstance(const, types.CodeType) else [repr(const)])
    return words


def _structure(module: torch.nn.Module) -> list[Any]:
    words: list[Any] = []
    for name, sub in module.named_modules():
        words.append((name, type(sub).__module__, type(sub).__qualname__))
        for pname, t in list(sub.named_parameters(recurse=False)) + \
                list(sub.named_buffers(recurse=False)):
            if t is None:
                continue
            words.append((pname, tuple(t.shape), str(t.dtype), tuple(t.stride()),
                          t.device.type, bool(t.requires_grad)))
        for attr, value in sorted(vars(sub).items()):
            if not attr.startswith("_"):
                words.append((attr, _settings(value, depth=2)))
        # Hooks run inside the forward, so inside its graphs.
        for kind in ("_forward_pre_hooks", "_forward_hooks"):
            hooks = getattr(sub, kind, {})
            words.append((kind, [getattr(h, "__qualname__", repr(h)) for h in hooks.values()]))
        words.append(("training", sub.training))
    return words


def _settings(value: Any, depth: int) -> Any:
    """A module attribute as the key sees it: a plain value as itself; an object of settings (a
    transformers config, and the configs in it) as its plain values, which can reach graphs as
    constants (a rope base); anything else (tensors, modules, functions) as nothing."""
    if _plain(value):
        return repr(value)
    if depth == 0 or isinstance(value, (torch.nn.Module, torch.Tensor)) or callable(value) or \
            not hasattr(value, "__dict__"):
        return None
    return sorted((k, _settings(v, depth - 1)) for k, v in vars(value).items()
                  if not k.startswith("_"))


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return isinstance(value, _PLAIN) or isinstance(value, (torch.dtype, torch.device, enum.Enum))


def _libraries(modules: Iterable[tuple[str, torch.nn.Module]]) -> set[str]:
    """The top-level packages the modules' classes come from, other than torch and builtins."""
    names = set()
    for _, module in modules:
        for sub in module.modules():
            top = type(sub).__module__.split(".")[0]
            if top not in ("torch", "builtins", "__main__") and top in sys.modules:
                names.add(top)
    return names


def _library_version(name: str) -> str:
    return str(getattr(sys.modules.get(name), "__version__", "unknown"))


def file_of(obj: Any) -> Optional[str]:
    """The source file of a class or code object; nothing for one defined in C or typed in."""
    try:
        return inspect.getsourcefile(obj)
    except (TypeError, OSError):
        return None


def _file_digest(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:32]
    except OSError:
        return "unreadable"


def _digest(words: Iterable[Any]) -> str:
    h = hashlib.sha256()
    for word in words:
        h.update(word if isinstance(word, bytes) else repr(word).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]
