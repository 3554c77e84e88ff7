"""What every benchmark of the project shares: timing, memory, environment, running its modes, the
results file, and the markdown table (and, outside benchmarks/results, the PNG plot) written next
to it.

Results format (one JSON file per benchmark, variant and card, benchmarks/results/<benchmark>-<gpu>.json;
a later run replaces it, and git keeps the runs before):
  {"benchmark", "device", "torch", "cuda", "commit", "date", "cases": [
      {"name", "config": {...}, "modes": {"<mode>": {"ms_per_step", "gpu_mem_bytes", "correct", ...}}}]}

One name per kind of figure, in every benchmark's modes:
  ms_per_step         wall time per step (a decode step, that is one new token; a training or
                      inference step; a call), the median over the timed runs; ms_per_step_runs
                      each run's
  first_call_s        wall time of the mode's first call or generation, capture or compilation in it
  time_to_steady_s    wall time of every call before the first one from which each call runs
                      steady (grape: no warm-up, capture or eager call; modes without counters:
                      within STEADY_TOLERANCE of their steady time); calls_to_steady that call's
                      number (1: steady from the first call)
  setup_s             wall time until the mode is steady (every shape captured)
  gpu_mem_bytes       the mode's device memory (each benchmark says which); peak_allocated_bytes
                      the allocator's peak
  speedup_vs_<mode>   <mode>'s ms_per_step over this mode's (speedup_vs_eager, ...: higher is faster)
  ratio_to_<bound>    this mode's ms_per_step over a bound's (ideal, ptgraph, floor: 1.0 is the bound)
  <figure>_ratio_to_<mode>  another figure over <mode>'s (mem_ratio_to_eager: gpu_mem_bytes)
  correct             outputs match eager's (True / False), "reference" for eager itself, None where
                      not compared; how closely is in kind-specific fields beside it
compare_with_eager fills in the comparison with eager.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Where runs whose figures are not results go by default: on the CPU, or of a tiny model.
LOCAL_RESULTS_DIR = Path(__file__).resolve().parent.parent / "build" / "results"


def environment(device: str = "cuda") -> dict:
    """Where a run ran (`device`: the one its tensors were on) and with what."""
    cuda = device == "cuda" and torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
    }


def commit() -> str:
    if os.environ.get("GRAPE_COMMIT"):
        return os.environ["GRAPE_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL, cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def argument_parser(doc: str, modes: list[str], quick_help: str,
                    tiny_help: str = "a 2-layer GPT-2 instead of GPT-2 small") -> argparse.ArgumentParser:
    """The options every benchmark takes; a script adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5,
                        help="timed repetitions; a figure is their median (default %(default)s)")
    parser.add_argument("--modes", default=",".join(modes), help="comma-separated, from: " + ", ".join(modes))
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--tiny", action="store_true", help=tiny_help)
    parser.add_argument("--out", default=None,
                        help="results directory (default: benchmarks/results for a GPU run, "
                        "build/results for a run on the CPU or with --tiny; GRAPE_RESULTS_DIR "
                        "overrides it)")
    return parser


def parse(parser: argparse.ArgumentParser, argv, modes: list[str], needs: str | None):
    """Parsed arguments and the chosen modes; exits with `needs` where there is no CUDA device
    (None: the run needs none)."""
    args = parser.parse_args(argv)
    if needs is not None and not torch.cuda.is_available():
        raise SystemExit(needs)
    chosen = args.modes.split(",")
    unknown = set(chosen) - set(modes)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {modes}")
    return args, chosen


