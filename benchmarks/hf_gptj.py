"""Hugging Face GPT-J 6B (fp16, random weights) through its own, unchanged `generate` with the
default dynamic cache: batch 1, a 32-token prompt, greedy. Modes: eager; grape.compile(model);
grape.compile(model, executable_cache=0) (`grape_compact`: one executable per topology);
grape.compile(model, share_executables=False) (`grape_all_resident`); and `grape_step`, a whole
decode step (forward and greedy selection) compiled as one grape function in a plain Python loop.
Run only when named: `grape_inductor`, grape.compile(model) over a forward whose decode steps
run torch.compile(model.forward, dynamic=True): Inductor's fused kernels replayed from grape's
graphs (compiling takes minutes).
Against the physical limit: the HBM-bandwidth floor, the time to read the weights once per token.
And against what graphs can reach: `step_kernel_ms`, the GPU time of the kernels one decode step
launches (eager and grape_inductor, measured with torch.profiler outside graphs, at a KV cache of
the prompt plus half the new tokens), of which `step_matmul_kernel_ms` in matrix products: a replay
launches the same kernels, so no graph of that step runs faster.

    python -m benchmarks.hf_gptj                  # b1-greedy, 128 new tokens, 5 reps
    python -m benchmarks.hf_gptj --quick          # 16 new tokens, 2 reps
    python -m benchmarks.hf_gptj --tiny --quick   # smoke run: a 2-layer GPT-J, fits any GPU
    python -m benchmarks.hf_gptj --modes eager,grape_step,grape_inductor

All modes run in one process on the same weights and prompt; tokens are compared with eager's
(`correct`).
The model (12 GB) is never copied: each grape mode compiles its forward in place and gives the
original back when it is done, so modes may run in any order.
`ms_per_step` is the median over --reps generations of the wall time per new token (one decode
step), once the mode is steady (every shape captured); `speedup_vs_eager` is eager's over the
mode's; `first_call_s` is the wall time of the mode's first generation, captures included;
`time_to_steady_s` is the wall time of the generations before the first from which every one runs
steady (grape: no warm-up, capture or eager call; other modes: within 1.25x of the steady time),
`calls_to_steady` that generation's number.
The floor: `weight_bytes_per_step` (every parameter but the input embedding table, of which a
token reads one row; GPT-J's lm_head is a matrix of its own, read whole) over
`hbm_bandwidth_gbps`, measured by a device-to-device copy of 2 GiB (bytes read plus written, the
median of 20). The KV cache is left out (under 80 MB at 160 tokens, which the dynamic cache reads
and writes again at each step: about 1% of the weights' bytes). `ratio_to_floor` is a mode's
ms_per_step over `floor_ms_per_step`; the target is grape within 1.3x of it.
Memory: `peak_allocated_bytes` is torch's allocator peak during the mode (weights included);
grape's arena and executables are device memory that allocator does not see, so `gpu_mem_bytes`
adds `arena_bytes` and `executable_bytes` to it; `mem_ratio_to_eager` is it over eager's.
Writes JSON and a markdown table to benchmarks/results/ (a PNG plot too where matplotlib exists).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from typing import Iterator

import torch

import grape
from benchmarks import generation, harness
from benchmarks.generation import measure, measure_generate

MODES = ["eager", "grape", "grape_compact", "grape_all_resident", "grape_step"]
AVAILABLE_MODES = MODES + ["grape_inductor"]
PROMPT = 32
EOS = 50256
# HF's default init (normal, std 0.02) keeps GPT-J 6B's activations far from fp16's limit: a
# simulation of the 28 layers in fp32 peaks near 65 in the residual stream and 7 in the logits
# (fp16 overflows at 65504; attention scores are computed in fp32 by GPT-J itself). Should the
# prompt's logits still not be finite, the model is built again with a smaller init, so that
# greedy tokens are not the argmax of NaNs; the config records the init used.
INIT_RANGES = (0.02, 0.01, 0.005)


def gptj_config(tiny: bool, initializer_range: float):
    import transformers

    # GPTJConfig()'s defaults are GPT-J 6B: n_embd 4096, 28 layers, 16 heads, rotary_dim 64,
    # vocab 50400, n_positions 2048, an lm_head of its own (with a bias).
    small = dict(n_layer=2, n_embd=256, n_head=4, rotary_dim=16) if tiny else {}
    return transformers.GPTJConfig(**small, initializer_range=initializer_range,
                                   bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)


def build_model(tiny: bool, initializer_range: float, device: str = "cuda"):
    """Random weights made in fp16 where they live: 6B fp32 parameters initialized on the CPU
    would take 24 GB and minutes."""
    import transformers

    torch.manual_seed(0)
    config = gptj_config(tiny, initializer_range)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        with torch.device(device):
            model = transformers.GPTJForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def build_checked(tiny: bool, ids: torch.Tensor):
    """The model, and the init it was built with: the first of INIT_RANGES whose logits on the
    prompt are finite."""
    for initializer_range in INIT_RANGES:
        model = build_model(tiny, initializer_range)
        if torch.isfinite(model(ids).logits).all():
            return model, initializer_range
        print(f"logits not finite with initializer_range {initializer_range}; building again")
        del model
        harness.clear_memory()
    raise SystemExit(f"hf_gptj: the prompt's logits are not finite with any init of {INIT_RANGES}")


def hbm_bandwidth_gbps(nbytes: int = 2 * 2**30, reps: int = 20) -> float:
    """Device-memory bandwidth in GB/s (1e9 bytes): a device-to-device copy of `nbytes` reads and
    writes them, 2 x nbytes; the median over `reps` copies timed with CUDA events."""
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    ms = harness.median(harness.time_ms(lambda: dst.copy_(src), reps))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def weight_bytes_per_step(model) -> int:
    """Bytes of the parameters one decode step reads: all of them but the input embedding table
    (a token reads one row of it), unless it is tied to the lm_head (GPT-J's is not)."""
    wte = model.get_input_embeddings().weight
    tied = wte is model.get_output_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not wte)


