"""grape.compile under torch.distributed on the GPU: NCCL collectives captured and replayed,
capture points agreed across ranks, collectives refused in predicated bodies. Each test runs its
ranks as processes of their own (tests/python/ranks.py); tests of two NCCL ranks need two GPUs."""

import pytest
import torch
import torch.distributed as dist

import grape
from ranks import returned, run_ranks

# A FallbackWarning fails a test here unless it is marked expects_fallback (conftest.py); the
# ranks run in processes of their own, which that filter does not reach.
pytestmark = pytest.mark.gpu

needs_nccl = pytest.mark.skipif(not dist.is_available() or not dist.is_nccl_available(),
                                reason="torch.distributed with NCCL is not available")


def nccl_ranks(world: int):
    if torch.cuda.device_count() < world:
        pytest.skip(f"{world} NCCL ranks need {world} GPUs, this machine has "
                    f"{torch.cuda.device_count()}")


def all_reduce_step(rank, world):
    def step(x):
        y = x * (rank + 1)
        dist.all_reduce(y)
        return y + 1

    compiled = grape.compile(step)
    equal = []
    for i in range(4):  # warm-up, capture, replays
        x = torch.arange(1024, device="cuda", dtype=torch.float32) + i
        equal.append(torch.equal(compiled(x), step(x)))
    s = grape.stats(compiled)
    return equal, s["captures"], s["replays"], s["fallbacks"]


@needs_nccl
@pytest.mark.parametrize("world", [1, 2])
def test_an_all_reduce_inside_a_captured_step_replays_as_eager(world):
    nccl_ranks(world)
    for equal, captures, replays, fallbacks in returned(run_ranks(all_reduce_step, world,
                                                                  backend="nccl")):
        assert equal == [True] * 4
        assert (captures, replays, fallbacks) == (1, 3, [])


def refused_on_one_rank(rank, world, with_collective):
    def step(x):
        y = x + 1
        if with_collective:
            dist.all_reduce(y)
        # Rank 1 alone returns a CPU tensor, which no graph can give.
        return y, torch.ones(1, device="cpu" if rank == 1 else x.device)

    compiled = grape.compile(step)
    equal = []
    for i in range(4):
        x = torch.full((256,), float(i), device="cuda")
        equal.append(torch.equal(compiled(x)[0], step(x)[0]))
    s = grape.stats(compiled)
    return equal, s["captures"], s["replays"], [f["reason"] for f in s["fallbacks"]]


# Every rank falls back (in the ranks' processes; the mark documents it).
@pytest.mark.expects_fallback
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_a_capture_refused_on_one_rank_runs_eagerly_on_every_rank_for_the_same_reason(backend):
    # NCCL ranks need a GPU each, and then the step holds an all-reduce; gloo ranks share this
    # GPU (a gloo collective on CUDA tensors cannot be captured, so that step holds none).
    nccl = backend == "nccl"
    if nccl:
        nccl_ranks(2)
    ranks = returned(run_ranks(refused_on_one_rank, 2, nccl, backend=backend))
    for equal, captures, replays, reasons in ranks:
        assert equal == [True] * 4 and replays == 0
        assert len(reasons) == 1
        assert "a tensor on cpu (graphs read CUDA tensors only) (on rank 1;" in reasons[0]
    assert ranks[0][3] == ranks[1][3]


def collective_in_predicate(rank, world):
    def step(x):
        y = x * 2
        with grape.Predicate(y.sum() > 0):
            dist.all_reduce(y)
        return y

    compiled = grape.compile(step)
    x = torch.ones(8, device="cuda")
    first = compiled(x)  # the warm-up: eager, the condition read on the host
    try:
        compiled(x)
    except grape.PredicateError as e:
        return torch.equal(first, step(x)), str(e)
    return torch.equal(first, step(x)), None


@needs_nccl
@pytest.mark.parametrize("world", [1, 2])
def test_a_collective_inside_a_predicate_is_refused_on_every_rank(world):
    nccl_ranks(world)
    ranks = returned(run_ranks(collective_in_predicate, world, backend="nccl"))
    for eager_equal, message in ranks:
        assert eager_equal
        assert message is not None and "a torch.distributed collective (c10d.allreduce_" in message
    assert len({message for _, message in ranks}) == 1
