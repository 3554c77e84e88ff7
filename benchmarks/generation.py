"""What the benchmarks of Hugging Face `generate` share (hf_gpt2, hf_gptj, hf_gptj_tp): timing a
generation per new token (one decode step), grape's counters, the markdown table and the plot.

A mode's result: {"ms_per_step", "ms_per_step_runs", "first_call_s", "time_to_steady_s",
"calls_to_steady", "calls_ms" (every call's wall time), "outputs" (the tokens), ...};
harness.compare_with_eager compares the tokens with eager's and removes them.
"""

from __future__ import annotations

import functools
import inspect
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from benchmarks import harness

# grape.stats keys that a compiled `generate` records (hf_gpt2 and hf_gptj, mode `grape`).
GRAPE_STATS = ("graphs", "captures", "capture_seconds", "fallbacks", "replays", "calls",
               "topology_groups", "topology_unions", "pool_bytes", "executable_bytes",
               "resident_executables", "cached_executable_bytes", "bytes_copied_in", "alias_hits",
               "alias_misses", "evacuations", "executable_switches", "nodes_patched",
               "patch_seconds", "patches_ahead")


def cache_keyword(model_class) -> str:
    """The keyword a Hugging Face model class's forward takes its KV cache by: `cache` where it has
    one (transformers 5.24 on, where `past_key_values` is deprecated, to go in 5.40), else
    `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else \
        "past_key_values"


def cache_of(output):
    """The KV cache a Hugging Face model's forward returned, under either name."""
    return output["cache"] if "cache" in output else output.past_key_values


def generate_kwargs(beams: int, new_tokens: int) -> dict:
    # min_new_tokens: every mode generates the same number of tokens, EOS or not.
    return dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                num_beams=beams)


def measure(run: Callable[[], torch.Tensor], new_tokens: int, reps: int, steady_calls: int,
            desc: str, counters: harness.GrapeCounters | None = None) -> dict:
    """Times generations by `run()` (which returns the tokens): the first one, then `reps` once
    `steady_calls` more have captured / compiled and recorded every shape. Every call is timed,
    for the time to steady state: with grape's `counters`, the calls before the first from which
    none warms up, captures or runs eagerly; otherwise those before the first from which each
    takes at most harness.STEADY_TOLERANCE times the timed generations' median. `new_tokens`:
    what a call's time is divided by for ms_per_step (a workload of forwards: their count)."""
    seconds, changes = [], []
    for call in harness.progress(range(1 + steady_calls + reps), desc):
        tokens, s = harness.timed(run)
        seconds.append(s)
        changes.append(counters.change() if counters else {})
    times = seconds[1 + steady_calls:]
    steady_at = (harness.steady_by_counters(changes) if counters
                 else harness.steady_by_time(seconds, steady=harness.median(times)))
    return {"ms_per_step": harness.median(times) * 1e3 / new_tokens,
            "ms_per_step_runs": [t * 1e3 / new_tokens for t in times],
            "first_call_s": seconds[0], **harness.time_to_steady(seconds, steady_at),
            "calls_ms": [s * 1e3 for s in seconds], "outputs": tokens}


def measure_generate(model, ids: torch.Tensor, mask: torch.Tensor, kwargs: dict, reps: int,
                     steady_calls: int, desc: str, grape_counters: bool = False) -> dict:
    """measure() of model.generate; `grape_counters`: the model is grape-compiled, and its
    counters tell when it is steady."""
    counters = harness.GrapeCounters(model) if grape_counters else None
    return measure(lambda: model.generate(ids, attention_mask=mask, **kwargs),
                   kwargs["max_new_tokens"], reps, steady_calls, desc, counters)


def host_ms_per_forward(model, ids: torch.Tensor, mask: torch.Tensor, kwargs: dict) -> float:
    """CPU time of one compiled forward call inside generate (the call returns before the GPU is
    done): one more generation with model.forward timed."""
    compiled, spent = model.forward, []

    @functools.wraps(compiled)  # generate reads forward's signature to choose its arguments
    def timed_forward(*args, **kw):
        t0 = time.perf_counter()
        out = compiled(*args, **kw)
        spent.append(time.perf_counter() - t0)
        return out

    model.forward = timed_forward
    try:
        model.generate(ids, attention_mask=mask, **kwargs)
    finally:
        model.forward = compiled
    return harness.median(spent) * 1e3


def decode_loop(step: Callable, config, ids: torch.Tensor, new_tokens: int) -> Callable[[], torch.Tensor]:
    """A generation as a plain loop of `step(tokens, cache) -> next token` over a fresh
    DynamicCache (the `grape_step` modes): returns a function that runs one and returns the
    tokens."""
    import transformers

    def generate() -> torch.Tensor:
        cache = transformers.DynamicCache(config=config)
        tok = step(ids, cache)
        out = [tok]
        for _ in range(new_tokens - 1):
            tok = step(tok, cache)
            out.append(tok)
        return torch.cat([ids, *out], 1)

    return generate


def markdown(cases: list[dict], extra: Sequence[tuple[str, str, str]] = (),
             memory: bool = False) -> str:
    """One row per case and mode; `extra`: more columns after "vs eager", each (header, key of the
    mode's result, template such as "{:.2f}x"); then, with `memory`, device memory and its ratio to
    eager's. `correct`: tokens equal eager's."""
    return harness.markdown_table(cases, [
        harness.STEP_COLUMN, harness.SPEEDUP_COLUMN,
        *(harness.value_column(*column) for column in extra),
        *(harness.MEMORY_COLUMNS if memory else ()),
        harness.value_column("first call (s)", "first_call_s", "{:.2f}"),
        harness.value_column("to steady (s)", "time_to_steady_s", "{:.2f}"),
        harness.CORRECT_COLUMN])


def plot(cases: list[dict], path: Path, modes: Sequence[str], title: str) -> bool:
    """Bars of ms per step (new token), one group per case; a case whose config has
    `floor_ms_per_step` gets it as a dashed line across its group. False where matplotlib is
    missing."""

    def floors(ax, spans: list[tuple[float, float]]) -> None:
        label = "HBM-bandwidth floor"
        for (left, right), case in zip(spans, cases):
            floor = case["config"].get("floor_ms_per_step")
            if floor:
                ax.hlines(floor, left, right, colors="black", linestyles="dashed", label=label)
                label = None  # one legend entry for all the floors

    return harness.bar_plot(path, cases, modes, [("ms_per_step", "ms per step (new token)")], title,
                            (8, 4), mark=floors)
