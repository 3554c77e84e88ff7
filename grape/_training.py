"""Training steps under grape.compile: the optimizers a compiled function steps, the parameters
whose gradients its graphs produce, the hyperparameters baked into its graphs, and the ones its
graphs read from device memory (Note [Device settings]).

The runtime (csrc/torch/graphs/training.cpp) calls into this module only on warm-up and capture
calls; see Note [Gradients of a captured step] and docs/design.md, "Training steps".
"""

from __future__ import annotations

import numbers
import sys
import weakref
from typing import Optional

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.weak import WeakIdKeyDictionary

from grape import _C, _distributed
from grape._predicate import _capturing

__all__ = ["DeviceSetting", "DeviceSettings", "DeviceSettingsSwap", "Seen", "StepWatch",
           "device_keys", "hyperparameters", "leaves_of", "leaves_reached", "prepare_backward",
           "state_tensors"]


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


class Seen:
    """What a compiled function's warm-ups and captures have seen of its training steps, held
    weakly across calls: the optimizers it stepped, and the leaves its backward passes reached
    (whose ``.grad`` its graphs set or accumulate into)."""

    def __init__(self):
        self.optimizers: weakref.WeakSet = weakref.WeakSet()
        self.leaves = WeakIdKeyDictionary()  # tensor -> None, in the order first seen
        self.backward_seen = False
        self.ddp = _distributed.DDPWatch()

    def defers_capture(self) -> bool:
        """Whether a call that would capture now warms up instead (Note [DDP under capture] in
        grape/_distributed.py)."""
        return self.ddp.defers_capture()

    @property
    def training(self) -> bool:
        """Whether a backward pass or an optimizer step was seen: until then a capture tracks
        no module's parameters that has no gradient (Note [Gradients of a captured step])."""
        return self.backward_seen or len(self.optimizers) > 0


