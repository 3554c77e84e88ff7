"""grape.Predicate and grape.while_loop on the GPU: eager behaviour, and capture into CUDA
conditional nodes under grape.compile and under a plain torch.cuda.graph."""

import pytest
import torch

import grape

# A FallbackWarning fails a test here unless it is marked expects_fallback (conftest.py).
pytestmark = [pytest.mark.gpu]

DEV = "cuda"


def flag(value: bool) -> torch.Tensor:
    return torch.tensor(value, device=DEV)


@pytest.mark.parametrize("condition, error, words", [
    (lambda: torch.ones(1, device=DEV), TypeError, "got dtype torch.float32 \\(compare it"),
    (lambda: torch.ones(2, dtype=torch.bool, device=DEV), ValueError, "got 2 elements \\(reduce it"),
])
def test_conditions_of_the_wrong_dtype_or_size_are_refused(condition, error, words):
    with pytest.raises(error, match=words):
        grape.Predicate(condition())
    with pytest.raises(error, match=words):
        grape.while_loop(lambda x: condition(), lambda x: (x,), (torch.zeros(1, device=DEV),))


@pytest.mark.expects_fallback
def test_a_cpu_condition_under_capture_runs_the_call_eagerly_with_the_reason():
    gate = torch.tensor(True)  # a CPU condition the function reads (an argument would be refused)

    def step(x):
        out = x.clone()
        with grape.Predicate(gate):  # read on the host, which no replay could do
            out.add_(1)
        return out

    compiled = grape.compile(step)
    for value in (True, False, True):
        gate.fill_(value)
        x = torch.ones(4, device=DEV)
        assert torch.equal(compiled(x), step(x))
    s = grape.stats(compiled)
    assert s["replays"] == 0 and len(s["fallbacks"]) == 1
    assert "a condition on cpu cannot be captured" in s["fallbacks"][0]["reason"]


def test_eager_predicate_runs_the_taken_block_only():
    out = torch.zeros(2, device=DEV)
    for value in (True, False):
        branch = grape.Predicate(flag(value))
        with branch:
            out[0] += 1
        with branch.otherwise():
            out[1] += 1
    assert out.tolist() == [1.0, 1.0]


def branchy(x, limit):
    """x * 2 where x.sum() > limit, else x - 1; then + 10 where x.max() > 2 * limit."""
    out = torch.empty_like(x)
    branch = grape.Predicate(x.sum() > limit)
    with branch:
        out.copy_(x * 2)
    with branch.otherwise():
        out.copy_(x - 1)
    with grape.Predicate(x.max() > 2 * limit):
        out.add_(10)
        with grape.Predicate(x.min() < 0):  # nested
            out.mul_(-1)
    return out


def test_compiled_branches_follow_the_condition_at_every_replay():
    step = grape.compile(branchy)
    limit = torch.tensor(4.0, device=DEV)
    cases = [torch.tensor(v, device=DEV) for v in
             ([1.0, 2.0, 3.0], [0.5, 0.5, 0.5], [1.0, -2.0, 9.0], [3.0, 2.0, 1.0], [0.0, 0.0, -1.0],
              [9.0, 1.0, 1.0])]
    for x in cases + cases:
        torch.testing.assert_close(step(x, limit), branchy(x, limit), rtol=0, atol=0)
    s = grape.stats(step)
    assert s["captures"] >= 1 and s["eager_calls"] == 0 and s["fallbacks"] == []
    assert s["replays"] == len(cases) * 2 - 1  # one signature: everything after the warm-up


def test_replays_with_branches_do_not_synchronize():
    step = grape.compile(branchy)
    limit = torch.tensor(4.0, device=DEV)
    x = torch.tensor([1.0, 2.0, 3.0], device=DEV)
    step(x, limit), step(x, limit)  # warm-up, capture
    inputs = [torch.tensor(v, device=DEV) for v in ([9.0, 9.0, 9.0], [0.0, 0.0, 0.0])]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [step(y, limit) for y in inputs]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for y, out in zip(inputs, outs):
        torch.testing.assert_close(out, branchy(y, limit), rtol=0, atol=0)
    s = grape.stats(step)
    assert s["replays"] == 3 and s["eager_calls"] == 0  # the capture and both checked calls


