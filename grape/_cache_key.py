"""Note [Graph cache keys]
~~~~~~~~~~~~~~~~~~~~~~~~~
A stored graph (the graph cache, docs/design.md) is right in a later process only if that process
would capture the same graph: the same code on the same structure of modules, with the same
libraries on the same GPU. The key says all of that as text, one ``name=value`` line each, so that
a miss can name what changed (csrc/core/graph_store_file.h):

- ``grape``, ``python``, ``torch``, ``cuda``, ``cudnn``, ``driver``, ``gpu`` (name and compute
  capability), ``rank`` and ``world`` (torch.distributed, where initialized), and the version of
  every library that the function's modules come from (``lib:transformers``, ...);
- ``code``: the function's code objects, its own and every nested one (bytecode, constants,
  names), and ``source:<file>`` for the file of the function and of every module class reached,
  so that an edit in the model's file changes the key even where the function only calls it;
- ``module:<name>``: per module reached (the function itself where it is an ``nn.Module``, the
  bound method's owner, modules in its closure and in the globals its code names), each
  submodule's class, its parameters' and buffers' shapes, dtypes and strides (never their
  values or addresses: a stored graph reads them in place), and its plain attributes (numbers,
  strings, flags, and tuples, lists and dicts of them) and those of its settings objects (a
  transformers config), which can reach a graph as constants.

Argument signatures are not in the key: each stored shape carries its own (a file holds many).
Nothing here reads a tensor's data.
"""

from __future__ import annotations

import hashlib
import inspect
import platform
import sys
import types
from typing import Any, Callable, Iterable, Optional

import torch

__all__ = ["cache_key", "environment_facts"]

_PLAIN = (bool, int, float, str, type(None))


def environment_facts() -> dict[str, str]:
    """This process's libraries, GPU and rank, as the key's first lines."""
    import grape

    facts = {"grape": grape.__version__, "python": platform.python_version(),
             "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    if torch.cuda.is_available():
        facts["cudnn"] = str(torch.backends.cudnn.version())
        facts["driver"] = str(torch._C._cuda_getDriverVersion()) \
            if hasattr(torch._C, "_cuda_getDriverVersion") else "unknown"
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        facts["gpu"] = f"{props.name} sm_{props.major}{props.minor}"
    else:
        facts["cudnn"] = facts["driver"] = facts["gpu"] = "none"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        facts["rank"] = str(torch.distributed.get_rank())
        facts["world"] = str(torch.distributed.get_world_size())
    else:
        facts["rank"], facts["world"] = "0", "1"
    return facts


def cache_key(fn: Callable, facts: Optional[dict[str, str]] = None) -> str:
    """The key of what ``fn`` captures (Note [Graph cache keys]); ``facts``: the environment's
    lines (``environment_facts()`` where not given; tests pass their own)."""
    facts = environment_facts() if facts is None else facts
    modules = _modules_reached(fn)
    code = _code_of(fn)
    lines = [f"{name}={value}" for name, value in facts.items()]
    for library in sorted(_libraries(modules)):
        lines.append(f"lib:{library}={_library_version(library)}")
    lines.append(f"code={_digest(_code_words(code) if code is not None else [repr(fn)])}")
    files = {_file_of(code)} if code is not None else set()
    files |= {_file_of(type(sub)) for _, m in modules for sub in m.modules()}
    for path in sorted(f for f in files if f):
        lines.append(f"source:{path}={_file_digest(path)}")
    for name, module in modules:
        lines.append(f"module:{name}={_digest(_structure(module))}")
    return "".join(line.replace("\n", " ") + "\n" for line in lines)


def _code_of(fn: Callable) -> Optional[types.CodeType]:
    """The code ``fn`` runs: a module's forward, a bound method's function, beneath decorators
    that kept it as ``__wrapped__`` (transformers wraps its forwards)."""
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    return getattr(fn, "__code__", None)


def _modules_reached(fn: Callable) -> list[tuple[str, torch.nn.Module]]:
    """The modules ``fn`` can read, by a name that says where they were found."""
    found: list[tuple[str, torch.nn.Module]] = []
    seen: set[int] = set()

    def add(name: str, value: Any) -> None:
        if isinstance(value, torch.nn.Module) and id(value) not in seen:
            seen.add(id(value))
            found.append((name, value))

    add("self", fn)
    add("self", getattr(fn, "__self__", None))
    inner = getattr(fn, "__func__", fn)
    for cell_name, cell in zip(getattr(getattr(inner, "__code__", None), "co_freevars", ()),
                               getattr(inner, "__closure__", None) or ()):
        try:
            add(f"closure.{cell_name}", cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    code = _code_of(fn)
    scope = getattr(inner, "__globals__", {})
    for global_name in (code.co_names if code is not None else ()):
        add(f"global.{global_name}", scope.get(global_name))
    return found


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
            if attr.startswith("_"):
                continue
            if _plain(value):
                words.append((attr, repr(value)))
            elif not isinstance(value, (torch.nn.Module, torch.Tensor)) and \
                    hasattr(value, "__dict__"):
                # An object of settings (a transformers config): its plain values, such as a
                # rope base, reach graphs as constants.
                words.append((attr, sorted((k, repr(v)) for k, v in vars(value).items()
                                           if not k.startswith("_") and _plain(v))))
        words.append(("training", sub.training))
    return words


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return isinstance(value, _PLAIN)


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


def _file_of(obj: Any) -> Optional[str]:
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