class StepWatch:
    """While entered: every optimizer that steps is remembered in ``seen.optimizers`` and made
    capturable, every leaf a backward pass reaches in ``seen.leaves``, and every
    DistributedDataParallel module that runs in ``seen.ddp``. Outside a capture that
    is a setting change; inside one, an optimizer that is not capturable yet (or has no state
    yet), cannot be fixed without host work, so its step raises with what to do; a backward pass
    that reaches a leaf whose gradient the capture does not track is remembered, and fails the
    capture once the function returned if the leaf outlives the call (untracked_leaves_kept)."""

    def __init__(self, seen: Seen):
        self.seen = seen
        self.stepped: list[torch.optim.Optimizer] = []
        # Why no capture of the function can succeed, seen in a warm-up: the function then runs
        # eagerly without trying, since a capture that fails half-way leaves Python state (the
        # GradScaler's per-optimizer stage) that the eager run after it would read.
        self.refusal: Optional[str] = None
        self._handle = None
        self._ddp_pre_forward = None
        self._backward = None
        # In a capture: the leaves its backward passes reached untracked, with their gradients
        # before (Note [Gradients of a captured step]).
        self._untracked: list[tuple[weakref.ref, Optional[torch.Tensor]]] = []

    def _pre_step(self, optimizer, args, kwargs):
        if not _capturing() and _stepped_by_grad_scaler() and not getattr(
                optimizer, "_step_supports_amp_scaling", False):
            self.refusal = (f"GradScaler.step reads found-inf on the host (.item()) for "
                            f"{type(optimizer).__name__} without fused=True, a synchronization no "
                            "capture allows; fused Adam and AdamW take it on the device")
        if _capturing():
            if optimizer not in self.seen.optimizers:
                raise RuntimeError(
                    f"{type(optimizer).__name__}.step() ran for the first time while capturing; grape "
                    "makes optimizers capturable during warm-up calls (use warmup >= 1)")
            if any(not group.get("capturable", True) for group in optimizer.param_groups):
                raise RuntimeError(f"{type(optimizer).__name__} has capturable=False")
        else:
            _make_capturable(optimizer)
        self.seen.optimizers.add(optimizer)
        if not any(o is optimizer for o in self.stepped):
            self.stepped.append(optimizer)

    def _pre_backward(self, tensors, inputs) -> None:
        self.seen.backward_seen = True
        known = self.seen.leaves
        for leaf in leaves_reached(tensors, inputs):
            if leaf not in known:
                known[leaf] = None
                if _capturing():
                    self._untracked.append((weakref.ref(leaf), leaf.grad))

    def untracked_leaves_kept(self) -> Optional[str]:
        """After a capture's function returned: why the capture cannot be used, where its backward
        passes reached leaves it did not track that outlive the call (a leaf the function made,
        such as an input it set requires_grad on, dies with the call and does not count). Their
        gradients are put back when the watch is left; they are known from now on."""
        kept = sum(ref() is not None for ref, _ in self._untracked)
        if not kept:
            return None
        return (f"a backward pass reached {kept} tensor(s) whose .grad grape did not track when "
                "the capture began (parameters of a module that is neither compiled, an argument, "
                "nor stepped by an optimizer seen in a warm-up); they are tracked from now on")

    def __enter__(self) -> "StepWatch":
        self._handle = register_optimizer_step_pre_hook(self._pre_step)
        # DistributedDataParallel's own step before each forward: seen there, rather than by a
        # global module hook, which torch.compile would trace into every compiled module.
        ddp = _distributed.ddp_class()
        if ddp is not None:
            self._ddp_pre_forward = original_pre_forward = ddp._pre_forward
            seen_ddp = self.seen.ddp

            def pre_forward(module, *inputs, **kwargs):
                seen_ddp.saw(module, _capturing())
                return original_pre_forward(module, *inputs, **kwargs)

            ddp._pre_forward = pre_forward
        # Tensor.backward calls torch.autograd.backward through the module: one place sees every
        # backward pass that sets .grad (torch.autograd.grad sets none).
        self._backward = original = torch.autograd.backward

        def backward(tensors, *args, **kwargs):
            inputs = kwargs.get("inputs", args[4] if len(args) > 4 else None)
            self._pre_backward(tensors, inputs)
            return original(tensors, *args, **kwargs)

        torch.autograd.backward = backward
        return self

    def __exit__(self, *exc) -> None:
        torch.autograd.backward = self._backward
        self._handle.remove()
        if self._ddp_pre_forward is not None:
            _distributed.ddp_class()._pre_forward = self._ddp_pre_forward
            self._ddp_pre_forward = None
        for ref, grad in self._untracked:
            leaf = ref()
            if leaf is not None:
                leaf.grad = grad
        self._untracked.clear()


def leaves_reached(tensors, inputs=None) -> list[torch.Tensor]:
    """The leaves whose ``.grad`` a backward pass from ``tensors`` (a tensor, gradient edge, or a
    sequence of them) accumulates into: ``inputs`` where given, else the variables of the
    AccumulateGrad nodes its autograd graph reaches."""
    if inputs is not None:
        inputs = (inputs,) if isinstance(inputs, torch.Tensor) else inputs
        return [t for t in inputs if isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad]
    roots = (tensors,) if isinstance(tensors, torch.Tensor) else tensors
    leaves, stack, visited = [], [], set()
    for root in roots:
        if isinstance(root, torch.Tensor):
            if root.grad_fn is not None:
                stack.append(root.grad_fn)
            elif root.requires_grad:
                leaves.append(root)
        elif getattr(root, "node", None) is not None:  # torch.autograd.graph.GradientEdge
            stack.append(root.node)
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        variable = getattr(node, "variable", None) if type(node).__name__ == "AccumulateGrad" else None
        if variable is not None:
            leaves.append(variable)
        stack.extend(edge[0] for edge in node.next_functions)
    return leaves


