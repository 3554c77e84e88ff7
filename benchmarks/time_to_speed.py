"""Time to speed: what a user of Hugging Face `generate` meets first, the way to steady state and
not only the steady state. Each case's model (random weights, seeded) runs its own, unchanged
`generate` --reps times (5) with one prompt (8 tokens), then 2 times with a longer prompt (32
tokens), greedy, the same number of new tokens every call. Cases: `gpt2-b1`, `gpt2-b8` (GPT-2
small, fp16, batch 1 and 8) and `tinyllama-b1` (a Llama of TinyLlama-1.1B's shape: 22 layers,
hidden 2048, intermediate 5632, 32 heads, 4 KV heads, vocab 32000; bf16, batch 1). Modes: eager
(the dynamic cache); static_compile (HF's static cache, which HF's generate compiles with
torch.compile by itself); grape (grape.compile(model), the dynamic cache); grape_plan_free
(grape.compile(model, plan_free_attention=True): its calls run attention on backends that build no
per-shape plan); grape_cached and grape_plan_free_cached (--cold only: the same with a graph cache
directory, filled by a first process of that mode, then measured in a second, fresh one; the
filling process's graph_cache stats are filling_graph_cache, the measured one's graph_cache);
eager_plan_free (when asked for: eager on the plan-free modes' attention backends, whose tokens
those modes' are compared with too, as correct_same_attention).
--no-alias-prediction compiles every grape mode with alias_prediction=False. Each mode has a fresh copy of the case's weights.

    python -m benchmarks.time_to_speed                  # the three cases, 128 new tokens
    python -m benchmarks.time_to_speed --quick          # gpt2-b1 only, 16 new tokens
    python -m benchmarks.time_to_speed --tiny --quick   # smoke run: 2-layer models of width 64
    python -m benchmarks.time_to_speed --tiny --quick --device cpu --modes eager,grape
                                                        # the script itself, anywhere (grape runs
                                                        # eagerly on the CPU, HF compiles nothing)

A mode's figures (lists "per call" and cumulative_ms have one entry per call: the --reps calls
with the prompt, then the longer prompt's):
  calls_ms                wall ms of each call with the prompt (synchronized), capture or
                          compilation included; longer_prompt_calls_ms: the longer prompt's calls
  cumulative_ms           wall ms of all calls up to each
  first_call_ms, steady_ms  the first call's, and the median of the last STEADY_CALLS (3) with the
                          prompt (one call's noise, of eager's too, moves no ratio); ms_per_step: steady_ms
                          per new token, so speedup_vs_eager is eager's over the mode's when steady
  calls_to_steady         grape: the first call from which no call with the prompt warms up, runs
                          eagerly or captures (every forward replays), None where the last one
                          does; other modes, which have no such counters: the first call from
                          which every call with the prompt is within 1.25x of the fastest of them
                          (None where the last one is not)
  correct                 every call's tokens equal eager's same call's (calls_equal, call by call);
                          correct_same_attention: a plan-free mode's against eager_plan_free's
  eager_steady_ms, first_call_vs_eager_steady (call 1 over eager's steady_ms),
  first_call_vs_eager_first (call 1 over eager's call 1), second_call_speedup_vs_eager (eager's
  steady_ms over the mode's call 2), third_call_vs_second (the mode's call 3 over its call 2),
  cumulative_2_vs_eager (calls 1 and 2 over eager's): every mode but eager
  grape:  captures_per_call (chain variants included), replays_per_call, warmup_calls_per_call,
          eager_calls_per_call, nodes_patched_per_call (changes of grape.stats' counters in each
          call);
          longer_prompt_captures; signatures_with_variants (those captured more than once);
          capture_ms_median (a signature's capture, every try and its join, the median over
          signatures) and capture_vs_eager_forward (over one eager forward: eager's steady call
          over its forwards);
          own_ms_per_capture_per_call (capture less capture_function, per capture; None in a
          call that captured nothing);
          breakdown_ms_per_call: {"warmup", "capture", of the capture time "capture_function"
          (the model's forward itself), "graph_read", "join", "settle" (a join's work left
          until its graph's first launch is queued, done after that launch, its compression on
          a worker thread), "instantiate" (also rebuilds after eviction) and "chain_variant", "patch"} (grape.stats' <name>_seconds, in ms); graphs and fallbacks at the end
  static_compile:  compiles_per_call (graphs torch.compile compiled in each call), compiled_by_hf
A case's capture_floor (CUDA, with grape among the modes): what PyTorch alone spends on one decode
forward after the prompt, medians over CAPTURE_FLOOR_REPS, alternating: eager_forward_ms (host,
synchronized), plain_capture_ms (torch.cuda.graph capturing it, not instantiated) and
plain_instantiate_ms, their ratio plain_capture_vs_eager_forward, and grape_capture_vs_plain
(grape's capture_ms_median over plain_capture_ms): the floor under a capture at first sight; and
first_call_vs_eager_steady, the floor under grape's call 1 (first_call_floor; with eager among the
modes).
Before a case's modes, throwaway copies of its model generate once with each prompt, eagerly and
(where grape is among the modes) through a throwaway grape.compile, which calls the prompt twice
so that its capture of the prompt's signature comes too (config `process_warmup_ms`, per path and
call): the process's first-use costs (CUDA context, cuBLAS handles, kernels loaded lazily,
and the per-shape plans of cuDNN's attention, which eager pays at the first call of each length
too, and which a captured forward needs apart from eager's because Hugging Face builds the
attention mask when it cannot look at it on the host) would otherwise fall on whichever mode runs
first. Only the throwaway function's graphs are gone; the library's caches are the process's.
`--no-warmup` skips it: the modes run one after another in this process, the first paying the
process's first-use costs (grape after eager: what a process that ran eager first meets).
`--cold` skips it too, and runs each mode in a fresh process of its own (this script with that
mode alone), so that every mode pays what a fresh process pays; the modes' figures and tokens are
then compared as in one process, in one file (time_to_speed-cold-<gpu>.json, config `processes`).
Inductor's caches are left as they are, so a second run on one machine compiles from them.
`--rounds N` runs each case's modes N times in turn (eager, grape, eager, grape, ...: a host that
slows down for a while moves one round, not one mode): a mode's calls_ms are then each call's
median over the rounds, as are its breakdown's, capture_ms_median's and each ratio's (each round's
against the same round's eager, listed in <ratio>_rounds); every round's calls_ms are in
calls_ms_rounds; counters and outputs are the first round's, and correct holds only where it held
in every round.
Writes JSON and a markdown table to benchmarks/results/ (a PNG plot of cumulative time against
calls too where matplotlib exists).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import operator
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

import torch

import grape
from benchmarks import generation, harness
from grape import _attention

MODES = ["eager", "static_compile", "grape", "grape_plan_free"]  # the default
CACHED_MODES = ("grape_cached", "grape_plan_free_cached")  # --cold only, when asked for
# Eager with the attention backends of grape's plan-free calls: the plan-free modes' tokens
# are also compared with its (correct_same_attention), when asked for.
SAME_ATTENTION = "eager_plan_free"
ALL_MODES = MODES + list(CACHED_MODES) + [SAME_ATTENTION]
CASES = {"gpt2-b1": ("gpt2", 1), "gpt2-b8": ("gpt2", 8), "tinyllama-b1": ("tinyllama", 1)}
QUICK_CASES = "gpt2-b1"
PROMPT, LONGER_PROMPT, LONGER_CALLS = 8, 32, 2
# grape.stats counters and times (seconds) read around each call.
COUNTERS = ("captures", "replays", "warmup_calls", "eager_calls", "nodes_patched")
BREAKDOWN = ("warmup_seconds", "capture_seconds", "capture_function_seconds", "graph_read_seconds",
             "join_seconds", "settle_seconds", "instantiate_seconds", "chain_variant_seconds",
             "patch_seconds")
MODEL_NAMES = {"gpt2": ("gpt2-small", "gpt2-tiny"),  # (full, --tiny)
               "tinyllama": ("tinyllama-1.1b-shape", "llama-tiny")}
STEADY_CALLS = 3  # steady_ms: the median of the last calls with the prompt
CAPTURE_FLOOR_REPS = 9
SIGNATURE_CHARS = 160  # of a signature with chain variants, as recorded
CACHE_VARIABLE = "GRAPE_CACHE_DIR"  # grape/_graph_cache.py: the cached modes' directory
NEEDS = ("time_to_speed needs a CUDA device (--device cpu --tiny checks the script itself, "
         "without one)")


def model_config(family: str, tiny: bool):
    """A case's config and dtype: GPT-2 small (fp16) or TinyLlama-1.1B's shape (bf16); `tiny`:
    2 layers of width 64."""
    import transformers

    if family == "gpt2":
        shape = dict(n_layer=2, n_embd=64, n_head=4) if tiny else {}  # GPT2Config(): GPT-2 small
        return transformers.GPT2Config(**shape, pad_token_id=50256), torch.float16
    shape = (dict(num_hidden_layers=2, hidden_size=64, intermediate_size=176, num_attention_heads=4,
                  num_key_value_heads=2) if tiny else
             dict(num_hidden_layers=22, hidden_size=2048, intermediate_size=5632,
                  num_attention_heads=32, num_key_value_heads=4))
    return transformers.LlamaConfig(**shape, vocab_size=32000, pad_token_id=2), torch.bfloat16


def build_model(family: str, tiny: bool, device: str):
    """Random weights, seeded, made in their dtype where they live."""
    import transformers

    config, dtype = model_config(family, tiny)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def prompts(vocab_size: int, batch: int, calls: int, device: str) -> list[tuple]:
    """(ids, attention mask) of each call: `calls` times the prompt, then the longer prompt's."""
    g = torch.Generator(device="cpu").manual_seed(1)
    short, longer = (torch.randint(0, vocab_size, (batch, n), generator=g).to(device)
                     for n in (PROMPT, LONGER_PROMPT))
    return ([(short, torch.ones_like(short))] * calls
            + [(longer, torch.ones_like(longer))] * LONGER_CALLS)


