"""Training steps under grape.compile (Note [Gradients of a captured step]): forward, backward and
optimizer step captured per shape, parameters, gradients and optimizer state equal to eager's
on the same weights, for the usual places of zero_grad, AMP, parameter arguments, settings
changed by a scheduler (Note [Device settings]), and what must run eagerly."""

import copy

import pytest
import torch
import torch.nn.functional as F

import grape
from grape import _training

# A FallbackWarning fails a test here unless it is marked expects_fallback (conftest.py).
pytestmark = [pytest.mark.gpu]

DEV = "cuda"


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 4)).to(DEV)


def batches(n, sizes=(8, 12), seed=1):
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for i in range(n):
        b = sizes[i % len(sizes)]
        out.append((torch.randn(b, 16, generator=g).to(DEV), torch.randn(b, 4, generator=g).to(DEV)))
    return out


def adamw(model, **kw):
    # capturable=True on both sides: grape sets it on the optimizers a compiled step uses, and
    # the capturable update rounds differently from the host-side one.
    return torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True, **kw)


def make_step(model, opt, zero_grad):
    def step(x, y):
        if zero_grad == "start":
            opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if zero_grad == "end":
            opt.zero_grad()
        return loss.detach()

    return step


def assert_same_state(a, b, opt_a, opt_b):
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb)
        assert (pa.grad is None) == (pb.grad is None)
        if pa.grad is not None:
            torch.testing.assert_close(pa.grad, pb.grad, equal_nan=True)  # a skipped step's
    for pa, pb in zip(a.parameters(), b.parameters()):
        for key, value in opt_a.state[pa].items():
            torch.testing.assert_close(value, opt_b.state[pb][key])


@pytest.mark.parametrize("zero_grad", ["start", "end", "outside"])
def test_step_equals_eager_over_shapes(zero_grad):
    eager_model = mlp()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = adamw(eager_model), adamw(model)
    eager_step = make_step(eager_model, eager_opt, zero_grad)
    step = grape.compile(make_step(model, opt, zero_grad))
    for i, (x, y) in enumerate(batches(10)):
        if zero_grad == "outside":
            eager_opt.zero_grad()
            opt.zero_grad()
        want = eager_step(x, y)
        got = step(x, y)
        assert not got.requires_grad
        torch.testing.assert_close(got, want)
        assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    assert s["fallbacks"] == []
    assert s["graphs"] == 2 and s["captures"] == 2
    # The function's first call warms up; the second shape is captured at first sight, and every
    # later call replays (captures included).
    assert s["replays"] == 10 - 1
    assert s["recaptures"] == 0
    if zero_grad == "start":
        # Gradients only the parameters hold are dropped before a replay, not moved out of its
        # way (the losses the loop still holds are).
        assert s["bytes_evacuated"] < sum(p.numel() * p.element_size() for p in model.parameters())


def test_gradients_stay_valid_while_held():
    """A gradient the caller keeps is not overwritten by the next replay (it is moved first)."""
    model = mlp()
    opt = adamw(model)
    step = grape.compile(make_step(model, opt, "start"))
    data = batches(6)
    for x, y in data[:4]:
        step(x, y)
    held = model[0].weight.grad
    snapshot = held.clone()
    step(*data[4])
    step(*data[5])
    torch.testing.assert_close(held, snapshot)
    assert model[0].weight.grad is not held
    # Sizes 8 and 12 alternate: a warm-up, two captures, then the calls above replay.
    assert grape.stats(step)["replays"] == 5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_amp_step_equals_eager(dtype):
    def make(model, opt, scaler):
        def step(x, y):
            with torch.autocast("cuda", dtype=dtype):
                loss = F.mse_loss(model(x).float(), y)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            opt.zero_grad()
            return loss.detach()

        return step

    eager_model = mlp()
    model = copy.deepcopy(eager_model)
    # fused AdamW reads GradScaler's scale and found-inf flags on the device (no host sync).
    eager_opt, opt = adamw(eager_model, fused=True), adamw(model, fused=True)
    scaled = dtype == torch.float16
    eager_scaler = torch.amp.GradScaler("cuda") if scaled else None
    scaler = torch.amp.GradScaler("cuda") if scaled else None
    eager_step, step = make(eager_model, eager_opt, eager_scaler), grape.compile(make(model, opt, scaler))
    for x, y in batches(8):
        torch.testing.assert_close(step(x, y), eager_step(x, y))
    assert_same_state(model, eager_model, opt, eager_opt)
    if scaled:
        assert scaler.get_scale() == eager_scaler.get_scale()
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["replays"] == 7