def skip_unpadded_masks_while_capturing() -> list[str]:
    """Every stream capture on this thread, for the rest of the process, skips an unpadded batch's
    attention mask as eager calls do, plain CUDA graphs (ptgraph modes) included, so that every
    mode runs the kernel eager runs; returns the names of the transformers mask rules this needed
    (none on releases that skip it already). grape's own captures do so anyway (Note [Masks of
    unpadded batches under capture] in grape/_masks.py)."""
    try:
        import transformers.masking_utils  # noqa: F401  (the rules are wrapped once it is imported)
    except ImportError:
        return []
    from grape import _masks

    if not _PROCESS_CONTEXTS:
        _PROCESS_CONTEXTS.append(_masks.eager_mask_rules())
        _PROCESS_CONTEXTS[-1].__enter__()  # left for the rest of the process
    return _masks.rules_changed()


# The context entered for the rest of the process, held so that it is never collected (its exit
# would then run).
_PROCESS_CONTEXTS: list = []


def clear_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def free_bytes() -> int:
    """Free device memory as the driver sees it (graphs' own memory included)."""
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def rss_bytes() -> int:
    """Resident host memory of this process."""
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def time_ms(fn: Callable[[], object], reps: int) -> list[float]:
    """Wall time of `fn` on the device, in ms, once per repetition (call fn once before: warm-up)."""
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


# Kernels of matrix products (cuBLAS's and CUTLASS's names), for kernel_ms's matmul_kernel_ms.
MATMUL_KERNELS = ("gemm", "gemv", "nvjet", "cutlass", "splitk", "xmma")


