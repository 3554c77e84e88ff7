"""What a compiled training step relies on that runs without a GPU: which optimizers and leaves
grape watches, the settings a graph bakes in, and which arguments that require grad can be
captured (Note [Gradients of a captured step])."""

import pytest
import torch

from grape import _C, _training


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def one_step(m, opt):
    m(torch.randn(3, 4)).sum().backward()
    opt.step()


def test_step_watch_records_the_optimizers_stepped_while_entered():
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    seen = _training.Seen()
    with _training.StepWatch(seen) as watch:
        one_step(m, opt)
        one_step(m, opt)
    assert opt in seen.optimizers and watch.stepped == [opt]
    # CPU parameters cannot be capturable (the GPU tests check that CUDA ones are made so).
    assert opt.param_groups[0]["capturable"] is False
    # The hook is gone once the watch is left.
    other = torch.optim.SGD(model().parameters(), lr=0.1)
    one_step(model(), other)
    assert other not in seen.optimizers


def test_optimizers_without_the_option_are_left_alone():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    with _training.StepWatch(_training.Seen()) as watch:
        one_step(m, opt)
    assert watch.stepped == [opt] and "capturable" not in opt.param_groups[0]


def test_step_watch_forgets_optimizers_that_die():
    seen = _training.Seen()
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    with _training.StepWatch(seen):
        one_step(m, opt)
    del opt
    assert len(seen.optimizers) == 0
    del m
    assert len(seen.leaves) == 0


def test_step_watch_records_the_leaves_every_backward_pass_reaches():
    m = model()
    m[2].bias.requires_grad_(False)
    seen = _training.Seen()
    with _training.StepWatch(seen):
        m(torch.randn(3, 4)).sum().backward()  # no optimizer: a closure's model, stepped outside
    assert {id(p) for p in seen.leaves} == {id(m[0].weight), id(m[0].bias), id(m[2].weight)}
    assert len(seen.leaves) == 3
    # torch.autograd.backward with inputs= accumulates into those only; and the watch is gone
    # once left.
    other = model()
    seen = _training.Seen()
    with _training.StepWatch(seen):
        torch.autograd.backward(other(torch.randn(3, 4)).sum(), inputs=[other[2].weight])
    model()(torch.randn(3, 4)).sum().backward()
    assert [id(p) for p in seen.leaves] == [id(other[2].weight)]


def test_step_watches_nest_and_put_backward_back_even_after_an_error():
    # A compiled function calling another warms up inside the outer one's watch: both see the
    # backward pass, and each leaves torch.autograd.backward as it found it.
    original = torch.autograd.backward
    m = model()
    outer, inner = _training.Seen(), _training.Seen()
    with _training.StepWatch(outer):
        with pytest.raises(ZeroDivisionError):
            with _training.StepWatch(inner):
                m(torch.randn(3, 4)).sum().backward()
                1 / 0
        assert torch.autograd.backward is not original
    assert torch.autograd.backward is original
    assert len(inner.leaves) == len(outer.leaves) == 4


def test_leaves_reached_follow_the_autograd_graph_to_its_accumulate_grad_nodes():
    m = model()
    x = torch.randn(3, 4, requires_grad=True)
    out = m(x).sum()
    reached = {id(p) for p in _training.leaves_reached(out)}
    assert reached == {id(p) for p in m.parameters()} | {id(x)}
    assert _training.leaves_reached([out, x]) and _training.leaves_reached(x) == [x]
    assert _training.leaves_reached(m(torch.randn(3, 4)).detach()) == []