def test_parameter_arguments_are_used_in_place():
    torch.manual_seed(0)
    w_eager = torch.randn(16, 4, device=DEV, requires_grad=True)
    w = w_eager.detach().clone().requires_grad_()

    def step(w, x, y):
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
        w.grad = None
        return loss.detach()

    compiled = grape.compile(step)
    for x, y in batches(6, sizes=(8,)):
        torch.testing.assert_close(compiled(w, x, y), step(w_eager, x, y))
        torch.testing.assert_close(w, w_eager)
        assert w.grad is None
    s = grape.stats(compiled)
    assert s["fallbacks"] == [] and s["replays"] == 5


def test_a_setting_read_on_the_host_captures_again_when_it_changes():
    # SGD with momentum (foreach) reads its lr on the host: each new value is a capture.
    eager_model = mlp()
    model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=1e-2, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    eager_sched = torch.optim.lr_scheduler.StepLR(eager_opt, step_size=3, gamma=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    eager_step = make_step(eager_model, eager_opt, "start")
    step = grape.compile(make_step(model, opt, "start"))
    with pytest.warns(UserWarning, match="'lr' changed"):
        for x, y in batches(9, sizes=(8,)):
            torch.testing.assert_close(step(x, y), eager_step(x, y))
            sched.step()
            eager_sched.step()
    assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    assert s["recaptures"] == 2
    assert "'lr'" in s["last_recapture_reason"]


# Note [Device settings]: each scheduler in common use, over two shapes.
SCHEDULERS = {
    "lambda_warmup": lambda opt: torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min(1.0, (step + 1) / 4)),
    "cosine": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=12),
    "one_cycle": lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=2e-2, total_steps=13, cycle_momentum=False),
    "sequential": lambda opt: torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3),
              torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=9)], milestones=[3]),
}


def scheduled_steps(make_scheduler, steps=12, **adamw_kw):
    """eager and grape over `steps` steps of two shapes, the scheduler stepped after each: the
    compiled step, and whether its params were bit-identical throughout to those of a third,
    eager, copy that reads its lr from a device tensor as the graphs do, from its second step
    (grape's first call is its warm-up, an eager call with the float)."""
    eager_model = mlp()
    model, twin = copy.deepcopy(eager_model), copy.deepcopy(eager_model)
    eager_opt, opt, twin_opt = (adamw(m, **adamw_kw) for m in (eager_model, model, twin))
    scheds = [make_scheduler(o) for o in (eager_opt, opt, twin_opt)]
    eager_step = make_step(eager_model, eager_opt, "start")
    step = grape.compile(make_step(model, opt, "start"))
    twin_step, twin_settings = make_step(twin, twin_opt, "start"), _training.DeviceSettings()
    identical = True
    for i, (x, y) in enumerate(batches(steps)):
        torch.testing.assert_close(step(x, y), eager_step(x, y))
        with twin_settings.swap([twin_opt] if i > 0 else []) as swap:
            swap.write()
            twin_step(x, y)
        identical &= all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
        for sched in scheds:
            sched.step()
        # The user's param group holds the scheduler's float, as in eager.
        lr = opt.param_groups[0]["lr"]
        assert type(lr) is float and lr == eager_opt.param_groups[0]["lr"]
    assert_same_state(model, eager_model, opt, eager_opt)
    return step, identical


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_scheduler_keeps_one_graph_per_shape(name):
    step, identical = scheduled_steps(SCHEDULERS[name])
    s = grape.stats(step)
    assert s["recaptures"] == 0 and s["graphs"] == 2
    assert s["replays"] == 12 - 1  # all but the warm-up
    # The same update as eager's with the lr in device memory (a float lr rounds differently).
    assert identical