def _stepped_by_grad_scaler() -> bool:
    """Whether the optimizer step being taken was called by torch.amp.GradScaler.step."""
    frame = sys._getframe(2)
    for _ in range(8):  # the optimizer's step wrappers, then GradScaler's
        if frame is None:
            return False
        if frame.f_code.co_name == "_maybe_opt_step" and "grad_scaler" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def leaves_of(arguments, seen: Seen, parameters) -> list[torch.Tensor]:
    """The tensors whose ``.grad`` a captured step may set: the tensor arguments that require
    grad, then the parameters that require grad of the optimizers seen, then the leaves backward
    passes were seen to reach, then ``parameters`` (the modules', which the runtime reads from
    them), each once. All of them are seen leaves from then on: a capture tracks them."""
    leaves, ids = [], set()

    def add(p):
        if isinstance(p, torch.Tensor) and p.requires_grad and id(p) not in ids:
            ids.add(id(p))
            leaves.append(p)

    for p in arguments:
        add(p)
    for optimizer in seen.optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                add(p)
    for p in list(seen.leaves.keys()):
        add(p)
    for p in parameters:
        add(p)
    for p in leaves:
        seen.leaves[p] = None
    return leaves


def hyperparameters(optimizers) -> list[tuple]:
    """What a graph of an optimizer's step bakes in from Python: (param group, key, value) for
    each setting of every param group. A setting given as a CUDA tensor is read by the kernels,
    so only its identity matters; a float one that changes (a scheduler's ``lr``) needs another
    capture, unless the graph reads it from device memory (Note [Device settings])."""
    settings = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for key, value in group.items():
                if key != "params":
                    settings.append((group, key, value))
    return settings


# Note [Device settings]
# ~~~~~~~~~~~~~~~~~~~~~~
# A learning-rate scheduler changes group["lr"] before every step. A graph bakes a Python float
# into its kernels' arguments, so each new value would need a capture. Some optimizers read a
# setting from device memory when it is a CUDA tensor (Adam and AdamW with capturable or fused
# groups, fused SGD: their lr), so for those grape keeps one float32 tensor per (param group,
# setting) and
# - during a capture, puts the tensor in the param group in place of the float, and puts the
#   float back when the capture ends: the user's param_group always holds what they wrote, and
#   schedulers, logging and state_dict see floats;
# - before each replay, writes the group's current float into the tensor, on the replay's stream,
#   when it differs from what was written last. Every graph of the function shares the tensor, so
#   that is one small fill per scheduler step.
# The float32 tensor rounds as the kernels round a float argument, so results equal eager's with
# a float setting where the optimizer computes nothing from the setting on the host.
# Settings an optimizer reads on the host (Adam's betas, SGD's momentum: torch converts a tensor
# to a Python number there, a sync that no capture allows) stay baked in: a change captures again,
# with its reason. So does a function that changes a setting itself (a scheduler stepped inside
# the compiled function): its replays would not, so the capture is refused.


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def device_keys(optimizer: torch.optim.Optimizer, group: dict) -> tuple[str, ...]:
    """The settings of ``group`` that ``optimizer.step()`` reads from device memory when they are
    CUDA tensors, without a host synchronization (checked against torch's implementations of
    exactly these classes; a subclass may read them differently)."""
    kind = type(optimizer)
    if kind in (torch.optim.Adam, torch.optim.AdamW):
        return ("lr",) if group.get("capturable") or group.get("fused") else ()
    if kind is torch.optim.SGD:
        return ("lr",) if group.get("fused") else ()
    return ()


def _device_of(group: dict) -> Optional[torch.device]:
    """The one device of a group's parameters (CUDA in a capture; any in tests), or None."""
    params = group["params"]
    if not params or any(p.device != params[0].device for p in params):
        return None
    return params[0].device


