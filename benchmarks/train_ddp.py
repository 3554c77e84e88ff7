"""Data-parallel training as tutorials write it: DistributedDataParallel (or FSDP2) over torchrun,
each rank with batches of its own lengths (what a DistributedSampler over variable-length data
gives), eager and grape.compile side by side on the same weights, in one process per rank.

    torchrun --nproc-per-node 2 -m benchmarks.train_ddp             # both cases, 200 steps a mode
    torchrun --nproc-per-node 2 -m benchmarks.train_ddp --parallel fsdp2   # FSDP2 instead of DDP
    torchrun --nproc-per-node 2 -m benchmarks.train_ddp --quick     # smoke run: 40 steps, 1 pass
    torchrun --nproc-per-node 2 -m benchmarks.train_ddp --tiny --quick --device cpu  # the script
                                                                    # itself, over gloo

Any number of ranks; a case is named by it (gpt2-ddp2 on 2 ranks, gpt2-fsdp2x2 under FSDP2), and
so is the results file (train_ddp-ranks<N>-<card>.json).
Cases, as benchmarks/train_lm builds them (its gpt2-cosine and wav2vec2-onecycle), with each
rank's batches drawn by a seed of its own:
- gpt2-ddpN: GPT2LMHeadModel (4 layers, width 512, dropout 0.1), batch 8 per rank, lengths drawn
  alike from --lengths (32, 64, 96 and 128 tokens, as train_lm's; other lengths name the case
  gpt2-ddpN-<shortest>-<longest>); bf16 autocast, AdamW, cosine lr, clipping.
- wav2vec2-ddpN: Wav2Vec2ForCTC with wav2vec2-base's config, batch 8 clips per rank padded to one
  of 4 widths, CTC loss, bf16 autocast, AdamW, OneCycleLR.
--parallel fsdp2 applies fully_shard to each transformer block and then to the whole model
instead of wrapping it in DistributedDataParallel.

Modes, each a data-parallel model of its own over a copy of the same initial weights, seeded
alike on every rank before its first step: eager (capturable AdamW, the float lr), eager_device_lr
(the update grape runs: the float lr in the calls grape warms the step up, 11 under DDP, then the
lr read from device memory; the bit-exact reference, as in train_lm), grape (the step compiled
whole).

Each rank times its steps as train_lm does (the first pass step by step with a device sync,
then --reps steady passes); a figure is rank 0's, and `*_by_rank` gives every rank's. The modes run
one after another in one process per rank: only the first mode's first step is from a cold
process (--modes grape alone gives grape's). Per rank:
`losses` (its local losses); grape's `losses_equal_eager` (every rank's losses equal to
eager_device_lr's to the bit), `max_loss_rel_diff_eager` (against eager, over ranks),
`ranks_in_sync` (the whole parameters identical on every rank after the mode's last step),
`recaptures`, and `hung` (false: a watchdog writes the results with hung true and ends the run
where no step finishes within HANG_S seconds).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import threading
import time
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from benchmarks import harness
from benchmarks import train_lm
from grape import _distributed

MODES = ["eager", "eager_device_lr", "grape"]
CASES = ["gpt2", "wav2vec2"]
NEEDS = ("train_ddp needs CUDA devices (--device cpu --tiny checks the script itself over gloo, "
         "with grape running eagerly)")
GPT2_LENGTHS = "32,64,96,128"
TINY_GPT2_LENGTHS = [16, 32, 48, 64]
WAV2VEC2_BUCKETS = 4
SCHEDULES = {"gpt2": "gpt2-cosine", "wav2vec2": "wav2vec2-onecycle"}
TARGET_SPEEDUP = {"gpt2": 3.0}
HANG_S = 300.0
GRAPE_STATS = ("graphs", "captures", "recaptures", "last_recapture_reason", "replays",
               "warmup_calls", "eager_calls", "capture_seconds", "fallbacks", "arena_bytes",
               "executable_bytes")


def build_case(name: str, tiny: bool, steps: int, device: str, rank: int,
               lengths: list[int]) -> dict:
    """train_lm's case, with this rank's batches and `blocks`: a model's transformer blocks (what
    FSDP2 shards one by one)."""
    seed = 1 + rank  # each rank its own batches; the weights are seeded alike
    if name == "gpt2":
        case = train_lm.gpt2_case(tiny, steps, device, seed=seed,
                                  lengths=TINY_GPT2_LENGTHS if tiny else lengths)
        return {**case, "blocks": lambda model: model.transformer.h}
    case = train_lm.wav2vec2_case(tiny, steps, device, seed=seed, buckets=WAV2VEC2_BUCKETS)
    return {**case, "blocks": lambda model: model.wav2vec2.encoder.layers}


class Watchdog:
    """Ends the run, its results written with hung true, where no step finishes for HANG_S."""

    def __init__(self, on_hang):
        self.last = time.monotonic()
        self.on_hang = on_hang
        threading.Thread(target=self._watch, daemon=True).start()

    def step(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(5)
            if time.monotonic() - self.last > HANG_S:
                self.on_hang()
                os._exit(3)


def parameters_digest(model: torch.nn.Module) -> str:
    """A digest of the whole parameters (an FSDP2 shard gathered whole, on every rank)."""
    digest = hashlib.sha256()
    for p in model.parameters():
        whole = p.full_tensor() if hasattr(p, "full_tensor") else p
        digest.update(whole.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def wrapped(model: torch.nn.Module, blocks, parallel: str, local) -> torch.nn.Module:
    """`model` made data-parallel: DistributedDataParallel, or FSDP2 (fully_shard on each of its
    `blocks`, then on the whole)."""
    if parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in blocks:
            fully_shard(block)
        return fully_shard(model)
    # Under a side stream, as PyTorch's CUDA graph recipe says: DDP's gradient hooks run on the
    # stream current at its construction, and the default stream cannot join a capture.
    with torch.cuda.stream(torch.cuda.Stream()) if local else contextlib.nullcontext():
        return DistributedDataParallel(model, device_ids=[local.index] if local else None)


def grape_warmups(parallel: str) -> int:
    """The calls grape runs eagerly before it captures a step: DDP's timed iterations (Note [DDP
    under capture]), else one."""
    return _distributed.DDP_TIMED_ITERATIONS + 1 if parallel == "ddp" else 1


def run_mode(name: str, case: dict, mode: str, reps: int, device: str, watchdog: Watchdog,
             parallel: str) -> dict:
    import grape

    local = torch.device(device, torch.cuda.current_device()) if device == "cuda" else None
    model = copy.deepcopy(case["model"]).to(local or device).train()
    ddp = wrapped(model, case["blocks"](model), parallel, local)
    capturable = mode in ("eager", "eager_device_lr") and device == "cuda"
    opt = torch.optim.AdamW(ddp.parameters(), lr=case["lr"], weight_decay=case["weight_decay"],
                            capturable=capturable)
    batches = case["batches"]
    sched = train_lm.scheduler(SCHEDULES[name], opt, len(batches) + reps * train_lm.STEADY_STEPS)
    step = train_lm.make_train_step(ddp, opt, case["loss_of"], device)
    if mode == "grape":
        step = grape.compile(step)
    elif mode == "eager_device_lr":
        # grape's warm-ups read the float lr.
        step = train_lm.with_device_lr(step, opt, grape_warmups(parallel))
    counters = harness.GrapeCounters(step) if mode == "grape" else None
    if device == "cuda":
        harness.clear_memory()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(train_lm.SEED)

    seconds, losses, changes = [], [], []
    for batch in batches:
        start = time.perf_counter()
        losses.append(step(*batch))
        train_lm.sync(device)
        seconds.append(time.perf_counter() - start)
        watchdog.step()
        sched.step()
        if counters is not None:
            changes.append(counters.change())
    passes = []
    steady = batches[:train_lm.STEADY_STEPS]
    for _ in range(reps):
        train_lm.sync(device)
        dist.barrier()
        start = time.perf_counter()
        for batch in steady:
            step(*batch)
            sched.step()
        train_lm.sync(device)
        passes.append((time.perf_counter() - start) * 1e3 / len(steady))
        watchdog.step()

    r = {"ms_per_step": harness.median(passes), "steady_passes_ms_per_step": passes,
         "first_call_s": seconds[0], "first_pass_s": sum(seconds),
         "step_ms": [s * 1e3 for s in seconds]}
    at = (harness.steady_by_counters(changes) if counters is not None
          else harness.steady_by_time(seconds, r["ms_per_step"] / 1e3))
    r.update(harness.time_to_steady(seconds, at))
    r["losses"] = torch.stack(losses).float().tolist()
    r["parameters_digest"] = parameters_digest(model)
    if device == "cuda":
        r["gpu_mem_bytes"] = torch.cuda.max_memory_allocated()
    if mode == "grape":
        r.update(harness.grape_stats(step, GRAPE_STATS))
        r["gpu_mem_bytes"] = r.get("gpu_mem_bytes", 0) + r.get("arena_bytes", 0) + \
            r.get("executable_bytes", 0)
    return r


def gathered(results: dict[str, dict], world: int) -> dict[str, list[dict]]:
    """Every rank's result of each mode, by mode (on every rank)."""
    ranks: list = [None] * world
    dist.all_gather_object(ranks, results)
    return {mode: [ranks[r][mode] for r in range(world)] for mode in results}