def test_fused_adamw_under_a_scheduler_keeps_one_graph_per_shape():
    step, _ = scheduled_steps(SCHEDULERS["cosine"], fused=True)
    s = grape.stats(step)
    assert s["recaptures"] == 0 and s["graphs"] == 2 and s["replays"] == 11


def test_betas_cycled_by_one_cycle_capture_again_with_the_reason():
    # Adam reads its betas on the host (torch makes a tensor beta a Python number there).
    def one_cycle(opt):
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-2, total_steps=7)

    with pytest.warns(UserWarning, match="'betas' changed"):
        step, _ = scheduled_steps(one_cycle, steps=6)
    s = grape.stats(step)
    assert s["recaptures"] >= 3 and "'betas'" in s["last_recapture_reason"]


def test_a_tensor_lr_given_after_the_capture_captures_again():
    eager_model = mlp()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = adamw(eager_model), adamw(model)
    eager_step = make_step(eager_model, eager_opt, "start")
    step = grape.compile(make_step(model, opt, "start"))
    with pytest.warns(UserWarning, match="no longer a number"):
        for i, (x, y) in enumerate(batches(6, sizes=(8,))):
            if i == 3:
                opt.param_groups[0]["lr"] = torch.tensor(5e-3, device=DEV)
                eager_opt.param_groups[0]["lr"] = torch.tensor(5e-3, device=DEV)
            torch.testing.assert_close(step(x, y), eager_step(x, y))
    assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    assert s["recaptures"] == 1 and s["replays"] == 5


# A scheduler stepped inside the step: its replays would not step it, so the signature runs
# eagerly, with the reason.
@pytest.mark.expects_fallback
def test_a_scheduler_stepped_inside_the_step_runs_eagerly():
    model = mlp()
    opt = adamw(model)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    inner = make_step(model, opt, "start")

    def step(x, y):
        loss = inner(x, y)
        sched.step()
        return loss

    compiled = grape.compile(step)
    for x, y in batches(4, sizes=(8,)):
        compiled(x, y)
        assert type(opt.param_groups[0]["lr"]) is float
    s = grape.stats(compiled)
    (fallback,) = s["fallbacks"]
    assert "'lr'" in fallback["reason"] and "scheduler" in fallback["reason"]
    assert s["replays"] == 0


def test_tensor_learning_rate_keeps_one_graph():
    eager_model = mlp()
    model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=torch.tensor(1e-2, device=DEV),
                                  capturable=True)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-2, device=DEV), capturable=True)
    eager_step = make_step(eager_model, eager_opt, "start")
    step = grape.compile(make_step(model, opt, "start"))
    for i, (x, y) in enumerate(batches(8, sizes=(8,))):
        torch.testing.assert_close(step(x, y), eager_step(x, y))
        if i == 3:
            opt.param_groups[0]["lr"].fill_(5e-3)
            eager_opt.param_groups[0]["lr"].fill_(5e-3)
    assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    assert s["recaptures"] == 0 and s["replays"] == 7


def test_optimizer_is_made_capturable_by_warm_up():
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # capturable=False
    step = grape.compile(make_step(model, opt, "start"))
    for x, y in batches(4, sizes=(8,)):
        step(x, y)
    assert opt.param_groups[0]["capturable"] is True
    assert grape.stats(step)["replays"] == 3


# The optimizer steps first inside the capture (warmup=0): the signature falls back.
@pytest.mark.expects_fallback
def test_optimizer_first_stepped_in_a_capture_runs_eagerly():
    model = mlp()
    opt = adamw(model)
    x, y = batches(1)[0]
    F.mse_loss(model(x), y).backward()  # the backward thread's cuBLAS is set up: not the reason
    step = grape.compile(make_step(model, opt, "start"), warmup=0)
    step(x, y)
    (fallback,) = grape.stats(step)["fallbacks"]
    assert "warm-up" in fallback["reason"]


