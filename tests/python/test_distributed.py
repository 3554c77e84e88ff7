"""grape under torch.distributed on the CPU, ranks as processes of one gloo process group: ranks
that call with signatures of their own, DistributedDataParallel's timed iterations (Note [DDP
under capture] in grape/_distributed.py), NCCL's graph buffer registration left off, and
collectives refused in predicated bodies."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import grape
from grape import _distributed, _predicate
from ranks import returned, run_ranks

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def own_signatures(rank, world):
    def step(x):
        total = x.sum().reshape(1)
        dist.all_reduce(total)
        return x * total

    compiled = grape.compile(step)
    lengths = [[4, 4, 8, 4], [8, 16, 16, 4], [2, 8, 2, 8], [16, 16, 16, 16]][rank]
    return [torch.equal(compiled(torch.arange(n) * 1.0), step(torch.arange(n) * 1.0))
            for n in lengths]


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_call_a_compiled_function_with_signatures_of_their_own(world):
    # No rank waits for another to reach the same signature: only the collectives meet.
    for equal in returned(run_ranks(own_signatures, world)):
        assert equal == [True] * 4


def ddp_timed_iterations(rank, world, steps):
    """What a DDPWatch says of a DDP module after each of `steps` training steps."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    watch = _distributed.DDPWatch()
    defers, refused = [], []
    for _ in range(steps):
        defers.append(watch.defers_capture())
        try:
            watch.saw(model, capturing=True)  # would a capture of this forward go on?
            refused.append(False)
        except RuntimeError as e:
            refused.append(str(e))
        watch.saw(model, capturing=False)
        model(torch.randn(2, 4)).sum().backward()
    return defers, refused, model._get_ddp_logging_data().get("iteration")


@pytest.mark.parametrize("world", [2, 4])
def test_a_ddp_module_defers_captures_until_its_reducer_stopped_timing_iterations(world):
    steps = 120  # past the reducer's default sample at iteration 100
    for defers, refused, iteration in returned(run_ranks(ddp_timed_iterations, world, steps)):
        timed = _distributed.DDP_TIMED_ITERATIONS + 1  # forwards 2 to 11 wait on the host
        # The first step is unseen until it runs; then the watch knows the module.
        assert defers == [False] + [True] * (timed - 1) + [False] * (steps - timed)
        assert all(refused[1:timed]) and not any(refused[timed:])
        assert "grape: DistributedDataParallel synchronizes with the host" in refused[1]
        # grape set the sample rate past the run: iteration 100 was not timed.
        assert iteration == _distributed.DDP_TIMED_ITERATIONS


def test_a_forward_without_gradient_sync_is_never_refused():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        watch = _distributed.DDPWatch()
        watch.saw(model, capturing=False)
        model(torch.randn(2, 4)).sum().backward()
        with model.no_sync():
            watch.saw(model, capturing=True)  # the reducer times no step without sync
        with torch.no_grad():
            watch.saw(model, capturing=True)
        assert watch.defers_capture()  # a step with sync would still be timed
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("chosen", [None, "1"])
def test_nccl_graph_buffer_registration_is_off_unless_the_user_chose(chosen):
    env = {k: v for k, v in os.environ.items() if k != "NCCL_GRAPH_REGISTER"}
    if chosen is not None:
        env["NCCL_GRAPH_REGISTER"] = chosen
    out = subprocess.run([sys.executable, "-c", "import os, grape; "
                          "print(os.environ['NCCL_GRAPH_REGISTER'])"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == (chosen or "0")


def collective_under_refusal(rank, world):
    x = torch.ones(2)
    with _predicate._CollectivesRefused("grape.Predicate"):
        y = x * 2  # other operators run
        try:
            dist.all_reduce(y)
        except RuntimeError as e:
            return str(e), y.tolist()
    return None, y.tolist()


def test_a_collective_in_a_predicated_body_fails_the_capture():
    (message, values), = returned(run_ranks(collective_under_refusal, 1))
    assert values == [2.0, 2.0]
    # A "grape:" error under capture: the capture falls back (Note [Exceptions under capture]).
    assert message.startswith("grape: grape.Predicate: a torch.distributed collective "
                              "(c10d.allreduce_")


def unwatchable(rank, world):
    """What grape says of a module whose parameters are DTensors: split by parallelize_module, and
    sharded by FSDP2's fully_shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from grape import _C

    mesh = init_device_mesh("cpu", (world,))
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    split = parallelize_module(torch.nn.Sequential(torch.nn.Linear(4, 4)), mesh,
                               {"0": ColwiseParallel()})
    sharded = fully_shard(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    return (_C._unwatchable_state(plain, []), _C._unwatchable_state(split, []),
            _C._unwatchable_state(plain, list(sharded.parameters())))


def test_dtensor_parameters_are_named_as_what_a_capture_cannot_watch():
    for plain, split, leaves in returned(run_ranks(unwatchable, 2)):
        assert plain == ""
        assert split.startswith("a parameter of Sequential (or of a submodule) is a DTensor, a "
                                "tensor subclass with a dispatch of its own")
        assert leaves.startswith("a tensor whose gradient the step sets is a DTensor")