def timed_calls(model, inputs: Sequence[tuple], kwargs: dict, counters: harness.Counters,
                desc: str) -> tuple[list[float], list, list[dict]]:
    """model.generate once per (ids, mask) of `inputs`: each call's wall ms, its tokens, and how
    much each of `counters` changed in it."""
    ms, outputs, changes = [], [], []
    for ids, mask in harness.progress(inputs, desc):
        tokens, seconds = harness.timed(lambda: model.generate(ids, attention_mask=mask, **kwargs))
        ms.append(seconds * 1e3)
        outputs.append(tokens)
        changes.append(counters.change())
    return ms, outputs, changes


def dynamo_graphs() -> dict:
    from torch._dynamo.utils import counters

    return {"compiles": counters["stats"]["unique_graphs"]}


# Pure helpers, from the per-call figures (tests/python/test_time_to_speed.py).

def per_call(changes: Sequence[dict], key: str, scale: float = 1) -> list:
    """`key`'s change in each call (0 where it is missing), times `scale`."""
    return [change.get(key, 0) * scale for change in changes]


def call_times(ms: Sequence[float], calls: int, new_tokens: int) -> dict:
    """A mode's times from every call's wall ms: `calls` with the prompt, then the longer's."""
    same = list(ms[:calls])
    steady = statistics.median(same[-min(STEADY_CALLS, calls - 1):])
    return {"ms_per_step": steady / new_tokens, "calls_ms": same,
            "longer_prompt_calls_ms": list(ms[calls:]),
            "cumulative_ms": list(itertools.accumulate(ms)),
            "first_call_ms": same[0], "steady_ms": steady}