def floor(model, bandwidth_gbps: float) -> dict:
    nbytes = weight_bytes_per_step(model)
    return {"weight_bytes_per_step": nbytes, "hbm_bandwidth_gbps": bandwidth_gbps,
            "floor_ms_per_step": nbytes / (bandwidth_gbps * 1e9) * 1e3}


def prompt(vocab_size: int, device="cuda") -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(1)
    return torch.randint(0, vocab_size, (1, PROMPT), generator=g).to(device)


@contextlib.contextmanager
def compiled_in_place(model, **options) -> Iterator:
    """grape.compile(model) compiles model.forward in place (no copy of the 12 GB); on exit the
    model's own forward is back, and the graphs go with the compiled function."""
    grape.compile(model, **options)
    try:
        yield model
    finally:
        del model.forward  # the instance attribute grape.compile set: the class's forward again


def step_kernels(model, case) -> dict:
    """GPU time of the kernels one decode step of `model` launches, run outside graphs, at a KV
    cache of the prompt plus half the new tokens (torch.profiler): step_kernel_ms, of which
    step_matmul_kernel_ms in matrix products, and step_kernels (how many)."""
    import transformers

    cache = transformers.DynamicCache(config=model.config)

    def step(tok):
        logits = model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        return logits[:, -1:].argmax(-1)

    tok = step(case["inputs"][0])
    for _ in range(case["kwargs"]["max_new_tokens"] // 2):
        tok = step(tok)
    return {"step_" + key: value for key, value in harness.kernel_ms(lambda: step(tok)).items()}


def setup_eager(model, case):
    r = measure_generate(model, *case["inputs"], case["kwargs"], case["reps"], 0, "eager")
    r.update(step_kernels(model, case))
    return r


def setup_grape(model, case, **options):
    with compiled_in_place(model, **options):
        r = measure_generate(model, *case["inputs"], case["kwargs"], case["reps"], 2, "grape",
                             grape_counters=True)
        r["host_ms_per_forward"] = generation.host_ms_per_forward(model, *case["inputs"],
                                                                  case["kwargs"])
        r.update(harness.grape_stats(model, (*generation.GRAPE_STATS, "arena_bytes")))
    return r


def setup_grape_step(model, case):
    """A decode step (forward + argmax) as one grape function, in a plain loop."""
    if isinstance(model.__dict__.get("forward"), grape.CompiledFunction):
        raise RuntimeError("grape_step calls the model's own forward, but it is compiled")
    ids = case["inputs"][0]
    new = case["kwargs"]["max_new_tokens"]

    @grape.compile
    def step(tok, cache):
        # logits_to_keep=1 as generate passes it; EOS masked as generate's min_new_tokens does.
        logits = model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        logits[:, -1, EOS] = float("-inf")
        return logits[:, -1:].argmax(-1)

    generate = generation.decode_loop(step, model.config, ids, new)
    r = measure(generate, new, case["reps"], 2, "grape_step", harness.GrapeCounters(step))
    r.update(harness.grape_stats(step, ("graphs", "captures", "replays", "fallbacks", "pool_bytes",
                                           "arena_bytes", "executable_bytes")))
    return r


def setup_grape_inductor(model, case):
    """grape.compile(model) over a forward whose decode steps (one new token) run
    torch.compile(model.forward, dynamic=True): the warm-up calls compile (the first two decode
    steps each once: the prompt's KV cache is laid out unlike later ones), captures run the
    compiled code, replays launch Inductor's kernels. The prompt's one call runs eagerly rather
    than compile for minutes. torch.compile's own CUDA graphs stay off."""
    import torch._dynamo

    eager_forward = model.forward
    decode = torch.compile(eager_forward, dynamic=True)

    @functools.wraps(eager_forward)  # generate reads forward's signature to choose its arguments
    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        return (decode if ids is not None and ids.shape[1] == 1 else eager_forward)(*args, **kwargs)

    model.forward = forward
    try:
        r = setup_grape(model, case)  # grape compiles model.forward, `forward`, and removes it
        model.forward = forward
        r.update(step_kernels(model, case))
        return r
    finally:
        model.__dict__.pop("forward", None)
        torch._dynamo.reset()


SETUPS = {"eager": setup_eager, "grape": setup_grape,
          # one executable per topology, patched for every other shape: the least device memory
          "grape_compact": lambda model, case: setup_grape(model, case, executable_cache=0),
          # one executable per graph: no patching between shapes (more device memory)
          "grape_all_resident": lambda model, case: setup_grape(model, case, share_executables=False),
          "grape_step": setup_grape_step, "grape_inductor": setup_grape_inductor}


def run_case(model, name, ids, new_tokens, reps, modes, config) -> dict:
    case = {"inputs": (ids, torch.ones_like(ids)),
            "kwargs": generation.generate_kwargs(1, new_tokens), "reps": reps}

    def run_mode(mode: str) -> dict:
        torch.cuda.reset_peak_memory_stats()
        r = SETUPS[mode](model, case)
        r["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        r["gpu_mem_bytes"] = (r["peak_allocated_bytes"] + (r.get("arena_bytes") or 0)
                              + (r.get("executable_bytes") or 0))
        return r

    results = harness.run_modes(modes, run_mode)
    harness.compare_with_eager(results)
    for r in results.values():
        if r.get("ms_per_step"):
            r["ratio_to_floor"] = r["ms_per_step"] / config["floor_ms_per_step"]
    config = dict(config, new_tokens=new_tokens, reps=reps)
    return {"name": name, "config": config, "modes": results}


def main(argv=None):
    parser = harness.argument_parser(
        __doc__, MODES, "16 new tokens, 2 reps",
        tiny_help="a 2-layer GPT-J (n_embd 256) instead of GPT-J 6B: a smoke run that fits any GPU")
    parser.add_argument("--new-tokens", type=int, default=128,
                        help="tokens each generation adds (default %(default)s)")
    args, modes = harness.parse(parser, argv, AVAILABLE_MODES,
                                "hf_gptj needs a CUDA device (GPT-J 6B in fp16 takes 12 GB of it)")
    if args.quick:
        args.new_tokens, args.reps = 16, 2
    warnings.simplefilter("ignore", grape.FallbackWarning)  # they are in the JSON
    with torch.no_grad():
        bandwidth = hbm_bandwidth_gbps()  # before the model: the copy needs 4 GiB free
        harness.clear_memory()
        ids = prompt(gptj_config(args.tiny, INIT_RANGES[0]).vocab_size)
        model, initializer_range = build_checked(args.tiny, ids)
        params = sum(p.numel() for p in model.parameters())
        config = {"model": "gptj-tiny" if args.tiny else "gptj-6b", "dtype": "float16", "batch": 1,
                  "prompt": PROMPT, "parameters": params,
                  "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                  "initializer_range": initializer_range, **floor(model, bandwidth)}
        print(f"b1-greedy: {params / 1e9:.2f}B parameters; floor {config['floor_ms_per_step']:.3f} "
              f"ms/step ({config['weight_bytes_per_step'] / 1e9:.2f} GB at {bandwidth:.0f} GB/s)",
              flush=True)
        cases = [run_case(model, "b1-greedy", ids, args.new_tokens, args.reps, modes, config)]
        harness.print_table(cases[-1])
    name = "hf_gptj" + ("-tiny" if args.tiny else "") + ("-quick" if args.quick else "")
    path = harness.write_results(name, cases, args.out)
    c = cases[0]["config"]
    title = f"HF {'GPT-J tiny' if args.tiny else 'GPT-J 6B'} generate, fp16, batch 1, greedy"
    preface = (f"{title}: {c['prompt']}-token prompt, {c['new_tokens']} new tokens. "
               f"HBM-bandwidth floor {c['floor_ms_per_step']:.3f} ms/step: "
               f"{c['weight_bytes_per_step'] / 1e9:.2f} GB of weights read per step at "
               f"{c['hbm_bandwidth_gbps']:.0f} GB/s (a device-to-device copy).\n\n")
    table = generation.markdown(cases, extra=[("vs floor", "ratio_to_floor", "{:.2f}x"),
                                              ("step kernels ms", "step_kernel_ms", "{:.3f}"),
                                              ("of which matmul", "step_matmul_kernel_ms", "{:.3f}")],
                                memory=True)
    harness.write_table_and_plot(path, preface + table,
                                 lambda png: generation.plot(cases, png, AVAILABLE_MODES, title))
    return cases


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
