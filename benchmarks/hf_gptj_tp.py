"""Hugging Face GPT-J 6B (fp16, random weights, as hf_gptj builds it) split over the GPUs of one
host by tensor parallelism written here (a plain Megatron split), through HF's own, unchanged
`generate` with the default dynamic cache: batch 1, a 32-token prompt, 128 new tokens, greedy.
Cases:
  `tp2` (`tp<N>` on N ranks): the split model, modes `eager` and `grape` (grape.compile(model) in
      place, on every rank); every rank runs the same generations (their collectives must meet),
      rank 0 reports. The target: grape >= 2x eager, with eager's tokens.
  `tp2-dtensor` (--split dtensor): the same split made by the ecosystem's tool,
      torch.distributed.tensor.parallel.parallelize_module (parallelize_gptj): DTensor parameters,
      HF's code unchanged.
  `tp1`: the unsplit model on one GPU (rank 0's), `eager` and `grape`: the reference without
      collectives, run after the split case, whose shards are freed first, by rank 0 alone once
      the ranks have left their process group (the other ranks are then done).

    torchrun --nproc-per-node 2 -m benchmarks.hf_gptj_tp                  # tp2, then tp1
    torchrun --nproc-per-node 2 -m benchmarks.hf_gptj_tp --quick          # 16 new tokens, 2 reps
    torchrun --nproc-per-node 2 -m benchmarks.hf_gptj_tp --tiny --quick   # smoke run: 2 layers
    torchrun --nproc-per-node 2 -m benchmarks.hf_gptj_tp --split dtensor  # split by parallelize_module
    python -m benchmarks.hf_gptj_tp                                       # a world of 1: tp1 only
    torchrun --nproc-per-node 2 -m benchmarks.hf_gptj_tp --tiny --quick --device cpu

`--device cpu` runs the ranks over gloo on the CPU, where grape runs every call eagerly (its
fallbacks are in the JSON): a smoke run of the split and of the harness.

The split (shard_gptj), in every GPTJBlock: attn.q_proj, k_proj and v_proj keep this rank's heads
(their output features: column parallel) and the attention module is given the local head count,
so that HF's attention code runs unchanged on the shard; attn.out_proj keeps the matching input
features (row parallel); mlp.fc_in keeps a block of its output features and their bias, mlp.fc_out
the matching input features, its bias on rank 0 only. The partial outputs of out_proj and fc_out
are summed over the ranks by torch.distributed.all_reduce (forward hooks): two all-reduces a
block. Embeddings, layer norms and the lm_head are replicated. Every rank builds the same full
model (the same seed) and keeps its shard only.
NCCL's NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set at import (recorded in the
JSON's config).

`ms_per_step` is the median over --reps generations of the wall time per new token (one decode
step), once the mode is steady (every shape captured), as in hf_gptj; `first_call_s` is the wall
time of the mode's first generation, captures included, and `time_to_steady_s` that of every
generation before the first steady one, as in hf_gptj; tokens are compared with eager's
(`correct`). Every rank times its own generations: the results are rank 0's, and `ranks` lists
each rank's ms_per_step and grape's fallbacks there. Modes begin together on every rank (a
barrier). `speedup_vs_tp1` is tp1's ms_per_step over the split case's, mode by mode. Memory:
`peak_allocated_bytes` is rank 0's allocator peak during the mode (its shard included);
`gpu_mem_bytes` adds grape's arena and executables, as in hf_gptj (`mem_ratio_to_eager`).
Writes JSON and a markdown table to benchmarks/results/ (a PNG plot too where matplotlib exists),
named by the number of ranks (hf_gptj_tp-ranks<N>-<card>.json).
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings

# NVLink multicast (NVLS) stays off on the hosts this runs on. NCCL reads it when it makes a
# communicator: set before any process group exists, whatever the environment said.
os.environ["NCCL_NVLS_ENABLE"] = "0"

import torch
import torch.distributed as dist

import grape
from benchmarks import generation, harness, hf_gptj

MODES = ["eager", "grape"]
TARGET_SPEEDUP = 2.0  # grape over eager, both split over the ranks
SPLIT = ("Megatron, per block: q/k/v_proj and mlp.fc_in column parallel (this rank's heads, its "
         "rows of fc_in), out_proj and mlp.fc_out row parallel (fc_out's bias on rank 0), their "
         "outputs summed by all_reduce (two a block); embeddings, layer norms, lm_head replicated")
SPLIT_DTENSOR = ("torch.distributed.tensor.parallel.parallelize_module over a 1-D device mesh, per "
                 "block: ColwiseParallel q/k/v_proj and mlp.fc_in, RowwiseParallel out_proj and "
                 "mlp.fc_out (DTensor parameters; the row-parallel outputs all-reduced)")
UNSPLIT = "none: the whole model on one device"


# ---------------------------------------------------------------------------------------- split

def keep_output_features(linear: torch.nn.Linear, rank: int, world: int) -> None:
    """Column parallel: the rank's block of output features (weight rows and bias), copied so that
    the full weight is freed."""
    rows = linear.out_features // world
    part = slice(rank * rows, (rank + 1) * rows)
    linear.weight = torch.nn.Parameter(linear.weight[part].contiguous(),
                                       requires_grad=linear.weight.requires_grad)
    if linear.bias is not None:
        linear.bias = torch.nn.Parameter(linear.bias[part].contiguous(),
                                         requires_grad=linear.bias.requires_grad)
    linear.out_features = rows


def keep_input_features(linear: torch.nn.Linear, rank: int, world: int) -> None:
    """Row parallel: the rank's block of input features; the bias on rank 0 only, so that the sum
    over the ranks adds it once."""
    columns = linear.in_features // world
    part = slice(rank * columns, (rank + 1) * columns)
    linear.weight = torch.nn.Parameter(linear.weight[:, part].contiguous(),
                                       requires_grad=linear.weight.requires_grad)
    if rank != 0:
        linear.bias = None
    linear.in_features = columns


@torch.no_grad()
def shard_gptj(model, rank: int, world: int, group=None):
    """Splits HF's GPTJForCausalLM `model` in place over `world` ranks of torch.distributed's
    `group` (None: the default group) and returns it: this rank keeps its shard of every block
    (module docstring). Every rank must call it on the same model and then run the same forwards:
    each block's forward holds two all-reduces."""
    heads = model.config.n_head
    if heads % world:
        raise ValueError(f"GPT-J's {heads} heads do not split over {world} ranks")

    def sum_over_ranks(module, inputs, output):
        dist.all_reduce(output, group=group)  # in place: the layer's output is the sum

    for block in model.transformer.h:
        attn, mlp = block.attn, block.mlp
        for projection in (attn.q_proj, attn.k_proj, attn.v_proj):
            keep_output_features(projection, rank, world)  # head h is rows h*head_dim.. of each
        keep_input_features(attn.out_proj, rank, world)
        keep_output_features(mlp.fc_in, rank, world)
        keep_input_features(mlp.fc_out, rank, world)
        # HF's attention forward reads num_attention_heads to split and merge heads (transformers
        # 5.17) or views the projections as (-1, head_dim) (5.24): both hold the local head count
        # then. head_dim and the attention scale do not change; embed_dim, read by neither
        # forward, is kept consistent with the shard.
        attn.num_attention_heads = heads // world
        attn.embed_dim = attn.num_attention_heads * attn.head_dim
        # Two all-reduces a block, of out_proj's and of fc_out's partial sums. One of their sum
        # would do (GPT-J adds attention, MLP and residual in one expression), but it needs HF's
        # block forward replaced, whose arguments and return value differ between transformers
        # releases; hooks on the two layers leave all of HF's code as it is.
        attn.out_proj.register_forward_hook(sum_over_ranks)
        mlp.fc_out.register_forward_hook(sum_over_ranks)
    return model


