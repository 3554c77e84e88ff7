"""grape.compile under torch.distributed on the GPU: NCCL collectives captured and replayed, each
rank on its own signatures (Note [Ranks decide alone] in grape/_distributed.py), collectives in
predicated bodies, and DistributedDataParallel training with each rank's own batch lengths. Each
test runs its ranks as processes of their own (tests/python/ranks.py); tests of two NCCL ranks need
two GPUs."""

import hashlib

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
        # Every call after the warm-up replays: the graph, or a chain variant of it (each call's
        # input lies where the previous call's output did).
        assert (replays, fallbacks) == (3, []) and captures >= 1


# Each rank's lengths, call by call: one rank warms up or captures a length while the other
# replays one, and their collectives meet all the same.
OWN_LENGTHS = [[64, 64, 128, 64, 128, 192, 64, 192, 128], [128, 192, 192, 64, 128, 64, 128, 64, 192]]


def own_shapes(rank, world):
    def step(x):
        summary = torch.stack([x.sum(), x.square().sum(), x.amax()]) * (rank + 1)
        dist.all_reduce(summary)  # the same size on every rank, whatever x's
        return x * summary[0] + summary[1]

    compiled = grape.compile(step)
    equal = []
    for i, n in enumerate(OWN_LENGTHS[rank]):
        x = torch.linspace(-1, 1, n, device="cuda") + i
        equal.append(torch.equal(compiled(x), step(x)))
    s = grape.stats(compiled)
    return equal, s["captures"], s["replays"], s["warmup_calls"], s["fallbacks"]


@needs_nccl
def test_ranks_capture_and_replay_signatures_of_their_own_at_calls_of_their_own():
    nccl_ranks(2)
    for rank, (equal, captures, replays, warmups, fallbacks) in enumerate(
            returned(run_ranks(own_shapes, 2, backend="nccl"))):
        assert equal == [True] * len(OWN_LENGTHS[rank])
        assert fallbacks == [] and captures >= 3 and warmups == 1  # a graph per length, at least
        assert replays == len(OWN_LENGTHS[rank]) - warmups


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


# Rank 1 falls back (in the ranks' processes; the mark documents it).
@pytest.mark.expects_fallback
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_a_capture_refused_on_one_rank_runs_eagerly_there_while_the_other_replays(backend):
    # NCCL ranks need a GPU each, and then the step holds an all-reduce; gloo ranks share this
    # GPU (a gloo collective on CUDA tensors cannot be captured, so that step holds none).
    nccl = backend == "nccl"
    if nccl:
        nccl_ranks(2)
    (equal0, captures0, replays0, reasons0), (equal1, captures1, replays1, reasons1) = returned(
        run_ranks(refused_on_one_rank, 2, nccl, backend=backend))
    assert equal0 == equal1 == [True] * 4
    assert (replays0, reasons0) == (3, []) and captures0 >= 1
    assert (captures1, replays1) == (0, 0) and len(reasons1) == 1
    assert "a tensor on cpu (graphs read CUDA tensors only)" in reasons1[0]


def collective_in_predicate(rank, world):
    def step(x):
        y = x * 2
        with grape.Predicate(y.sum() > 0):
            dist.all_reduce(y)
        return y

    compiled = grape.compile(step)
    equal = []
    for i in range(4):  # warm-up, captures that fail, eager calls
        x = torch.ones(8, device="cuda") * (i - 1)
        equal.append(torch.equal(compiled(x), step(x)))
    s = grape.stats(compiled)
    return equal, s["replays"], [f["reason"] for f in s["fallbacks"]]


@needs_nccl
@pytest.mark.expects_fallback
@pytest.mark.parametrize("world", [1, 2])
def test_a_collective_inside_a_predicate_runs_the_call_eagerly(world):
    nccl_ranks(world)
    for equal, replays, reasons in returned(run_ranks(collective_in_predicate, world,
                                                      backend="nccl")):
        assert equal == [True] * 4 and replays == 0
        assert len(reasons) == 1
        assert "a torch.distributed collective (c10d.allreduce_" in reasons[0]


# ------------------------------------------------------------------- DistributedDataParallel

DDP_STEPS = 24  # past the reducer's 10 timed iterations, then replays of every length
DDP_LENGTHS = [16, 32, 48]


