"""The predication rewriter: data-dependent ``if``/``elif``/``else``, ``break`` and ``continue`` on
CUDA tensors become predication contexts, so they run inside graphs (docs/semantics.md,
"The predication rewriter").

``grape.compile`` rewrites a function whose source is available, once, before its first call.
Python semantics are kept wherever a condition is not a CUDA tensor under capture: every rewritten
``if`` first evaluates its condition, then either runs the original ``if`` (a Python value, or any
value outside capture) or the predicated form. The predicated form runs both branches' Python code
while capturing, each inside its ``grape.Predicate`` block, and merges every name the branches
rebind with ``torch.where``. ``break`` and ``continue`` become flags and guards first (the usual
elimination), so a tensor-conditioned ``break`` turns the rest of the loop into predicated blocks.

The transformation, for ``if C: A else: B`` assigning ``x``::

    c = C
    if rt.predicated(c):
        p = rt.branch(c, where)                 # validates c, makes the Predicate
        pre_x = rt.value_of(lambda: x)          # UNDEFINED if unbound
        with p:            A;  t_x = rt.value_of(lambda: x)
        x = pre_x                               # (unbound again if it was)
        with p.otherwise(): B; f_x = rt.value_of(lambda: x)
        x = rt.merge(p, t_x, f_x, "x", where)
    elif c: A
    else:   B
"""

from __future__ import annotations

import ast
import copy
import inspect
from collections import Counter
import textwrap
import types
import warnings
from typing import Callable, Optional

import torch

from grape import _predicate

__all__ = ["RewriteError", "rewrite", "rewritten_source"]

_PREFIX = "__grape_"
_RT = _PREFIX + "rt"


class RewriteError(RuntimeError):
    """A tensor-dependent branch that cannot be predicated; the message names the file and line
    and says what to change."""


class _Undefined:
    def __repr__(self):
        return "UNDEFINED"


UNDEFINED = _Undefined()

# Statements whose effect cannot be predicated: they leave the function, change scopes or have
# Python-side effects that a replay would not repeat.
_UNSUPPORTED = {
    ast.Return: "a return", ast.Raise: "a raise", ast.Global: "a global statement",
    ast.Nonlocal: "a nonlocal statement", ast.Delete: "a del statement", ast.Import: "an import",
    ast.ImportFrom: "an import", ast.FunctionDef: "a function definition",
    ast.AsyncFunctionDef: "a function definition", ast.ClassDef: "a class definition",
    ast.Try: "a try statement", ast.With: "a with statement", ast.Assert: "an assert",
    ast.AsyncWith: "a with statement", ast.AsyncFor: "an async for", ast.Match: "a match statement",
}
if hasattr(ast, "TryStar"):
    _UNSUPPORTED[ast.TryStar] = "a try statement"
_ADVICE = {
    "a return": "assign the result to a variable in both branches and return it after the if",
    "a break or continue": "keep it directly in if/else blocks of a loop without an else clause",
    "an assignment to an attribute": "compute the value with torch.where, or update a tensor "
                                     "attribute in place (self.t.copy_(...))",
}


# --- run time ------------------------------------------------------------------------------------

