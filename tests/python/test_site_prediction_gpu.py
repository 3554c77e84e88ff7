"""Allocation-site prediction on the GPU: inputs the caller allocates between calls land in the
graphs' input buffers (docs/design.md, "Allocation-site prediction")."""

import pytest
import torch

import grape

# A FallbackWarning fails a test here unless it is marked expects_fallback (conftest.py).
pytestmark = [pytest.mark.gpu]

DEV = "cuda"


def score(ids, mask):
    """A decode step's shape: inputs grow by one column per call, the output feeds the next."""
    h = (ids * 3 + mask).float().cumsum(1)
    return (h[:, -1:] % 97).long()


def decode(step, steps, prompt=4, batch=2, held=None):
    """A loop that builds input_ids and attention_mask with torch.cat outside the step."""
    ids = torch.arange(batch * prompt, device=DEV).reshape(batch, prompt) % 50
    mask = torch.ones_like(ids)
    out = []
    for _ in range(steps):
        tok = step(ids, mask)
        out.append(tok)
        ids = torch.cat([ids, tok], 1)
        mask = torch.cat([mask, torch.ones_like(tok)], 1)
        if held is not None:
            held.append((ids, mask))
    return torch.cat(out, 1)


def delta(step, run):
    before = grape.stats(step)
    result = run()
    after = grape.stats(step)
    return result, {k: after[k] - before[k] for k in after if isinstance(after[k], int)
                    and not isinstance(after[k], bool)}


def warm_until_steady(step, run, reference, limit=8):
    """Runs passes until one captures nothing and copies nothing; returns how many it took. A
    graph captured before its input came from a site buffer copies that input until the copies
    pay for a variant that reads it in place (Note [Chain variants]): for these small functions,
    whose captures cost little, within some tens of calls of that graph."""
    for passes in range(1, limit + 1):
        result, d = delta(step, run)
        torch.testing.assert_close(result, reference, rtol=0, atol=0)
        graphs_only = d["warmup_calls"] == 0 and d["eager_calls"] == 0 and d["captures"] == 0
        if graphs_only and d["bytes_copied_in"] == 0:
            return passes
    raise AssertionError(f"no steady state after {limit} passes: {grape.stats(step)}")


def test_cat_loop_inputs_are_allocated_in_place_and_copy_nothing():
    step = grape.compile(score)
    reference = decode(score, 70)
    # Pass 1 warms up, learns the sites and captures, 2 captures the prompt. The calls whose
    # inputs came from elsewhere when they were captured (the first prompt, a size class's first
    # buffer) copy them, a few bytes, until the copies pay for a variant.
    for _ in range(2):
        decode(step, 70)
    result, d = delta(step, lambda: decode(step, 70))
    torch.testing.assert_close(result, reference, rtol=0, atol=0)
    assert d["captures"] == d["chain_variants"] == 0 and d["replays"] == 70
    assert d["alias_hits"] + d["alias_misses"] <= 2 * 70 and d["alias_hits"] > 0
    # Copies only where a variant waits for its rent: ids and mask, 73 columns at most.
    assert d["bytes_copied_in"] <= d["chain_variants_deferred"] * 2 * (2 * 73 * 8)
    assert warm_until_steady(step, lambda: decode(step, 70), reference, limit=400) > 1
    result, d = delta(step, lambda: decode(step, 70))  # and it stays so
    torch.testing.assert_close(result, reference, rtol=0, atol=0)
    assert d["replays"] == 70 and d["captures"] == 0
    assert d["bytes_copied_in"] == 0 and d["chain_variants_deferred"] == 0
    # The loop keeps every token: each is moved out of the pool once, at the next replay.
    assert d["bytes_evacuated"] <= 70 * 2 * 8
    assert d["alias_hits"] == 2 * 70 and d["alias_misses"] == 0
    s = grape.stats(step)
    # The prompt's two allocations and the two torch.cat lines (a site can be learned twice when
    # allocations between other functions' calls shifted its occurrence count in the first pass);
    # ids reach 73 * 8 * 2 bytes: three size classes, two buffers each at most.
    assert 4 <= s["input_sites"] <= 6
    assert 0 < s["input_buffer_bytes"] <= 4 * 2 * (512 + 1024 + 2048)
    assert s["arena_lane_bytes"]["input"] >= s["input_buffer_bytes"]


def test_inputs_from_elsewhere_are_copied_and_correct():
    step = grape.compile(score)
    for _ in range(3):
        decode(step, 20)
    ids = torch.randint(0, 50, (2, 10), device=DEV)  # not a predicted site
    mask = torch.ones_like(ids)
    result, d = delta(step, lambda: step(ids, mask))
    torch.testing.assert_close(result, score(ids, mask), rtol=0, atol=0)
    assert d["bytes_copied_in"] == 2 * ids.numel() * 8
    assert d["replays"] == 1