def compare(name: str, by_rank: dict[str, list[dict]]) -> dict[str, dict]:
    """Rank 0's result of each mode, with the figures that need every rank's."""
    out = {}
    eager, reference = by_rank.get("eager"), by_rank.get("eager_device_lr")
    for mode, ranks in by_rank.items():
        r = dict(ranks[0])
        if any(x.get("error") for x in ranks):
            r["error"] = "; ".join(f"rank {i}: {x['error']}" for i, x in enumerate(ranks)
                                   if x.get("error"))
            out[mode] = r
            continue
        for key in ("ms_per_step", "first_call_s", "time_to_steady_s", "gpu_mem_bytes"):
            r[f"{key}_by_rank"] = [x.get(key) for x in ranks]
        r["losses_by_rank"] = [x["losses"] for x in ranks]
        r["ranks_in_sync"] = len({x["parameters_digest"] for x in ranks}) == 1
        r["hung"] = False
        if mode == "grape":
            for key in ("captures", "recaptures", "replays", "warmup_calls", "eager_calls"):
                r[f"{key}_by_rank"] = [x.get(key) for x in ranks]
            r["fallbacks_by_rank"] = [x.get("fallbacks") for x in ranks]
        ok = lambda rs: rs is not None and not any(x.get("error") for x in rs)  # noqa: E731
        # The update a mode ran: grape's, unless it replayed nothing (a fallback on every rank:
        # eager's update, the float lr throughout).
        same_update = eager if mode == "grape" and not any(x.get("replays") for x in ranks) \
            else reference
        if ok(same_update) and mode not in ("eager_device_lr", "eager"):
            r["losses_equal_eager"] = all(x["losses"] == y["losses"]
                                          for x, y in zip(ranks, same_update))
        elif ok(reference) and mode == "eager":
            r["losses_equal_eager"] = all(x["losses"] == y["losses"]
                                          for x, y in zip(ranks, reference))
        if ok(eager) and mode != "eager":
            r["max_loss_rel_diff_eager"] = max(train_lm.max_rel_diff(x["losses"], y["losses"])
                                               for x, y in zip(ranks, eager))
            times = harness.speedup(eager[0], r)
            if times is not None:
                r["speedup_vs_eager"] = times
        if mode == "grape":
            r["correct"] = bool(r.get("losses_equal_eager")) and r["ranks_in_sync"]
            if name in TARGET_SPEEDUP:
                r["meets_target_speedup"] = (r.get("speedup_vs_eager") or 0) >= TARGET_SPEEDUP[name]
        elif mode == "eager":
            r["correct"] = "reference"
        out[mode] = r
    return out


