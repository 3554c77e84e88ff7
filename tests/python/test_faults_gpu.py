"""Faults leave nothing behind (docs/semantics.md, "Faults and threads"): after out-of-memory,
an exception of the function's own, an interrupt, an error the capture causes, other threads, a
fork or the interpreter's exit, the results equal eager's and the process stays sound. Each
scenario compares with eager on the same inputs, then checks the process with `assert_sound`.
Scenarios that could end the process (an abort from a destructor, a fork) run in a child process."""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import grape

pytestmark = [pytest.mark.gpu]

DEV = "cuda"


def assert_sound():
    """What any process must still do after a fault: random numbers on the default stream and on
    a side stream, a user's own torch.cuda.graph capture with a random op, and a new compiled
    function that captures and replays."""
    torch.cuda.synchronize()
    on_default = torch.rand(1000, device=DEV)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = torch.rand(1000, device=DEV)
    side.synchronize()
    assert not torch.equal(on_default, on_side)
    assert 0.4 < on_default.mean().item() < 0.6

    x = torch.ones(64, device=DEV)
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        (x * 2 + torch.rand_like(x) * 0).sum()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2 + torch.rand_like(x) * 0
    x.fill_(3)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(x, 6))
    del graph

    fresh = grape.compile(lambda t: (t * 2).sum(0))
    t = torch.arange(12.0, device=DEV).reshape(3, 4)
    for _ in range(3):
        out = fresh(t)
    assert torch.equal(out, (t * 2).sum(0))
    assert grape.stats(fresh)["replays"] >= 1 and grape.stats(fresh)["captures"] == 1