def kernel_ms(run: Callable[[], object]) -> dict:
    """GPU time of the kernels and memory operations `run()` launches, measured with
    torch.profiler: {"kernel_ms", "matmul_kernel_ms" (of it, matrix products), "kernels" (how
    many)}. A graph of that work launches the same kernels, so it runs no faster than kernel_ms.
    It is a sum of durations: check it against a graph's replay time before relying on it (over
    wav2vec2's eager steps it came out above their wall time, so hf_wav2vec2 does not use it)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    us = [e.time_range.elapsed_us() for e in kernels]
    matmul = [u for e, u in zip(kernels, us) if any(k in e.name.lower() for k in MATMUL_KERNELS)]
    return {"kernel_ms": sum(us) / 1e3, "matmul_kernel_ms": sum(matmul) / 1e3,
            "kernels": len(kernels)}


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """fn's result and its wall time in seconds, the device synchronized before and after (where
    CUDA is in use: a CPU smoke run has none to wait for)."""
    synchronize = torch.cuda.synchronize if torch.cuda.is_initialized() else lambda: None
    synchronize()
    t0 = time.perf_counter()
    out = fn()
    synchronize()
    return out, time.perf_counter() - t0


def progress(iterable: Iterable, desc: str, total: int | None = None) -> Iterable:
    """A tqdm progress bar where tqdm is installed and the output is a terminal (a log keeps
    no bar's redrawn lines)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False, mininterval=0.5, disable=None)


class PerShapeGraphs:
    """The plain CUDA-graph baseline: one torch.cuda.CUDAGraph per input shape, inputs copied into
    the graph's static tensors before each replay. Each graph has a private pool (PyTorch's
    default), or all share `pool` (torch.cuda.graph_pool_handle()): safe in any replay order,
    since a graph's outputs stay allocated and the static inputs live outside the pool, but only
    while no output is held across a replay of another graph. `executable_bytes`: the device
    memory its executables took as the driver saw it: what each capture and first replay took
    beyond PyTorch's own reservations."""

    def __init__(self, fn, pool=None):
        self.fn, self.pool, self.graphs, self.stream = fn, pool, {}, torch.cuda.Stream()
        self.executable_bytes = 0

    def __call__(self, *inputs):
        key = tuple((t.shape, t.dtype) for t in inputs)
        entry = self.graphs.get(key)
        new = entry is None
        if new:
            static = [t.clone() for t in inputs]
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                self.fn(*static)  # warm-up, as torch.cuda.graph's documentation asks
            torch.cuda.current_stream().wait_stream(self.stream)
            free, reserved = free_bytes(), torch.cuda.memory_reserved()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.fn(*static)
            entry = self.graphs[key] = (graph, static, outputs)
        graph, static, outputs = entry
        for s, t in zip(static, inputs):
            s.copy_(t)
        graph.replay()  # the first one uploads the executable
        if new:
            taken = free - free_bytes() - (torch.cuda.memory_reserved() - reserved)
            self.executable_bytes += max(0, taken)
        # Outputs are overwritten by the next replay of this graph: hand out copies.
        return tuple(o.clone() for o in outputs) if isinstance(outputs, tuple) else outputs.clone()


def grape_stats(fn, keys: Sequence[str]) -> dict:
    """The `keys` of grape.stats(fn) that the running build has; the fallbacks' call sites and the
    graph cache's file named without the machine's paths (results files are committed)."""
    import grape

    s = grape.stats(fn)
    picked = {k: s[k] for k in keys if k in s}
    if "fallbacks" in picked:
        picked["fallbacks"] = portable_fallbacks(picked["fallbacks"])
    if picked.get("graph_cache"):  # the file by its name alone: the directory is the machine's
        cache = dict(picked["graph_cache"])
        cache["file"] = os.path.basename(cache["file"])
        picked["graph_cache"] = cache
    return picked


def portable_fallbacks(fallbacks: list[dict]) -> list[dict]:
    """grape.stats' fallbacks, their call sites without the machine's paths."""
    return [dict(f, call_site=portable_path(f["call_site"])) for f in fallbacks]


def portable_path(where: str) -> str:
    """A "file:line" of this project relative to its root, and of an installed package from the
    package's folder on (transformers/generation/utils.py:3030)."""
    root = str(Path(__file__).resolve().parent.parent) + os.sep
    if where.startswith(root):
        return where[len(root):]
    marker = "site-packages" + os.sep
    return where.split(marker, 1)[1] if marker in where else where


def median(values: list[float]) -> float:
    return statistics.median(values)


# Steadiness (time_to_steady_s, calls_to_steady).
STEADY_TOLERANCE = 1.25  # modes without counters: steady within this of their steady time
UNSTEADY_COUNTERS = ("warmup_calls", "eager_calls", "captures")  # grape: not steady


def steady_from(unsteady: Sequence[bool]) -> int | None:
    """The first call (from 1) from which no call is unsteady; None where the last one is."""
    return next((call + 1 for call in range(len(unsteady)) if not any(unsteady[call:])), None)


def steady_by_counters(changes: Sequence[dict]) -> int | None:
    """The first call from which no call warms up, runs eagerly or captures (`changes`: each
    call's change of grape.stats' counters)."""
    return steady_from([any(change.get(key, 0) for key in UNSTEADY_COUNTERS)
                        for change in changes])


def steady_by_time(seconds: Sequence[float], steady: float | None = None,
                   tolerance: float = STEADY_TOLERANCE) -> int | None:
    """The first call from which every call takes at most `tolerance` times `steady` (default:
    the fastest call)."""
    limit = tolerance * (min(seconds) if steady is None else steady)
    return steady_from([t > limit for t in seconds])


def time_to_steady(seconds: Sequence[float], steady_at: int | None) -> dict:
    """time_to_steady_s and calls_to_steady from each call's wall time and the first steady call
    (None: not steady by the last call, whose time then counts too)."""
    before = len(seconds) if steady_at is None else steady_at - 1
    return {"time_to_steady_s": sum(seconds[:before]), "calls_to_steady": steady_at}


class Counters:
    """How much each value of `read()` (a dict of numbers) changed since the last change() (or
    since construction): read it after each call or epoch."""

    def __init__(self, read: Callable[[], dict]):
        self.read = read
        self.last = read()
        self.changes: list[dict] = []  # every change(), in order

    def change(self) -> dict:
        now = self.read()
        change = {key: value - self.last.get(key, 0) for key, value in now.items()}
        self.last = now
        self.changes.append(change)
        return change


class GrapeCounters(Counters):
    """Counters of grape.stats(fn)'s `keys` (0 where the running build lacks one); by default
    those that tell whether a call ran steady."""

    def __init__(self, fn, keys: Sequence[str] = UNSTEADY_COUNTERS):
        import grape

        super().__init__(lambda: {key: grape.stats(fn).get(key, 0) for key in keys})


def error_text(e: Exception) -> str:
    """How a results file records an exception: its type and message, at most 500 characters."""
    return f"{type(e).__name__}: {e}"[:500]


def run_modes(modes: Iterable[str], run: Callable[[str], dict]) -> dict[str, dict]:
    """Each mode's result by `run(mode)`, in order; a mode that raises gets {"ms_per_step": None,
    "error"}. Device memory is cleared after each mode."""
    results = {}
    for mode in modes:
        print(f"  {mode} ...", flush=True)
        try:
            results[mode] = run(mode)
        except Exception as e:  # a mode that fails is reported, not fatal to the others
            results[mode] = {"ms_per_step": None, "error": error_text(e)}
        clear_memory()
    return results


def speedup(reference: dict, result: dict) -> float | None:
    """How many times faster `result` ran than `reference` (two modes' results): reference's
    ms_per_step over result's; None where either was not timed."""
    if reference.get("ms_per_step") and result.get("ms_per_step"):
        return reference["ms_per_step"] / result["ms_per_step"]
    return None


def outputs_equal(output, reference) -> bool:
    """Whether `output` is `reference` to the bit: tensors of one shape and equal values, lists
    and tuples of them item by item."""
    if isinstance(output, torch.Tensor):
        return isinstance(reference, torch.Tensor) and bool(torch.equal(output, reference))
    if isinstance(output, (list, tuple)):
        return (isinstance(reference, (list, tuple)) and len(output) == len(reference)
                and all(map(outputs_equal, output, reference)))
    return output == reference


def largest_difference(output, reference) -> float | None:
    """The largest absolute difference between the floating-point tensors of `output` and
    `reference` (lists and tuples item by item), elements equal on both sides (infinities and NaNs
    included) counting as 0; None where they differ in structure or shape, hold no floating-point
    tensor, or differ by no finite amount (a NaN or an infinity against a number)."""
    if isinstance(output, torch.Tensor):
        if not isinstance(reference, torch.Tensor) or output.shape != reference.shape or \
                not output.is_floating_point() or output.numel() == 0:
            return None
        o, r = output.double(), reference.double()
        same = (o == r) | (o.isnan() & r.isnan())
        difference = torch.where(same, 0.0, (o - r).abs()).max().item()
        return difference if math.isfinite(difference) else None
    if isinstance(output, (list, tuple)) and isinstance(reference, (list, tuple)) and \
            len(output) == len(reference):
        parts = [largest_difference(o, r) for o, r in zip(output, reference)]
        if parts and all(d is not None for d in parts):
            return max(parts)
    return None


def exactly_equal(output, reference) -> dict:
    """compare_with_eager's default check: correct where the outputs are eager's to the bit; where
    they are not, `max_abs_diff` says by how much floating-point outputs differ (largest_difference)."""
    if outputs_equal(output, reference):
        return {"correct": True}
    difference = largest_difference(output, reference)
    return {"correct": False, **({} if difference is None else {"max_abs_diff": difference})}


def compare_with_eager(results: dict[str, dict],
                       check: Callable[[object, object], dict] = exactly_equal,
                       ratios: Mapping[str, str] | None = None) -> None:
    """Adds to every mode's result in `results` (mode -> result) its comparison with the "eager"
    mode's, in place:
      speedup_vs_eager    eager's ms_per_step over the mode's, where both were timed;
      mem_ratio_to_eager  the mode's gpu_mem_bytes over eager's, where both were measured; and
                          likewise each {figure: name of its ratio} of `ratios`;
      correct             from check(the mode's outputs, eager's outputs) -> {"correct": bool,
                          kind-specific details, added too}; "reference" for eager itself; None
                          where the mode or eager has no outputs (it failed, or was not run).
    A result's outputs are its "outputs" entry, which is removed (results files hold no tensors).
    Without an eager result, only `correct` is added: None."""
    eager = results.get("eager")
    reference = eager.get("outputs") if eager is not None else None
    ratios = {"gpu_mem_bytes": "mem_ratio_to_eager", **(ratios or {})}
    for mode, result in results.items():
        output = result.pop("outputs", None)
        if output is None or reference is None:
            result["correct"] = None
        elif mode == "eager":
            result["correct"] = "reference"
        else:
            details = check(output, reference)
            result.update(details, correct=bool(details["correct"]))
        if eager is None:
            continue
        times = speedup(eager, result)
        if times is not None:
            result["speedup_vs_eager"] = times
        for figure, name in ratios.items():
            if eager.get(figure) and result.get(figure) is not None:
                result[name] = result[figure] / eager[figure]


def exit_status(cases: list[dict]) -> int:
    """1 where a mode of any case failed (its error is in the results) or computed results that
    differ from eager's ("correct" False, unless the mode is an opt-in that may round otherwise:
    "numerics_may_differ" True), else 0: a run whose modes fail is reported in full, then fails,
    so that smoke runs catch it."""
    failed = [f"{case['name']}/{mode}" + ("" if r.get("error") else " (results differ from eager)")
              for case in cases for mode, r in case.get("modes", {}).items()
              if r.get("error") or (r.get("correct") is False and not r.get("numerics_may_differ"))]
    if failed:
        print(f"failed modes: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


def write_results(benchmark: str, cases: list[dict], out_dir: Path | None = None,
                  device: str = "cuda") -> Path:
    """Writes `<benchmark>-<card>.json` (card: the GPU's short name, or cpu for a run on the CPU,
    whatever the machine has)."""
    env = environment(device)
    gpu = env["device"].replace("NVIDIA ", "").split()[0].lower() if env["device"] != "cpu" else "cpu"
    local = gpu == "cpu" or "-tiny" in benchmark  # smoke runs of the script, not results
    out_dir = Path(out_dir or os.environ.get("GRAPE_RESULTS_DIR")
                   or (LOCAL_RESULTS_DIR if local else RESULTS_DIR))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{benchmark}-{gpu}.json"
    path.write_text(json.dumps({"benchmark": benchmark, **env, "cases": cases}, indent=2) + "\n")
    return path


def fresh_process_cases(module: str, args: Sequence[str], out: Path,
                        env: Mapping[str, str] | None = None, check: bool = True,
                        quiet: bool = False) -> list[dict]:
    """The cases that `python -m <module> <args> --out <out>` writes, run in a fresh process of
    its own (what a benchmark measures cold, or keeps apart): its one results file under `out`.
    `check`: a child that exits with an error raises; else only one that wrote no results does.
    `quiet`: its standard output is dropped."""
    command = [sys.executable, "-m", module, *args, "--out", str(out)]
    done = subprocess.run(command, check=check, cwd=Path(__file__).resolve().parent.parent,
                          env=env, stdout=subprocess.DEVNULL if quiet else None)
    written = list(Path(out).glob("*.json"))
    if len(written) != 1:
        raise RuntimeError(f"{' '.join(command[1:])}: no results written "
                           f"(exit status {done.returncode})")
    return json.loads(written[0].read_text())["cases"]


def print_table(case: dict) -> None:
    """A case's modes on stdout: time per step, speed-up, device memory, correctness."""
    print(f"\n{case['name']}  {json.dumps(case['config'])}")
    print(f"{'mode':<20}{'ms_per_step':>12}{'vs eager':>10}{'GPU MB':>10}  correct")
    for name, m in case["modes"].items():
        print(f"{name:<20}{formatted(m.get('ms_per_step'), '{:.3f}'):>12}"
              f"{formatted(m.get('speedup_vs_eager'), '{:.2f}x'):>10}{gpu_mebibytes(m):>10}"
              f"  {formatted(m.get('correct'), '{}')}")


def formatted(value, template: str) -> str:
    """`value` in `template` ("{:.2f}x"); "-" where there is none."""
    return template.format(value) if value is not None else "-"


def gpu_mebibytes(result: dict) -> str:
    """A mode's gpu_mem_bytes in MiB, for tables."""
    nbytes = result.get("gpu_mem_bytes")
    return formatted(nbytes / 2**20 if nbytes is not None else None, "{:.1f}")


def value_column(header: str, key: str, template: str) -> tuple[str, Callable[[dict], str]]:
    """A column of markdown_table: the value of `key` in a mode's result, in `template`."""
    return header, lambda result: formatted(result.get(key), template)


# Columns of markdown_table with compare_with_eager's figures, the same in every benchmark.
STEP_COLUMN = value_column("ms/step", "ms_per_step", "{:.3f}")
SPEEDUP_COLUMN = value_column("vs eager", "speedup_vs_eager", "{:.2f}x")
MEMORY_COLUMNS = (("GPU MB", gpu_mebibytes),
                  value_column("mem vs eager", "mem_ratio_to_eager", "{:.2f}x"))
CORRECT_COLUMN = value_column("correct", "correct", "{}")


def markdown_table(cases: list[dict], columns: Sequence[tuple[str, Callable[[dict], str]]]) -> str:
    """One row per case and mode: the case's name, the mode, then one cell per column, each column
    (header, the cell of a mode's result)."""
    headers = ["case", "mode", *(header for header, _ in columns)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for case in cases:
        for mode, result in case["modes"].items():
            cells = [case["name"], mode, *(cell(result) for _, cell in columns)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bar_plot(path: Path, cases: list[dict], modes: Sequence[str],
             panels: Sequence[tuple[str, str]], title: str, figsize: tuple[float, float],
             mark: Callable[[object, list[tuple[float, float]]], None] | None = None) -> bool:
    """A PNG at `path`: one panel per (metric, y label) of `panels`, in each a group of bars per
    case, one bar per mode; modes with no value of the first panel's metric in any case are left
    out. `mark(axes, spans)` draws more on each panel before its legend, `spans` the x extent of
    each case's group. False where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    first_metric = panels[0][0]
    modes = [m for m in modes if any(c["modes"].get(m, {}).get(first_metric) for c in cases)]
    fig, axes = plt.subplots(1, len(panels), figsize=figsize, squeeze=False)
    width = 0.8 / max(len(modes), 1)
    spans = [(x - width / 2, x + width * (len(modes) - 0.5)) for x in range(len(cases))]
    for ax, (metric, label) in zip(axes[0], panels):
        for i, mode in enumerate(modes):
            values = [c["modes"].get(mode, {}).get(metric) or 0 for c in cases]
            ax.bar([x + i * width for x in range(len(cases))], values, width, label=mode)
        if mark is not None:
            mark(ax, spans)
        ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(cases))])
        ax.set_xticklabels([c["name"] for c in cases])
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    return True


def write_table_and_plot(results: Path, table: str, plot: Callable[[Path], bool]) -> None:
    """The markdown `table` and the PNG that `plot(png path)` draws (False where it drew none) next
    to the results JSON at `results`; no PNG in benchmarks/results, which keeps the figures and
    tables only (docs/results.md indexes them)."""
    table_path, png = results.with_suffix(".md"), results.with_suffix(".png")
    table_path.write_text(table)
    plotted = results.resolve().parent != RESULTS_DIR and plot(png)
    print(f"\nwrote {results}, {table_path.name}" + (f", {png.name}" if plotted else ""))