def markdown(cases: list[dict]) -> str:
    columns = [*train_lm.STEP_COLUMNS,
               harness.value_column("losses = eager", "losses_equal_eager", "{}"),
               harness.value_column("ranks in sync", "ranks_in_sync", "{}"),
               *harness.MEMORY_COLUMNS]
    return harness.markdown_table(cases, columns)


def init_ranks(device: str) -> tuple[int, int]:
    # NVLink multicast stays off: the GPU machines' hosts require it.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def main(argv=None) -> list[dict]:
    parser = train_lm.loop_parser(__doc__, MODES, CASES)
    parser.add_argument("--parallel", choices=("ddp", "fsdp2"), default="ddp",
                        help="DistributedDataParallel, or FSDP2's fully_shard on each block")
    parser.add_argument("--lengths", default=GPT2_LENGTHS,
                        help="gpt2's sequence lengths, comma-separated (default %(default)s)")
    args, modes = harness.parse(parser, argv, MODES, None)
    train_lm.check_device(parser, args, NEEDS)
    if args.quick:
        args.steps, args.reps = 40, 1
    import grape  # before NCCL makes its communicators (grape/_distributed.py)

    rank, world = init_ranks(args.device)
    warnings.simplefilter("ignore", grape.FallbackWarning)  # they are in the JSON
    mask_rules = harness.skip_unpadded_masks_while_capturing()
    label = ("train_ddp" + ("-fsdp2" if args.parallel == "fsdp2" else "") + f"-ranks{world}"
             + ("-tiny" if args.tiny else "") + ("-quick" if args.quick else ""))
    if args.lengths != GPT2_LENGTHS and not args.tiny:
        shortest_longest = sorted(int(n) for n in args.lengths.split(","))
        label += f"-len{shortest_longest[0]}-{shortest_longest[-1]}"
    cases: list[dict] = []

    def write(hung_in: str | None = None):
        if hung_in is not None:
            cases.append({"name": hung_in, "modes": {"grape": {"hung": True}}})
        if rank == 0:
            path = harness.write_results(label, cases, args.out, device=args.device)
            harness.write_table_and_plot(path, markdown(cases), lambda png: False)

    current = {"name": None}
    watchdog = Watchdog(lambda: write(hung_in=current["name"]))
    for base in args.cases.split(","):
        if base not in CASES:
            parser.error(f"unknown case {base}; choose from {CASES}")
        lengths = [int(n) for n in args.lengths.split(",")]
        name = f"{base}-{args.parallel}{'x' if args.parallel == 'fsdp2' else ''}{world}"
        if base == "gpt2" and args.lengths != GPT2_LENGTHS and not args.tiny:
            name += f"-{min(lengths)}-{max(lengths)}"
        current["name"] = name
        case = build_case(base, args.tiny, args.steps, args.device, rank, lengths)
        if rank == 0:
            print(f"{name}: {args.steps} steps, batch {train_lm.BATCH} per rank, "
                  f"modes {', '.join(modes)}", flush=True)
        results = harness.run_modes(modes, lambda mode: run_mode(base, case, mode, args.reps,
                                                                 args.device, watchdog,
                                                                 args.parallel))
        by_mode = compare(base, gathered(results, world))
        shapes = {tuple(t.shape for t in b) for b in case["batches"]}
        config = {**case["config"], "parallel": args.parallel, "world_size": world, "steps": args.steps,
                  "batch_per_rank": train_lm.BATCH, "steady_steps": train_lm.STEADY_STEPS,
                  "reps": args.reps, "device": args.device, "backend": dist.get_backend(),
                  "unpadded_mask_rules_changed": mask_rules, "distinct_shapes_rank0": len(shapes)}
        cases.append({"name": name, "config": config, "modes": by_mode})
        if rank == 0:
            harness.print_table(cases[-1])
    write()
    # Every rank leaves together, rank 0 once it has written: a gloo rank whose peers closed
    # their connections while it still tore its group down aborted at exit (4 CPU ranks, CI).
    dist.barrier()
    dist.destroy_process_group()
    return cases


if __name__ == "__main__":
    cases = main()
    raise SystemExit(harness.exit_status(cases))