# A non-leaf argument that requires grad: the signature falls back.
@pytest.mark.expects_fallback
def test_non_leaf_argument_that_requires_grad_runs_eagerly():
    w = torch.randn(16, 4, device=DEV, requires_grad=True)

    @grape.compile
    def f(h):
        return h.sum()

    h = (torch.randn(8, 16, device=DEV) @ w)
    f(h)
    (fallback,) = grape.stats(f)["fallbacks"]
    assert "not a leaf" in fallback["reason"]


# --- the habits of training loops -----------------------------------------------------------------


def eager_and_grape(make, **adamw_kw):
    """(eager step, compiled step, eager model, model, eager opt, opt): `make(model, opt)` builds
    the user's step, over two copies of one model with AdamW each."""
    eager_model = mlp()
    model = copy.deepcopy(eager_model)
    eager_opt, opt = adamw(eager_model, **adamw_kw), adamw(model, **adamw_kw)
    return (make(eager_model, eager_opt), grape.compile(make(model, opt)), eager_model, model,
            eager_opt, opt)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradient_accumulation_steps_every_kth_call(set_to_none):
    k = 3

    def make(model, opt):
        def step(x, y, apply):
            loss = F.mse_loss(model(x), y) / k
            loss.backward()
            if apply:
                opt.step()
                opt.zero_grad(set_to_none=set_to_none)
            return loss.detach()

        return step

    eager_step, step, eager_model, model, eager_opt, opt = eager_and_grape(make)
    for i, (x, y) in enumerate(batches(4 * k, sizes=(8,))):
        apply = (i + 1) % k == 0
        torch.testing.assert_close(step(x, y, apply), eager_step(x, y, apply))
        assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    # The first stepping call fails its capture at first sight (the optimizer has not stepped in
    # a warm-up yet) and warms up instead.
    assert s["fallbacks"] == [] and s["replays"] == 4 * k - 2 and s["capture_failures"] == 1
    if not set_to_none:
        # Gradients stay where they are: one graph per signature, never captured again.
        assert s["recaptures"] == 0 and s["graphs"] == 2
    else:
        # The first micro-batch makes the gradients, the others accumulate into them where the
        # last one left them: each cycle moves them, and captures again.
        assert s["recaptures"] > 0


@pytest.mark.parametrize("set_to_none", [True, False])
def test_forward_and_backward_compiled_with_the_optimizer_stepped_outside(set_to_none):
    """The model is the step's closure and no optimizer steps inside it: the gradients it sets
    are known from the backward pass of its warm-up (Note [Gradients of a captured step])."""
    def make(model, opt):
        def forward_backward(x, y):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss.detach()

        return forward_backward

    eager_step, step, eager_model, model, eager_opt, opt = eager_and_grape(make)
    for x, y in batches(8):
        torch.testing.assert_close(step(x, y), eager_step(x, y))
        assert_same_state(model, eager_model, opt, eager_opt)
        for o in (opt, eager_opt):
            o.step()
            o.zero_grad(set_to_none=set_to_none)
        assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["capture_failures"] == 0
    assert s["graphs"] == 2 and s["replays"] == 7 and s["recaptures"] == 0


def test_a_backward_pass_reaching_new_parameters_captures_once_they_are_known():
    """A signature whose backward pass reaches parameters no warm-up saw (a head used only for
    it, stepped outside): its capture at first sight fails with the reason, it warms up, and the
    next call captures tracking their gradients."""
    heads = []

    def make(model, opt):
        torch.manual_seed(3)
        head = torch.nn.Linear(4, 1).to(DEV)
        heads.append(head)

        def forward_backward(x, y, with_head):
            out = model(x)
            loss = F.mse_loss(out, y)
            if with_head:
                loss = loss + head(out).square().mean()
            loss.backward()
            return loss.detach()

        return forward_backward

    eager_step, step, eager_model, model, eager_opt, opt = eager_and_grape(make)
    eager_head, head = heads
    for i, (x, y) in enumerate(batches(8, sizes=(8,))):
        with_head = i >= 2
        torch.testing.assert_close(step(x, y, with_head), eager_step(x, y, with_head))
        assert_same_state(model, eager_model, opt, eager_opt)
        assert (head.weight.grad is None) == (eager_head.weight.grad is None)
        if with_head:
            torch.testing.assert_close(head.weight.grad, eager_head.weight.grad)
        for m in (model, eager_model, head, eager_head):
            m.zero_grad(set_to_none=False)
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["capture_failures"] == 1
    assert s["graphs"] == 2 and s["recaptures"] == 0


