"""Data-dependent control flow inside CUDA graphs: grape.Predicate and grape.while_loop.

Under capture (inside a function grape.compile is capturing, or any CUDA graph capture) they add
CUDA conditional nodes: the condition is read on the GPU at every replay and the skipped body's
kernels do not run (csrc/cuda/conditional.h, Note [Conditional capture]). Outside capture they
read the condition on the host (a synchronization) and behave like ``if`` and ``while``.
See docs/semantics.md, "Predication".
"""

from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grape import _C, _distributed

__all__ = ["Predicate", "PredicateError", "raised_in_body", "while_loop"]

# Operator namespaces of torch.distributed's collectives (c10d's and the functional ones).
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


class PredicateError(RuntimeError):
    """An operation that a predicated body cannot hold under capture (a collective)."""


class _CollectivesRefused(TorchDispatchMode):
    """Active while a predicated body is captured in a torch.distributed process: a collective
    there fails the capture at once, and the call runs eagerly, collective included (Note [Ranks
    decide alone] in grape/_distributed.py). A CUDA conditional body cannot hold the cross-stream
    waits that a NCCL collective makes, and ranks whose conditions differ would leave it waiting
    forever."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in _COLLECTIVE_NAMESPACES:
            raise RuntimeError(
                f"grape: {self.what}: a torch.distributed collective ({func}) inside a predicated "
                "body cannot be captured: a CUDA conditional body cannot hold the cross-stream "
                "waits of a NCCL collective. Call the collective outside the body (compute the "
                "branch's values, select them with torch.where, then reduce once)")
        return func(*args, **(kwargs or {}))


# Set on an exception that left a body under capture (Note [Exceptions under capture] in
# csrc/core/capture_policy.h): the body was captured whatever its condition, so eager may not have
# run the code that raised, and the call runs eagerly instead of raising.
_RAISED_IN_BODY = "_grape_raised_in_predicated_body"


def raised_in_body(error: BaseException) -> bool:
    """Whether `error` left a grape.Predicate or grape.while_loop body while it was captured."""
    return bool(getattr(error, _RAISED_IN_BODY, False))


class _Body:
    """The capture of one predicated body: its conditional node's body, with collectives refused
    where this process is a rank of a process group."""

    def __init__(self, branch, index: int, what: str):
        self._branch = branch
        self._refused = _CollectivesRefused(what) if _distributed.active() else None
        branch.begin_body(index)
        if self._refused is not None:
            self._refused.__enter__()

    def end(self, error: Optional[BaseException] = None) -> None:
        if error is not None:
            try:
                setattr(error, _RAISED_IN_BODY, True)
            except (AttributeError, TypeError):  # an exception type that takes no attributes
                pass
        if self._refused is not None:
            self._refused.__exit__(None, None, None)
        self._branch.end_body()


def _check_condition(condition, what: str) -> None:
    if not isinstance(condition, torch.Tensor):
        raise TypeError(f"{what} needs a one-element CUDA bool tensor as its condition, got "
                        f"{type(condition).__name__} (a Python bool needs no predication: use if)")
    if not condition.is_cuda and _capturing():
        # Outside capture the condition is read on the host wherever it lives (a machine without
        # a GPU runs everything eagerly), as eager would; a graph reads it on the GPU at every
        # replay. A grape error under capture: the call runs eagerly, with the reason.
        raise RuntimeError(f"grape: {what}: a condition on {condition.device} cannot be captured "
                           "(a replay reads it on the GPU): make it a one-element CUDA bool tensor")
    if condition.dtype != torch.bool:
        raise TypeError(f"{what} needs a one-element CUDA bool tensor as its condition, got dtype "
                        f"{condition.dtype} (compare it, e.g. x > 0)")
    if condition.numel() != 1:
        raise ValueError(f"{what} needs a one-element CUDA bool tensor as its condition, got "
                         f"{condition.numel()} elements (reduce it, e.g. x.any() or x.all())")


def _capturing() -> bool:
    return bool(getattr(_C, "built_with_cuda", False)) and torch.cuda.is_available() and \
        _C.stream_is_capturing()


class _SkipBody(Exception):
    """Raised at the first line of a with-block whose branch is not taken; its __exit__ swallows it."""


class _HostBranch:
    """A with-block that runs only when `taken`: Python has no way to skip a with-block's body, so
    __enter__ sets a trace function on the caller's frame that raises _SkipBody at the body's
    first line, and __exit__ swallows it and restores tracing. (A body written on the same line as
    its ``with`` runs regardless; write it on its own lines.)"""

    def __init__(self, taken: bool):
        self.taken = taken
        self._frame = None
        self._previous_trace = None
        self._previous_frame_trace = None

    def __enter__(self):
        return self.enter(sys._getframe(1))

    def enter(self, frame):
        """__enter__ for the with-statement that `frame` runs."""
        if not self.taken:
            self._frame = frame
            self._previous_trace = sys.gettrace()
            self._previous_frame_trace = frame.f_trace  # a debugger's or coverage's
            sys.settrace(lambda *_: None)  # tracing on, so that the frame's own tracer runs

            def skip(frame, event, arg):
                raise _SkipBody

            self._frame.f_trace = skip
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._frame is None:
            return False
        self._frame.f_trace = self._previous_frame_trace
        sys.settrace(self._previous_trace)
        self._frame = None
        return exc_type is _SkipBody


class Predicate:
    """``with grape.Predicate(x):`` runs its body only where ``x`` is true.

    ``x`` is a one-element CUDA bool tensor. Under capture the body becomes the body of a CUDA
    conditional node: every replay reads ``x`` on the GPU and skips the body's kernels when it is
    false. Outside capture ``x`` is read on the host and the body runs or not, as under ``if``.
    ``otherwise()`` gives the else block; it must directly follow the Predicate block::

        branch = grape.Predicate(done)
        with branch:
            out.copy_(a)
        with branch.otherwise():
            out.copy_(b)

    Tensors created inside a body that a replay skips hold unspecified values: read them only
    under the same predicate (or merge them with torch.where). Predicates nest.
    """

    def __init__(self, condition: torch.Tensor):
        _check_condition(condition, "grape.Predicate")
        self._condition = condition
        self._branch = None  # the conditional node, under capture
        self._body = None  # the body being captured
        self._host = None  # the host branch, outside capture
        self._state = "new"

    def __enter__(self) -> "Predicate":
        if self._state != "new":
            raise RuntimeError("a grape.Predicate is entered once; make a new one for another block")
        self._state = "if"
        if _capturing():
            kind = "if_else" if not _C.conditional_unsupported_reason("if_else") else "if"
            self._branch = _C.ConditionalBranch(self._condition, kind)
            self._body = _Body(self._branch, 0, "grape.Predicate")
            return self
        self._host = _HostBranch(bool(self._condition.item()))
        self._host.enter(sys._getframe(1))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._state = "if done"
        if self._body is not None:
            self._body.end(exc)
            return False
        return self._host.__exit__(exc_type, exc, tb)

    def otherwise(self) -> "_Otherwise":
        """The else block of this predicate: runs where the condition is false."""
        if self._state != "if done":
            raise RuntimeError("otherwise() follows its Predicate's own with-block")
        self._state = "else"
        return _Otherwise(self)


class _Otherwise:
    def __init__(self, predicate: Predicate):
        self._predicate = predicate
        self._body = None
        self._host = None

    def __enter__(self) -> "_Otherwise":
        p = self._predicate
        if p._branch is not None:
            if p._branch.bodies < 2:
                raise RuntimeError("grape: otherwise() under capture needs CUDA conditional "
                                   "IF/ELSE nodes: " + _C.conditional_unsupported_reason("if_else"))
            self._body = _Body(p._branch, 1, "grape.Predicate.otherwise")
            return self
        self._host = _HostBranch(not p._host.taken)
        self._host.enter(sys._getframe(1))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._body is not None:
            self._body.end(exc)
            return False
        return self._host.__exit__(exc_type, exc, tb)


def while_loop(cond_fn: Callable[..., torch.Tensor], body_fn: Callable[..., Sequence[torch.Tensor]],
               carried: Sequence[torch.Tensor]) -> tuple:
    """``while cond_fn(*carried): carried = body_fn(*carried)``, returning the final ``carried``.

    The signature of ``torch._higher_order_ops.while_loop``: ``carried`` is a tuple of tensors,
    ``body_fn`` returns tensors of the same shapes and dtypes, ``cond_fn`` a one-element CUDA bool
    tensor. Under capture the loop is a CUDA WHILE node: the whole loop replays in one graph launch,
    the GPU deciding when it ends. Outside capture it is a Python loop that reads the condition on
    the host every iteration. The tensors passed in are not modified; the result is new tensors.
    """
    carried = tuple(carried)
    for t in carried:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"grape.while_loop carries tensors, got {type(t).__name__}")
    state = tuple(t.clone() for t in carried)  # new tensors, whatever the number of iterations
    if not _capturing():
        while True:
            condition = cond_fn(*state)
            _check_condition(condition, "grape.while_loop's cond_fn")
            if not bool(condition.item()):
                return state
            state = _checked_step(body_fn(*state), state)
    branch = _C.ConditionalBranch(cond_fn(*state), "while")
    body = _Body(branch, 0, "grape.while_loop")
    error = None
    try:
        new = _checked_step(body_fn(*state), state)
        # A value that shares memory with another carried tensor is read before anything is
        # written back: (b, a) swaps, (x + 1, x) shifts.
        storages = {s.untyped_storage().data_ptr() for s in state}
        staged = [n if n is s or n.untyped_storage().data_ptr() not in storages else n.clone()
                  for s, n in zip(state, new)]
        for s, n in zip(state, staged):
            if n is not s:
                s.copy_(n)
        branch.set_condition(cond_fn(*state))
    except BaseException as e:
        error = e
        raise
    finally:
        body.end(error)
    return state


def _checked_step(new, carried: tuple) -> tuple:
    new = tuple(new) if isinstance(new, (tuple, list)) else (new,)
    if len(new) != len(carried):
        raise ValueError(f"grape.while_loop: body_fn returned {len(new)} values for "
                         f"{len(carried)} carried tensors")
    for i, (n, c) in enumerate(zip(new, carried)):
        if not isinstance(n, torch.Tensor) or n.shape != c.shape or n.dtype != c.dtype:
            got = f"{tuple(n.shape)} {n.dtype}" if isinstance(n, torch.Tensor) else type(n).__name__
            raise ValueError(f"grape.while_loop: body_fn's value {i} must keep the carried "
                             f"tensor's shape {tuple(c.shape)} and dtype {c.dtype}, got {got}")
    return new