def ddp_training(rank, world, own_lengths, side_stream=True, recipe="bf16"):
    """A small GPT-2 LM with dropout in DDP, trained eagerly and through grape.compile from the same
    weights and seed: each rank's losses, whether they are eager's to the bit, whether the
    parameters agree across ranks, and grape's counters. `side_stream`: DDP is constructed under a
    side stream, as PyTorch's CUDA graph recipe says (its gradient hooks run there). `recipe`:
    "bf16" (autocast, clipping, SGD with momentum) or "fp16_accumulate" (autocast with a
    GradScaler, two micro-batches, the first under no_sync, clipping, fused AdamW)."""
    import copy

    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.parallel import DistributedDataParallel

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=64,
                                     attn_implementation="sdpa")  # dropout 0.1
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(1 + rank if own_lengths else 1)
    batches = [torch.randint(0, config.vocab_size,
                             (4, DDP_LENGTHS[int(torch.randint(0, 3, (1,), generator=g))]),
                             generator=g).cuda() for _ in range(DDP_STEPS)]
    # Kernels that give the same bits on every run (train_lm's choice).
    attention = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    def train(compiled):
        with torch.cuda.stream(torch.cuda.Stream() if side_stream else torch.cuda.current_stream()):
            model = DistributedDataParallel(copy.deepcopy(base).cuda().train(),
                                            device_ids=[torch.cuda.current_device()])

        def loss_of(ids, dtype):
            with torch.autocast("cuda", dtype=dtype), sdpa_kernel(attention):
                return model(input_ids=ids, labels=ids).loss

        if recipe == "bf16":
            opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)  # its lr baked in

            def step(ids):
                opt.zero_grad(set_to_none=True)
                loss = loss_of(ids, torch.bfloat16)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                return loss.detach()
        else:
            # The update grape runs: capturable, the lr read from the device in either case.
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)
            scaler = torch.amp.GradScaler("cuda")

            def step(ids):
                opt.zero_grad(set_to_none=True)
                first, second = ids.chunk(2)
                with model.no_sync():  # accumulate without reducing
                    scaler.scale(loss_of(first, torch.float16)).backward()
                loss = loss_of(second, torch.float16)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
                return loss.detach()

        run = grape.compile(step) if compiled else step
        torch.manual_seed(7)
        losses = [run(ids).item() for ids in batches]
        digest = hashlib.sha256()
        for p in model.parameters():
            digest.update(p.detach().float().cpu().numpy().tobytes())
        return losses, digest.hexdigest(), (grape.stats(run) if compiled else None)

    eager_losses, eager_digest, _ = train(compiled=False)
    losses, digest, s = train(compiled=True)
    return (losses == eager_losses, digest == eager_digest, digest, s["captures"], s["replays"],
            s["warmup_calls"], s["recaptures"], s["fallbacks"])


@needs_nccl
@pytest.mark.parametrize("own_lengths,recipe", [(False, "bf16"), (True, "bf16"),
                                                (True, "fp16_accumulate")],
                         ids=["same_lengths", "own_lengths", "own_lengths_fp16_accumulate"])
def test_ddp_training_with_dropout_replays_eager_losses_with_ranks_in_sync(own_lengths, recipe):
    # Same lengths on every rank: the fault issue's case (a first capture poisoned dropout's
    # generator). Own lengths: the ranks' signatures differ within a step.
    nccl_ranks(2)
    ranks = returned(run_ranks(ddp_training, 2, own_lengths, True, recipe, backend="nccl",
                               timeout_s=300))
    for equal, equal_params, _, captures, replays, warmups, recaptures, fallbacks in ranks:
        assert equal and equal_params
        assert fallbacks == [] and recaptures == 0
        # The reducer's timed iterations run as warm-ups, then each length captures once.
        assert warmups == 11 and 1 <= captures <= len(DDP_LENGTHS)
        assert replays == DDP_STEPS - warmups  # a capture's call launches its graph
    assert ranks[0][2] == ranks[1][2]  # the parameters, identical on both ranks


@needs_nccl
@pytest.mark.expects_fallback
def test_ddp_constructed_on_the_default_stream_runs_eagerly_and_says_how_to_construct_it():
    nccl_ranks(1)
    (equal, equal_params, _, captures, replays, _, _, fallbacks), = returned(
        run_ranks(ddp_training, 1, False, False, backend="nccl", timeout_s=300))
    assert equal and equal_params and replays == 0
    assert {f["kind"] for f in fallbacks} == {"legacy_stream"}
    assert "construct DistributedDataParallel under" in fallbacks[0]["reason"]


def dtensor_module(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    model = parallelize_module(model.cuda(), init_device_mesh("cuda", (world,)),
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    inputs = [torch.randn(4, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(i))
              for i in range(3)]
    with torch.no_grad():
        want = [model(x) for x in inputs]  # eager, before the module is compiled in place
        compiled = grape.compile(model)
        equal = [torch.equal(compiled(x), w) for x, w in zip(inputs, want)]
    s = grape.stats(compiled)
    return equal, s["captures"], [(f["kind"], f["reason"]) for f in s["fallbacks"]]


@needs_nccl
@pytest.mark.expects_fallback
@pytest.mark.parametrize("world", [1, 2])
def test_a_module_with_dtensor_parameters_runs_eagerly_with_the_reason(world):
    nccl_ranks(world)
    for equal, captures, fallbacks in returned(run_ranks(dtensor_module, world, backend="nccl")):
        assert equal == [True] * 3 and captures == 0
        assert [kind for kind, _ in fallbacks] == ["unsupported_argument"]
        assert "is a DTensor, a tensor subclass with a dispatch of its own" in fallbacks[0][1]