def parallelize_gptj(model, world: int, device: str):
    """The same split as shard_gptj, made by the ecosystem's tool instead of by hand:
    parallelize_module turns each block's projections into DTensor modules over a device mesh of
    the `world` ranks (ColwiseParallel hands the next layer its local shard, RowwiseParallel
    all-reduces its output), and HF's attention is told the local head count as in shard_gptj."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    heads = model.config.n_head
    if heads % world:
        raise ValueError(f"GPT-J's {heads} heads do not split over {world} ranks")
    mesh = init_device_mesh(device, (world,))
    plan = {"attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(), "attn.out_proj": RowwiseParallel(),
            "mlp.fc_in": ColwiseParallel(), "mlp.fc_out": RowwiseParallel()}
    for block in model.transformer.h:
        parallelize_module(block, mesh, plan)
        block.attn.num_attention_heads = heads // world
        block.attn.embed_dim = block.attn.num_attention_heads * block.attn.head_dim
    return model


SPLITS = {"megatron": SPLIT, "dtensor": SPLIT_DTENSOR}


# ---------------------------------------------------------------------------------------- ranks

def init_ranks(device: str) -> tuple[int, int]:
    """This process's rank and the world size, from torchrun's environment (none: a world of 1),
    with the process group where the world has more than one rank: NCCL on the rank's GPU, or
    gloo on the CPU. A world of 1 needs none: its only case, tp1, has no collective."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world == 1:
        return 0, 1
    if device == "cpu":
        dist.init_process_group("gloo")
    elif "device_id" in inspect.signature(dist.init_process_group).parameters:
        # The communicator is made at once, bound to this rank's GPU.
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    else:
        dist.init_process_group("nccl")
    return dist.get_rank(), world


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def nccl_version(device: str) -> str | None:
    if device != "cuda":
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