@pytest.mark.parametrize("caller_grad", [True, False])
def test_a_module_compiled_for_inference_tracks_its_parameters_once_a_backward_reaches_them(
        caller_grad):
    """Captures of a function never seen training track no module's parameters (Seen.training):
    a later signature whose backward pass reaches them fails its capture at first sight with the
    reason, warms up, and captures tracking their gradients at its next call. Called under
    no_grad too, where those captures prepared no backward pass (core::prepares_backward)."""
    def make(model, opt):
        def forward(x, y, train):
            if not train:
                with torch.no_grad():
                    return model(x)
            with torch.enable_grad():
                loss = F.mse_loss(model(x), y)
                loss.backward()
            return loss.detach()

        return forward

    eager_step, step, eager_model, model, eager_opt, opt = eager_and_grape(make)
    with torch.set_grad_enabled(caller_grad):
        for i, (x, y) in enumerate(batches(8, sizes=(8,))):
            train = i >= 4
            torch.testing.assert_close(step(x, y, train), eager_step(x, y, train))
            assert_same_state(model, eager_model, opt, eager_opt)
            for m in (model, eager_model):
                m.zero_grad(set_to_none=False)
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["capture_failures"] == 1
    assert s["graphs"] == 2 and s["replays"] == 6 and s["recaptures"] == 0


def test_inference_under_no_grad_captures_without_preparing_a_backward_pass(monkeypatch):
    """Under no_grad, after a warm-up that ran no backward pass, captures skip the small backward
    pass that readies the autograd engine (core::prepares_backward): its start is most of a
    process's first capture. With grad mode on they prepare it. (A backward pass run all the same,
    under enable_grad: test_a_module_compiled_for_inference_tracks_its_parameters...)"""
    prepared = []
    real = _training.prepare_backward

    def counted(device):
        prepared.append(device)
        real(device)

    monkeypatch.setattr(_training, "prepare_backward", counted)

    class Detached(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x).detach()

    model = mlp()
    # Compiled modules: their parameters, which require grad, are what a backward pass may reach.
    infer = grape.compile(copy.deepcopy(model))
    with torch.no_grad():
        for x, _ in batches(6):
            torch.testing.assert_close(infer(x), model(x))
    s = grape.stats(infer)
    assert prepared == [] and s["graphs"] == 2 and s["replays"] == 5

    detached = grape.compile(Detached(copy.deepcopy(model)))
    for x, _ in batches(3):
        torch.testing.assert_close(detached(x), model(x).detach())
    assert len(prepared) == 1 and grape.stats(detached)["graphs"] == 2


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_function_that_only_reads_and_scales_gradients_tracks_them(set_to_none):
    """No backward pass or optimizer step runs in the function (gradient clipping after an eager
    backward), but the parameters of its module argument have gradients: they are tracked (Note
    [Gradients of a captured step]), so a gradient replaced since the capture captures again
    instead of the replay scaling memory that is no longer the gradient. (A module reached through
    a closure is not checked: docs/semantics.md, "What is static".)"""
    def make(model, opt):
        def clip(module):
            return torch.nn.utils.clip_grad_norm_(module.parameters(), 0.5)

        return clip

    eager_clip, clip, eager_model, model, eager_opt, opt = eager_and_grape(make)
    replaced = []
    for x, y in batches(6, sizes=(8,)):
        for m in (model, eager_model):
            F.mse_loss(m(x), y).backward()
        torch.testing.assert_close(clip(model), eager_clip(eager_model))
        assert_same_state(model, eager_model, opt, eager_opt)
        # Replaced gradients are held until the next call's are made, so that those cannot land
        # where the allocator freed these: a replay that scaled these would go unseen otherwise.
        replaced = [p.grad for p in model.parameters()]
        for m in (model, eager_model):
            m.zero_grad(set_to_none=set_to_none)
    s = grape.stats(clip)
    assert s["fallbacks"] == [] and s["captures"] >= 1
    if set_to_none:  # new gradients at every call: each capture's guards send the next one back
        assert s["captures"] >= 4 and s["recaptures"] == s["captures"] - 1
    else:  # gradients zeroed in place: one graph, replayed
        assert s["replays"] >= 4 and s["recaptures"] == 0
    del replaced


