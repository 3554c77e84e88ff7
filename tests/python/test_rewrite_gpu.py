"""The predication rewriter under grape.compile on the GPU: tensor-conditioned if/elif/else,
break and continue capture into conditional nodes and give eager's results at every replay."""

import pytest
import torch

import grape

# A FallbackWarning fails a test here unless it is marked expects_fallback (conftest.py).
pytestmark = [pytest.mark.gpu]

DEV = "cuda"


def route(x, limit):
    steps = torch.zeros((), device=DEV)
    if x.sum() > limit:
        x = x * 0.5
        steps = steps + 1
    elif x.min() < 0:
        x = x.abs()
        steps = steps + 2
    else:
        x = x + 1
    return x, steps


def pick(scores, threshold):
    """A scorer's loop: skip negative candidates, stop at the first one above the threshold."""
    total = torch.zeros((), device=DEV)
    chosen = torch.full((), -1.0, device=DEV)
    for i in range(scores.shape[0]):
        s = scores[i]
        if s < 0:
            continue
        if s > threshold:
            chosen = s
            break
        total = total + s
    return total, chosen


def cases(fn):
    rows = {route: ([3.0, 4.0], [1.0, -2.0], [0.5, 0.5], [9.0, -1.0]),
            pick: ([1.0, -2.0, 3.0, 9.0, 4.0], [1.0, 2.0, 3.0, 1.0, 1.0], [7.0, 1.0, 1.0, 1.0, 1.0],
                   [-1.0, -1.0, 6.0, -1.0, 8.0])}[fn]
    limit = 4.0 if fn is route else 5.0
    return [(torch.tensor(v, device=DEV), torch.tensor(limit, device=DEV)) for v in rows]


@pytest.mark.parametrize("fn", [route, pick], ids=lambda f: f.__name__)
def test_tensor_branches_capture_and_match_eager(fn):
    step = grape.compile(fn)
    assert step.rewritten
    rows = cases(fn)
    for args in rows + rows:
        for got, want in zip(step(*args), fn(*args)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    s = grape.stats(step)
    assert s["fallbacks"] == [] and s["eager_calls"] == 0 and s["replays"] == 2 * len(rows) - 1
    # Replays read the conditions on the GPU: no host synchronization.
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for args in rows:
            step(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def early_return(x):
    if x.sum() > 0:
        return x * 2
    return x


def test_a_return_in_a_tensor_branch_is_an_error_naming_the_line():
    step = grape.compile(early_return)
    x = torch.ones(3, device=DEV)
    step(x)  # the warm-up runs eagerly: Python semantics
    with pytest.raises(grape.RewriteError, match=r"test_rewrite_gpu.py:\d+: a return"):
        step(x)


# on_unsupported='sync' reads the condition on the host: the signature falls back.
@pytest.mark.expects_fallback
def test_sync_mode_runs_such_a_function_eagerly_with_a_warning():
    step = grape.compile(early_return, on_unsupported="sync")
    x = torch.ones(3, device=DEV)
    with pytest.warns(UserWarning, match="synchroniz"):
        for _ in range(3):
            torch.testing.assert_close(step(x), x * 2)
    assert grape.stats(step)["fallbacks"]


# Without the rewriter the tensor condition synchronizes under capture: falls back.
@pytest.mark.expects_fallback
def test_without_the_rewriter_a_tensor_branch_falls_back():
    step = grape.compile(route, rewrite=False)
    args = cases(route)[0]
    for _ in range(3):
        step(*args)
    (fallback,) = grape.stats(step)["fallbacks"]
    assert "synchroniz" in fallback["reason"]
