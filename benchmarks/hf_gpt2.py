"""Hugging Face GPT-2 small (fp16, random weights) through its own, unchanged `generate`: eager with
the dynamic cache, HF's static cache with torch.compile, and grape.compile(model) with the dynamic
cache (`grape`; `grape_compact` with executable_cache=0, one executable per topology;
`grape_all_resident` with share_executables=False, one per shape); plus `grape_step`, a whole decode step (forward and greedy selection) compiled as one grape
function in a plain Python loop.

    python -m benchmarks.hf_gpt2            # b1/b8, greedy and 4-beam, 128 new tokens
    python -m benchmarks.hf_gpt2 --quick    # smoke run: 16 tokens, 2 reps, no torch.compile

All modes run in one process on the same weights and prompt; tokens are compared with eager's
(`correct`). `ms_per_step` is the median over --reps generations of the wall time per new token
(one decode step), once the mode is steady (grape: every shape captured; torch.compile: compiled
and recorded); `speedup_vs_eager` is eager's over the mode's.
`first_call_s` is the wall time of the mode's first generation, capture or compilation included;
`time_to_steady_s` is the wall time of the generations before the first from which every one runs
steady (grape: no warm-up, capture or eager call; other modes: within 1.25x of the steady time),
`calls_to_steady` that generation's number.
`ptgraph` (plain torch.cuda.graph) has no way into an unchanged `generate` with a dynamic cache:
the cache's tensors change address and shape at every step, so the mode is reported as skipped.
Greedy cases also time the compiled forward alone in a plain loop of decode steps against its ideal
replay, one plain CUDA graph per step replayed in order (`forward_alone` in the JSON).
Writes JSON and a markdown table to benchmarks/results/ (a PNG plot too where matplotlib exists).
"""

from __future__ import annotations

import copy
import sys
import warnings

import torch

import grape
from benchmarks import generation, harness
from benchmarks.generation import measure, measure_generate

MODES = ["eager", "static_compile", "grape", "grape_compact", "grape_all_resident", "grape_step"]
CASES = {"b1-greedy": (1, 1), "b8-greedy": (8, 1), "b1-beam4": (1, 4), "b8-beam4": (8, 4)}


def build_model(layers: int):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=layers, bos_token_id=50256, eos_token_id=50256,
                                  pad_token_id=50256)
    return transformers.GPT2LMHeadModel(cfg).to("cuda", torch.float16).eval()


def setup_eager(base, case):
    return measure_generate(base, *case["inputs"], case["kwargs"], case["reps"], 0, "eager")


def setup_static_compile(base, case):
    model = copy.deepcopy(base)
    torch._dynamo.reset()
    kwargs = dict(case["kwargs"], cache_implementation="static")
    r = measure_generate(model, *case["inputs"], kwargs, case["reps"], 2, "static+compile")
    # HF compiles the decoding forward by itself when the cache is static (its auto-compile).
    r["compiled_by_hf"] = hasattr(model, "_compiled_call")
    return r


def setup_grape(base, case, **options):
    model = grape.compile(copy.deepcopy(base), **options)
    r = measure_generate(model, *case["inputs"], case["kwargs"], case["reps"], 2, "grape",
                         grape_counters=True)
    r["host_ms_per_forward"] = generation.host_ms_per_forward(model, *case["inputs"], case["kwargs"])
    r.update(harness.grape_stats(model, generation.GRAPE_STATS))
    return r


def setup_grape_step(base, case):
    """A decode step (forward + argmax) as one grape function, in a plain loop; greedy only."""
    model = copy.deepcopy(base)
    ids, mask = case["inputs"]
    new = case["kwargs"]["max_new_tokens"]

    @grape.compile
    def step(tok, cache):
        logits = model(input_ids=tok, past_key_values=cache, use_cache=True).logits
        return logits[:, -1:].argmax(-1)

    generate = generation.decode_loop(step, model.config, ids, new)
    with torch.no_grad():
        r = measure(generate, new, case["reps"], 2, "grape_step", harness.GrapeCounters(step))
    r.update(harness.grape_stats(step, ("graphs", "fallbacks")))
    return r