def grape_figures(changes: Sequence[dict], calls: int) -> dict:
    """grape's counters and times per call, from the change of grape.stats in each call."""
    figures = {"calls_to_steady": harness.steady_by_counters(changes[:calls])}
    figures.update({f"{key}_per_call": per_call(changes, key) for key in COUNTERS})
    figures["longer_prompt_captures"] = sum(per_call(changes[calls:], "captures"))
    figures["breakdown_ms_per_call"] = {key.removesuffix("_seconds"): per_call(changes, key, 1e3)
                                        for key in BREAKDOWN}
    # grape's own work per capture: a capture's time but the function's own.
    breakdown, captures = figures["breakdown_ms_per_call"], figures["captures_per_call"]
    figures["own_ms_per_capture_per_call"] = [
        (all_ms - function_ms) / n if n else None
        for all_ms, function_ms, n in zip(breakdown["capture"], breakdown["capture_function"],
                                          captures)]
    return figures


def first_call_floor(floor: dict, grape_steady_ms: float, eager_steady_ms: float,
                     new_tokens: int) -> float:
    """What grape's call 1 would cost against eager's steady call if its own work were nothing:
    PyTorch's capture of each decode forward against its eager forward (the capture floor's
    plain_capture_vs_eager_forward, for the new_tokens - 1 forwards after the prompt's), plus a
    replayed call against eager's (the GPU work that a call that captures runs after each
    capture, where eager overlaps it with launching)."""
    return (floor["plain_capture_vs_eager_forward"] * (new_tokens - 1) / new_tokens
            + grape_steady_ms / eager_steady_ms)