class _Runtime:
    """What rewritten code calls (bound as a closure variable of the rewritten function)."""

    UNDEFINED = UNDEFINED

    @staticmethod
    def predicated(condition) -> bool:
        return isinstance(condition, torch.Tensor) and condition.is_cuda and _predicate._capturing()

    @staticmethod
    def branch(condition: torch.Tensor, where: str) -> _predicate.Predicate:
        if condition.numel() != 1:
            raise RewriteError(f"{where}: the condition is a tensor of {condition.numel()} elements; "
                               "reduce it to one (x.any(), x.all()) as Python's if would require")
        if condition.dtype != torch.bool:
            condition = condition != 0
        return _predicate.Predicate(condition.reshape(()))

    @staticmethod
    def unsupported(condition, what: str, where: str, on_unsupported: str) -> bool:
        """A branch holding `what` on `condition`: its truth value the Python way (a host sync),
        after an error or a warning when that condition would need predication."""
        if _Runtime.predicated(condition):
            message = (f"{where}: {what} inside a branch on a CUDA tensor cannot be predicated"
                       f"; {_ADVICE.get(what, 'move it out of the branch')}")
            if on_unsupported != "sync":
                raise RewriteError(message + ", or pass on_unsupported='sync' to grape.compile to "
                                   "synchronize (the call then runs eagerly)")
            warnings.warn(message + "; synchronizing (on_unsupported='sync')", stacklevel=3)
        return bool(condition)

    @staticmethod
    def merge(branch: _predicate.Predicate, taken, not_taken, name: str, where: str,
              read_outside: bool = True):
        if taken is not_taken:
            return taken
        if taken is UNDEFINED or not_taken is UNDEFINED:
            if not read_outside:  # a temporary of one branch
                return not_taken if taken is UNDEFINED else taken
            raise RewriteError(f"{where}: '{name}' is assigned in one branch only of a branch on a "
                               "CUDA tensor; give it a value before the if (or in both branches)")
        condition = branch._condition
        if isinstance(taken, torch.Tensor) or isinstance(not_taken, torch.Tensor):
            for value in (taken, not_taken):
                if not isinstance(value, (torch.Tensor, bool, int, float)):
                    raise RewriteError(f"{where}: '{name}' is a tensor in one branch and a "
                                       f"{type(value).__name__} in the other")
            if isinstance(taken, torch.Tensor) and isinstance(not_taken, torch.Tensor) and (
                    taken.shape != not_taken.shape or taken.dtype != not_taken.dtype):
                raise RewriteError(f"{where}: '{name}' has shape {tuple(taken.shape)} {taken.dtype} "
                                   f"in one branch and {tuple(not_taken.shape)} {not_taken.dtype} in "
                                   "the other; a graph needs one")
            return torch.where(condition, taken, not_taken)
        numbers = (bool, int, float)
        if isinstance(taken, numbers) and isinstance(not_taken, numbers):
            if taken == not_taken and type(taken) is type(not_taken):
                return taken
            full = [torch.full((), v, device=condition.device) for v in (taken, not_taken)]
            return torch.where(condition, full[0], full[1])
        if isinstance(taken, (tuple, list)) and type(taken) is type(not_taken) and \
                len(taken) == len(not_taken):
            return type(taken)(_Runtime.merge(branch, a, b, f"{name}[{i}]", where)
                               for i, (a, b) in enumerate(zip(taken, not_taken)))
        if taken == not_taken:
            return taken
        raise RewriteError(f"{where}: '{name}' takes different Python values in the two branches "
                           "of a branch on a CUDA tensor; make it a tensor or keep it the same")

    @staticmethod
    def is_true(flag, where: str = "") -> bool:
        """A break flag: True stops a Python loop; a tensor flag never does (later iterations run,
        predicated off)."""
        return flag is True

    @staticmethod
    def while_break(flag, where: str) -> bool:
        if isinstance(flag, torch.Tensor):
            raise RewriteError(f"{where}: a break on a CUDA tensor inside a while loop cannot be "
                               "predicated (the Python loop would never end); use "
                               "grape.while_loop(cond_fn, body_fn, carried)")
        return flag is True

    @staticmethod
    def check_loop_target(flag, name: str, where: str) -> None:
        if isinstance(flag, torch.Tensor):
            raise RewriteError(f"{where}: the loop variable '{name}' is read after a loop left by a "
                               "break on a CUDA tensor; after predication it holds the last item. "
                               "Record what you need in a tensor inside the loop")

    @staticmethod
    def live(broken, continued):
        """`not (broken or continued)`, for Python bools and bool tensors."""
        if broken is True or continued is True:
            return False
        flags = [f for f in (broken, continued) if isinstance(f, torch.Tensor)]
        if not flags:
            return True
        return ~(flags[0] | flags[1]) if len(flags) == 2 else ~flags[0]


# --- source transformation -----------------------------------------------------------------------

def _stores(statements) -> list[str]:
    """Names a block binds, in order, outside nested scopes and generated names."""
    names: list[str] = []

    class Visitor(ast.NodeVisitor):
        def visit_Name(self, node):
            if isinstance(node.ctx, ast.Store) and node.id not in names and node.id != _RT:
                names.append(node.id)

        def visit_FunctionDef(self, node):  # its own scope
            pass

        visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

        def visit_ListComp(self, node):
            pass

        visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

    for s in statements:
        Visitor().visit(s)
    return names


def _walk_scope(statements):
    """ast.walk over a function's own scope: nested functions, classes and lambdas excluded."""
    stack = list(statements)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _attribute_store(statements) -> bool:
    """Whether a block assigns an attribute (a Python side effect a merge cannot undo)."""
    return any(isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
               for s in statements for n in ast.walk(s))