def forward_alone(base, batch: int, new_tokens: int, reps: int) -> dict:
    """The compiled forward alone, called in a plain loop of decode steps over a DynamicCache,
    against its ideal replay: one plain CUDA graph per step, captured on that step's cache and
    replayed in order with nothing copied or rebuilt in Python (the least those kernels cost).
    ms per decode step; the prefill is outside the timed loop. Tokens are fixed (teacher forcing):
    a step's cost does not depend on their values."""
    import transformers

    g = torch.Generator(device="cpu").manual_seed(2)
    ids = torch.randint(0, base.config.vocab_size, (batch, 8), generator=g).to("cuda")
    steps = torch.randint(0, base.config.vocab_size, (new_tokens, batch, 1), generator=g).to("cuda")

    def prefilled(model):
        cache = transformers.DynamicCache(config=model.config)
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        return cache

    def ms_per_step(run_steps) -> float:
        return harness.timed(run_steps)[1] * 1e3 / new_tokens

    model = grape.compile(copy.deepcopy(base))

    def grape_pass() -> float:
        cache = prefilled(model)
        return ms_per_step(lambda: [model(input_ids=tok, past_key_values=cache, use_cache=True)
                                    for tok in steps])

    for _ in harness.progress(range(2), "grape forward"):  # warm-up, capture
        grape_pass()
    grape_runs = [grape_pass() for _ in range(reps)]
    result = {"grape_ms_per_step": harness.median(grape_runs),
              "grape_ms_per_step_runs": grape_runs,
              **harness.grape_stats(model, ("graphs", "replays", "fallbacks"))}

    plain = copy.deepcopy(base)
    cache = prefilled(plain)
    plain(input_ids=steps[0], past_key_values=copy.deepcopy(cache), use_cache=True)  # warm-up
    pool, graphs, read = torch.cuda.graph_pool_handle(), [], []
    try:
        for tok in harness.progress(steps, "ideal capture"):
            snapshot = copy.deepcopy(cache)
            # The graph reads these; the capture rebinds the snapshot's layers to its own outputs.
            read.append([(layer.keys, layer.values) for layer in snapshot.layers])
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                plain(input_ids=tok, past_key_values=snapshot, use_cache=True)
            graphs.append(graph)
            plain(input_ids=tok, past_key_values=cache, use_cache=True)
    except Exception as e:  # reported, not fatal to the rest of the benchmark
        result["ideal_error"] = harness.error_text(e)
        return result
    ms_per_step(lambda: [graph.replay() for graph in graphs])
    ideal_runs = [ms_per_step(lambda: [graph.replay() for graph in graphs]) for _ in range(reps)]
    result.update(ideal_ms_per_step=harness.median(ideal_runs), ideal_ms_per_step_runs=ideal_runs)
    result["ratio_to_ideal"] = result["grape_ms_per_step"] / result["ideal_ms_per_step"]
    return result


SETUPS = {"eager": setup_eager, "static_compile": setup_static_compile, "grape": setup_grape,
          # one executable per topology, patched for every other shape: the least device memory
          "grape_compact": lambda base, case: setup_grape(base, case, executable_cache=0),
          # one executable per graph: no patching between shapes (more device memory)
          "grape_all_resident": lambda base, case: setup_grape(base, case, share_executables=False),
          "grape_step": setup_grape_step}


def run_case(base, name, batch, beams, new_tokens, reps, modes) -> dict:
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, base.config.vocab_size, (batch, 8), generator=g).to("cuda")
    case = {"inputs": (ids, torch.ones_like(ids)), "kwargs": generation.generate_kwargs(beams, new_tokens),
            "reps": reps}
    runnable = [m for m in modes if not (m == "grape_step" and beams > 1)]  # grape_step: greedy only
    results = harness.run_modes(runnable, lambda mode: SETUPS[mode](base, case))
    results["ptgraph"] = {"ms_per_step": None, "skipped": (
        "an unchanged generate() with a dynamic cache cannot replay plain CUDA graphs: the "
        "cache's tensors change shape and address at every step")}
    harness.compare_with_eager(results)
    grape_r, compiled = results.get("grape", {}), results.get("static_compile", {})
    speedup = harness.speedup(compiled, grape_r)
    if speedup is not None:
        grape_r["speedup_vs_static_compile"] = speedup
        grape_r["first_call_ratio_to_static_compile"] = (
            grape_r["first_call_s"] / compiled["first_call_s"])
    config = {"model": "gpt2-small" if base.config.n_layer == 12 else "gpt2-tiny",
              "dtype": "float16", "batch": batch, "beams": beams, "prompt": 8,
              "new_tokens": new_tokens, "reps": reps}
    case_result = {"name": name, "config": config, "modes": results}
    if beams == 1 and "grape" in modes:
        print("  forward alone vs its ideal replay ...", flush=True)
        case_result["forward_alone"] = f = forward_alone(base, batch, new_tokens, reps)
        harness.clear_memory()
        if f.get("ideal_ms_per_step"):
            print(f"  forward alone: grape {f['grape_ms_per_step']:.3f} ms/step, ideal replay "
                  f"{f['ideal_ms_per_step']:.3f} ({f['ratio_to_ideal']:.3f}x)", flush=True)
    return case_result


def main(argv=None):
    parser = harness.argument_parser(__doc__, MODES, "smoke run: 16 new tokens, 2 reps, no torch.compile")
    parser.add_argument("--cases", default=",".join(CASES), help="from: " + ", ".join(CASES))
    parser.add_argument("--new-tokens", type=int, default=128,
                        help="tokens each generation adds (default %(default)s)")
    args, modes = harness.parse(parser, argv, MODES, "hf_gpt2 needs a CUDA device")
    if args.quick:
        args.new_tokens, args.reps = 16, 2
        modes = [m for m in modes if m != "static_compile"]
    base = build_model(2 if args.tiny else 12)
    warnings.simplefilter("ignore", grape.FallbackWarning)  # they are in the JSON
    name = "hf_gpt2" + ("-quick" if args.quick else "")
    cases = []
    with torch.no_grad():
        for case_name in args.cases.split(","):
            batch, beams = CASES[case_name]
            print(f"{case_name}:", flush=True)
            cases.append(run_case(base, case_name, batch, beams, args.new_tokens, args.reps, modes))
            harness.print_table(cases[-1])
            path = harness.write_results(name, cases, args.out)
    harness.write_table_and_plot(
        path, generation.markdown(cases),
        lambda png: generation.plot(cases, png, MODES, "HF GPT-2 small generate, fp16"))
    return cases


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