def test_a_backward_pass_reaching_untracked_leaves_fails_the_capture_and_tracks_them(monkeypatch):
    # Inside a capture (simulated here) an untracked gradient would be written where the capture
    # left it by every replay: the capture is refused once the function returned, the gradient is
    # put back, and the retry tracks it. A leaf the function made and dropped does not count.
    m = model()
    seen = _training.Seen()
    tracked = _training.leaves_of([], seen, list(m[0].parameters()))
    assert [id(p) for p in tracked] == [id(m[0].weight), id(m[0].bias)]
    monkeypatch.setattr(_training, "_capturing", lambda: True)
    with _training.StepWatch(seen) as watch:
        m(torch.randn(3, 4)).sum().backward()
        assert m[2].weight.grad is not None
        reason = watch.untracked_leaves_kept()
    assert "reached 2 tensor(s) whose .grad grape did not track" in reason
    assert m[2].weight.grad is None and m[0].weight.grad is not None  # put back; tracked kept
    with _training.StepWatch(seen) as watch:
        m(torch.randn(3, 4)).sum().backward()  # now tracked
        made = torch.randn(3, 4)[:, None].requires_grad_()  # as Wav2Vec2's feature encoder does
        (m(made.squeeze(1)).sum()).backward()
        del made
        assert watch.untracked_leaves_kept() is None
    assert m[2].weight.grad is not None
    assert len(_training.leaves_of([], seen, [])) == 4


def test_a_function_is_seen_training_once_a_backward_pass_or_a_step_was_seen():
    m = model()
    seen = _training.Seen()
    with _training.StepWatch(seen):
        with torch.no_grad():
            m(torch.randn(3, 4))
    assert not seen.training
    with _training.StepWatch(seen):
        m(torch.randn(3, 4)).sum().backward()
    assert seen.training
    assert seen_stepping(torch.optim.SGD(m.parameters(), lr=0.1)).training
    # Leaves tracked for a parameter argument are not training.
    fresh = _training.Seen()
    _training.leaves_of([m[0].weight], fresh, [])
    assert not fresh.training


def seen_stepping(*optimizers):
    seen = _training.Seen()
    for optimizer in optimizers:
        seen.optimizers.add(optimizer)
    return seen


def test_leaves_are_parameters_that_require_grad_once():
    m = model()
    m[2].bias.requires_grad_(False)
    opt = torch.optim.AdamW(list(m[0].parameters()) + list(m[2].parameters()))
    leaves = _training.leaves_of([], seen_stepping(opt), [*m.parameters(), *m[0].parameters()])
    assert [id(p) for p in leaves] == [id(m[0].weight), id(m[0].bias), id(m[2].weight)]


def test_leaves_start_with_the_arguments_that_require_grad_once():
    m = model()
    opt = torch.optim.AdamW(m[0].parameters())
    extra = torch.zeros(2, requires_grad=True)
    arguments = [m[2].weight, extra, extra, torch.zeros(2)]
    leaves = _training.leaves_of(arguments, seen_stepping(opt), list(m.parameters()))
    assert [id(p) for p in leaves] == [id(m[2].weight), id(extra), id(m[0].weight),
                                       id(m[0].bias), id(m[2].bias)]