# The loop holds every input, so both buffers of a site are busy: the next input comes from
# PyTorch and a graph whose placeholder is a held buffer may refuse its replay (that call runs
# eagerly, with a FallbackWarning: docs/semantics.md, "Inputs your code allocates").
@pytest.mark.expects_fallback
def test_held_inputs_keep_their_values_and_busy_buffers_fall_back_to_pytorch():
    step = grape.compile(score)
    reference = decode(score, 40)
    for _ in range(3):
        decode(step, 40)
    held = []
    result, d = delta(step, lambda: decode(step, 40, held=held))
    torch.testing.assert_close(result, reference, rtol=0, atol=0)
    assert d["site_buffers_busy"] > 0  # both buffers of a class held: PyTorch's allocator serves
    # Every input the loop kept still holds what it held when it was made.
    ids = torch.arange(8, device=DEV).reshape(2, 4) % 50
    for k, (kept_ids, kept_mask) in enumerate(held):
        ids = torch.cat([ids, reference[:, k : k + 1]], 1)
        torch.testing.assert_close(kept_ids, ids, rtol=0, atol=0)
        assert bool((kept_mask == 1).all())


def test_in_place_update_of_a_predicted_input_reaches_the_caller():
    def bump(x):
        x.add_(1)
        return x.sum(1, keepdim=True)

    step = grape.compile(bump)
    for _ in range(5):
        x0 = torch.zeros(3, 5, device=DEV)
        x = torch.cat([x0, x0], 1)  # the predicted site
        total = step(x)
        assert bool((x == 1).all())
        torch.testing.assert_close(total, torch.full((3, 1), 10.0, device=DEV))
    s = grape.stats(step)
    assert s["input_sites"] == 1 and s["alias_hits"] >= 1


def test_growing_inputs_change_size_class_and_stay_correct():
    step = grape.compile(score)
    reference = decode(score, 300, prompt=1, batch=1)  # 8 to 2408 bytes: classes 512 to 4096
    run = lambda: decode(step, 300, prompt=1, batch=1)  # noqa: E731
    warm_until_steady(step, run, reference, limit=400)


def test_prediction_off_learns_nothing():
    step = grape.compile(score, alias_prediction=False)
    reference = decode(score, 20)
    for _ in range(3):
        torch.testing.assert_close(decode(step, 20), reference, rtol=0, atol=0)
    s = grape.stats(step)
    assert s["input_sites"] == 0 and s["site_allocations"] == 0
    assert s["arena_lane_bytes"]["input"] == 0
    assert s["bytes_copied_in"] > 0


def test_two_functions_interleaved_each_get_their_inputs_in_place():
    def other(ids, mask):
        return ((ids + 2 * mask).float().sum(1, keepdim=True) % 89).long()

    f, g = grape.compile(score), grape.compile(other)

    def both(f, g, steps=30):
        a = torch.arange(8, device=DEV).reshape(2, 4) % 50
        b = a.clone() + 1
        ma, mb = torch.ones_like(a), torch.ones_like(b)
        out = []
        for _ in range(steps):
            ta = f(a, ma)
            tb = g(b, mb)
            out += [ta, tb]
            a = torch.cat([a, tb], 1)
            b = torch.cat([b, ta], 1)
            ma = torch.cat([ma, torch.ones_like(ta)], 1)
            mb = torch.cat([mb, torch.ones_like(tb)], 1)
        return torch.cat(out, 1)

    reference = both(score, other)
    for fn in (f, g):  # until the copies paid for their variants (warm_until_steady)
        warm_until_steady(fn, lambda: both(f, g), reference, limit=400)
    before_f, before_g = grape.stats(f), grape.stats(g)
    torch.testing.assert_close(both(f, g), reference, rtol=0, atol=0)
    for fn, before in ((f, before_f), (g, before_g)):
        after = grape.stats(fn)
        assert after["bytes_copied_in"] == before["bytes_copied_in"]
        assert after["alias_misses"] == before["alias_misses"]
        assert after["alias_hits"] - before["alias_hits"] == 2 * 30


def test_host_batches_of_several_lengths_land_in_place():
    weights = torch.randn(1, 1, 9, device=DEV)

    def features(x):
        return torch.nn.functional.conv1d(x.unsqueeze(1), weights, stride=4).relu().mean(-1)

    step = grape.compile(features)
    gen = torch.Generator().manual_seed(0)
    lengths = [4000, 5200, 6400, 8000]
    host = {n: torch.randn(4, n, generator=gen).pin_memory() for n in lengths}
    order = torch.randint(0, len(lengths), (60,), generator=gen).tolist()

    def epoch():
        outs = []
        for k in order:
            x = host[lengths[k]].to(DEV, non_blocking=True)
            outs.append(step(x))
        return outs

    reference = [features(host[lengths[k]].to(DEV)) for k in order]
    assert warm_until_steady(step, epoch, reference) <= 4
    outs, d = delta(step, epoch)
    torch.testing.assert_close(outs, reference, rtol=0, atol=0)
    assert d["bytes_copied_in"] == 0 and d["alias_misses"] == 0
    assert d["alias_hits"] == len(order)
