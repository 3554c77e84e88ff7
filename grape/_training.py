"""Training steps under grape.compile: the optimizers a compiled function steps, the parameters
whose gradients its graphs produce, and the hyperparameters baked into its graphs.

The runtime (csrc/torch/training.cpp) calls into this module only on warm-up and capture calls;
see Note [Gradients of a captured step] and docs/design.md, "Training steps".
"""

from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from grape._predicate import _capturing

__all__ = ["StepWatch", "hyperparameters", "leaves_of", "prepare_backward", "state_tensors"]


def _make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Sets ``capturable=True`` on the param groups of CUDA parameters where the optimizer has
    the option, moving the step counters it already keeps to the parameters' devices (capturable
    Adam keeps them there)."""
    changed = False
    for group in optimizer.param_groups:
        on_cuda = all(p.is_cuda for p in group["params"])
        if on_cuda and "capturable" in group and not group["capturable"]:
            group["capturable"] = True
            changed = True
    if not changed:
        return
    for param, state in optimizer.state.items():
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor) and step.device != param.device:
            state["step"] = step.to(param.device, torch.float32)


class StepWatch:
    """While entered: every optimizer that steps is remembered in ``seen`` (a WeakSet the
    runtime keeps across calls) and made capturable. Outside a capture that is a setting change;
    inside one, an optimizer that is not capturable yet (or has no state yet) cannot be fixed
    without host work, so its step raises with what to do."""

    def __init__(self, seen: weakref.WeakSet):
        self.seen = seen
        self.stepped: list[torch.optim.Optimizer] = []
        self._handle = None

    def _pre_step(self, optimizer, args, kwargs):
        if _capturing():
            if optimizer not in self.seen:
                raise RuntimeError(
                    f"{type(optimizer).__name__}.step() ran for the first time while capturing; grape "
                    "makes optimizers capturable during warm-up calls (use warmup >= 1)")
            if any(not group.get("capturable", True) for group in optimizer.param_groups):
                raise RuntimeError(f"{type(optimizer).__name__} has capturable=False")
        else:
            _make_capturable(optimizer)
        self.seen.add(optimizer)
        if not any(o is optimizer for o in self.stepped):
            self.stepped.append(optimizer)

    def __enter__(self) -> "StepWatch":
        self._handle = register_optimizer_step_pre_hook(self._pre_step)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def leaves_of(arguments, optimizers, parameters) -> list[torch.Tensor]:
    """The tensors whose ``.grad`` a captured step may set: the tensor arguments that require
    grad, then the parameters that require grad of the optimizers, then ``parameters`` (the
    modules', which the runtime reads from them), each once."""
    leaves, ids = [], set()

    def add(p):
        if isinstance(p, torch.Tensor) and p.requires_grad and id(p) not in ids:
            ids.add(id(p))
            leaves.append(p)

    for p in arguments:
        add(p)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                add(p)
    for p in parameters:
        add(p)
    return leaves


def hyperparameters(optimizers) -> list[tuple]:
    """What a graph of an optimizer's step bakes in from Python: for every param group, each
    setting that is not a tensor (a tensor setting, such as ``lr=torch.tensor(...)`` on the
    device, is read by the kernels, so only its identity matters). A replay whose settings
    differ (a learning-rate scheduler changed a float ``lr``) must capture again."""
    settings = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for key, value in group.items():
                if key != "params":
                    settings.append((group, key, value))
    return settings


def state_tensors(optimizers) -> list[torch.Tensor]:
    """The optimizers' state tensors (moments, step counters): static state of the graphs."""
    tensors = []
    for optimizer in optimizers:
        for state in optimizer.state.values():
            if isinstance(state, dict):
                tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return tensors


def prepare_backward(device: torch.device) -> None:
    """A small backward pass on the current stream (a compiled function's capture stream),
    outside any capture: the autograd engine's device thread sets up its cuBLAS handle and that
    stream's workspaces now, from PyTorch's allocator, rather than inside the first capture."""
    with torch.enable_grad():
        for dtype in (torch.float32, torch.float16):
            w = torch.ones(16, 16, device=device, dtype=dtype, requires_grad=True)
            b = torch.ones(16, device=device, dtype=dtype, requires_grad=True)
            torch.nn.functional.linear(w, w, b).sum().backward()