def two_groups():
    """AdamW over two param groups: one with a float lr (0.5), one with a tensor lr."""
    m = model()
    lr = torch.tensor(1e-3)
    groups = [{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": lr}]
    return torch.optim.AdamW(groups, lr=0.5), lr


def test_hyperparameters_are_the_settings_a_graph_bakes_in():
    opt, lr = two_groups()
    settings = _training.hyperparameters([opt])
    keys = {(id(group), key) for group, key, _ in settings}
    assert (id(opt.param_groups[0]), "lr") in keys and (id(opt.param_groups[1]), "betas") in keys
    assert all(key != "params" for _, key, _ in settings)
    lrs = [value for group, key, value in settings if key == "lr"]
    assert lrs[0] == 0.5 and lrs[1] is lr


def test_state_tensors_are_the_optimizers_moments_and_steps():
    m = model()
    opt = torch.optim.Adam(m.parameters())
    assert _training.state_tensors([opt]) == []
    one_step(m, opt)
    assert len(_training.state_tensors([opt])) == 3 * len(list(m.parameters()))


def test_non_leaf_that_requires_grad_is_unsupported_with_the_reason():
    w = torch.ones(2, requires_grad=True)
    sig = _C.signature(w * 2)
    assert "not a leaf" in sig["unsupported"]



needs_cuda_build = pytest.mark.skipif(not _C.built_with_cuda,
                                      reason="grape was built without CUDA: no training runtime")


@needs_cuda_build
def test_settings_hold_by_value_and_tensor_settings_by_identity():
    opt, lr = two_groups()
    settings = _training.hyperparameters([opt])
    assert _C._optimizer_settings_hold(settings) == (True, "")
    opt.param_groups[1]["lr"].fill_(5e-4)  # read by the kernels: the graph stays valid
    opt.param_groups[0]["betas"] = (0.9, 0.999)  # an equal value
    assert _C._optimizer_settings_hold(settings)[0]
    opt.param_groups[0]["lr"] = 0.25  # a scheduler's step: baked into the graph
    hold, changed = _C._optimizer_settings_hold(settings)
    assert not hold and "'lr'" in changed
    opt.param_groups[0]["lr"] = 0.5
    opt.param_groups[1]["lr"] = torch.tensor(1e-3)  # another tensor: not the one the graph reads
    assert not _C._optimizer_settings_hold(settings)[0]


@needs_cuda_build
def test_a_gradient_is_dropped_before_a_replay_only_when_nothing_else_holds_it():
    p = torch.zeros(4, requires_grad=True)
    p.grad = torch.ones(4)
    assert _C._grad_held_by_leaf_only(p)
    held = p.grad
    assert not _C._grad_held_by_leaf_only(p)
    del held
    assert _C._grad_held_by_leaf_only(p)
    view = p.grad[:2]
    assert not _C._grad_held_by_leaf_only(p)
    del view
    assert _C._grad_held_by_leaf_only(p)


def test_a_capture_reads_the_parameters_and_buffers_that_the_module_gives():
    # Read from the modules' dicts (csrc/torch/python/module_tensors.cpp): the same tensors, in
    # the same order, each once, as Module.parameters() and Module.buffers().
    shared = torch.nn.Linear(3, 3)
    m = torch.nn.Sequential(shared, torch.nn.BatchNorm1d(3), torch.nn.Sequential(shared),
                            torch.nn.Linear(3, 2, bias=False))
    m[1].register_buffer("unset", None)
    m[3].weight.requires_grad_(False)
    parameters, buffers = _C._module_tensors(m)
    assert [id(p) for p in parameters] == [id(p) for p in m.parameters()]
    assert [id(b) for b in buffers] == [id(b) for b in m.buffers()]
    assert len(parameters) == 5 and len(buffers) == 3
    # A ScriptModule keeps its tensors in wrappers, not dicts: asked through its methods.
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
    parameters, buffers = _C._module_tensors(scripted)
    assert [p.data_ptr() for p in parameters] == [p.data_ptr() for p in scripted.parameters()]
    assert [b.data_ptr() for b in buffers] == [b.data_ptr() for b in scripted.buffers()]
    assert len(parameters) == 4 and len(buffers) == 3


# --- Note [Device settings] -----------------------------------------------------------------------


def test_device_keys_are_the_settings_the_optimizer_reads_from_device_memory():
    params = list(model().parameters())

    def keys(opt):
        return _training.device_keys(opt, opt.param_groups[0])

    assert keys(torch.optim.AdamW(params, capturable=True)) == ("lr",)
    assert keys(torch.optim.Adam(params, fused=True)) == ("lr",)
    assert keys(torch.optim.AdamW(params)) == ()  # host-side step: lr is read on the host
    assert keys(torch.optim.SGD(params, lr=0.1, fused=True)) == ("lr",)
    assert keys(torch.optim.SGD(params, lr=0.1, momentum=0.9)) == ()

    class MyAdam(torch.optim.Adam):  # may read its settings differently
        pass

    assert keys(MyAdam(params, capturable=True)) == ()


def capturable_adamw(m, **kw):
    # Capturable AdamW over CPU parameters: constructed, never stepped (torch steps capturable
    # optimizers on accelerators only); the swap's logic is the same for any device.
    return torch.optim.AdamW(m.parameters(), lr=0.5, capturable=True, **kw)


def test_a_swap_puts_tensors_in_place_of_floats_and_the_floats_back():
    opt = capturable_adamw(model(), weight_decay=0.1)
    group = opt.param_groups[0]
    settings = _training.DeviceSettings()
    with settings.swap([opt]) as swap:
        tensor = group["lr"]
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
        assert group["betas"] == (0.9, 0.999) and group["weight_decay"] == 0.1  # read on the host
        baked, on_device = swap.bake([opt])
        assert swap.changed_by_function() is None
    assert group["lr"] == 0.5 and type(group["lr"]) is float
    assert [s.key for s in on_device] == ["lr"] and on_device[0].tensor is tensor
    assert {key for _, key, _ in baked} == set(group) - {"params", "lr"}
    # The next capture reads the same tensor: every graph of the function shares it.
    with settings.swap([opt]):
        assert group["lr"] is tensor
    # A group whose lr is a tensor already keeps it (only its identity matters, as before).
    lr = torch.tensor(0.25)
    group["lr"] = lr
    with settings.swap([opt]) as swap:
        assert group["lr"] is lr and swap.bake([opt])[1] == []


def test_a_swap_leaves_optimizers_that_read_on_the_host_alone():
    opt = torch.optim.SGD(model().parameters(), lr=0.1, momentum=0.9)
    with _training.DeviceSettings().swap([opt]) as swap:
        assert opt.param_groups[0]["lr"] == 0.1
        baked, on_device = swap.bake([opt])
    assert on_device == [] and ("lr" in {key for _, key, _ in baked})


@pytest.mark.parametrize("key, value", [("lr", 0.1), ("betas", (0.5, 0.9)), ("weight_decay", 0.0)])
def test_a_function_that_changes_a_setting_is_named(key, value):
    # A scheduler stepped inside the compiled function: its replays would not step it.
    opt = capturable_adamw(model())
    with _training.DeviceSettings().swap([opt]) as swap:
        opt.param_groups[0][key] = value
        changed = swap.changed_by_function()
    assert f"'{key}'" in changed and "scheduler" in changed
    if key == "lr":
        assert opt.param_groups[0]["lr"] == 0.5  # put back: the eager run changes it once


def test_a_device_setting_is_written_when_its_value_changes():
    opt = capturable_adamw(model())
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    with _training.DeviceSettings().swap([opt]) as swap:
        (setting,) = swap.bake([opt])[1]
    for _ in range(4):
        sched.step()
        lr = opt.param_groups[0]["lr"]
        assert setting.write(lr)
        assert setting.tensor.item() == torch.tensor(lr, dtype=torch.float32).item()
    version = setting.tensor._version
    assert setting.write(opt.param_groups[0]["lr"]) and setting.tensor._version == version
    assert not setting.write(torch.tensor(0.1)) and not setting.write(None)
    assert not setting.write(True)


@needs_cuda_build
def test_device_settings_are_written_before_a_replay_or_name_what_is_not_a_number():
    opt = capturable_adamw(model())
    with _training.DeviceSettings().swap([opt]) as swap:
        settings = swap.bake([opt])[1]
    group = opt.param_groups[0]
    assert _C._write_device_settings(settings) == (True, "")
    assert settings[0].tensor.item() == 0.5 and settings[0].written is group["lr"]
    group["lr"] = 0.125
    assert _C._write_device_settings(settings) == (True, "")
    assert settings[0].tensor.item() == 0.125
    group["lr"] = torch.tensor(0.25)  # the user's own tensor: the graph must be captured again
    written, changed = _C._write_device_settings(settings)
    assert not written and "'lr'" in changed


def test_a_scheduler_that_fills_the_swapped_tensor_is_named():
    # torch's schedulers fill a tensor lr in place rather than rebinding it.
    opt = capturable_adamw(model())
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    with _training.DeviceSettings().swap([opt]) as swap:
        sched.step()
        assert "'lr'" in swap.changed_by_function()
    assert type(opt.param_groups[0]["lr"]) is float


def test_a_grad_scaler_stepping_an_optimizer_that_reads_found_inf_on_the_host_is_a_refusal():
    # Its scaler.step calls .item() after unscaling: a capture would fail half-way and leave the
    # scaler's stage unscaled for the eager run after it, so the runtime never tries.
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    with _training.StepWatch(_training.Seen()) as watch:
        one_step(m, opt)
    assert watch.refusal is None
    scaler = torch.amp.GradScaler("cpu")
    with _training.StepWatch(_training.Seen()) as watch:
        scaler.scale(m(torch.randn(3, 4)).sum()).backward()
        scaler.step(opt)
        scaler.update()
    assert "GradScaler" in watch.refusal and "fused=True" in watch.refusal
