"""GPT-2 small decode with a KV cache that grows one token per step: eager, per-shape CUDA graphs
(ptgraph), hand-chained graphs with no copies (ideal), torch.compile(reduce-overhead), grape.

    python -m benchmarks.gpt2_decode                 # batch 1 and 8, 128 steps, every mode
    python -m benchmarks.gpt2_decode --quick         # smoke run: few steps, no torch.compile
    python -m benchmarks.gpt2_decode --while-loop    # a whole generation in one graph launch
    python -m benchmarks.gpt2_decode --shapes 1024   # graph memory: prompt 1 -> 1024 tokens

All modes run in one process on the same weights and inputs; each is checked against eager's
tokens (`correct`; `steps_equal_to_eager`: how many leading steps agree). Times are medians of
--reps whole generations after a warm-up generation (and after every shape was captured, for the
graph modes): `ms_per_step`, and `speedup_vs_eager` eager's over the mode's; `first_call_s` is the
first generation's time (torch_compile: compiling; grape: its first step's warm-up and the capture
of every other shape), and for grape `time_to_steady_s` the generations before the first in which
every step replays (`calls_to_steady`: that generation's number). Memory is what the mode adds on the device, read from
cudaMemGetInfo, so the driver's memory for instantiated graphs counts: `gpu_mem_bytes` is what it
keeps after the runs once PyTorch's cache of free blocks is released (eager keeps next to nothing;
graph modes keep their graphs and pools), `gpu_mem_bytes_with_allocator_cache` the same before that
release; eager's `gpu_mem_bytes` is its peak during a generation (it keeps nothing);
`mem_ratio_to_eager` is a mode's gpu_mem_bytes over eager's. `host_rss_bytes`
is the growth of the process's resident host memory over setup and runs.

--shapes N generates N tokens from a 1-token prompt (N shapes) and compares graph memory: ptgraph
(one graph per shape, private pools, PyTorch's default), ptgraph_shared_pool (one pool for all
shapes), grape (graphs of one topology share executables, one per shape within the default
executable cache), grape_compact (executable_cache=0: one executable per topology) and
grape_all_resident (one executable per shape). Per-shape graph modes stop capturing before the device runs out of memory; their memory
for N shapes is then extrapolated from the shapes that fit (`extrapolated_from_shapes`), and they are
not timed. grape's device memory per extra shape (`gpu_bytes_per_extra_shape`) is what its memory
outside the shared pool (executables, the driver's state) exceeds that of a grape function that
captured only the largest shape, over N - 1. The pool is reported apart: its size is set by the
largest shape's buffers, not by the number of shapes; in a generation it holds the largest cache
about three times (the ping-pong of Note [Capture arena layout]) where one shape holds it twice,
which `gpu_bytes_per_extra_shape_pool_included` spreads over the extra shapes. Host memory per shape
is what the pass that captures every shape added to the process's resident memory, over N.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

import grape
from benchmarks import harness
from benchmarks.models import gpt2


def modes_available() -> list[str]:
    return ["eager", "ptgraph", "ideal", "torch_compile", "grape", "grape_copy",
            "ptgraph_shared_pool", "grape_compact", "grape_all_resident"]


DEFAULT_MODES = ["eager", "ptgraph", "ideal", "torch_compile", "grape", "grape_copy"]
# grape first: the driver keeps the memory of destroyed executables for later ones, so modes that
# ran after the per-shape graphs would look smaller than they are.
SHAPES_MODES = ["eager", "grape", "grape_compact", "grape_all_resident", "ptgraph",
                "ptgraph_shared_pool"]


class Case:
    def __init__(self, cfg, batch, steps, device):
        self.cfg, self.batch, self.steps = cfg, batch, steps
        self.weights = gpt2.init_weights(cfg, device)
        self.step = gpt2.make_decode_step(cfg, self.weights)
        g = torch.Generator(device="cpu").manual_seed(1)
        self.tok0 = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g).to(device)
        self.kv0 = gpt2.empty_cache(cfg, batch, device)

    def generate(self, step):
        return gpt2.generate(step, self.tok0, self.kv0, self.steps)


def measure(case: Case, setup, reps: int) -> dict:
    """setup() -> (generate_fn or None, extra_fields_fn); memory counts everything setup and the runs
    keep. A mode whose setup could not fit every shape returns no generate_fn: it is not run."""
    harness.clear_memory()
    free0 = harness.free_bytes()
    rss0 = harness.rss_bytes()
    t0 = time.perf_counter()
    generate, extra = setup()
    if generate is None:
        return {"ms_per_step": None, "outputs": None, "setup_s": time.perf_counter() - t0, **extra()}
    allocated0 = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    tokens = generate()  # warm-up (graph modes: every shape captured by now)
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - allocated0
    host0 = time.perf_counter()
    times = harness.time_ms(generate, reps)
    host_ms = (time.perf_counter() - host0) * 1e3 / reps
    with_cache = free0 - harness.free_bytes()
    # What the mode keeps to run again (graphs, their pools, driver memory), without the blocks
    # PyTorch's allocator caches from eager work (warm-ups included); releasing those frees no
    # graph's memory.
    torch.cuda.empty_cache()
    result = {
        "ms_per_step": harness.median(times) / case.steps,
        "ms_per_step_runs": [t / case.steps for t in times],
        "host_ms_per_step": host_ms / case.steps,
        "gpu_mem_bytes": free0 - harness.free_bytes(),
        "gpu_mem_bytes_with_allocator_cache": with_cache,
        "peak_allocated_bytes": peak,
        "host_rss_bytes": harness.rss_bytes() - rss0,
        "setup_s": setup_s,
        "outputs": tokens,
    }
    result.update(extra())
    return result


def setup_eager(case):
    return (lambda: case.generate(case.step)), dict


def capture_per_shape(case, chain: bool, pool=None):
    """One torch.cuda.CUDAGraph per shape, each with its own private pool (PyTorch's default) or all
    in `pool`. chain=False: static inputs per graph, filled by copies (the seeds' PtGraph baseline).
    chain=True: graph t reads graph t-1's outputs in place; no copies (the ideal replay).
    Stops before a shape would not fit in device memory: returns the graphs captured and the device
    memory each shape took."""
    step, stream = case.step, torch.cuda.Stream()
    tok, kv = case.tok0.clone(), case.kv0.clone()
    graphs, shape_bytes = [], []
    for _ in range(case.steps):
        free = harness.free_bytes()
        # The next shape takes a bit more than the last one (its cache is one position longer).
        if shape_bytes and free < 2 * shape_bytes[-1] + (2 << 30):
            break
        if not chain:  # this shape's own static inputs
            tok, kv = torch.zeros_like(tok), torch.zeros_like(kv)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step(tok, kv)  # warm-up, as torch.cuda.graph's documentation asks
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out_tok, out_kv = step(tok, kv)
        graphs.append((graph, tok, kv, out_tok, out_kv))
        tok, kv = out_tok, out_kv  # the next shape
        torch.cuda.empty_cache()  # the warm-up's blocks: not the graph's memory
        shape_bytes.append(free - harness.free_bytes())
    return graphs, shape_bytes


def extrapolate(shape_bytes: list[int], shapes: int) -> dict:
    """Memory of `shapes` per-shape graphs from the first len(shape_bytes): each shape's memory
    grows linearly with its length (its KV cache), fitted by least squares on the later half."""
    n = len(shape_bytes)
    xs = list(range(n // 2, n))
    ys = shape_bytes[n // 2:]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    rest = sum(my + slope * (x - mx) for x in range(n, shapes))
    return {"gpu_mem_bytes": int(sum(shape_bytes) + rest), "extrapolated_from_shapes": n,
            "gpu_mem_bytes_measured": sum(shape_bytes),
            "fit_bytes_per_shape": {"at_first_fitted": my - slope * (mx - xs[0]), "per_position": slope}}


def per_shape_setup(case, chain: bool, pool=None):
    graphs, shape_bytes = capture_per_shape(case, chain, pool)
    if len(graphs) < case.steps:
        del graphs  # freed before the next mode runs
        return None, lambda: extrapolate(shape_bytes, case.steps)
    return graphs, None


def setup_ptgraph(case, pool=None):
    graphs, truncated = per_shape_setup(case, chain=False, pool=pool)
    if truncated is not None:
        return None, truncated

    def generate():
        tok, kv = case.tok0, case.kv0
        tokens = torch.empty(case.batch, case.steps, dtype=torch.long, device=tok.device)
        for i, (graph, static_tok, static_kv, out_tok, out_kv) in enumerate(graphs):
            static_tok.copy_(tok)
            static_kv.copy_(kv)
            graph.replay()
            tok, kv = out_tok, out_kv
            tokens[:, i : i + 1].copy_(tok)
        return tokens

    return generate, lambda: {"graphs": len(graphs)}


def setup_ideal(case):
    graphs, truncated = per_shape_setup(case, chain=True)
    if truncated is not None:
        return None, truncated
    first_tok = graphs[0][1]

    def generate():
        first_tok.copy_(case.tok0)  # once per generation, not per step
        tokens = torch.empty(case.batch, case.steps, dtype=torch.long, device=first_tok.device)
        for i, (graph, _, _, out_tok, _) in enumerate(graphs):
            graph.replay()
            tokens[:, i : i + 1].copy_(out_tok)
        return tokens

    return generate, lambda: {"graphs": len(graphs)}


def setup_torch_compile(case):
    torch._dynamo.reset()
    graphed = torch.compile(case.step, mode="reduce-overhead")

    def compiled(tok, kv):
        # cudagraph trees overwrite a step's outputs at the next step: mark the step and clone, as
        # its error message asks ("accessing tensor output of CUDAGraphs that has been overwritten").
        torch.compiler.cudagraph_mark_step_begin()
        tok, kv = graphed(tok, kv)
        return tok.clone(), kv.clone()
    t0 = time.perf_counter()
    case.generate(compiled)  # compiles (and records) every shape
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - t0
    return (lambda: case.generate(compiled)), lambda: {"first_call_s": first_call_s}


# Generations a grape mode may take to be steady before it is timed (it takes two: the first call
# warms up, the other shapes are captured at first sight, and the second captures the first).
MAX_CALLS_TO_STEADY = 4


def setup_grape(case, **options):
    step = grape.compile(case.step, **options)
    counters = harness.GrapeCounters(step)
    rss = harness.rss_bytes()
    seconds, changes = [], []
    while len(seconds) < MAX_CALLS_TO_STEADY and harness.steady_by_counters(changes) is None:
        seconds.append(harness.timed(lambda: case.generate(step))[1])
        changes.append(counters.change())
    steady = harness.time_to_steady(seconds, harness.steady_by_counters(changes))
    capture_host_bytes = harness.rss_bytes() - rss
    before = {}

    def generate():
        nonlocal before
        before = grape.stats(step)
        return case.generate(step)

    def extra():
        s = grape.stats(step)
        copied = (s["bytes_copied_in"] - before["bytes_copied_in"]) + (
            s["bytes_evacuated"] - before["bytes_evacuated"]) + (
            s["bytes_copied_back"] - before["bytes_copied_back"])
        return {
            "first_call_s": seconds[0],
            **steady,
            "graphs": s["graphs"],
            "pool_bytes": s["pool_bytes"],
            "arena_lane_bytes": s["arena_lane_bytes"],
            "capture_seconds": s["capture_seconds"],
            "bytes_copied_per_step": copied / case.steps,
            "bytes_copied_per_generation": copied,
            "alias_hits_per_generation": s["alias_hits"] - before["alias_hits"],
            "alias_misses_per_generation": s["alias_misses"] - before["alias_misses"],
            "bytes_avoided_per_step": (s["bytes_avoided"] - before["bytes_avoided"]) / case.steps,
            "evacuations": s["evacuations"],
            "fallbacks": harness.portable_fallbacks(s["fallbacks"]),
            # Graph memory (docs/design.md, "Shared executables").
            "shapes": s["shapes"],
            "topology_groups": s["topology_groups"],
            "unshareable_reason": s["unshareable_reason"],
            "host_bytes_of_captures": capture_host_bytes,
            "resident_executables": s["resident_executables"],
            "executable_bytes": s["executable_bytes"],
            "params_bytes": s["params_bytes"],
            "params_raw_bytes": s["params_raw_bytes"],
            "nodes_patched_per_step": (s["nodes_patched"] - before["nodes_patched"]) / case.steps,
            "patch_us_per_step": (s["patch_seconds"] - before["patch_seconds"]) * 1e6 / case.steps,
        }

    return generate, extra


def one_shape_grape_memory(case) -> dict:
    """Device memory of a grape function that captured only the largest shape: what the memory of
    every shape is compared with to get the cost of each extra shape."""
    harness.clear_memory()
    tok = case.tok0.clone()
    kv = torch.zeros(*case.kv0.shape[:-2], case.steps - 1, case.kv0.shape[-1], device=tok.device,
                     dtype=case.kv0.dtype)
    free0 = harness.free_bytes()
    step = grape.compile(case.step)
    for _ in range(3):  # warm-up, capture, replay
        out = step(tok, kv)
    largest_cache_bytes = out[1].numel() * out[1].element_size()  # the last step's output cache
    del out
    harness.clear_memory()
    s = grape.stats(step)
    result = {"gpu_mem_bytes": free0 - harness.free_bytes(), "shapes": s["shapes"],
              "pool_bytes": s["pool_bytes"], "executable_bytes": s["executable_bytes"],
              "largest_cache_bytes": largest_cache_bytes}
    del step
    return result


def print_graph_memory(case: dict) -> None:
    g = case["modes"].get("grape")
    if not g or "one_shape" not in g:
        return
    kb = 1 / 1024
    print(f"grape: {g['shapes']} shapes in {g['topology_groups']} topology groups, "
          f"{g['resident_executables']} resident executables; per extra shape "
          f"{g['gpu_bytes_per_extra_shape'] * kb:.1f} KB device outside the pool "
          f"({g['gpu_bytes_per_extra_shape_pool_included'] * kb:.1f} KB with the pool's growth), "
          f"{g['host_bytes_per_shape'] * kb:.1f} KB host; pool "
          f"{g['pool_bytes'] / g['one_shape']['largest_cache_bytes']:.2f}x the largest cache "
          f"(one shape: {g['one_shape']['pool_bytes'] / g['one_shape']['largest_cache_bytes']:.2f}x); "
          f"parameters {g['params_bytes'] * kb:.0f} KB compressed from {g['params_raw_bytes'] * kb:.0f} KB")


SETUPS = {"eager": setup_eager, "ptgraph": setup_ptgraph, "ideal": setup_ideal,
          "torch_compile": setup_torch_compile, "grape": setup_grape,
          # grape with every input copied into a placeholder (no alias prediction)
          "grape_copy": lambda case: setup_grape(case, alias_prediction=False),
          # per-shape graphs whose pools are one pool
          "ptgraph_shared_pool": lambda case: setup_ptgraph(case, pool=torch.cuda.graph_pool_handle()),
          # grape with one executable per topology (executable_cache=0): the least device memory
          "grape_compact": lambda case: setup_grape(case, executable_cache=0),
          # grape with one executable per shape (no sharing by topology)
          "grape_all_resident": lambda case: setup_grape(case, share_executables=False)}


def leading_equal_steps(tokens: torch.Tensor, reference: torch.Tensor) -> int:
    """How many steps, from the first, generated the same tokens in every sequence."""
    differs = (tokens != reference).any(0).nonzero()
    return int(differs[0]) if len(differs) else tokens.shape[1]


def same_tokens(tokens: torch.Tensor, reference: torch.Tensor) -> dict:
    """harness.compare_with_eager's check of generated tokens [batch, steps]."""
    return {"correct": bool(torch.equal(tokens, reference)),
            "steps_equal_to_eager": leading_equal_steps(tokens, reference)}


def run_case(cfg, batch, steps, modes, reps, memory_case=False) -> dict:
    case = Case(cfg, batch, steps, "cuda")
    results = {}
    for mode in modes:
        print(f"  {mode} ...", flush=True)
        with torch.no_grad():
            results[mode] = measure(case, lambda: SETUPS[mode](case), reps)
        harness.clear_memory()
    if "eager" in results:
        results["eager"]["gpu_mem_bytes"] = results["eager"]["peak_allocated_bytes"]
        reference = results["eager"]["outputs"]
        # Eager itself may pick another token where two logits nearly tie (a reduction whose
        # order varies between runs); a second eager generation shows whether it does.
        with torch.no_grad():
            again = case.generate(case.step)
        results["eager"]["self_consistent"] = bool(torch.equal(again, reference))
        results["eager"]["steps_equal_to_its_rerun"] = leading_equal_steps(again, reference)
    harness.compare_with_eager(results, same_tokens)
    ideal = results.get("ideal", {}).get("ms_per_step")
    for r in results.values():
        if r["ms_per_step"] is not None and ideal:  # None: did not fit, not run
            r["ratio_to_ideal"] = r["ms_per_step"] / ideal
    grape_r = results.get("grape")
    if grape_r and "ptgraph" in results:
        grape_r["mem_ratio_to_ptgraph"] = grape_r["gpu_mem_bytes"] / results["ptgraph"]["gpu_mem_bytes"]
    if grape_r and "ptgraph_shared_pool" in results:
        grape_r["mem_ratio_to_ptgraph_shared_pool"] = (
            grape_r["gpu_mem_bytes"] / results["ptgraph_shared_pool"]["gpu_mem_bytes"])
    if grape_r and "grape_all_resident" in results:
        grape_r["ratio_to_all_resident"] = (
            grape_r["ms_per_step"] / results["grape_all_resident"]["ms_per_step"])
    if memory_case and grape_r:
        with torch.no_grad():
            one = one_shape_grape_memory(case)
        grape_r["one_shape"] = one
        outside_pool = grape_r["gpu_mem_bytes"] - grape_r["pool_bytes"]
        grape_r["gpu_bytes_per_extra_shape"] = (
            outside_pool - (one["gpu_mem_bytes"] - one["pool_bytes"])) / (steps - 1)
        grape_r["gpu_bytes_per_extra_shape_pool_included"] = (
            grape_r["gpu_mem_bytes"] - one["gpu_mem_bytes"]) / (steps - 1)
        # Host memory: what capturing every shape added to the process (graphs, compressed
        # parameters, the driver's host memory), per shape.
        grape_r["host_bytes_per_shape"] = grape_r["host_bytes_of_captures"] / grape_r["shapes"]
    config = {"model": "gpt2-small" if cfg.n_layer == 12 else "gpt2-tiny", "dtype": "float16",
              "batch": batch, "prompt": 1, "steps": steps, "shapes": steps, "reps": reps}
    name = f"b{batch}-shapes{steps}" if memory_case else f"b{batch}"
    return {"name": name, "config": config, "modes": results}


def while_loop_case(cfg, batch, steps, reps) -> dict:
    """N greedy tokens on a static KV cache: one graph per step replayed N times (the best a per-step
    replay can do: one torch.cuda.CUDAGraph whose outputs land in its own inputs) against one
    grape.while_loop graph for the whole generation."""
    device = "cuda"
    forward = gpt2.make_static_forward(cfg, gpt2.init_weights(cfg, device))

    def step(tok, kv, pos, tokens):
        nxt = forward(tok, kv, pos).argmax(-1, keepdim=True)  # writes kv at pos
        return nxt, kv, pos + 1, tokens.index_copy(1, pos.view(1), nxt)

    def generate_in_one_graph(tok, kv, pos, tokens):
        return grape.while_loop(lambda tok, kv, pos, tokens: pos < steps, step, (tok, kv, pos, tokens))[3]

    g = torch.Generator(device="cpu").manual_seed(1)
    tok0 = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g).to(device)
    kv_shape = (2, cfg.n_layer, batch, cfg.n_head, steps, cfg.n_embd // cfg.n_head)

    def fresh():
        return (tok0.clone(), torch.zeros(kv_shape, device=device, dtype=torch.float16),
                torch.zeros((), dtype=torch.long, device=device),
                torch.zeros(batch, steps, dtype=torch.long, device=device))

    def eager():
        state = fresh()
        for _ in range(steps):
            state = step(*state)
        return state[3]

    static = fresh()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(*fresh())  # warm-up, as torch.cuda.graph's documentation asks
    torch.cuda.current_stream().wait_stream(stream)
    step_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(step_graph):
        outputs = step(*static)
        for buffer, value in zip(static, outputs):
            if value is not buffer:
                buffer.copy_(value)  # the next replay reads this step's outputs

    def per_step_replays():
        for buffer, value in zip(static, fresh()):
            buffer.copy_(value)
        for _ in range(steps):
            step_graph.replay()
        return static[3].clone()

    whole = grape.compile(generate_in_one_graph)
    start = fresh()
    runs = {"eager": eager, "step_graph": per_step_replays, "grape_while_loop": lambda: whole(*start)}
    results = {}
    with torch.no_grad():
        for mode, run in runs.items():
            print(f"  {mode} ...", flush=True)
            tokens = [run() for _ in range(2)][-1]  # grape: warm-up, then capture
            times = harness.time_ms(run, reps)
            results[mode] = {"ms_per_step": harness.median(times) / steps,
                             "ms_per_step_runs": [t / steps for t in times], "outputs": tokens}
    s = grape.stats(whole)
    results["grape_while_loop"].update({"graphs": s["graphs"], "replays": s["replays"],
                                        "eager_calls": s["eager_calls"], "fallbacks": harness.portable_fallbacks(s["fallbacks"])})
    harness.compare_with_eager(results, same_tokens)
    results["grape_while_loop"]["speedup_vs_step_graph"] = harness.speedup(
        results["step_graph"], results["grape_while_loop"])
    config = {"model": "gpt2-small" if cfg.n_layer == 12 else "gpt2-tiny", "dtype": "float16",
              "batch": batch, "steps": steps, "kv_cache": "static", "reps": reps}
    return {"name": f"b{batch}-while-loop", "config": config, "modes": results}


def strip_option(argv: list[str], option: str) -> list[str]:
    """argv without `option` and the values that follow it."""
    out, skipping = [], False
    for a in argv:
        if a == option or a.startswith(option + "="):
            skipping = a == option
            continue
        if skipping and not a.startswith("--"):
            continue
        skipping = False
        out.append(a)
    return out


def main(argv=None):
    parser = harness.argument_parser(__doc__, DEFAULT_MODES, "smoke run: 16 steps, 2 reps, no torch.compile")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (default 1 8)")
    parser.add_argument("--steps", type=int, default=128,
                        help="decode steps, one shape each (default %(default)s)")
    parser.add_argument("--shapes", type=int, default=None,
                        help="graph memory: N tokens from a 1-token prompt, modes " + ",".join(SHAPES_MODES))
    parser.add_argument("--while-loop", action="store_true",
                        help="only the whole-generation case: one grape.while_loop graph vs per-step replays")
    args, modes = harness.parse(parser, argv, modes_available(),
                                "gpt2_decode needs a CUDA device (benchmarks/demo_gpt2.py runs anywhere)")
    if args.shapes is not None:
        if args.modes == ",".join(DEFAULT_MODES):
            modes = SHAPES_MODES
        args.steps = args.shapes
    if args.quick:
        args.steps, args.reps = min(args.steps, 16 if args.shapes is None else 64), 2
        modes = [m for m in modes if m != "torch_compile"]
    cfg = gpt2.GPT2Config.tiny() if args.tiny else gpt2.GPT2Config()
    cases = []
    if args.while_loop:
        for batch in args.batch:
            print(f"batch {batch}, while loop:", flush=True)
            cases.append(while_loop_case(cfg, batch, args.steps, args.reps))
            harness.print_table(cases[-1])
            path = harness.write_results("gpt2_decode-while-loop" + ("-quick" if args.quick else ""),
                                         cases, args.out)
        print(f"\nwrote {path}")
        return cases
    name = "gpt2_decode" + (f"-shapes{args.steps}" if args.shapes is not None else "")
    if args.shapes is not None and len(args.batch) > 1:
        # Each batch in a process of its own: the driver keeps the memory of destroyed
        # executables for later ones, which would hide the next case's executables.
        for batch in args.batch:
            with tempfile.TemporaryDirectory() as out:
                child = [a for a in (argv if argv is not None else sys.argv[1:])]
                child = strip_option(strip_option(child, "--batch"), "--out")
                # A child whose results differ from eager exits with an error, results written.
                cases += harness.fresh_process_cases("benchmarks.gpt2_decode",
                                                     [*child, "--batch", str(batch)], Path(out),
                                                     check=False)
            path = harness.write_results(name + ("-quick" if args.quick else ""), cases, args.out)
        print(f"\nwrote {path}")
        return cases
    for batch in args.batch:
        print(f"batch {batch}:", flush=True)
        cases.append(run_case(cfg, batch, args.steps, modes, args.reps, memory_case=args.shapes is not None))
        harness.print_table(cases[-1])
        if args.shapes is not None:
            print_graph_memory(cases[-1])
        # Written after every case, so a run cut short keeps what it measured.
        path = harness.write_results(name + ("-quick" if args.quick else ""), cases, args.out)
    print(f"\nwrote {path}")
    return cases


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
