"""grape.compile on the GPU: correctness against eager, liveness, fallbacks, memory."""

import dataclasses
import warnings

import pytest
import torch

import grape

# A FallbackWarning fails a test here unless it is marked expects_fallback (conftest.py).
pytestmark = [pytest.mark.gpu]

DEV = "cuda"


def mlp_weights(d=64, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(d, d, generator=g).to(DEV) / d**0.5 for _ in range(3)]


def make_mlp(weights):
    def mlp(x):
        for w in weights:
            x = torch.tanh(x @ w)
        return x

    return mlp


def process_device_bytes(*compiled):
    """Device bytes this process holds through PyTorch's allocator (private pools included), plus
    the compiled functions' arena lanes, mapped outside it. Not the card's free memory, which other
    processes on the card change while a test runs; nor the executables, whose charge is measured
    that way (a few KB per node here)."""
    torch.cuda.synchronize()
    return torch.cuda.memory_reserved() + sum(grape.stats(fn)["arena_bytes"] for fn in compiled)


def test_warming_up_once_per_function_captures_new_shapes_at_first_sight():
    fn = make_mlp(mlp_weights())
    step = grape.compile(fn, warmup_each_signature=False, alias_prediction=False)
    for rows in (8, 8, 16, 24, 16, 24):
        x = torch.randn(rows, 64, device=DEV)
        torch.testing.assert_close(step(x), fn(x), rtol=0, atol=0)
    s = grape.stats(step)
    # Only the function's first call warms up; 16 and 24 rows are captured when first seen.
    assert s["warmup_calls"] == 1 and s["captures"] == 3 and s["replays"] == 5
    assert s["eager_calls"] == 0 and not s["fallbacks"]


def test_a_first_sight_capture_that_fails_warms_that_shape_up_and_captures_it_next():
    w = mlp_weights()[0]
    norms = {}

    def fn(x):
        # Lazy per-shape initialization with a host sync: it cannot run inside a capture.
        if x.shape not in norms:
            norms[x.shape] = float(x.norm())
        return (x @ w).relu() / norms[x.shape]

    step = grape.compile(fn, warmup_each_signature=False, alias_prediction=False)
    for rows in (8, 8, 16, 16, 16):
        x = torch.ones(rows, 64, device=DEV) * rows
        torch.testing.assert_close(step(x), fn(x), rtol=0, atol=0)
    s = grape.stats(step)
    # 16 rows: the capture at first sight fails, that call is its warm-up, the next captures.
    assert s["capture_failures"] == 1 and s["warmup_calls"] == 2
    assert s["captures"] == 2 and s["replays"] == 3 and not s["fallbacks"]
    assert s["first_sight_failures"] == 1 and not s["warmup_each_signature"]
    # A second such failure: from then on each new shape warms up before its capture, and none
    # fails again.
    for rows in (24, 24, 32, 32, 32):
        x = torch.ones(rows, 64, device=DEV) * rows
        torch.testing.assert_close(step(x), fn(x), rtol=0, atol=0)
    s = grape.stats(step)
    assert s["first_sight_failures"] == 2 and s["warmup_each_signature"]
    assert s["capture_failures"] == 2 and s["warmup_calls"] == 4 and not s["fallbacks"]
    assert s["captures"] == 4 and s["replays"] == 6


def test_static_shape_replays_match_eager():
    fn = make_mlp(mlp_weights())
    step = grape.compile(fn)
    for i in range(5):
        x = torch.randn(8, 64, device=DEV)
        torch.testing.assert_close(step(x), fn(x), rtol=0, atol=0)
    s = grape.stats(step)
    # One graph for the shape; the site that allocates x gets chain variants that read it in
    # place (allocation-site prediction).
    assert s["warmup_calls"] == 1 and s["captures"] - s["chain_variants"] == 1
    assert s["replays"] == 4 and s["graphs"] == 1 and s["eager_calls"] == 0