def test_a_skipped_body_runs_none_of_its_kernels():
    def heavy(x, go):
        y = x.clone()
        with grape.Predicate(go):
            z = y
            for _ in range(50):
                z = torch.sin(z) + 1
            y.copy_(z)  # a name rebound in the body would hold unspecified values when skipped
        return y

    step = grape.compile(heavy)
    x = torch.rand(1 << 16, device=DEV)
    for value in (True, False, True, False):
        torch.testing.assert_close(step(x, flag(value)), heavy(x, flag(value)), rtol=0, atol=0)

    def replay_ms(value):
        go = flag(value)
        step(x, go)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            step(x, go)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    assert replay_ms(False) < replay_ms(True) / 3
    s = grape.stats(step)
    # 4 + 2 * 21 calls of one signature: only the first warmed up, so the timings are replays'.
    assert s["calls"] == 46 and s["replays"] == 45


def test_while_loop_runs_a_data_dependent_number_of_iterations_in_one_graph():
    def collatz_steps(n):
        def cond(value, count):
            return value > 1

        def body(value, count):
            odd = value % 2 == 1
            return torch.where(odd, 3 * value + 1, value // 2), count + 1

        return grape.while_loop(cond, body, (n, torch.zeros_like(n)))[1]

    step = grape.compile(collatz_steps)
    expected = {6: 8, 7: 16, 27: 111, 1: 0, 97: 118}
    for _ in range(2):
        for n, count in expected.items():
            n_t = torch.tensor([n], device=DEV)
            assert step(n_t).item() == count
            assert n_t.item() == n  # the carried inputs are not modified
    s = grape.stats(step)
    # One graph (plus a variant reading the input where torch.tensor allocates it).
    assert s["captures"] - s["chain_variants"] == 1 and s["eager_calls"] == 0


# otherwise() after other GPU work is refused under capture: the signature falls back.
@pytest.mark.expects_fallback
def test_otherwise_after_other_gpu_work_is_refused_under_capture():
    def misplaced(x):
        out = x.clone()
        branch = grape.Predicate(x.sum() > 0)
        with branch:
            out.add_(1)
        out.mul_(2)  # between the blocks: eager would run it before the else block
        with branch.otherwise():
            out.sub_(1)
        return out

    step = grape.compile(misplaced)
    x = torch.ones(3, device=DEV)
    for _ in range(3):
        torch.testing.assert_close(step(x), misplaced(x))
    (fallback,) = grape.stats(step)["fallbacks"]
    assert "otherwise() must directly follow" in fallback["reason"]


def test_predicate_inside_a_plain_torch_cuda_graph():
    total = torch.zeros(1, device=DEV)
    go = flag(False)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph):
            with grape.Predicate(go):
                total.add_(1)
    for value in (True, False, True, True):
        go.fill_(value)
        graph.replay()
    assert total.item() == 3.0


def test_while_loop_bodies_that_return_aliases_of_the_carried_tensors():
    def shift(x, prev, n):
        return grape.while_loop(lambda x, prev, n: n < 3, lambda x, prev, n: (x + 1, x, n + 1),
                                (x, prev, n))

    def swap(a, b, n):
        return grape.while_loop(lambda a, b, n: n < 3, lambda a, b, n: (b, a, n + 1), (a, b, n))

    for fn in (shift, swap):
        step = grape.compile(fn)
        args = (torch.zeros(1, device=DEV), torch.ones(1, device=DEV), torch.zeros((), device=DEV))
        want = fn(*args)  # eager
        for _ in range(3):
            for got, expected in zip(step(*args), want):
                torch.testing.assert_close(got, expected, rtol=0, atol=0)
        assert grape.stats(step)["replays"] == 2  # warm-up, then the capture and a replay
    eager = shift(*(torch.zeros(1, device=DEV), torch.ones(1, device=DEV),
                    torch.full((), 5.0, device=DEV)))
    assert eager[0].item() == 0.0  # zero iterations: new tensors with the inputs' values


def test_many_predicates_inside_one_body_capture():
    def gated_sum(x, go):
        out = torch.zeros_like(x)
        with grape.Predicate(go):
            for i in range(40):
                with grape.Predicate(x[i] > 0):
                    out[i:i + 1].copy_(x[i:i + 1])
        return out

    step = grape.compile(gated_sum)
    x = torch.randn(40, device=DEV)
    for value in (True, False, True):
        torch.testing.assert_close(step(x, flag(value)), gated_sum(x, flag(value)), rtol=0, atol=0)
    assert grape.stats(step)["fallbacks"] == []
    assert grape.stats(step)["replays"] == 2