# ---------------------------------------------------------------------------------------- model

def build(tiny: bool, ids: torch.Tensor):
    """hf_gptj's model on the prompt's device and the init it was built with, alike on every rank
    (build_model seeds it): on CUDA, the first init whose logits on the prompt are finite (the same
    on every rank: the same computation on the same GPUs); the CPU smoke run takes the first."""
    if ids.is_cuda:
        return hf_gptj.build_checked(tiny, ids)
    return hf_gptj.build_model(tiny, hf_gptj.INIT_RANGES[0], "cpu"), hf_gptj.INIT_RANGES[0]


def parameter_bytes(model) -> int:
    """The bytes of parameters this rank holds (a DTensor's local shard)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    return sum(p.numel() * p.element_size() for p in local)


# ---------------------------------------------------------------------------------------- modes

def measure_generate(model, case, steady_calls: int, desc: str, grape_counters: bool = False) -> dict:
    ids, mask = case["inputs"]
    return generation.measure_generate(model, ids, mask, case["kwargs"], case["reps"],
                                       steady_calls, desc, grape_counters)


def setup_eager(model, case):
    return measure_generate(model, case, 0, "eager")


def setup_grape(model, case):
    with hf_gptj.compiled_in_place(model):
        r = measure_generate(model, case, 2, "grape", grape_counters=True)
        r.update(harness.grape_stats(model, (*generation.GRAPE_STATS, "arena_bytes")))
    return r


SETUPS = {"eager": setup_eager, "grape": setup_grape}


def record_ranks(results: dict) -> None:
    """Adds `ranks` to every mode's result: each rank's ms_per_step, grape's fallbacks there, and
    its error if its mode failed (gathered from all ranks; every rank must call it)."""
    mine = {mode: {key: r[key] for key in ("ms_per_step", "fallbacks", "error") if key in r}
            for mode, r in results.items()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    for mode, r in results.items():
        r["ranks"] = [ranks_results[mode] for ranks_results in gathered]


def run_case(model, name: str, ids: torch.Tensor, args, modes: list[str], config: dict) -> dict:
    case = {"inputs": (ids, torch.ones_like(ids)),
            "kwargs": generation.generate_kwargs(1, args.new_tokens), "reps": args.reps}

    def run_mode(mode: str) -> dict:
        barrier()  # the ranks begin each mode together
        if ids.is_cuda:
            torch.cuda.reset_peak_memory_stats()
        r = SETUPS[mode](model, case)
        if ids.is_cuda:
            r["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            r["gpu_mem_bytes"] = (r["peak_allocated_bytes"] + (r.get("arena_bytes") or 0)
                                  + (r.get("executable_bytes") or 0))
        return r

    results = harness.run_modes(modes, run_mode)
    if config["world_size"] > 1:
        record_ranks(results)
    harness.compare_with_eager(results)
    config = dict(config, new_tokens=args.new_tokens, reps=args.reps)
    if config["world_size"] > 1:
        config["target_speedup_vs_eager"] = TARGET_SPEEDUP
        grape_result = results.get("grape", {})
        if grape_result.get("speedup_vs_eager") is not None:
            grape_result["meets_target"] = bool(grape_result["speedup_vs_eager"] >= TARGET_SPEEDUP
                                                and grape_result.get("correct"))
    return {"name": name, "config": config, "modes": results}


def compare_with_tp1(cases: list[dict]) -> None:
    """Adds `speedup_vs_tp1` to the modes of the split case that tp1 ran too."""
    tp1 = next((c for c in cases if c["name"] == "tp1"), None)
    if tp1 is None:
        return
    for case in cases:
        if case is tp1:
            continue
        for mode, r in case["modes"].items():
            speedup = harness.speedup(tp1["modes"].get(mode, {}), r)
            if speedup is not None:
                r["speedup_vs_tp1"] = speedup


def print_targets(cases: list[dict]) -> None:
    for case in cases:
        g = case["modes"].get("grape", {})
        if g.get("speedup_vs_eager") is None:
            continue
        fallbacks = [len(r.get("fallbacks") or []) for r in g.get("ranks", [g])]
        line = (f"  {case['name']} grape: {g['speedup_vs_eager']:.2f}x eager, tokens equal "
                f"eager's: {g.get('correct')}, fallbacks per rank {fallbacks}")
        target = case["config"].get("target_speedup_vs_eager")
        if target:
            line += (f" (target >= {target:.0f}x, eager's tokens)"
                     + ("" if g.get("meets_target") else "  << below target"))
        print(line)


# ---------------------------------------------------------------------------------------- main

def main(argv=None):
    parser = harness.argument_parser(
        __doc__, MODES, "16 new tokens, 2 reps",
        tiny_help="a 2-layer GPT-J (n_embd 256, 4 heads) instead of GPT-J 6B: a smoke run that "
                  "fits any GPU")
    parser.add_argument("--new-tokens", type=int, default=128,
                        help="tokens each generation adds (default %(default)s)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the ranks over gloo, grape falling back to eager (a smoke run)")
    parser.add_argument("--split", choices=tuple(SPLITS), default="megatron",
                        help="megatron: the split written here (the reference); dtensor: the same "
                             "split by torch.distributed.tensor.parallel (case tp<N>-dtensor)")
    args, modes = harness.parse(parser, argv, MODES, None)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("hf_gptj_tp needs CUDA devices (or --device cpu: a smoke run over gloo)")
    if args.quick:
        args.new_tokens, args.reps = 16, 2
    rank, world = init_ranks(args.device)
    device = torch.device(args.device, torch.cuda.current_device() if args.device == "cuda" else None)
    warnings.simplefilter("ignore", grape.FallbackWarning)  # they are in the JSON
    gptj = hf_gptj.gptj_config(args.tiny, hf_gptj.INIT_RANGES[0])
    shared_config = {"model": "gptj-tiny" if args.tiny else "gptj-6b", "layers": gptj.n_layer,
              "heads": gptj.n_head, "dtype": "float16", "batch": 1, "prompt": hf_gptj.PROMPT,
              "device": args.device, "nccl_version": nccl_version(args.device),
              "NCCL_NVLS_ENABLE": os.environ["NCCL_NVLS_ENABLE"]}
    cases = []
    with torch.no_grad():
        ids = hf_gptj.prompt(gptj.vocab_size, device)
        if world > 1:
            model, initializer_range = build(args.tiny, ids)
            if args.split == "dtensor":
                parallelize_gptj(model, world, args.device)
            else:
                shard_gptj(model, rank, world)
            harness.clear_memory()  # the full weights, of which this rank keeps its shard
            config = dict(shared_config, world_size=world, backend=dist.get_backend(),
                          tp_split=SPLITS[args.split],
                          initializer_range=initializer_range,
                          parameter_bytes_per_rank=parameter_bytes(model))
            if rank == 0:
                print(f"tp{world}: {world} ranks, {config['parameter_bytes_per_rank'] / 1e9:.2f} GB "
                      "of parameters each", flush=True)
            suffix = "-dtensor" if args.split == "dtensor" else ""
            cases.append(run_case(model, f"tp{world}{suffix}", ids, args, modes, config))
            del model
            harness.clear_memory()
            # tp1 runs on rank 0 alone, with no collective: the other ranks are done.
            barrier()
            dist.destroy_process_group()
            if rank != 0:
                return []
        model, initializer_range = build(args.tiny, ids)
        config = dict(shared_config, world_size=1, tp_split=UNSPLIT,
                      initializer_range=initializer_range,
                      parameter_bytes_per_rank=parameter_bytes(model))
        print(f"tp1: the unsplit model, {config['parameter_bytes_per_rank'] / 1e9:.2f} GB of "
              "parameters", flush=True)
        cases.append(run_case(model, "tp1", ids, args, modes, config))
    compare_with_tp1(cases)
    for case in cases:
        harness.print_table(case)
    print()
    print_targets(cases)
    name = ("hf_gptj_tp" + ("-dtensor" if args.split == "dtensor" else "") + f"-ranks{world}"
            + ("-tiny" if args.tiny else "") + ("-quick" if args.quick else ""))
    path = harness.write_results(name, cases, args.out, device=args.device)
    c = cases[0]["config"]
    split = f"tensor parallel over {world} ranks" if world > 1 else "unsplit (a world of 1)"
    title = f"HF {'GPT-J tiny' if args.tiny else 'GPT-J 6B'} generate, {split}, fp16, batch 1, greedy"
    nccl = f"NCCL {c['nccl_version']}, " if c["nccl_version"] else ""
    preface = (f"{title}: {c['prompt']}-token prompt, {c['new_tokens']} new tokens, on "
               f"{args.device} ({nccl}NCCL_NVLS_ENABLE={c['NCCL_NVLS_ENABLE']}). Split: "
               f"{SPLITS[args.split]}. "
               "tp1: the unsplit model on rank 0's device.\n\n")
    table = generation.markdown(cases, extra=[("vs tp1", "speedup_vs_tp1", "{:.2f}x")], memory=True)
    harness.write_table_and_plot(path, preface + table,
                                 lambda png: generation.plot(cases, png, MODES, title))
    return cases


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