def capture_ms_median(entries: Sequence[dict]) -> float | None:
    """The median over signatures of what capturing one cost (every try, joining included;
    chain variants left out), from grape.stats' entries; None where none was captured."""
    costs = [(e["seconds"]["capture"] - e["seconds"]["variants"]) * 1e3 for e in entries
             if e.get("state") == "graph"]
    return statistics.median(costs) if costs else None


def against_eager(mode_ms: Sequence[float], eager_ms: Sequence[float],
                  eager_steady_ms: float) -> dict:
    """A mode's calls with the prompt against eager's (calls_ms of each, and eager's steady_ms),
    and its call 3 against its call 2."""
    return {"eager_steady_ms": eager_steady_ms,
            "first_call_vs_eager_steady": mode_ms[0] / eager_steady_ms,
            "first_call_vs_eager_first": mode_ms[0] / eager_ms[0],
            "second_call_speedup_vs_eager": eager_steady_ms / mode_ms[1],
            "third_call_vs_second": mode_ms[2] / mode_ms[1] if len(mode_ms) > 2 else None,
            "cumulative_2_vs_eager": (mode_ms[0] + mode_ms[1]) / (eager_ms[0] + eager_ms[1])}


# Figures of a mode taken as their median over rounds (median_over_rounds), each round's listed.
ROUND_MEDIANS = ("eager_steady_ms", "first_call_vs_eager_steady", "first_call_vs_eager_first",
                 "second_call_speedup_vs_eager", "third_call_vs_second",
                 "cumulative_2_vs_eager", "capture_vs_eager_forward", "speedup_vs_eager",
                 "capture_ms_median")


def median_over_rounds(runs: Sequence[dict], calls: int, new_tokens: int) -> dict:
    """One mode's result over the rounds of its case (module docstring, --rounds): a round that
    failed stands for them all."""
    if len(runs) == 1:
        return runs[0]
    failed = [run for run in runs if "error" in run]
    if failed:
        return failed[0]
    result = dict(runs[0])
    each_call = zip(*(run["calls_ms"] + run["longer_prompt_calls_ms"] for run in runs))
    result.update(call_times([statistics.median(ms) for ms in each_call], calls, new_tokens))
    result["calls_ms_rounds"] = [run["calls_ms"] for run in runs]
    if "captures_per_call" not in result:  # grape's comes from its counters, the same each round
        result["calls_to_steady"] = harness.steady_by_time(result["calls_ms"])
    for key in ROUND_MEDIANS:
        values = [run[key] for run in runs if run.get(key) is not None]
        if values:
            result[key], result[f"{key}_rounds"] = statistics.median(values), values
    if "breakdown_ms_per_call" in result:
        result["breakdown_ms_per_call"] = {
            key: [statistics.median(ms) for ms in zip(*(run["breakdown_ms_per_call"][key]
                                                         for run in runs))]
            for key in result["breakdown_ms_per_call"]}
    not_correct = [run.get("correct") for run in runs if run.get("correct") is not True]
    if not_correct:
        result["correct"] = not_correct[0]
    return result