def test_a_variant_that_would_only_save_small_copies_waits_until_they_pay_for_its_capture():
    """Two shapes in turn (neither repeats the call before it), each input made at one line: once
    that line is a predicted site, the graphs, captured with the caller's tensors, copy the input
    from its buffer rather than each shape being captured again, until those copies add up to what
    a capture cost (Note [Chain variants])."""
    fn = make_mlp(mlp_weights())
    step = grape.compile(fn, warmup=0)

    def call(rows, check=False):
        x = torch.randn(rows, 64, device=DEV)  # the predicted site
        out = step(x)
        if check:
            torch.testing.assert_close(out, fn(x), rtol=0, atol=0)

    for _ in range(10):
        for rows in (2, 3):
            call(rows, check=True)
    s = grape.stats(step)
    assert s["captures"] == 2 and s["chain_variants"] == 0 and s["replays"] == 20
    assert s["site_allocations"] > 0 and s["chain_variants_deferred"] > 0
    # Until no call defers any more: each shape whose graph copies its input has its variant.
    deferred, calls = -1, 20
    while deferred != s["chain_variants_deferred"] and calls < 40_000:
        deferred = s["chain_variants_deferred"]
        for _ in range(50):
            call(2)
            call(3)
        calls += 100
        s = grape.stats(step)
    assert 1 <= s["chain_variants"] <= 2 and s["captures"] == 2 + s["chain_variants"], calls
    # Each call that copied the input alone (a few hundred bytes) was charged one copy launch,
    # core::CopyCost::kLaunchNs, and the call whose charge reached its shape's capture cost, as
    # core::CaptureCost estimates it from the graph's nodes, captured the variant: every other such
    # call was deferred. (A shape captured once its input came from the site buffer needs no
    # variant, and is never charged.)
    launch_ns = 4000
    capture_ns = [200_000 + 20_000 * e["nodes"] for e in s["entries"] if e["chain_variants"]]
    assert s["chain_variants_deferred"] == sum(-(-ns // launch_ns) - 1 for ns in capture_ns)
    before = s["bytes_copied_in"]
    call(2, check=True)
    call(3, check=True)
    assert grape.stats(step)["bytes_copied_in"] == before  # the variants read the buffers in place


def test_changing_shapes_in_random_order_match_eager():
    fn = make_mlp(mlp_weights())
    step = grape.compile(fn, warmup=0)
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(1, 40, (60,), generator=g).tolist()
    for n in rows:
        x = torch.randn(n, 64, device=DEV)
        torch.testing.assert_close(step(x), fn(x), rtol=0, atol=0)
    s = grape.stats(step)
    assert s["graphs"] == len(set(rows))
    assert s["replays"] == len(rows)


def test_held_outputs_are_never_overwritten():
    fn = make_mlp(mlp_weights())
    step = grape.compile(fn, warmup=0)
    held, expected = [], []
    for i in range(12):
        x = torch.randn(4 + i % 3, 64, device=DEV)
        held.append(step(x))
        expected.append(fn(x))
    for out, ref in zip(held, expected):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert grape.stats(step)["evacuations"] > 0
    assert grape.stats(step)["replays"] == 12  # warmup=0: every call a graph


def test_views_of_held_outputs_survive():
    step = grape.compile(lambda x: (x * 2, x + 1), warmup=0)
    a, b = step(torch.ones(16, device=DEV))
    a_view = a[3:9]
    step(torch.zeros(16, device=DEV))
    step(torch.zeros(16, device=DEV))
    assert torch.equal(a_view, torch.full((6,), 2.0, device=DEV))
    assert torch.equal(b, torch.full((16,), 2.0, device=DEV))
    s = grape.stats(step)
    assert s["replays"] == s["calls"] == 3  # warmup=0: every call a graph (the first captures)


def feed_back(step, fn, x, calls):
    """x = step(x), `calls` times, checked against eager; returns the last output."""
    ref = x.clone()
    for _ in range(calls):
        x = step(x)
        ref = fn(ref)
    torch.testing.assert_close(x, ref, rtol=0, atol=0)
    return x


def test_output_fed_back_at_one_shape_chains_into_variants():
    fn = make_mlp(mlp_weights())
    step = grape.compile(fn, warmup=0)
    x = feed_back(step, fn, torch.randn(8, 64, device=DEV), 20)
    s = grape.stats(step)
    # The first graph reads a copy of the caller's tensor; chained variants then feed each other.
    assert 1 <= s["chain_variants"] <= 3 and s["evacuations"] == 0
    before = s["bytes_copied_in"]
    feed_back(step, fn, x, 10)
    s = grape.stats(step)
    assert s["bytes_copied_in"] == before and s["alias_misses"] == 0


def test_output_fed_back_without_prediction_is_moved_not_copied_twice():
    fn = make_mlp(mlp_weights())
    step = grape.compile(fn, warmup=0, alias_prediction=False)
    feed_back(step, fn, torch.randn(8, 64, device=DEV), 20)
    s = grape.stats(step)
    assert s["inputs_moved"] >= 18 and s["evacuations"] == 0 and s["chain_variants"] == 0


def test_in_place_mutation_of_inputs_matches_eager():
    def bump(x, y):
        x.add_(1)
        return y * 2

    step = grape.compile(bump, warmup=0)
    x = torch.zeros(5, device=DEV)
    y = torch.ones(5, device=DEV)
    for i in range(3):
        out = step(x, y)
    assert torch.equal(x, torch.full((5,), 3.0, device=DEV))
    assert torch.equal(out, torch.full((5,), 2.0, device=DEV))
    s = grape.stats(step)
    assert s["replays"] == s["calls"] == 3  # the mutation was copied back by replays


# The aliased call's replay is refused and runs eagerly, with a FallbackWarning.
@pytest.mark.expects_fallback
def test_mutated_input_shared_with_another_input_runs_eagerly():
    def bump(x, y):
        x.add_(1)
        return x + y

    step = grape.compile(bump, warmup=0)
    base = torch.zeros(8, device=DEV)
    step(torch.zeros(4, device=DEV), torch.zeros(4, device=DEV))  # capture with separate inputs
    out = step(base[:4], base[:4])  # aliased: replay would lose x's update seen through y
    assert torch.equal(out, torch.full((4,), 2.0, device=DEV))
    assert any("shares memory" in f["reason"] for f in grape.stats(step)["fallbacks"])


def test_outputs_that_alias_inputs_are_views_of_the_callers_tensor():
    step = grape.compile(lambda x: (x, x[1:], x.view(2, 3)), warmup=0)
    for _ in range(2):
        x = torch.arange(6.0, device=DEV)
        same, tail, view = step(x)
    assert same.data_ptr() == x.data_ptr()
    assert tail.data_ptr() == x.data_ptr() + 4
    x.fill_(7)
    assert torch.equal(view, torch.full((2, 3), 7.0, device=DEV))
    s = grape.stats(step)
    assert s["replays"] == s["calls"] == 2


def test_nested_inputs_and_outputs():
    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        scale: float

    def fn(batch, extra):
        return {"y": batch.x * batch.scale, "pair": (extra["z"] + 1, None), "n": 3}

    step = grape.compile(fn, warmup=0)
    for s in (2.0, 2.0, 3.0):
        b = Batch(torch.randn(3, device=DEV), s)
        e = {"z": torch.randn(2, device=DEV)}
        out = step(b, e)
        ref = fn(b, e)
        torch.testing.assert_close(out["y"], ref["y"])
        torch.testing.assert_close(out["pair"][0], ref["pair"][0])
        assert out["pair"][1] is None and out["n"] == 3
    assert grape.stats(step)["graphs"] == 2  # the float is part of the signature
    assert grape.stats(step)["replays"] == 3  # warmup=0: every call a graph


# .item() under capture: the signature falls back (the test records the warning itself).
@pytest.mark.expects_fallback
def test_item_inside_the_function_falls_back_with_the_reason_and_site():
    def fn(x):
        if x.sum().item() > 0:
            return x + 1
        return x - 1

    step = grape.compile(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [step(torch.ones(3, device=DEV)) for _ in range(4)]
    for out in outs:
        assert torch.equal(out, torch.full((3,), 2.0, device=DEV))
    msgs = [str(w.message) for w in caught if issubclass(w.category, grape.FallbackWarning)]
    assert len(msgs) == 1
    assert "host synchronization" in msgs[0] and "test_compile_gpu.py" in msgs[0]
    s = grape.stats(step)
    assert s["capture_failures"] == 1 and s["eager_calls"] == 3
    # The allocator and the stream are usable afterwards: another function still captures.
    other = grape.compile(lambda x: x * 3, warmup=0)
    assert torch.equal(other(torch.ones(2, device=DEV)), torch.full((2,), 3.0, device=DEV))
    assert grape.stats(other)["replays"] == 1


# The function raises while it is captured: the exception reaches the caller, as in eager, and
# the signature is not marked as failed (tests/python/test_faults_gpu.py has the rest).
def test_an_exception_during_capture_reaches_the_caller_and_the_signature_captures_later():
    state = {"fail": False, "runs": 0}

    def fn(x):
        state["runs"] += 1
        if state["fail"]:
            raise RuntimeError("boom")
        return x * 2

    step = grape.compile(fn)
    step(torch.ones(2, device=DEV))  # warm-up
    state["fail"] = True
    with pytest.raises(RuntimeError, match="boom"):
        step(torch.ones(2, device=DEV))  # captured: f raised, and ran once
    assert state["runs"] == 2
    state["fail"] = False
    assert torch.equal(step(torch.ones(2, device=DEV)), torch.full((2,), 2.0, device=DEV))
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["raised_under_capture"] == 1 and s["replays"] == 1


# An output that requires grad, without a backward inside: falls back.
@pytest.mark.expects_fallback
def test_outputs_for_the_callers_backward_run_eagerly():
    # A leaf argument that requires grad is static state (a parameter); an output that needs the
    # caller's autograd graph cannot come from a graph, so the signature runs eagerly.
    step = grape.compile(lambda x: x * 2, warmup=0)
    x = torch.ones(3, device=DEV, requires_grad=True)
    y = step(x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0, device=DEV))
    assert "no backward pass" in grape.stats(step)["fallbacks"][0]["reason"]


# A CPU argument: the signature falls back.
@pytest.mark.expects_fallback
def test_cpu_and_mixed_inputs_run_eagerly_with_the_argument_named():
    step = grape.compile(lambda x, y: x + y.to(x.device), warmup=0)
    out = step(torch.ones(2, device=DEV), torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0, device=DEV))
    reason = grape.stats(step)["fallbacks"][0]["reason"]
    assert "args[1]" in reason and "cpu" in reason


def test_a_cpu_scalar_argument_keys_the_signature_by_value():
    # Note [Host scalars]: a graph per value, replayed for the calls that bring it.
    def step(x, scale):
        return x * scale + 1

    compiled = grape.compile(step)
    x = torch.ones(4, device=DEV)
    for v in (2.0, 2.0, 2.0, 3.0, 3.0, 2.0):
        assert torch.equal(compiled(x, torch.tensor(v)), step(x, torch.tensor(v)))
    s = grape.stats(compiled)
    assert s["fallbacks"] == [] and s["warmup_calls"] == 1 and s["replays"] == 5
    assert s["signatures"] == 2


@pytest.mark.expects_fallback
def test_a_cpu_scalar_argument_changed_in_place_runs_eagerly_as_eager_would():
    def step(x, count):
        count += 1  # on the host, at once: a replay could not repeat it
        return x * count

    compiled = grape.compile(step)
    x = torch.ones(4, device=DEV)
    for _ in range(4):
        mine, theirs = torch.tensor(1), torch.tensor(1)
        assert torch.equal(compiled(x, mine), step(x, theirs))
        assert mine.item() == theirs.item() == 2  # changed once, as eager changes it
    s = grape.stats(compiled)
    assert s["replays"] == 0 and len(s["fallbacks"]) == 1
    assert "changed a CPU scalar tensor argument in place" in s["fallbacks"][0]["reason"]


def test_module_parameters_are_static_and_tracked():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(DEV)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(DEV)
    ref.load_state_dict(model.state_dict())
    grape.compile(model)
    x = torch.randn(5, 16, device=DEV)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
        # In-place weight update: the graph reads the same memory.
        model[0].weight.mul_(0.5)
        ref[0].weight.mul_(0.5)
        torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
        # New storage for a weight: the graph is captured again.
        model[2].weight.data = model[2].weight.data.clone() * 2
        ref[2].weight.data = ref[2].weight.data * 2
        torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
    s = grape.stats(model)
    assert s["recaptures"] == 1 and s["captures"] == 2, s["fallbacks"]


# Grad mode on and no backward inside: falls back.
@pytest.mark.expects_fallback
def test_outputs_requiring_grad_fall_back():
    model = torch.nn.Linear(4, 4).to(DEV)
    grape.compile(model, warmup=0)
    out = model(torch.randn(2, 4, device=DEV))  # grad mode on, and no backward inside
    assert out.requires_grad  # eager semantics kept: the caller can still call backward
    assert "no backward pass" in grape.stats(model)["fallbacks"][0]["reason"]


def test_random_numbers_differ_between_replays_like_eager():
    step = grape.compile(lambda x: x + torch.rand_like(x), warmup=0)
    x = torch.zeros(1000, device=DEV)
    a, b = step(x).clone(), step(x).clone()
    assert not torch.equal(a, b)
    assert 0.4 < a.mean().item() < 0.6
    assert grape.stats(step)["replays"] == 2  # both draws came from graph replays


def test_two_compiled_functions_interleaved():
    f = grape.compile(lambda x: x * 2 + 1, warmup=0)
    g = grape.compile(lambda x: x.flip(0) - 3, warmup=0)
    x = torch.arange(8.0, device=DEV)
    ref = x.clone()
    for _ in range(6):
        x = g(f(x))
        ref = (ref * 2 + 1).flip(0) - 3
    torch.testing.assert_close(x, ref)
    for compiled in (f, g):
        s = grape.stats(compiled)
        assert s["replays"] == s["calls"] == 6


def test_nested_compiled_call_is_recorded_into_the_outer_graph():
    inner = grape.compile(lambda x: x + 1, warmup=0)
    outer = grape.compile(lambda x: inner(x) * 2, warmup=0)
    for _ in range(3):
        assert torch.equal(outer(torch.ones(2, device=DEV)), torch.full((2,), 4.0, device=DEV))
    assert grape.stats(outer)["replays"] == 3


def test_memory_stays_flat_across_100_shapes():
    weights = mlp_weights(256)
    fn = make_mlp(weights)
    step = grape.compile(fn, warmup=0)
    held_before = process_device_bytes(step)
    working_sets, pool_at_50 = [], None
    for n in range(1, 101):
        x = torch.randn(16 * n, 256, device=DEV)
        out = step(x)
        torch.testing.assert_close(out, fn(x), rtol=0, atol=0)
        working_sets.append(4 * x.numel() * 4)  # placeholder, two temporaries, output
        del out
        if n == 50:
            pool_at_50 = grape.stats(step)["pool_bytes"]
    used = process_device_bytes(step) - held_before
    pool = grape.stats(step)["pool_bytes"]
    largest = max(working_sets)
    # Per-shape pools would add every working set; one shared pool grows only as the largest
    # shape grows (plus the allocator's segment granularity, 20 MB for blocks of 1-10 MB).
    assert pool - pool_at_50 <= 2 * largest + (40 << 20), (pool_at_50, pool, largest)
    assert pool < sum(working_sets) / 4, (pool, sum(working_sets))
    assert used < sum(working_sets) / 2, (used, sum(working_sets))


def make_growing_step(d=32):
    """A decode-like step: the state gains one row per call (a new shape each call)."""
    w = torch.randn(d, d, device=DEV) / d**0.5

    def step(tok, state):
        row = torch.tanh(tok @ w)
        new_state = torch.cat([state, row], 0)
        return torch.tanh(new_state.sum(0, keepdim=True) @ w), new_state

    return step


def run_growing(step, steps, d=32, keep=None):
    tok = torch.full((1, d), 0.5, device=DEV)
    state = torch.zeros(0, d, device=DEV)
    for _ in range(steps):
        tok, state = step(tok, state)
        if keep is not None:
            keep.append(state)
    return tok, state


def test_chained_outputs_are_read_in_place_with_no_copies():
    step_fn = make_growing_step()
    step = grape.compile(step_fn, warmup=0)
    ref = run_growing(step_fn, 30)
    first = run_growing(step, 30)  # captures: each graph reads the previous graph's output
    for a, b in zip(ref, first):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    del first, a, b
    s1 = grape.stats(step)
    second = run_growing(step, 30)  # replays only
    s2 = grape.stats(step)
    for a, b in zip(ref, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert s1["captures"] == 30 and s2["captures"] == 30
    assert s1["alias_predictions"] == 58  # tok and state of every call but the first
    # The second pass copies only the first call's inputs (the caller's tensors).
    first_call_bytes = 32 * 4  # tok; the empty state has no bytes
    assert s2["bytes_copied_in"] - s1["bytes_copied_in"] == first_call_bytes
    assert s2["alias_hits"] - s1["alias_hits"] == 58 and s2["alias_misses"] == 0
    assert s2["evacuations"] == 0


def test_alias_prediction_off_copies_every_input():
    step_fn = make_growing_step()
    step = grape.compile(step_fn, warmup=0, alias_prediction=False)
    ref = run_growing(step_fn, 20)
    run_growing(step, 20)
    before = grape.stats(step)["bytes_copied_in"]
    out = run_growing(step, 20)
    s = grape.stats(step)
    for a, b in zip(ref, out):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert s["alias_predictions"] == 0 and s["alias_hits"] == 0
    assert s["bytes_copied_in"] - before >= sum(32 * 4 * t for t in range(20))


def test_held_chained_outputs_stay_intact():
    step_fn = make_growing_step()
    step = grape.compile(step_fn, warmup=0)
    ref_states, states = [], []
    run_growing(step_fn, 25, keep=ref_states)
    run_growing(step, 25)  # capture every shape
    run_growing(step, 25, keep=states)  # replays while every state is held
    for r, s in zip(ref_states, states):
        torch.testing.assert_close(s, r, rtol=0, atol=0)
    s = grape.stats(step)
    assert s["replays"] == s["calls"] == 50 and s["captures"] >= 25


def test_in_place_update_of_a_chained_input_reaches_the_caller():
    def step(x):
        x.mul_(2)
        return x + 1

    compiled = grape.compile(step, warmup=0)
    x = torch.ones(4, device=DEV)
    y = compiled(x)  # captured with the caller's tensor
    z = compiled(y)  # same signature: a chained variant updates y where it lies
    torch.testing.assert_close(y, torch.full((4,), 6.0, device=DEV))
    torch.testing.assert_close(z, torch.full((4,), 7.0, device=DEV))
    assert grape.stats(compiled)["replays"] == 2

    def grow(x):
        x.add_(1)
        return torch.cat([x, x])

    compiled = grape.compile(grow, warmup=0)
    a = compiled(torch.zeros(2, device=DEV))  # [1, 1, 1, 1]
    b = compiled(a)  # a is chained into this capture and updated in place
    assert grape.stats(compiled)["alias_predictions"] == 1
    torch.testing.assert_close(a, torch.full((4,), 2.0, device=DEV))
    torch.testing.assert_close(b, torch.full((8,), 2.0, device=DEV))


def test_growing_state_memory_stays_near_the_largest_working_set():
    width = 1 << 16  # 256 KB per row

    def step(state):
        return torch.cat([state, state[-1:] + 1], 0)

    compiled = grape.compile(step, warmup=0)
    steps = 120
    held_before = process_device_bytes(compiled)
    copied = []
    for _ in range(3):
        before = grape.stats(compiled)["bytes_copied_in"]
        state = torch.zeros(1, width, device=DEV)
        for _ in range(steps):
            state = compiled(state)
        copied.append(grape.stats(compiled)["bytes_copied_in"] - before)
    used = process_device_bytes(compiled) - held_before
    assert state.shape[0] == steps + 1 and state[-1, 0].item() == steps
    s = grape.stats(compiled)
    largest = (steps + 1) * width * 4
    per_shape_sum = sum((t + 1) * width * 4 for t in range(1, steps + 1))
    # A ping-pong of a growing buffer lays out within three times the largest one
    # (Note [Capture arena layout]); lanes map 2 MB granules.
    assert s["arena_lane_bytes"]["large"] <= 3 * largest + (4 << 20), s["arena_lane_bytes"]
    assert used < per_shape_sum / 8, (used, per_shape_sum)
    # Only the caller's first state is copied, into the first graph's placeholder. Once the
    # torch.zeros line is a predicted site, a variant could read its buffer in place, but it would
    # lay out its outputs elsewhere, where the second graph, which reads them in place, would not
    # find them (Note [Chain variants]): the one small copy stays.
    assert copied[1:] == [width * 4] * 2 and s["chain_variants"] == 0, copied


def test_allocator_hook_can_be_removed_and_captures_reinstall_it():
    from grape import _C

    fn = make_mlp(mlp_weights())
    step = grape.compile(fn, warmup=0)
    x = torch.randn(8, 64, device=DEV)
    out = step(x)
    assert _C.allocator_hook_installed()
    assert _C.allocator_hook(False) is True
    assert not _C.allocator_hook_installed()
    keep = torch.randn(1000, device=DEV)  # plain PyTorch allocations still work
    torch.testing.assert_close(step(x), fn(x), rtol=0, atol=0)  # replays need no hook
    del out
    y = torch.randn(9, 64, device=DEV)  # a new shape: the capture installs the hook again
    torch.testing.assert_close(step(y), fn(y), rtol=0, atol=0)
    assert _C.allocator_hook_installed()
    assert grape.stats(step)["captures"] == 2
    del keep


def test_device_tensors_made_from_python_values_are_captured():
    # torch.tensor(value, device="cuda") copies from pageable memory, which a capture refuses;
    # grape builds it in pinned memory the graph keeps, so each graph copies its own value.
    def make(scale):
        def f(x):
            return x * torch.tensor(scale, device=x.device) + torch.as_tensor([1.0, 2.0], device=x.device)

        return grape.compile(f)

    halve, triple = make(0.5), make(3.0)
    x = torch.ones(2, device=DEV)
    for _ in range(4):
        torch.testing.assert_close(halve(x), torch.tensor([1.5, 2.5], device=DEV))
        torch.testing.assert_close(triple(x), torch.tensor([4.0, 5.0], device=DEV))
    for compiled in (halve, triple):
        s = grape.stats(compiled)
        assert s["fallbacks"] == [] and s["replays"] == 3
        # The first capture is refused for the pageable copy and tried again with pinned memory.
        assert s["pinned_host_constants"] == 1 and s["capture_failures"] == 0
    plain = grape.compile(make_mlp(mlp_weights()))
    for _ in range(3):
        plain(x.new_ones(4, 64))
    assert grape.stats(plain)["pinned_host_constants"] == 0


def test_a_cpu_tensor_moved_to_the_device_is_captured_from_pinned_memory():
    # A Hugging Face sliding-window cache moves its 0-dim window size to the device at its first
    # update, inside the prompt's forward: a copy from pageable memory, refused under capture,
    # then captured from pinned memory. The value keys the signature (Note [Host scalars]).
    def shift(x, window):
        return x + window.to(x.device)

    compiled = grape.compile(shift)
    x = torch.ones(4, device=DEV)
    for v in (3, 3, 3, 3, 5, 5):
        assert torch.equal(compiled(x, torch.tensor(v)), shift(x, torch.tensor(v)))
    s = grape.stats(compiled)
    assert s["fallbacks"] == [] and s["signatures"] == 2 and s["replays"] == 5
    assert s["pinned_host_constants"] == 2 and s["capture_failures"] == 0


def test_an_index_built_on_the_host_is_captured_from_pinned_memory():
    # Falcon splits its fused keys and values with qkv[..., [-2]]: PyTorch builds the list's index
    # on the host and copies it from pageable memory, refused under capture, then captured from
    # pinned memory; so is a CPU index tensor, and an index assignment.
    def split(qkv):
        key, value = qkv[..., [-2], :], qkv[..., [-1], :]
        out = key * 2 + value
        out[:, torch.tensor([0, 2])] = 0.0  # a number through an index built on the host
        out[out > 2.0] = 2.0  # and through a mask, which PyTorch fills without a copy
        return out

    compiled = grape.compile(split)
    for _ in range(4):
        qkv = torch.randn(2, 3, 5, 4, device=DEV)
        assert torch.equal(compiled(qkv), split(qkv))
    s = grape.stats(compiled)
    assert s["fallbacks"] == [] and s["replays"] >= 3
    assert s["pinned_host_constants"] == 1 and s["capture_failures"] == 0


def dynamo_graphs() -> int:
    """Graphs Dynamo has compiled in this process."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def replay_rows(step, reference, rows):
    """Calls `step` on random inputs of each row count, checked against `reference`."""
    for n in rows:
        x = torch.randn(n, 64, device=DEV)
        torch.testing.assert_close(step(x), reference(x), rtol=1e-5, atol=1e-5)


def test_host_constants_are_pinned_for_the_signatures_that_make_them():
    # A prompt that runs eager code making a host constant and decode steps that run compiled
    # code: only the prompt's signature captures under the pinning mode, so Dynamo's guards on
    # the mode stack hold for the compiled steps.
    torch._dynamo.reset()
    weights = mlp_weights()
    compiled = torch.compile(make_mlp(weights), dynamic=True)

    def step(x):
        if x.shape[0] == 1:
            return make_mlp(weights)(x) * torch.tensor(2.0, device=x.device)
        return compiled(x)

    compiled_step = grape.compile(step, rewrite=False)
    graphs = dynamo_graphs()
    replay_rows(compiled_step, step, (1, 8, 16) * 3)
    s = grape.stats(compiled_step)
    # One capture per signature, and a chain variant where a predicted allocation site brought
    # the input (run alone, this test makes one; after the rest of the suite, none). The first
    # compiled-code signature, captured at first sight, may compile inside the capture: that
    # capture fails, the call warms up, and the next one captures (none fails where Inductor's
    # on-disk cache holds the kernels from an earlier process).
    assert s["fallbacks"] == [] and s["captures"] - s["chain_variants"] == 3
    assert s["capture_failures"] <= 1
    assert s["pinned_host_constants"] == 1
    assert dynamo_graphs() - graphs == 1


def test_a_torch_compiled_function_replays_inductors_kernels_without_compiling_again():
    # grape over torch.compile: the warm-up compiles, the capture runs that compiled code (no
    # compilation inside the capture, where it would fail), and replays launch its kernels.
    torch._dynamo.reset()
    weights = mlp_weights()

    def mlp_with_constant(x):
        # A Python value made a device tensor: Dynamo bakes it into the compiled graph.
        return make_mlp(weights)(x) * torch.tensor(0.5, device=x.device) + x.sin()

    compiled = torch.compile(mlp_with_constant, dynamic=True)
    step = grape.compile(compiled)
    graphs = dynamo_graphs()
    # The function's first call warms up (and compiles); the other shapes are captured at first
    # sight, running what Dynamo compiled for every shape.
    replay_rows(step, mlp_with_constant, (8, 16, 24) * 3)
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["captures"] == 3 and s["replays"] == 8
    assert s["pinned_host_constants"] == 0
    # One compilation for every shape (dynamic=True), made during the first warm-up.
    assert dynamo_graphs() - graphs == 1


def test_plan_free_attention_warms_up_and_captures_without_cudnn_attention():
    import torch.nn.functional as F

    default = torch.backends.cuda.cudnn_sdp_enabled()
    seen = []  # (capturing, cuDNN attention allowed) at each call of f

    def attend(q, k, v, mask):
        seen.append((torch.cuda.is_current_stream_capturing(),
                     torch.backends.cuda.cudnn_sdp_enabled()))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, 4, 16, 64, generator=g).to(DEV, torch.bfloat16) for _ in range(3))
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool, device=DEV).tril()
    f = grape.compile(attend, plan_free_attention=True)
    torch.backends.cuda.enable_cudnn_sdp(True)  # so that leaving it out shows
    try:
        for _ in range(3):
            out = f(q, k, v, mask)
        assert seen == [(False, False), (True, False)]  # the warm-up, then the capture
        assert grape.stats(f)["replays"] == 2
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(default)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