def _load_counts(node) -> Counter:
    return Counter(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


def _unsupported_in(statements) -> Optional[str]:
    """The first statement kind in a block that predication cannot express, if any."""
    if _loops_control(statements):  # left where elimination does not reach (try, with, for-else)
        return "a break or continue"
    for s in statements:
        for node in ast.walk(s):
            what = _UNSUPPORTED.get(type(node))
            if what is None and isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
                what = "a yield" if not isinstance(node, ast.Await) else "an await"
            if what is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("print", "input"):
                what = f"a call of {node.func.id}"
            if what is not None:
                return what
    return None


def _loops_control(statements, kinds=(ast.Break, ast.Continue)) -> bool:
    """Whether a block holds break/continue that belong to the loop around it."""
    for s in statements:
        if isinstance(s, kinds):
            return True
        if isinstance(s, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef,
                          ast.ClassDef)):
            continue
        for field in ("body", "orelse", "handlers", "finalbody"):
            inner = getattr(s, field, None)
            if isinstance(inner, list) and _loops_control(inner, kinds):
                return True
    return False


def _parse(code: str) -> list[ast.stmt]:
    """Generated statements, without locations: they take those of the user's statement they
    stand for (ast.fix_missing_locations), so tracebacks point at the user's line."""
    statements = ast.parse(textwrap.dedent(code)).body
    for s in statements:
        for n in ast.walk(s):
            for attribute in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
                if attribute in n._attributes:
                    delattr(n, attribute)
    return statements


def _at(statements: list[ast.stmt], node) -> list[ast.stmt]:
    for s in statements:
        if not hasattr(s, "lineno"):
            ast.copy_location(s, node)
    return statements