def calls_equal(outputs: Sequence, reference: Sequence) -> dict:
    """compare_with_eager's check: each call's tokens against eager's same call's."""
    equal = [harness.outputs_equal(o, r) for o, r in zip(outputs, reference)]
    return {"correct": len(outputs) == len(reference) and all(equal), "calls_equal": equal}


def run_mode(mode: str, base, case: dict) -> dict:
    model, kwargs, counters = copy.deepcopy(base), case["kwargs"], harness.Counters(dict)
    if mode == "static_compile":
        torch._dynamo.reset()
        kwargs = dict(kwargs, cache_implementation="static")
        counters = harness.Counters(dynamo_graphs)
    elif mode.startswith("grape"):
        model = grape.compile(model, plan_free_attention=mode.startswith("grape_plan_free"),
                              alias_prediction=not case["no_alias_prediction"],
                              cache_dir=os.environ.get(CACHE_VARIABLE) if mode in CACHED_MODES
                              else False)
        counters = harness.GrapeCounters(model, COUNTERS + BREAKDOWN)
    # grape's own choice of backends (grape/_attention.py), so that the same kernels run.
    with (_attention.plan_free_attention() if mode == SAME_ATTENTION
          else contextlib.nullcontext()):
        ms, outputs, changes = timed_calls(model, case["inputs"], kwargs, counters, mode)
    if mode in CACHED_MODES:
        grape.save_graph_cache(model)  # now, so that its figures are in this run's JSON
    calls = case["calls"]
    result = {**call_times(ms, calls, kwargs["max_new_tokens"]), "outputs": outputs,
              "numerics_may_differ": "plan_free" in mode}
    if mode.startswith("grape"):
        result.update(**grape_figures(changes, calls),
                      **harness.grape_stats(model, ("graphs", "fallbacks", "graph_cache")))
        entries = grape.stats(model)["entries"]
        # Which signatures were captured more than once (their signatures, cut short).
        result["signatures_with_variants"] = [
            e["signature"][:SIGNATURE_CHARS] for e in entries if e.get("chain_variants")]
        result["capture_ms_median"] = capture_ms_median(entries)
    else:
        result["calls_to_steady"] = harness.steady_by_time(result["calls_ms"])
    if mode == "static_compile":
        # HF compiles the decoding forward by itself when the cache is static (its auto-compile).
        result.update(compiles_per_call=per_call(changes, "compiles"),
                      compiled_by_hf=hasattr(model, "_compiled_call"))
    return result


def capture_floor(model, ids, mask, reps: int = CAPTURE_FLOOR_REPS) -> dict:
    """One decode forward of `model` after the prompt (ids, mask), with a fresh copy of the
    prompt's cache each time: its host ms eagerly, and capturing it into a torch.cuda.CUDAGraph
    (then instantiating it), medians over `reps` after one of each, alternating."""
    out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    position = torch.full((ids.shape[0], 1), ids.shape[1], device=ids.device)
    step = dict(input_ids=out.logits[:, -1:].argmax(-1),
                attention_mask=torch.cat([mask, torch.ones_like(mask[:, :1])], 1),
                position_ids=position, cache_position=position[0], use_cache=True)
    stream = torch.cuda.Stream()

    def eager() -> float:
        cache = copy.deepcopy(out.past_key_values)
        return harness.timed(lambda: model(past_key_values=cache, **step))[1] * 1e3

    def captured() -> tuple[float, float]:
        cache = copy.deepcopy(out.past_key_values)
        graph = torch.cuda.CUDAGraph(keep_graph=True)  # instantiated apart, below
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.graph(graph, stream=stream):
            model(past_key_values=cache, **step)
        t1 = time.perf_counter()
        graph.instantiate()
        t2 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3

    eager_ms, capture_ms, instantiate_ms = [], [], []
    for rep in range(reps + 1):
        forward_ms, (graph_ms, exec_ms) = eager(), captured()
        if rep > 0:
            eager_ms.append(forward_ms)
            capture_ms.append(graph_ms)
            instantiate_ms.append(exec_ms)
    floor = {"eager_forward_ms": statistics.median(eager_ms),
             "plain_capture_ms": statistics.median(capture_ms),
             "plain_instantiate_ms": statistics.median(instantiate_ms)}
    floor["plain_capture_vs_eager_forward"] = floor["plain_capture_ms"] / floor["eager_forward_ms"]
    return floor