class DeviceSetting:
    """The float32 tensor a graph reads one setting of one param group from, and the value last
    written into it (None: nothing yet)."""

    __slots__ = ("group", "key", "tensor", "written")

    def __init__(self, group: dict, key: str, device: torch.device):
        self.group = group
        self.key = key
        self.tensor = torch.zeros((), dtype=torch.float32, device=device)
        self.written = None

    def write(self, value) -> bool:
        """Writes ``value`` (the group's setting now) for the next replay, on the current stream;
        False where it is no longer a number (the graph must be captured again)."""
        if not _is_number(value):
            return False
        if self.written is None or value != self.written:
            self.tensor.fill_(value)
        self.written = value
        return True


class DeviceSettings:
    """The device settings of one compiled function, one per (param group, key), shared by all its
    graphs. Each keeps its group alive, so a group's id is not reused while it is here."""

    def __init__(self):
        self._settings: dict[tuple[int, str], DeviceSetting] = {}

    def setting(self, group: dict, key: str, device: torch.device) -> DeviceSetting:
        found = self._settings.get((id(group), key))
        if found is None or found.tensor.device != device:
            found = DeviceSetting(group, key, device)
            self._settings[(id(group), key)] = found
        return found

    def swap(self, optimizers) -> "DeviceSettingsSwap":
        return DeviceSettingsSwap(self, list(optimizers))


class DeviceSettingsSwap:
    """Entered around one capture (outside the CUDA capture itself, since it allocates): the
    device-readable float settings of ``optimizers`` are their tensors while entered. ``bake``
    then says what the graph reads from device memory and what it baked in, and
    ``changed_by_function`` whether the function changed a setting."""

    def __init__(self, settings: DeviceSettings, optimizers: list):
        self._settings = settings
        self._optimizers = optimizers
        # Each setting swapped in, by (id(group), key): it, the value put back on exit, and its
        # tensor's version on entry.
        self._swapped: dict[tuple[int, str], tuple[DeviceSetting, object, int]] = {}
        self._before: list[tuple] = []

    def __enter__(self) -> "DeviceSettingsSwap":
        self._before = hyperparameters(self._optimizers)
        for optimizer in self._optimizers:
            for group in optimizer.param_groups:
                device = _device_of(group)
                for key in device_keys(optimizer, group) if device is not None else ():
                    value = group[key]
                    if _is_number(value):
                        setting = self._settings.setting(group, key, device)
                        self._swapped[(id(group), key)] = (setting, value,
                                                           setting.tensor._version)
                        group[key] = setting.tensor
        return self

    def __exit__(self, *exc) -> None:
        for setting, value, _ in self._swapped.values():
            setting.group[setting.key] = value

    def write(self) -> None:
        """Writes the floats swapped out into their tensors: an eager step run while entered then
        computes what a replay computes (tests and benchmarks compare the two)."""
        for setting, value, _ in self._swapped.values():
            setting.write(value)

    def changed_by_function(self) -> Optional[str]:
        """While entered, after the function ran: which setting it changed, if any. A scheduler
        rebinds a float setting, and fills a tensor one in place."""
        for group, key, value in self._before:
            setting, _, version = self._swapped.get((id(group), key), (None, None, 0))
            if setting is not None:
                changed = group.get(key) is not setting.tensor or setting.tensor._version != version
            else:  # compared as a replay compares what its graph baked in
                changed = not _C._optimizer_settings_hold([(group, key, value)])[0]
            if changed:
                return (f"the function changed the optimizer setting '{key}', which its replays "
                        "would not do (a learning-rate scheduler stepped inside it?); step "
                        "schedulers outside the compiled function")
        return None

    def bake(self, stepped) -> tuple[list, list]:
        """For a graph that stepped ``stepped``: the settings it baked in (see hyperparameters)
        and the DeviceSettings it reads."""
        baked, on_device = [], []
        for group, key, value in hyperparameters(stepped):
            swapped = self._swapped.get((id(group), key))
            if swapped is None:
                baked.append((group, key, value))
            else:
                on_device.append(swapped[0])
        return baked, on_device


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