class _Rewriter(ast.NodeTransformer):
    def __init__(self, filename: str, first_line: int, on_unsupported: str, loads: Counter,
                 outer_names: set):
        self.loads = loads  # how many times the function reads each name
        self.outer_names = outer_names  # names it declares global or nonlocal
        self.filename = filename
        self.line_offset = first_line - 1  # the parsed source starts at line 1
        self.on_unsupported = on_unsupported
        self.counter = 0

    def fresh(self, kind: str) -> str:
        self.counter += 1
        return f"{_PREFIX}{kind}{self.counter}"

    def reads_outside(self, node, name: str, inside: Counter | None = None) -> bool:
        """Whether the function reads `name` outside `node` (`inside`: node's reads before its
        children were rewritten, which duplicates them)."""
        return self.loads[name] > (inside if inside is not None else _load_counts(node))[name]

    def where(self, node) -> str:
        return f"{self.filename}:{node.lineno + self.line_offset}"

    # Nested scopes keep their own control flow.
    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    # --- loops: break/continue -> flags and guards ----------------------------------------------
    def visit_For(self, node):
        return self._loop(node)

    def visit_While(self, node):
        return self._loop(node)

    def _loop(self, node):
        if node.orelse or not _loops_control(node.body):
            node.body = self._block(node.body)
            node.orelse = self._block(node.orelse)
            return node
        where = self.where(node)
        targets = [n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)] \
            if isinstance(node, ast.For) else []
        read_later = [t for t in targets if self.reads_outside(node, t)]  # before the rewrite
        broken, continued = self.fresh("break"), self.fresh("continue")
        # Once a break on a tensor may have happened, every later iteration runs predicated off.
        guard = _at(_parse(f"if {_RT}.live({broken}, False):\n    pass"), node)[0]
        guard.body = self._eliminate(node.body, broken, continued)
        leave = "is_true" if isinstance(node, ast.For) else "while_break"
        node.body = self._block(_at(_parse(f"{continued} = False"), node) + [guard]) + _at(_parse(
            f"if {_RT}.{leave}({broken}, {where!r}):\n    break"), node)  # before the next item
        after = []
        if read_later:  # its value after a predicated break would be the last item's
            after = _parse(f"{_RT}.check_loop_target({broken}, {read_later[0]!r}, {where!r})")
        return _at(_parse(f"{broken} = False") + [node] + after, node)

    def _eliminate(self, statements, broken: str, continued: str) -> list[ast.stmt]:
        """The block with its break/continue replaced by flags, and what follows a statement that
        may set one guarded by `live`."""
        out: list[ast.stmt] = []
        for i, s in enumerate(statements):
            if isinstance(s, (ast.Break, ast.Continue)):
                out += _at(_parse(f"{broken if isinstance(s, ast.Break) else continued} = True"), s)
                # Unreachable code stays (unreachable): its assignments keep names local.
                rest = statements[i + 1:]
                if rest:
                    out.append(ast.copy_location(ast.If(test=ast.Constant(False), body=rest, orelse=[]),
                                                 rest[0]))
                return out
            if isinstance(s, ast.If) and _loops_control([s]):
                s.body = self._eliminate(s.body, broken, continued)
                s.orelse = self._eliminate(s.orelse, broken, continued)
                out.append(s)
                rest = statements[i + 1:]
                if rest:
                    guard = _at(_parse(f"if {_RT}.live({broken}, {continued}):\n    pass"), rest[0])[0]
                    guard.body = self._eliminate(rest, broken, continued)
                    out.append(guard)
                return out
            out.append(s)
        return out

    # --- if -> predicated if ---------------------------------------------------------------------
    def visit_If(self, node):
        what = _unsupported_in(node.body + node.orelse)  # in the user's code, not what we generate
        inside = _load_counts(node)
        shared = [n for n in _stores(node.body + node.orelse) if n in self.outer_names]
        if what is None and shared:
            what = f"an assignment to the global or nonlocal '{shared[0]}'"
        if what is None and _attribute_store(node.body + node.orelse):
            what = "an assignment to an attribute"
        node.body = self._block(node.body)
        node.orelse = self._block(node.orelse)
        where = self.where(node)
        c = self.fresh("cond")
        head = ast.Assign(targets=[ast.Name(c, ast.Store())], value=node.test)
        python_if = ast.If(test=ast.Name(c, ast.Load()), body=node.body, orelse=node.orelse)
        if what is not None:
            python_if.test = _parse(
                f"{_RT}.unsupported({c}, {what!r}, {where!r}, {self.on_unsupported!r})")[0].value
            result = [head, python_if]
        else:
            result = [head, ast.If(test=_parse(f"{_RT}.predicated({c})")[0].value,
                                   body=self._predicated(node, c, where, inside), orelse=[python_if])]
        for r in result:
            ast.copy_location(r, node)
        return result

    def _predicated(self, node, c: str, where: str, inside: Counter) -> list[ast.stmt]:
        p = self.fresh("branch")
        # Every name the branches bind is merged. One bound in a single branch and unbound before is
        # a temporary of that branch unless it is read outside the if (then it is an error).
        names = [n for n in _stores(node.body + node.orelse)
                 if not n.startswith(_PREFIX) or n.startswith((_PREFIX + "break", _PREFIX + "continue"))]
        keep = {n: (self.fresh("pre"), self.fresh("taken"), self.fresh("else")) for n in names}

        def capture(target: str, name: str) -> list[ast.stmt]:
            return _parse(f"try:\n    {target} = {name}\nexcept NameError:\n"
                          f"    {target} = {_RT}.UNDEFINED")

        def restore(name: str, saved: str) -> list[ast.stmt]:
            return _parse(f"if {saved} is {_RT}.UNDEFINED:\n    try:\n        del {name}\n"
                          f"    except NameError:\n        pass\nelse:\n    {name} = {saved}")

        out = _parse(f"{p} = {_RT}.branch({c}, {where!r})")
        for n, (pre, _, _) in keep.items():
            out += capture(pre, n)
        taken = _parse(f"with {p}:\n    pass")[0]
        # Copies: the same statements also stay in the Python form, and one AST node must not sit
        # in two places (line numbers would be shifted twice).
        taken.body = copy.deepcopy(node.body) + [s for n, (_, t, _) in keep.items()
                                                 for s in capture(t, n)]
        out.append(taken)
        for n, (pre, _, _) in keep.items():
            out += restore(n, pre)
        otherwise = _parse(f"with {p}.otherwise():\n    pass")[0]
        otherwise.body = copy.deepcopy(node.orelse) + [s for n, (_, _, e) in keep.items()
                                                       for s in capture(e, n)]
        if not otherwise.body:
            otherwise.body = [ast.Pass()]
        if node.orelse:
            out.append(otherwise)
        else:  # nothing runs where the condition is false: the names keep their values
            out += [s for n, (pre, _, e) in keep.items() for s in _parse(f"{e} = {pre}")]
        for n, (_, t, e) in keep.items():
            out += _parse(f"{n} = {_RT}.merge({p}, {t}, {e}, {n!r}, {where!r}, "
                          f"{self.reads_outside(node, n, inside)})")
        return out

    def _block(self, statements) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in statements:
            r = self.visit(s)
            out += r if isinstance(r, list) else [r]
        return out