def run_case(base, model: str, name: str, batch: int, calls: int, new_tokens: int,
             modes: Sequence[str], device: str, cold: bool = False, rounds: int = 1,
             warm_up: bool = True, no_alias_prediction: bool = False) -> dict:
    inputs = prompts(base.config.vocab_size, batch, calls, device)
    case = {"inputs": inputs, "kwargs": generation.generate_kwargs(1, new_tokens), "calls": calls,
            "no_alias_prediction": no_alias_prediction}
    warmup = {}
    for path in (["eager"] + (["grape"] if "grape" in modes else []) if warm_up else []):
        throwaway = copy.deepcopy(base)
        if path == "grape":
            grape.compile(throwaway, cache_dir=False)
        # grape's throwaway calls the prompt twice: its second call captures the prompt's
        # signature (the first warms up), which needs cuDNN plans of its own.
        first_use = [inputs[0]] * (2 if path == "grape" else 1) + [inputs[-1]]
        warmup[path], _, _ = timed_calls(throwaway, first_use, case["kwargs"],
                                         harness.Counters(dict), f"process warm-up ({path})")
        del throwaway
        harness.clear_memory()
    each_round = []
    for _ in range(rounds):
        results = harness.run_modes(modes, lambda mode: run_mode(mode, base, case))
        if cold and len(modes) == 1:
            # One mode of a cold run (main): its tokens go to the file, compared there.
            for result in results.values():
                if result.get("outputs") is not None:
                    result["tokens"] = [o.tolist() for o in result["outputs"]]
        compare_modes(results, new_tokens)
        each_round.append(results)
    results = {mode: median_over_rounds([r[mode] for r in each_round], calls, new_tokens)
               for mode in each_round[0]}
    floor = None
    if device == "cuda" and "grape" in modes:
        floor = capture_floor(base, *inputs[0])
        grape_result, eager_result = results.get("grape", {}), results.get("eager", {})
        if grape_result.get("capture_ms_median") is not None:
            floor["grape_capture_vs_plain"] = (grape_result["capture_ms_median"]
                                               / floor["plain_capture_ms"])
        if grape_result.get("steady_ms") and eager_result.get("steady_ms"):
            floor["first_call_vs_eager_steady"] = first_call_floor(
                floor, grape_result["steady_ms"], eager_result["steady_ms"], new_tokens)
        print(f"  capture floor: {floor}", flush=True)
    config = {"model": model, "dtype": str(base.dtype).removeprefix("torch."),
              "layers": base.config.num_hidden_layers, "hidden": base.config.hidden_size,
              "batch": batch, "prompt": PROMPT, "longer_prompt": LONGER_PROMPT,
              "new_tokens": new_tokens, "calls": calls, "longer_prompt_calls": LONGER_CALLS,
              "rounds": rounds,
              "process_warmup_ms": warmup if warm_up else None, "cold": cold,
              "device": device}
    return {"name": name, "config": config, "modes": results, "capture_floor": floor}


def compare_modes(results: dict[str, dict], new_tokens: int) -> None:
    """Each mode's result against eager's, in place: tokens (compare_with_eager with calls_equal)
    and against_eager's ratios of its calls, and a capture's cost in eager forwards; a plan-free
    mode's tokens also against eager_plan_free's where it ran (correct_same_attention)."""
    same = results.get(SAME_ATTENTION, {}).get("outputs")
    for mode, result in results.items():
        if mode.startswith("grape_plan_free") and same is not None and "outputs" in result:
            check = calls_equal(result["outputs"], same)
            result.update(correct_same_attention=check["correct"],
                          calls_equal_same_attention=check["calls_equal"])
    harness.compare_with_eager(results, calls_equal)
    eager_ms = results.get("eager", {}).get("calls_ms")
    for mode, result in results.items():
        if mode != "eager" and eager_ms and result.get("calls_ms"):
            result.update(against_eager(result["calls_ms"], eager_ms,
                                        results["eager"]["steady_ms"]))
            if result.get("capture_ms_median") is not None:
                # One eager forward: a generate call runs one per new token (the prompt's first).
                forward_ms = results["eager"]["steady_ms"] / new_tokens
                result["capture_vs_eager_forward"] = result["capture_ms_median"] / forward_ms