def run_child(code: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """Runs `code` in a new Python process (grape importable), returning what it did."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), PYTHONFAULTHANDLER="1")
    preamble = textwrap.dedent(f"""
        import gc, os, sys, warnings
        import torch, grape
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_faults_gpu import assert_sound
        warnings.simplefilter("ignore", grape.FallbackWarning)
        DEV = "cuda"
    """)
    return subprocess.run([sys.executable, "-c", preamble + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_child_ok(child: subprocess.CompletedProcess):
    said = child.stdout + child.stderr
    assert child.returncode == 0, said
    assert "terminate called" not in said and "Traceback" not in said, said
    assert "sound" in child.stdout, said


# --- out of memory -----------------------------------------------------------------------------


def test_out_of_memory_at_capture_then_a_budget_over_many_shapes_does_not_abort():
    # The abort of the fault issue: a capture that ran out of device memory, then a function whose
    # budget refuses every capture, over many shapes (a destructor threw: "The graph should be
    # registered to the state").
    child = run_child("""
        big = grape.compile(lambda x: (x.repeat(2048, 1) * 2).sum(0))
        x = torch.ones(1 << 18, device=DEV)
        big(x)  # warm-up: 2 GiB fit
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        blocker = torch.empty(free - (1 << 30), dtype=torch.uint8, device=DEV)
        try:
            big(x.view(2, -1))  # a new shape: 4 GiB do not fit, for the capture nor for eager
            raise SystemExit("no OutOfMemoryError")
        except torch.OutOfMemoryError:
            pass
        del blocker
        torch.cuda.empty_cache()
        small = grape.compile(lambda x: x.cumsum(0) * 3, memory_budget=1 << 20)
        for n in range(1, 40):
            t = torch.arange(n * 100, device=DEV, dtype=torch.float32)
            assert torch.equal(small(t), t.cumsum(0) * 3), n
        assert grape.stats(small)["captures"] == 0
        del small, big
        gc.collect()
        assert_sound()
        print("sound")
    """)
    assert_child_ok(child)


@pytest.mark.expects_fallback
def test_out_of_memory_in_the_capture_and_in_eager_raises_and_captures_again_later():
    step = grape.compile(lambda x, n: x.new_empty(n).fill_(1).sum() + x.sum())
    x = torch.ones(4, device=DEV)
    step(x, 16)  # warm-up
    too_much = torch.cuda.get_device_properties(0).total_memory * 2 // 4
    with pytest.raises(torch.OutOfMemoryError):
        step(x, too_much)  # neither a graph nor eager has the memory: eager's error
    entry = [e for e in grape.stats(step)["entries"] if e["state"] == "deferred"]
    assert len(entry) == 1 and entry[0]["kind"] == "out_of_memory"
    assert grape.stats(step)["eager_calls"] == 1
    # Another signature captures and replays; the process is sound.
    assert torch.equal(step(x, 32), torch.tensor(36.0, device=DEV))
    assert torch.equal(step(x, 32), torch.tensor(36.0, device=DEV))
    assert grape.stats(step)["replays"] == 2
    assert_sound()


@pytest.mark.expects_fallback
def test_a_budget_refused_while_outputs_are_held_captures_once_they_are_dropped():
    # The budget fits one 32 MiB output besides the placeholders, not two: a new shape's capture
    # lays out around the output the caller holds, and runs out; once it is dropped, it fits.
    mib = 1 << 20
    step = grape.compile(lambda x: x * 2, memory_budget=80 * mib)
    a = torch.ones(8 * mib, device=DEV)  # 32 MiB
    b = torch.ones(2, a.numel() // 2, device=DEV)
    step(a)  # warm-up
    held = step(a)  # captured; its output stays in the pool while held
    assert grape.stats(step)["captures"] == 1
    out = step(b)  # new shape: its output would go beside `held`, past the budget
    assert torch.equal(out, b * 2)
    s = grape.stats(step)
    assert s["captures"] == 1 and s["eager_calls"] == 1
    assert [e["state"] for e in s["entries"]].count("deferred") == 1
    assert torch.equal(held, a * 2)
    del held, out
    gc.collect()
    out = step(b)  # memory freed: the next call captures again
    assert torch.equal(out, b * 2)
    s = grape.stats(step)
    assert s["captures"] == 2 and s["replays"] == 2
    assert all(e["state"] == "graph" for e in s["entries"])
    assert_sound()


# --- exceptions ----------------------------------------------------------------------------------


def test_the_functions_exception_at_capture_reaches_the_caller_once_after_its_gpu_work():
    calls = {"n": 0, "fail": False}
    scale = torch.ones(4, device=DEV)

    def f(x):
        calls["n"] += 1
        x.add_(1)  # an input changed in place
        scale.mul_(2)  # state outside the arguments
        if calls["fail"]:
            raise ValueError("no threes")
        return x * scale

    step = grape.compile(f)
    x = torch.zeros(4, device=DEV)
    step(x)  # warm-up: x = 1, scale = 2
    calls["fail"] = True
    y = torch.zeros(2, 4, device=DEV)  # a new shape: captured at first sight
    with pytest.raises(ValueError, match="no threes"):
        step(y)
    assert calls["n"] == 2  # the function did not run again
    # What eager did before raising is done: the input and the state changed once.
    assert torch.equal(y, torch.ones(2, 4, device=DEV))
    assert torch.equal(scale, torch.full((4,), 4.0, device=DEV))
    s = grape.stats(step)
    assert s["raised_under_capture"] == 1 and s["fallbacks"] == [] and s["eager_calls"] == 0
    # The signature was not marked as failed: its next call captures and replays.
    calls["fail"] = False
    out = step(y)
    assert torch.equal(y, torch.full((2, 4), 2.0, device=DEV))
    assert torch.equal(out, y * 8)
    assert grape.stats(step)["replays"] == 1 and grape.stats(step)["captures"] == 1
    assert_sound()


def test_an_exception_raised_at_every_capture_never_falls_back():
    def f(x):
        x.mul_(3)
        raise KeyError("always")

    step = grape.compile(f, warmup=0)
    x = torch.ones(3, device=DEV)
    for i in range(4):
        with pytest.raises(KeyError, match="always"):
            step(x)
        assert torch.equal(x, torch.full((3,), 3.0 ** (i + 1), device=DEV))
    s = grape.stats(step)
    assert s["raised_under_capture"] == 4 and s["fallbacks"] == [] and s["captures"] == 0
    assert_sound()


def test_an_exception_at_warm_up_reaches_the_caller():
    calls = {"n": 0}

    def f(x):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ZeroDivisionError("first call")
        return x + 1

    step = grape.compile(f)
    x = torch.zeros(2, device=DEV)
    with pytest.raises(ZeroDivisionError):
        step(x)
    assert calls["n"] == 1
    for _ in range(3):
        assert torch.equal(step(x), x + 1)
    assert grape.stats(step)["replays"] >= 1
    assert_sound()


def test_a_capture_before_the_process_used_cuda_runs_the_function():
    # No argument is a CUDA tensor and the process has not used CUDA yet: the capture's pool
    # makes PyTorch's CUDA state itself (the caching allocator once refused it, "Invalid device
    # argument", in place of the function's own exception).
    child = run_child("""
        calls = []

        @grape.compile(warmup=0, cache_dir=False)
        def f(n):
            calls.append(n)
            if n < 0:
                raise ValueError("negative")
            return torch.arange(4, device=DEV) * n

        assert not torch.cuda.is_initialized()
        torch.manual_seed(0)  # queued for CUDA's start, which must not come inside the capture
        try:
            f(-1)
        except ValueError as e:
            assert "negative" in str(e), e
        else:
            raise AssertionError("the function's exception did not reach the caller")
        assert torch.cuda.is_initialized()
        outs = [f(3).tolist() for _ in range(3)]
        s = grape.stats(f)
        assert outs == [[0, 3, 6, 9]] * 3, outs
        assert calls[0] == -1 and set(calls[1:]) == {3}, calls
        assert s["raised_under_capture"] == 1 and s["captures"] == 1 and s["replays"] >= 2, s
        assert_sound()
        print("sound")
    """)
    assert_child_ok(child)


@pytest.mark.expects_fallback
def test_an_exception_of_the_eager_run_after_a_capture_failure_reaches_the_caller():
    def f(x):
        if x.sum().item() > 100:  # a host sync: the capture fails, the eager run decides
            raise OverflowError("too big")
        return x * 2

    step = grape.compile(f, warmup=0)
    with pytest.raises(OverflowError):
        step(torch.full((4,), 50.0, device=DEV))
    assert grape.stats(step)["fallbacks"][0]["kind"] == "host_sync"
    assert torch.equal(step(torch.ones(4, device=DEV)), torch.full((4,), 2.0, device=DEV))
    assert_sound()


@pytest.mark.expects_fallback
def test_an_error_the_capture_causes_runs_eagerly():
    # Waiting for work outside the capture ends it (cudaErrorStreamCaptureIsolation): eager would
    # not raise, so the call runs eagerly and returns eager's result.
    side = torch.cuda.Stream()
    done = torch.cuda.Event()
    with torch.cuda.stream(side):
        torch.ones(1, device=DEV)
    done.record(side)

    def f(x):
        y = x * 2
        torch.cuda.current_stream().wait_event(done)
        return y + 1

    step = grape.compile(f, warmup=0)
    x = torch.arange(5.0, device=DEV)
    for _ in range(3):
        assert torch.equal(step(x), x * 2 + 1)
    s = grape.stats(step)
    assert s["raised_under_capture"] == 0 and len(s["fallbacks"]) == 1 and s["replays"] == 0
    assert_sound()


@pytest.mark.expects_fallback
def test_an_exception_from_a_predicated_body_follows_the_branch_eager_takes():
    def f(x, limit):
        with grape.Predicate((x > limit).any()):
            raise ValueError("over the limit")
        return x + 1

    step = grape.compile(f, warmup=0, rewrite=False)
    x = torch.arange(4.0, device=DEV)
    # The body is captured whatever the condition: the exception falls back to eager, which does
    # not take the branch here and so does not raise.
    assert torch.equal(step(x, torch.tensor(10.0, device=DEV)), x + 1)
    with pytest.raises(ValueError, match="over the limit"):
        step(x, torch.tensor(1.0, device=DEV))
    assert grape.stats(step)["raised_under_capture"] == 0
    assert_sound()


def test_keyboard_interrupt_during_a_capture_propagates_and_leaves_nothing_behind():
    state = {"interrupt": False}

    def f(x):
        y = torch.nn.functional.dropout(x, 0.5) * 2
        if state["interrupt"]:
            signal.raise_signal(signal.SIGINT)  # as if ^C came while the function was captured
        return y.sum()

    step = grape.compile(f)
    x = torch.ones(256, device=DEV)
    step(x)  # warm-up
    state["interrupt"] = True
    with pytest.raises(KeyboardInterrupt):
        step(x)
    state["interrupt"] = False
    assert 0 < step(x).item() < 4 * 256  # captured now, and random as dropout is
    assert grape.stats(step)["captures"] == 1
    assert_sound()


# --- threads -------------------------------------------------------------------------------------


class Background:
    """Runs `body()` over and over in a thread while the with-block runs; the thread's first
    error fails the test at the block's end."""

    def __init__(self, body):
        self.body = body
        self.stop = threading.Event()
        self.errors = []
        self.rounds = 0
        self.thread = threading.Thread(target=self.run)

    def run(self):
        try:
            while not self.stop.is_set():
                self.body()
                self.rounds += 1
        except BaseException as e:  # noqa: BLE001 - every failure of the thread is the test's
            self.errors.append(e)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.stop.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the background thread is still running: a deadlock"
        if self.errors and exc_info[0] is None:
            raise self.errors[0]
        assert exc_info[0] is not None or self.rounds > 0


def run_threads(target, count):
    errors = []

    def guarded(i):
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - every failure of a thread is the test's
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread is still running: a deadlock"
    assert not errors, errors


def test_two_threads_on_one_function_leave_the_generator_sound():
    # The poisoned generator of the fault issue: one thread's capture failed with
    # cudaErrorStreamCaptureIsolation, and torch.rand on a side stream raised afterwards.
    step = grape.compile(lambda x: (x.sin() * 2).cumsum(0))
    x = torch.linspace(0, 3, 1000, device=DEV)
    expected = (x.sin() * 2).cumsum(0)

    def work(_):
        for _ in range(200):
            torch.testing.assert_close(step(x), expected, rtol=0, atol=0)

    run_threads(work, 2)
    s = grape.stats(step)
    # A call that found the other thread's output in its way ran eagerly (see the test below).
    assert s["calls"] == 400 and s["replays"] + s["eager_for_other_threads"] >= 390
    assert s["fallbacks"] == []
    assert_sound()


def test_eight_threads_on_several_functions_and_shapes():
    # No random op in these functions: their eager references run outside grape, in threads, and
    # on torch 2.11 a random op there raises while another thread's graph captures.
    fns = [lambda x: (x * 3).relu().sum(0), lambda x: x.cumsum(0) - 1,
           lambda x: x.flip(0) * 2 + x]
    steps = [grape.compile(f) for f in fns]
    inputs = [torch.randn(n, 16, device=DEV) for n in (3, 5, 8, 13)]

    def work(i):
        for k in range(120):
            f, step = fns[(i + k) % 3], steps[(i + k) % 3]
            x = inputs[(i * 7 + k) % 4]
            torch.testing.assert_close(step(x), f(x), rtol=0, atol=0)

    run_threads(work, 8)
    total = sum(grape.stats(s)["calls"] for s in steps)
    replays = sum(grape.stats(s)["replays"] + grape.stats(s)["eager_for_other_threads"]
                  for s in steps)
    assert total == 8 * 120 and replays >= total - 3  # one warm-up call per function
    assert all(grape.stats(s)["fallbacks"] == [] for s in steps)
    assert_sound()


def test_an_output_another_thread_holds_is_never_moved():
    # That thread could be reading it at its old address (Note [Outputs of several threads]); the
    # eight threads above once compared a moved output's overwritten pool memory with eager's.
    step = grape.compile(lambda x: x * 2 + 1)
    x = torch.arange(4096.0, device=DEV)
    expected = x * 2 + 1
    results = []

    def from_another_thread():
        run_threads(lambda _: results.append(step(x)), 1)

    step(x)  # warm-up
    held = step(x)  # captured: it lies in the pool, returned to this thread
    address = held.data_ptr()
    from_another_thread()
    s = grape.stats(step)
    assert s["eager_for_other_threads"] == 1 and s["eager_calls"] == 1 and s["fallbacks"] == []
    assert held.data_ptr() == address  # not moved
    del held
    # From then on outputs leave the pool before their call returns: every thread replays, and
    # what one thread holds never moves.
    from_another_thread()
    mine = step(x)
    address = mine.data_ptr()
    from_another_thread()
    s = grape.stats(step)
    assert s["replays"] == 4 and s["eager_for_other_threads"] == 1
    assert s["outputs_copied_out"] == 3 and s["bytes_copied_out"] == 3 * x.nbytes
    assert mine.data_ptr() == address and s["live_outputs"] == 0
    for out in results + [mine]:
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert_sound()


def test_an_output_of_a_thread_that_has_ended_is_still_another_threads():
    # A new thread gets an ended thread's id at once; the output the ended one passed on to this
    # thread must not move under it.
    step = grape.compile(lambda x: x * 2 + 1)
    x = torch.arange(4096.0, device=DEV)
    outputs = []

    def call_in_a_new_thread():
        run_threads(lambda _: outputs.append(step(x)), 1)

    call_in_a_new_thread()  # warm-up
    call_in_a_new_thread()  # captured; its output lies in the pool
    address = outputs[1].data_ptr()
    call_in_a_new_thread()
    s = grape.stats(step)
    assert s["eager_for_other_threads"] == 1 and outputs[1].data_ptr() == address
    for out in outputs:
        torch.testing.assert_close(out, x * 2 + 1, rtol=0, atol=0)
    assert_sound()


def test_eager_work_that_allocates_in_another_thread_while_a_function_captures():
    def f(x):
        y = (x @ x.T).softmax(-1)
        time.sleep(0.005)  # without the GIL, under capture: the other thread runs meanwhile
        return y.sum(0)

    step = grape.compile(f)
    sizes = iter(range(1 << 30))

    def eager():
        # Each size is new to the caching allocator for a while: it maps memory (cudaMalloc). Not
        # torch.cuda.empty_cache(), which PyTorch's allocator refuses while any graph captures.
        n = next(sizes)
        big = torch.empty((1 << 20) * (1 + n % 97), device=DEV)
        big.fill_(1.0)
        assert big.sum().item() == big.numel()  # and a host synchronization
        del big

    with Background(eager):
        for n in range(1, 41):  # a capture per shape while the other thread allocates
            x = torch.randn(n, 32, device=DEV)
            torch.testing.assert_close(step(x), (x @ x.T).softmax(-1).sum(0), rtol=0, atol=0)
    s = grape.stats(step)
    assert s["captures"] == 39 and s["fallbacks"] == []
    assert_sound()


def test_a_thread_replays_dropout_while_another_captures():
    # On torch 2.11 a random op outside a capture raises while any graph captures; grape's replays
    # in other threads wait for the capture (Note [One compiled call at a time]).
    def captured(x):
        y = x.exp()
        time.sleep(0.005)  # without the GIL, under capture: the replaying thread tries meanwhile
        return y.cumsum(-1)

    replayer = grape.compile(lambda x: torch.nn.functional.dropout(x, 0.5).sum())
    capturer = grape.compile(captured)
    x = torch.ones(4096, device=DEV)
    replayer(x), replayer(x)

    def replay():
        assert 0 < replayer(x).item() < 2 * 4096

    with Background(replay):
        for n in range(1, 31):
            y = torch.randn(n, 8, device=DEV)
            torch.testing.assert_close(capturer(y), y.exp().cumsum(-1), rtol=0, atol=0)
    assert grape.stats(capturer)["captures"] == 29
    assert grape.stats(replayer)["fallbacks"] == []
    assert_sound()


# --- random state, streams, memory -----------------------------------------------------------------


def test_seeds_and_generator_state_set_between_calls_are_followed():
    step = grape.compile(lambda x: x * (torch.rand_like(x) > 0.5))
    x = torch.ones(4096, device=DEV)
    step(x), step(x)  # warm-up, capture
    torch.manual_seed(7)
    a = step(x).clone()
    torch.manual_seed(7)
    b = step(x).clone()
    assert torch.equal(a, b)
    state = torch.cuda.get_rng_state()
    c = step(x).clone()
    d = step(x).clone()
    torch.cuda.set_rng_state(state)
    assert torch.equal(step(x), c) and not torch.equal(c, d)
    assert 0.4 < a.mean().item() < 0.6
    assert grape.stats(step)["replays"] >= 6
    assert_sound()


@pytest.mark.expects_fallback
def test_dropout_with_a_users_own_generator_draws_as_eager():
    gen = torch.Generator(device=DEV)

    def f(x):
        return x * (torch.rand(x.shape, device=DEV, generator=gen) > 0.5)

    step = grape.compile(f)
    x = torch.ones(1024, device=DEV)
    for _ in range(3):
        gen.manual_seed(3)
        expected = f(x)
        gen.manual_seed(3)
        assert torch.equal(step(x), expected)
    assert_sound()


def test_calls_from_side_streams_order_with_them():
    step = grape.compile(lambda x: (x * 2).cumsum(0))
    side = torch.cuda.Stream()
    x = torch.arange(1000.0, device=DEV)
    for i in range(6):
        stream = side if i % 2 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            x2 = x + i
            out = step(x2)
            expected = (x2 * 2).cumsum(0)
            assert torch.equal(out, expected)
        torch.cuda.current_stream().wait_stream(stream)
    assert grape.stats(step)["replays"] >= 4
    assert_sound()


def test_eviction_under_a_budget_while_outputs_are_held():
    def f(x):
        return x.softmax(-1) * 2

    # The budget: the arena and two executables of a probe's shapes, so that one executable per
    # shape (no sharing) must evict.
    probe = grape.compile(f, share_executables=False)
    for n in (32, 31):
        probe(torch.randn(n, 64, device=DEV)), probe(torch.randn(n, 64, device=DEV))
    budget = grape.stats(probe)["arena_bytes"] + grape.stats(probe)["executable_bytes"]
    del probe
    step = grape.compile(f, share_executables=False, memory_budget=budget)
    held = []
    for n in range(32, 0, -1):
        x = torch.randn(n, 64, device=DEV)
        step(x)
        held.append((step(x), f(x)))
    for out, expected in held:
        assert torch.equal(out, expected)
    s = grape.stats(step)
    assert s["evictions"] > 0 and s["replays"] >= 32 and s["fallbacks"] == []
    assert_sound()


def test_empty_cache_between_calls():
    step = grape.compile(lambda x: (x.relu() + 1).mean(0))
    x = torch.randn(32, 32, device=DEV)
    for _ in range(5):
        torch.cuda.empty_cache()
        assert torch.equal(step(x), (x.relu() + 1).mean(0))
    assert grape.stats(step)["replays"] == 4
    assert_sound()


def test_a_deleted_function_leaves_its_outputs_valid():
    step = grape.compile(lambda x: x.square() + 1)
    x = torch.randn(1024, device=DEV)
    step(x)
    out = step(x)
    del step
    gc.collect()
    churn = [torch.randn(1 << 16, device=DEV) for _ in range(8)]
    del churn
    assert torch.equal(out, x.square() + 1)
    assert_sound()


# --- the process ---------------------------------------------------------------------------------


def test_the_interpreter_exits_cleanly_with_graphs_alive():
    child = run_child("""
        import threading
        step = grape.compile(lambda x, y: (x * y).cumsum(0))
        train = torch.nn.Linear(8, 8, device=DEV)
        opt = torch.optim.AdamW(train.parameters(), capturable=True)
        def train_step(x):
            loss = train(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        train_step = grape.compile(train_step)
        x = torch.randn(64, device=DEV)
        KEPT = [step(x, x) for _ in range(3)]
        for _ in range(3):
            LOSS = train_step(torch.randn(4, 8, device=DEV))
        assert grape.stats(step)["replays"] >= 1 and grape.stats(train_step)["replays"] >= 1
        print("sound")
    """)
    assert_child_ok(child)


def test_a_forked_child_runs_eagerly_or_raises_clearly():
    child = run_child("""
        step = grape.compile(lambda x: x * 2)
        x = torch.ones(4, device=DEV)
        step(x), step(x)
        pid = os.fork()
        if pid == 0:
            # The child has the parent's objects but none of its CUDA state: grape runs the
            # function eagerly, saying so, and CUDA raises as it does for eager code there.
            code = 3
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always", grape.FallbackWarning)
                try:
                    step(x)
                except RuntimeError:
                    code = 0
            if not any("forked" in str(w.message) for w in said):
                code = 5
            sys.exit(code)  # a normal exit: destructors run
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert torch.equal(step(x), x * 2)
        assert grape.stats(step)["replays"] == 2
        assert_sound()
        print("sound")
    """)
    assert_child_ok(child)