def grad_scaler_step(model, opt):
    """An fp16 step under torch.amp.GradScaler."""
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 10)

    def step(x, y):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return step


def test_grad_scaler_skips_the_step_on_inf_as_eager():
    # Fused AdamW takes GradScaler's scale and found-inf on the device: scaler.step does not sync.
    eager_step, step, eager_model, model, eager_opt, opt = eager_and_grape(grad_scaler_step,
                                                                           fused=True)
    before = None
    for i, (x, y) in enumerate(batches(8, sizes=(8,))):
        if i == 4:
            y = y.clone()
            y[0, 0] = float("inf")  # the loss and gradients overflow: the step is skipped
            before = [p.clone() for p in model.parameters()]
        torch.testing.assert_close(step(x, y), eager_step(x, y))
        if i == 4:
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["replays"] == 7 and s["recaptures"] == 0


# Non-fused AdamW under GradScaler: scaler.step reads found-inf on the host (.item()), a sync no
# capture allows: the signature runs eagerly, with the reason.
@pytest.mark.expects_fallback
def test_grad_scaler_with_a_host_side_step_runs_eagerly_with_the_reason():
    eager_step, step, eager_model, model, eager_opt, opt = eager_and_grape(grad_scaler_step)
    for x, y in batches(4, sizes=(8,)):
        torch.testing.assert_close(step(x, y), eager_step(x, y))
    assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    (fallback,) = s["fallbacks"]
    assert fallback["kind"] == "host_sync" and "fused=True" in fallback["reason"]
    # Known from the warm-up: no capture was tried (one failing half-way would leave the scaler
    # unscaled for the eager run).
    assert s["capture_failures"] == 0


def test_an_ema_of_the_weights_updated_in_the_step():
    def make(model, opt):
        ema = copy.deepcopy(model).requires_grad_(False)

        def step(x, y):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.1)
            return loss.detach()

        return step, ema

    eager_emas, emas = [], []

    def make_keeping_ema(into):
        def make_one(model, opt):
            step, ema = make(model, opt)
            into.append(ema)
            return step
        return make_one

    eager_step, _, eager_model, _, eager_opt, _ = eager_and_grape(make_keeping_ema(eager_emas))
    _, step, _, model, _, opt = eager_and_grape(make_keeping_ema(emas))
    for x, y in batches(8):
        torch.testing.assert_close(step(x, y), eager_step(x, y))
    assert_same_state(model, eager_model, opt, eager_opt)
    for a, b in zip(emas[-1].parameters(), eager_emas[0].parameters()):
        torch.testing.assert_close(a, b)
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["replays"] == 7 and s["recaptures"] == 0


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_either_way_keeps_one_graph_per_shape(set_to_none):
    def make(model, opt):
        def step(x, y):
            opt.zero_grad(set_to_none=set_to_none)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    eager_step, step, eager_model, model, eager_opt, opt = eager_and_grape(make)
    for x, y in batches(8):
        torch.testing.assert_close(step(x, y), eager_step(x, y))
        assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["replays"] == 7 and s["recaptures"] == 0


def test_a_torch_compiled_model_inside_the_step():
    def make(model, opt):
        compiled_model = torch.compile(model)

        def step(x, y):
            opt.zero_grad()
            loss = F.mse_loss(compiled_model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    eager_step, step, eager_model, model, eager_opt, opt = eager_and_grape(make)
    for x, y in batches(5, sizes=(8,)):
        torch.testing.assert_close(step(x, y), eager_step(x, y))
    assert_same_state(model, eager_model, opt, eager_opt)
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["replays"] == 4