def without_flags(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """`argv` without the options `flags` and their values (`--flag value` or `--flag=value`)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f + "=" for f in flags)):
            kept.append(arg)
    return kept


def cold_processes(argv: Sequence[str], modes: Sequence[str], out: Path) -> list[dict]:
    """--cold over several modes: each mode in a fresh process of its own (this script, run with
    that mode alone, writing under `out`), then one case list with every mode's figures, compared
    with eager's as in one process (their tokens travel in the files)."""
    runs = []
    for mode in modes:
        env = dict(os.environ)
        env.pop(CACHE_VARIABLE, None)
        passes = ["measured"]
        if mode in CACHED_MODES:
            # A first process of the mode fills the cache directory; the second is measured.
            env[CACHE_VARIABLE] = str(out / f"{mode}-cache")
            passes = ["filling", "measured"]
        written = {}
        for kind in passes:
            folder, args = out / mode / kind, [*argv, "--modes", mode]
            print(f"cold process for {mode} ({kind}): -m benchmarks.time_to_speed "
                  f"{' '.join(args)} --out {folder}", flush=True)
            written[kind] = harness.fresh_process_cases("benchmarks.time_to_speed", args, folder,
                                                        env=env)
        cases = written["measured"]
        if mode in CACHED_MODES:
            for case, filling in zip(cases, written["filling"]):
                case["modes"][mode]["filling_graph_cache"] = (
                    filling["modes"][mode].get("graph_cache"))
        runs.append(cases)
    cases = []
    for per_mode in zip(*runs):
        case = dict(per_mode[0], modes={})
        for run in per_mode:
            case["modes"].update(run["modes"])
            case["capture_floor"] = case.get("capture_floor") or run.get("capture_floor")
        for result in case["modes"].values():
            tokens = result.pop("tokens", None)
            if tokens is not None:
                result["outputs"] = [torch.tensor(t) for t in tokens]
        case["config"] = dict(case["config"], processes="one per mode")
        compare_modes(case["modes"], case["config"]["new_tokens"])
        cases.append(case)
    return cases


def list_column(header: str, key: str, pick: Callable[[list], object],
                template: str) -> tuple[str, Callable[[dict], str]]:
    """A column of harness.markdown_table: pick(a mode's list under `key`) in `template`."""
    return header, lambda result: harness.formatted(
        pick(result[key]) if result.get(key) else None, template)


def joined(values: Sequence, template: str = "{}") -> str:
    return " ".join(template.format(v) for v in values)


def markdown(cases: list[dict]) -> str:
    """One row per case and mode: each call's ms, cumulative ms after 2 and after all calls with
    the prompt, the longer prompt's calls, calls to steady, grape's captures per call (those of
    the longer prompt's after "/"), correct."""
    calls = cases[0]["config"]["calls"]
    return harness.markdown_table(cases, [
        *(list_column(f"call {i + 1} ms", "calls_ms", operator.itemgetter(i), "{:.1f}")
          for i in range(calls)),
        list_column("cum. 2 ms", "cumulative_ms", operator.itemgetter(1), "{:.1f}"),
        list_column(f"cum. {calls} ms", "cumulative_ms", operator.itemgetter(calls - 1), "{:.1f}"),
        list_column("longer prompt ms", "longer_prompt_calls_ms",
                    lambda ms: joined(ms, "{:.1f}"), "{}"),
        harness.value_column("calls to steady", "calls_to_steady", "{}"),
        list_column("captures per call", "captures_per_call",
                    lambda n: f"{joined(n[:calls])} / {joined(n[calls:])}", "{}"),
        harness.CORRECT_COLUMN])


def plot(cases: list[dict], path: Path, modes: Sequence[str], title: str) -> bool:
    """Cumulative wall time against calls, one line per mode, one panel per case; a dashed line
    where the longer prompt's calls begin. False where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 4), squeeze=False)
    for ax, case in zip(axes[0], cases):
        for mode in modes:
            cumulative = case["modes"].get(mode, {}).get("cumulative_ms")
            if cumulative:
                ax.plot(range(1, len(cumulative) + 1), [ms / 1e3 for ms in cumulative],
                        marker="o", label=mode)
        ax.axvline(case["config"]["calls"] + 0.5, color="gray", linestyle="dashed",
                   label="longer prompt from here")
        ax.set_title(case["name"])
        ax.set_xlabel("call")
        ax.set_ylabel("cumulative wall time (s)")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main(argv=None):
    parser = harness.argument_parser(
        __doc__, MODES, "smoke run: 16 new tokens, only gpt2-b1 unless --cases names others",
        tiny_help="2-layer models of width 64 instead of GPT-2 small and the 1.1B Llama")
    parser.add_argument("--cases", default=None,
                        help=f"comma-separated, from: {', '.join(CASES)} (default all; --quick: "
                             f"{QUICK_CASES})")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 128, --quick 16")
    parser.add_argument("--no-warmup", action="store_true",
                        help="no process warm-up: the modes in turn in this process, the first "
                             "paying the process's first-use costs")
    parser.add_argument("--cold", action="store_true",
                        help="no process warm-up, and each mode in a fresh process of its own "
                             "(figures merged into one file)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run each case's modes this many times in turn; figures are medians "
                             "over the rounds (module docstring)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a check of the script itself, with --tiny")
    parser.add_argument("--no-alias-prediction", action="store_true",
                        help="grape modes compiled with alias_prediction=False")
    args, modes = harness.parse(parser, argv, ALL_MODES, None)
    if set(modes) & set(CACHED_MODES) and not args.cold and not os.environ.get(CACHE_VARIABLE):
        parser.error(f"{', '.join(CACHED_MODES)} run with --cold (a process fills the cache, a "
                     "fresh one is measured)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(NEEDS)
    if args.reps < 2:
        parser.error("--reps (here: calls with the prompt) must be at least 2")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    names = (args.cases or (QUICK_CASES if args.quick else ",".join(CASES))).split(",")
    if set(names) - set(CASES):
        parser.error(f"unknown cases {sorted(set(names) - set(CASES))}; choose from {list(CASES)}")
    new_tokens = args.new_tokens or (16 if args.quick else 128)
    warnings.simplefilter("ignore", grape.FallbackWarning)  # they are in the JSON
    name = ("time_to_speed" + ("-quick" if args.quick else "") + ("-cold" if args.cold else "")
            + ("-no-warmup" if args.no_warmup and not args.cold else ""))
    if args.cold and len(modes) > 1:
        argv = without_flags(sys.argv[1:] if argv is None else argv, ("--modes", "--out"))
        with tempfile.TemporaryDirectory() as folder:
            cases = cold_processes(argv, modes, Path(folder))
        path = harness.write_results(name, cases, args.out, device=args.device)
        harness.write_table_and_plot(
            path, markdown(cases),
            lambda png: plot(cases, png, ALL_MODES, "HF generate, one process per mode"))
        return cases
    cases, family, base = [], None, None
    with torch.no_grad():
        for case_name in names:
            if CASES[case_name][0] != family:
                family, base = CASES[case_name][0], None  # one model at a time
                harness.clear_memory()
                base = build_model(family, args.tiny, args.device)
            print(f"{case_name}:", flush=True)
            cases.append(run_case(base, MODEL_NAMES[family][args.tiny], case_name,
                                  CASES[case_name][1], args.reps, new_tokens, modes, args.device,
                                  args.cold, args.rounds,
                                  warm_up=not (args.cold or args.no_warmup),
                                  no_alias_prediction=args.no_alias_prediction))
            print(markdown(cases[-1:]), flush=True)
            path = harness.write_results(name, cases, args.out, device=args.device)
    harness.write_table_and_plot(
        path, markdown(cases),
        lambda png: plot(cases, png, MODES, "HF generate: cumulative wall time per call"))
    return cases


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