def rewritten_source(fn: Callable, on_unsupported: str = "error") -> Optional[str]:
    """The source of what grape runs for `fn` (its definition after the rewrite), or None when it
    is left as is: to see how a branch was predicated."""
    tree = _transform(fn, on_unsupported)
    return None if isinstance(tree, str) or tree is None else ast.unparse(tree[1])


def _transform(fn: Callable, on_unsupported: str):
    """(target function, rewritten definition), None when there is nothing to rewrite, or a string
    saying why it cannot be rewritten."""
    if on_unsupported not in ("error", "sync"):
        raise ValueError(f"grape.compile: on_unsupported must be 'error' or 'sync', got {on_unsupported!r}")
    target = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if not isinstance(target, types.FunctionType):
        return f"{type(fn).__name__} is not a Python function"
    if target.__name__ == "<lambda>":
        return "a lambda has no statements to rewrite"
    if hasattr(target, "__wrapped__"):
        return "it wraps another function (functools.wraps): its source is not what it runs"
    try:
        source = textwrap.dedent(inspect.getsource(target))
        filename = inspect.getsourcefile(target) or target.__code__.co_filename
        definition = ast.parse(source).body[0]
    except (OSError, TypeError):
        return "its source is not available"
    except SyntaxError:
        return "its source does not parse on its own (indented continuation lines)"
    if "." in target.__qualname__ and any(
            isinstance(n, ast.Attribute) and n.attr.startswith("__") and not n.attr.endswith("__")
            for n in ast.walk(definition)):
        return "it uses private names of its class (self.__x), which only the class body mangles"
    if not isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
            definition.name != target.__name__:
        return "its source is not a plain function definition"
    if not any(isinstance(n, (ast.If, ast.Break, ast.Continue)) for n in ast.walk(definition)):
        return None
    definition.decorator_list = []
    outer_names = {name for node in _walk_scope(definition.body)
                   if isinstance(node, (ast.Global, ast.Nonlocal)) for name in node.names}
    rewriter = _Rewriter(filename, target.__code__.co_firstlineno, on_unsupported,
                         _load_counts(definition), outer_names)
    definition.body = rewriter._block(definition.body)
    ast.fix_missing_locations(definition)
    return target, definition, filename


def rewrite(fn: Callable, on_unsupported: str = "error") -> tuple[Callable, Optional[str]]:
    """(the rewritten function, None), or (fn, why it was left as is)."""
    transformed = _transform(fn, on_unsupported)
    if transformed is None or isinstance(transformed, str):
        return fn, transformed
    target, definition, filename = transformed
    # A factory whose closure holds the runtime helpers, then the function's own free variables.
    factory = ast.FunctionDef(
        name=_PREFIX + "factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(_RT)] + [ast.arg(v) for v in
                                                                   target.__code__.co_freevars],
                           kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[definition, ast.Return(ast.Name(definition.name, ast.Load()))], decorator_list=[],
        returns=None)
    if "type_params" in ast.FunctionDef._fields:
        factory.type_params = []
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, target.__code__.co_firstlineno - 1)
    code = compile(module, filename, "exec")
    factory_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    inner = next(c for c in factory_code.co_consts if isinstance(c, types.CodeType)
                 and c.co_name == target.__name__)
    cells = dict(zip(target.__code__.co_freevars, target.__closure__ or ()))
    cells[_RT] = types.CellType(_Runtime)
    rewritten = types.FunctionType(inner, target.__globals__, target.__name__, target.__defaults__,
                                   tuple(cells[name] for name in inner.co_freevars))
    rewritten.__kwdefaults__ = target.__kwdefaults__
    rewritten.__dict__.update(target.__dict__)
    rewritten.__wrapped__ = target
    rewritten.__qualname__ = target.__qualname__
    rewritten.__doc__ = target.__doc__
    if isinstance(fn, types.MethodType):
        return types.MethodType(rewritten, fn.__self__), None
    return rewritten, None
