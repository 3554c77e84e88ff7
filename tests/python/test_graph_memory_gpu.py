"""Graph memory on the GPU: shapes of one topology share executables, patched per shape beyond
the executable cache (docs/design.md, "Shared executables"), and a memory budget evicts executables and turns captures
that do not fit into eager calls (docs/semantics.md, "Graph memory")."""

import random

import pytest
import torch
import torch.nn.functional as F

import grape

# A FallbackWarning fails a test here unless it is marked expects_fallback (conftest.py).
pytestmark = [pytest.mark.gpu]

DEV = "cuda"


def make_step(dim=64, heads=4, seed=0):
    """A decode step with a KV cache that grows by one position per call: every length is a new
    shape, and the kernels' grids, sizes and pointers change with it."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    w_qkv = (torch.randn(3 * dim, dim, generator=g) * 0.1).to(DEV)
    w_out = (torch.randn(dim, dim, generator=g) * 0.1).to(DEV)

    def step(x, kv):
        q, k, v = F.linear(x, w_qkv).split(dim, -1)
        b = x.shape[0]
        q = q.view(b, 1, heads, -1).transpose(1, 2)
        new = torch.stack([k, v]).view(2, b, 1, heads, -1).transpose(2, 3)
        kv = torch.cat([kv, new], 3)
        a = F.scaled_dot_product_attention(q, kv[0], kv[1])
        y = x + F.linear(a.transpose(1, 2).reshape(b, 1, -1), w_out).tanh()
        return y, kv

    return step


def inputs(length, batch=2, dim=64, heads=4, seed=None):
    g = torch.Generator(device="cpu").manual_seed(length if seed is None else seed)
    x = torch.randn(batch, 1, dim, generator=g).to(DEV)
    kv = torch.randn(2, batch, heads, length, dim // heads, generator=g).to(DEV)
    return x, kv


def passes_until_every_shape_is_resident(compiled, one_pass, until=None, most=4):
    """Runs `one_pass` until every shape of `compiled` holds an executable of its own (or
    `until(stats)`), at most `most` times: where the GPU waits for the host, a shape gets its own
    executable at its launch after a patch of it, or right after a patch of another (Note
    [Executable slots])."""
    done = until or (lambda s: s["resident_executables"] == s["shapes"])
    for _ in range(most):
        if done(grape.stats(compiled)):
            return
        one_pass()
    assert done(grape.stats(compiled)), f"not resident after {most} passes"


def run_shapes(fn, lengths, host_bound=False):
    """fn's outputs at each length in turn. host_bound: the GPU finishes each call's work before
    the next call, as in a loop that reads every result on the host; there replayed shapes get
    executables of their own (Note [Executable slots])."""
    outputs = []
    for n in lengths:
        args = inputs(n)
        if host_bound:
            torch.cuda.synchronize()
        outputs.append(tuple(t.clone() for t in fn(*args)))
    return outputs


def expect_shapes(fn, lengths, expected, host_bound=False):
    """Runs fn at each length in turn: every output equals the expected one, bit for bit."""
    for n, out, want in zip(lengths, run_shapes(fn, lengths, host_bound), expected):
        assert all(torch.equal(a, b) for a, b in zip(out, want)), f"length {n}"


@pytest.mark.parametrize("executable_cache", [0, None], ids=["one-per-topology", "all-cached"])
def test_random_shape_orders_replay_results_identical_to_eager(executable_cache):
    step = make_step()
    lengths = list(range(1, 41))
    expected = {n: out for n, out in zip(lengths, run_shapes(step, lengths))}
    # All cached: without alias prediction, so that every graph is one length's (no chain variant
    # first captured in the last pass), and each replays in the host-bound passes after its capture.
    compiled = grape.compile(step, executable_cache=executable_cache,
                             alias_prediction=executable_cache == 0)
    rng = random.Random(0)

    def shuffled_pass():
        order = lengths[:]
        rng.shuffle(order)
        for n, out in zip(order, run_shapes(compiled, order, host_bound=True)):
            for got, want in zip(out, expected[n]):
                assert torch.equal(got, want), f"length {n}"

    # Warm-up, capture, then replays, each pass in a new random order. A shape replayed right after
    # a capture gets no executable of its own (the GPU waited for the capture, not for launches);
    # a later launch that patches it while the GPU waits makes the next launch of its group
    # give its shape one, and the shape gets one at its own next launch.
    for _ in range(5):
        shuffled_pass()
    if executable_cache is None:
        passes_until_every_shape_is_resident(compiled, shuffled_pass)
    before = grape.stats(compiled)
    shuffled_pass()
    s = grape.stats(compiled)
    last_pass_switches = s["executable_switches"] - before["executable_switches"]
    assert s["replays"] >= 2 * len(lengths) and not s["fallbacks"]
    # Every graph: one per length, and the chain variants that read predicted inputs in place.
    assert s["shapes"] == len(lengths) + s["chain_variants"]
    # Most shapes joined an existing topology's executable instead of instantiating their own.
    assert s["graphs_joined"] >= len(lengths) // 2
    assert s["topology_groups"] == s["shapes"] - s["graphs_joined"]
    assert 0 < s["params_bytes"] < s["params_raw_bytes"]
    if executable_cache == 0:  # one executable per topology, patched to each shape
        assert s["resident_executables"] == s["topology_groups"]
        assert s["cached_executable_bytes"] == 0
        assert s["executable_switches"] > 0 and s["nodes_patched"] > 0 and s["patch_seconds"] > 0
    else:  # every shape in an executable of its own once replayed: nothing to patch then
        assert s["resident_executables"] == s["shapes"]
        assert s["cached_executable_bytes"] > 0
        assert last_pass_switches == 0


def test_a_growing_cache_moves_no_temporaries_between_decode_shapes():
    """Note [Outputs apart from temporaries]: the cache a decode step extends is an output, laid
    out apart from the step's temporaries, so a new length patches only the kernels that touch the
    cache, not the layers that follow it."""
    dim, layers, batch = 64, 16, 2
    g = torch.Generator(device="cpu").manual_seed(0)
    weights = [(torch.randn(dim, dim, generator=g) * 0.1).to(DEV) for _ in range(layers)]

    def step(x, cache):
        cache = torch.cat([cache, x.unsqueeze(1)], 1)  # one position longer, every call
        h = x
        for w in weights:  # temporaries of one size at every length
            h = (h @ w).tanh()
        return h + cache.mean(1), cache

    compiled = grape.compile(step, executable_cache=0)
    x = torch.randn(batch, dim, generator=g).to(DEV)
    cache = eager_cache = torch.randn(batch, 4, dim, generator=g).to(DEV)
    joined_at = {}
    for t in range(40):
        y, cache = compiled(x, cache)
        want, eager_cache = step(x, eager_cache)
        assert torch.equal(y, want) and torch.equal(cache, eager_cache), f"step {t}"
        if t in (10, 39):
            joined_at[t] = grape.stats(compiled)
    before, after = joined_at[10], joined_at[39]
    assert after["replays"] - before["replays"] == 29 and not after["fallbacks"]
    joins = after["graphs_joined"] - before["graphs_joined"]
    assert joins >= 29 and after["topology_groups"] == 1
    # The layers alone run 2 * 16 kernels; the cat, the mean and the addition read the cache.
    patched_per_join = (after["nodes_patched"] - before["nodes_patched"]) / joins
    assert patched_per_join <= 8, patched_per_join
    assert after["arena_lane_bytes"]["output"] > 0


def test_the_executable_cache_keeps_shapes_resident_within_its_bytes():
    step = make_step()
    lengths = list(range(1, 25))
    expected = run_shapes(step, lengths)
    compact = grape.compile(step, alias_prediction=False, executable_cache=0)
    for _ in range(4):
        before = grape.stats(compact)
        run_shapes(compact, lengths, host_bound=True)
    c = grape.stats(compact)
    compact_pass_switches = c["executable_switches"] - before["executable_switches"]
    one_executable = c["executable_bytes"] // c["resident_executables"]
    assert one_executable > 0
    cache = 8 * one_executable
    compiled = grape.compile(step, alias_prediction=False, executable_cache=cache)
    for _ in range(4):
        expect_shapes(compiled, lengths, expected, host_bound=True)
    passes_until_every_shape_is_resident(
        compiled, lambda: expect_shapes(compiled, lengths, expected, host_bound=True),
        until=lambda s: s["cached_executable_bytes"] + one_executable > cache)
    before = grape.stats(compiled)
    expect_shapes(compiled, lengths, expected, host_bound=True)
    s = grape.stats(compiled)
    assert s["executable_cache"] == cache and not s["fallbacks"]
    assert 0 < s["cached_executable_bytes"] <= cache
    assert c["topology_groups"] < s["resident_executables"] < s["shapes"]
    # The shapes holding an executable of their own are not patched at each pass.
    assert s["executable_switches"] - before["executable_switches"] < compact_pass_switches


def test_shapes_replayed_while_the_gpu_is_busy_share_one_executable():
    # Note [Executable slots]: where work is still queued when a shape replays, patching overlaps
    # it, so even an unlimited executable cache makes no executable beyond one per topology.
    step = make_step()
    lengths = list(range(1, 17))
    expected = run_shapes(step, lengths)
    compiled = grape.compile(step, alias_prediction=False, executable_cache=None)
    for _ in range(4):
        outputs = []
        for n in lengths:
            args = inputs(n)
            torch.cuda._sleep(20_000_000)  # ~10 ms of GPU work queued before the call
            outputs.append(tuple(t.clone() for t in compiled(*args)))
        for n, out, want in zip(lengths, outputs, expected):
            assert all(torch.equal(a, b) for a, b in zip(out, want)), f"length {n}"
    s = grape.stats(compiled)
    assert s["replays"] >= 2 * len(lengths) and not s["fallbacks"]
    assert s["resident_executables"] == s["topology_groups"] < s["shapes"]
    assert s["executable_switches"] > 0
    # The same shapes in a host-bound loop: each shape is patched at most once while the GPU
    # waits, then gets an executable of its own.
    passes_until_every_shape_is_resident(
        compiled, lambda: expect_shapes(compiled, lengths, expected, host_bound=True))
    assert grape.stats(compiled)["resident_executables"] == s["shapes"]


def test_a_repeated_order_is_patched_ahead_with_results_identical_to_eager():
    # The same order every pass (a generation): after each launch the executable is patched for
    # the graph that came next last time, so that later launches find it ready.
    step = make_step()
    lengths = list(range(1, 25))
    expected = run_shapes(step, lengths)
    compiled = grape.compile(step, alias_prediction=False, executable_cache=0)
    for _ in range(4):
        expect_shapes(compiled, lengths, expected)
    s = grape.stats(compiled)
    assert s["patches_ahead"] >= len(lengths) // 2 and not s["fallbacks"]
    # Reversed, the predictions miss; the launches patch what they need, results unchanged.
    expect_shapes(compiled, lengths[::-1], expected[::-1])


def test_a_shuffled_order_is_not_patched_ahead():
    # Each pass in another order (an epoch's shuffled batches): a graph's successor seldom
    # repeats, and a patch ahead for an unconfirmed one would be undone by the next launch.
    step = make_step()
    lengths = list(range(1, 25))
    expected = dict(zip(lengths, run_shapes(step, lengths)))
    compiled = grape.compile(step, alias_prediction=False, executable_cache=0)
    rng = random.Random(3)
    for _ in range(4):
        order = rng.sample(lengths, len(lengths))
        expect_shapes(compiled, order, [expected[n] for n in order])
    s = grape.stats(compiled)
    assert s["replays"] >= 2 * len(lengths) and not s["fallbacks"]
    assert s["patches_ahead"] <= 3


def test_sharing_off_gives_every_shape_its_own_executable():
    step = make_step()
    lengths = [3, 9, 5]
    compiled = grape.compile(step, share_executables=False)
    for _ in range(3):
        got = run_shapes(compiled, lengths)
    for out, want in zip(got, run_shapes(step, lengths)):
        assert all(torch.equal(a, b) for a, b in zip(out, want))
    s = grape.stats(compiled)
    assert s["shapes"] == len(lengths) + s["chain_variants"]
    assert s["topology_groups"] == s["resident_executables"] == s["shapes"]
    assert s["graphs_joined"] == 0 and s["params_bytes"] == 0


def expect_shuffled_replays(compiled, fn, sizes, rng, passes=3):
    """Replays of (n, 32) inputs of every size, in `passes` random orders, queued back to back
    (none waited for before the next) and checked once all are queued."""
    order = [n for _ in range(passes) for n in rng.sample(sizes, len(sizes))]
    inputs = [torch.randn(n, 32, device=DEV) for n in order]
    outputs = [compiled(x) for x in inputs]
    for x, out in zip(inputs, outputs):
        assert torch.equal(out, fn(x)), x.shape[0]


def near_topologies(x):
    """Long inputs take an extra op: a topology a few nodes from the other."""
    y = (x * 2).sin()
    if x.shape[0] > 100:
        y = y.cumsum(0)
    return y + 1


@pytest.mark.parametrize("first", ["short", "long"])
@pytest.mark.parametrize("executable_cache", [0, None], ids=["one-per-topology", "all-cached"])
def test_near_topologies_share_one_executable_with_results_identical_to_eager(executable_cache,
                                                                             first):
    # Note [Near topologies]: the long inputs' graphs and the short ones' share a group, the union
    # of both whichever came first (a long one first: the union adds the short ones' edge past
    # the extra op). Each shape runs only its own nodes, so results match eager in any order,
    # also when replays are queued back to back, none waited for before the next.
    sizes = [64, 300, 96, 400, 32, 200]
    if first == "long":
        sizes = sizes[1:] + sizes[:1]
    compiled = grape.compile(near_topologies, alias_prediction=False,
                             executable_cache=executable_cache)
    rng = random.Random(1)
    # Warm-up, then captures in this order (a short shape's group first, then a long one joins it
    # and makes the union), each result checked as it comes.
    for order in [sizes, sizes]:
        for n in order:
            x = torch.randn(n, 32, device=DEV)
            assert torch.equal(compiled(x), near_topologies(x)), n
    expect_shuffled_replays(compiled, near_topologies, sizes, rng)
    s = grape.stats(compiled)
    assert not s["fallbacks"] and s["replays"] >= 3 * len(sizes)
    assert s["topology_groups"] == 1
    assert s["graphs_joined"] == s["shapes"] - 1
    assert s["graphs_joined_near"] >= 1
    assert s["topology_unions"] == 1


def other_kernels(x):
    """Long inputs run another elementwise kernel and an extra op: near, with a kernel swapped."""
    y = x * 2
    y = y.cos().cumsum(0) if x.shape[0] > 100 else y.sin()
    return y + 1


def test_near_topologies_pair_kernels_of_other_functions_and_each_runs_its_own():
    # Note [Near topologies]: the long inputs' cos pairs with the short ones' sin (a swap), and
    # each shape runs its own kernel, whichever shape the executable last ran.
    sizes = [64, 300, 96, 400]
    compiled = grape.compile(other_kernels, alias_prediction=False, executable_cache=0)
    for n in sizes * 2:
        x = torch.randn(n, 32, device=DEV)
        assert torch.equal(compiled(x), other_kernels(x)), n
    expect_shuffled_replays(compiled, other_kernels, sizes, random.Random(2))
    s = grape.stats(compiled)
    assert not s["fallbacks"]
    assert s["topology_groups"] == 1 and s["graphs_joined_near"] >= 1
    assert s["kernels_swapped_near"] >= 1


def test_near_topologies_keep_executables_of_their_own_when_only_topologies_share():
    # share_executables="topology": each topology has its own group, no unions.
    compiled = grape.compile(near_topologies, alias_prediction=False, share_executables="topology")
    for n in [64, 300, 96, 400] * 2:
        x = torch.randn(n, 32, device=DEV)
        assert torch.equal(compiled(x), near_topologies(x)), n
    s = grape.stats(compiled)
    assert s["topology_groups"] == 2 and s["graphs_joined"] == 2
    assert s["graphs_joined_near"] == 0 and s["topology_unions"] == 0


def two_topologies(x):
    """Long inputs take a dozen more ops: a topology far from the other."""
    y = (x * 2).sin()
    if x.shape[0] > 100:
        for _ in range(12):
            y = y.cos()
    return y + 1


def test_a_tight_budget_evicts_executables_and_rebuilds_them_on_demand():
    sizes = [64, 96, 300, 400]  # two topologies
    # Without alias prediction no input buffers are allocated, and both functions capture the
    # shapes in one order (where an allocation goes depends on the capture before it: Note
    # [Outputs apart from temporaries]): their arenas match.
    reference = grape.compile(two_topologies, alias_prediction=False, warmup_each_signature=True)
    for _ in range(3):
        for n in sizes:
            reference(torch.randn(n, 32, device=DEV))
    r = grape.stats(reference)
    assert r["topology_groups"] == 2
    # The long inputs' graph, twelve ops more, is too far from the short ones' to join them.
    assert r["near_join_refusals"]["far"] >= 1 and r["graphs_joined_near"] == 0
    assert r["executable_bytes"] > 0
    # Room for the arena only: each replay keeps its own executable and frees the other.
    budget = r["arena_bytes"]
    compiled = grape.compile(two_topologies, memory_budget=budget, alias_prediction=False,
                             warmup_each_signature=True)
    for _ in range(4):
        for n in sizes:
            x = torch.randn(n, 32, device=DEV)
            assert torch.equal(compiled(x), two_topologies(x))
    s = grape.stats(compiled)
    assert s["memory_budget"] == budget and not s["fallbacks"]
    assert s["replays"] == 3 * len(sizes)
    assert s["evictions"] >= 5, (s["evictions"], s["capture_oom_retries"], s["arena_lane_bytes"])
    assert s["instantiations"] > s["topology_groups"]
    # One instantiation per change of topology (3 passes from the capture on), and one after a
    # capture that found no room while an executable was resident freed them all (the arena
    # reaches its size only at the second capture, whose outputs take a lane of their own): the
    # budget leaves no room for a slot per shape, so the other shape of a topology is patched.
    assert s["instantiations"] <= 2 * 3 + s["capture_oom_retries"], (
        s["instantiations"], s["capture_oom_retries"], s["arena_lane_bytes"], r["arena_lane_bytes"])
    assert s["resident_executables"] == 1


# A budget of 0 bytes: the capture runs out of memory, the call runs eagerly, and the signature is
# tried again later (core::CaptureBackoff: at its next call, then after 1, 3, 7... calls).
@pytest.mark.expects_fallback
def test_a_capture_beyond_the_budget_runs_eagerly_with_the_reason():
    compiled = grape.compile(lambda x: (x @ x.T).relu().sum(0), memory_budget=0)
    x = torch.randn(256, 256, device=DEV)
    for _ in range(5):
        assert torch.allclose(compiled(x), (x @ x.T).relu().sum(0))
    s = grape.stats(compiled)
    # Calls 2 and 3 try (each once more after freeing executables), call 4 waits, call 5 tries.
    assert s["replays"] == 0 and s["capture_oom_retries"] == 3 and s["eager_calls"] == 4
    (fallback,) = s["fallbacks"]  # reported once
    assert "memory budget" in fallback["reason"] and "out of memory" in fallback["reason"]
    assert [e["state"] for e in s["entries"]] == ["deferred"]


def test_a_capture_that_fits_once_executables_are_freed_is_retried():
    def f(x):
        return (x.float() * 3).exp().to(x.dtype)

    small = torch.randn(1024, device=DEV)
    large = torch.randn(48 << 20, device=DEV, dtype=torch.half)  # 96 MB; its capture needs more arena
    reference = grape.compile(f, alias_prediction=False)
    for _ in range(2):
        reference(small)
    r_small = grape.stats(reference)
    for _ in range(2):
        reference(large)
    r = grape.stats(reference)
    assert r_small["executable_bytes"] > 0
    assert r["arena_bytes"] > r_small["arena_bytes"] + 2 * r_small["executable_bytes"]
    # Room for the large capture's arena only once the small shape's executable is freed.
    compiled = grape.compile(f, memory_budget=r["arena_bytes"], alias_prediction=False)
    for x in (small, small, large, large, large):
        assert torch.equal(compiled(x), f(x))
    s = grape.stats(compiled)
    assert s["capture_oom_retries"] == 1 and not s["fallbacks"]
    assert s["replays"] == 4  # the large shape is captured at first sight


MB = 1 << 20


def fragmenting_step(x):
    """First fit places a at 0 and b after it; a dies; c, twice their size, fits no gap and goes
    past b, the output past c: 6 sizes of x in the large lane, where 5 are ever live at once
    (b, c and the output). Placed by the plan: 5 (Note [Planned capture layouts])."""
    a = x * 2
    b = a + 1
    del a
    c = torch.cat([b, b])
    return c * 3


def test_a_capture_whose_first_fit_layout_wastes_memory_is_taken_again_along_its_plan():
    n = 4 * MB  # float32: 16 MB
    # Without alias prediction: x stays the placeholder's copy source, a single graph.
    compiled = grape.compile(fragmenting_step, alias_prediction=False)
    for i in range(4):  # warm-up, capture, replays
        x = torch.randn(n, device=DEV, generator=torch.Generator(DEV).manual_seed(i))
        assert torch.equal(compiled(x), fragmenting_step(x))
    s = grape.stats(compiled)
    assert s["captures"] == 1 and s["replays"] == 3 and not s["fallbacks"]
    assert s["replanned_captures"] == 1 and s["replans_diverged"] == 0
    size = 4 * n
    # The lanes are mapped in 2 MB granules: the plan's 5 sizes, not first fit's 6.
    assert 5 * size <= s["arena_lane_bytes"]["large"] <= 5 * size + 2 * MB


def test_a_capture_that_keeps_a_tensor_it_made_is_not_taken_again():
    # Without a warm-up the capture is the first call, and makes the cache: only its own graph
    # fills it, so a graph captured again (finding the cache made) would read what nothing wrote.
    cache = {}

    def step(x):
        if "offset" not in cache:
            cache["offset"] = torch.full_like(x, 0.5)
        return fragmenting_step(x + cache["offset"])

    compiled = grape.compile(step, warmup=0, alias_prediction=False)
    for i in range(3):
        x = torch.randn(4 * MB, device=DEV, generator=torch.Generator(DEV).manual_seed(i))
        assert torch.equal(compiled(x), fragmenting_step(x + 0.5))
    s = grape.stats(compiled)
    assert s["captures"] == 1 and not s["fallbacks"]
    assert s["replanned_captures"] == 0


# A CPU output: the signature falls back.
@pytest.mark.expects_fallback
def test_a_capture_refused_for_its_results_is_not_taken_again():
    # The layout would be planned, but the CPU output makes the graph unreplayable: f runs once
    # under capture, and the reason is the output's, not the plan's.
    runs_under_capture = []

    def step(x):
        runs_under_capture.append(torch.cuda.is_current_stream_capturing())
        return fragmenting_step(x), torch.ones(1)

    compiled = grape.compile(step, alias_prediction=False)
    x = torch.randn(4 * MB, device=DEV)
    for _ in range(3):
        out, _ = compiled(x)
        assert torch.equal(out, fragmenting_step(x))
    s = grape.stats(compiled)
    assert sum(runs_under_capture) == 1
    assert s["captures"] == 0 and s["replanned_captures"] == 0
    (fallback,) = s["fallbacks"]
    assert "returns output[1], a tensor on cpu" in fallback["reason"]


def test_a_capture_that_first_fit_lays_out_tightly_is_not_taken_again():
    compiled = grape.compile(lambda x: (x * 2 + 1).sum(0))
    x = torch.randn(4, MB, device=DEV)
    for _ in range(3):
        compiled(x)
    s = grape.stats(compiled)
    assert s["captures"] == 1 and s["replanned_captures"] == 0


def test_stats_report_graph_memory_keys():
    compiled = grape.compile(lambda x: x + 1)
    x = torch.ones(4, device=DEV)
    for _ in range(3):
        compiled(x)
    s = grape.stats(compiled)
    for key in ("shapes", "topology_groups", "resident_executables", "executable_bytes",
                "instantiations", "evictions", "graphs_joined", "executable_switches",
                "nodes_patched", "patch_seconds", "params_bytes", "params_raw_bytes",
                "capture_oom_retries", "memory_budget", "cached_executable_bytes",
                "executable_cache", "graphs_joined_near", "topology_unions",
                "near_join_refusals", "replanned_captures", "replans_diverged"):
        assert key in s, key
    assert s["shapes"] == 1 and s["memory_budget"] is None


def test_graphs_with_conditional_nodes_keep_executables_of_their_own():
    if grape._C.conditional_unsupported_reason("if"):
        pytest.skip(grape._C.conditional_unsupported_reason("if"))

    def f(x):
        y = x * 2
        with grape.Predicate(x.sum() > 0):
            y += 1
        return y

    compiled = grape.compile(f)
    for _ in range(3):
        for n in (8, 16):
            x = torch.randn(n, device=DEV)
            assert torch.equal(compiled(x), f(x))
    s = grape.stats(compiled)
    assert s["replays"] == 5 and s["graphs_joined"] == 0  # 16 captured at first sight
    assert s["unshareable_groups"] == s["topology_groups"] == s["shapes"]
    assert "conditional" in s["unshareable_reason"]
