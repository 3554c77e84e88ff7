"""Inputs the caller allocates between calls (allocation-site prediction, docs/design.md):

  gpt2-cat-b1, gpt2-cat-b8   GPT-2 small greedy decode fed like Hugging Face's generate loop: every
                             step gets input_ids and attention_mask, grown by torch.cat outside the
                             compiled step, plus the KV cache it returned (128 steps, 128 shapes).
  wav2vec2-host-batches      wav2vec2-base's convolutional feature encoder (fp16, batch 8): every
                             call brings a new pinned host batch, .to("cuda", non_blocking=True),
                             of one of 8 lengths (1 to 4 s of 16 kHz audio) in a seeded order.
  hook-overhead              the allocator hook's cost per allocation (torch.empty in a loop).

Modes: eager; ptgraph (one torch.cuda.CUDAGraph per shape, inputs copied into its static
placeholders); grape; grape_copy (grape with alias prediction off). All in one process, same weights
and inputs, outputs compared with eager's (`correct`). A step is one call of the workload's
function (a decode step; an encoder call): `ms_per_step` is the median of --reps passes after
warm-up passes (graph modes: every shape captured; grape: passes until one captures nothing, its
sites learned: `warm_passes`; a graph captured before its input came from a site buffer copies it
until the copies pay for a chain variant, docs/design.md, "Capture") over the calls of a pass;
`speedup_vs_eager` is eager's over the mode's, `ratio_to_ptgraph` the mode's over ptgraph's.
Counters come from one such steady pass.

    python -m benchmarks.alias_sites            # everything
    python -m benchmarks.alias_sites --quick    # smoke run: fewer steps and batches
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

import grape
from benchmarks import harness
from benchmarks.models import gpt2

MODES = ["eager", "ptgraph", "grape", "grape_copy"]


def grape_counters(step, before: dict, calls: int) -> dict:
    s = grape.stats(step)
    d = {k: s[k] - before[k] for k in ("bytes_copied_in", "bytes_evacuated", "bytes_copied_back",
                                        "alias_hits", "alias_misses", "replays", "eager_calls",
                                        "captures", "site_allocations")}
    predicted = d["alias_hits"] + d["alias_misses"]
    return {
        "bytes_copied_per_step": (d["bytes_copied_in"] + d["bytes_evacuated"] + d["bytes_copied_back"]) / calls,
        "input_bytes_copied_per_step": d["bytes_copied_in"] / calls,
        "alias_hits_per_pass": d["alias_hits"],
        "alias_misses_per_pass": d["alias_misses"],
        "alias_hit_rate": d["alias_hits"] / predicted if predicted else None,
        "site_allocations_per_pass": d["site_allocations"],
        "replays_per_pass": d["replays"],
        "captures_per_pass": d["captures"],
        "eager_calls_per_pass": d["eager_calls"],
        "input_sites": s["input_sites"],
        "input_buffer_bytes": s["input_buffer_bytes"],
        "chain_variants": s["chain_variants"],
        "graphs": s["graphs"] + s["chain_variants"],
        "arena_lane_bytes": s["arena_lane_bytes"],
    }


def warm_up(step, mode, run_pass, limit=8) -> int:
    """Passes until the mode's steady state: every call a replay of a graph already captured
    (grape: after learning its sites; chain variants come once copies paid for them). Returns the
    number of passes."""
    if not mode.startswith("grape"):
        for _ in range(2 if mode == "ptgraph" else 1):
            run_pass(step, False)
        return 2 if mode == "ptgraph" else 1
    for passes in range(1, limit + 1):
        before = grape.stats(step)
        run_pass(step, False)
        after = grape.stats(step)
        if all(after[k] == before[k] for k in ("captures", "warmup_calls", "eager_calls")):
            return passes
    return limit


def step_for(mode: str, fn):
    """What each mode calls for the workload's function `fn`."""
    if mode == "eager":
        return fn
    if mode == "ptgraph":
        return harness.PerShapeGraphs(fn)
    return grape.compile(fn, alias_prediction=(mode == "grape"))


def run_modes(name, config, fn, run_pass, calls, reps, modes) -> dict:
    """fn: the workload's function (step_for wraps it per mode); run_pass(step, keep) -> the
    pass's outputs when keep (a tensor
    or list of tensors), else None: timed passes drop each output before the next call, as a
    serving or training loop does (grape would otherwise move held outputs out of its pool)."""
    results = {}
    for mode in modes:
        print(f"  {mode} ...", flush=True)
        harness.clear_memory()
        step = step_for(mode, fn)
        with torch.no_grad():
            t0 = time.perf_counter()
            passes = warm_up(step, mode, run_pass)
            torch.cuda.synchronize()
            setup_s = time.perf_counter() - t0
            before = grape.stats(step) if mode.startswith("grape") else None
            run_pass(step, False)  # the steady-state pass whose counters are reported
            extra = grape_counters(step, before, calls) if before is not None else {}
            times = harness.time_ms(lambda: run_pass(step, False), reps)
            out = run_pass(step, True)  # outputs kept, for the comparison with eager
        results[mode] = {"ms_per_step": harness.median(times) / calls,
                         "ms_per_step_runs": [t / calls for t in times],
                         "warm_passes": passes, "setup_s": setup_s,
                         "outputs": out if isinstance(out, list) else [out], **extra}
        step = out = None  # released before the next mode
    harness.compare_with_eager(results)
    if "ptgraph" in results:
        for r in results.values():
            r["ratio_to_ptgraph"] = r["ms_per_step"] / results["ptgraph"]["ms_per_step"]
    return {"name": name, "config": config, "modes": results}


def gpt2_cat_case(batch, steps, reps, modes, tiny=False) -> dict:
    cfg = gpt2.GPT2Config.tiny() if tiny else gpt2.GPT2Config()
    weights = gpt2.init_weights(cfg, "cuda")
    decode = gpt2.make_decode_step(cfg, weights)

    def step_fn(input_ids, attention_mask, kv):
        return decode(input_ids[:, -1:], kv, attention_mask)

    g = torch.Generator(device="cpu").manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g).to("cuda")
    kv0 = gpt2.empty_cache(cfg, batch, "cuda")

    config = {"model": "gpt2-small" if not tiny else "gpt2-tiny", "dtype": "float16", "batch": batch,
              "prompt": 1, "steps": steps, "shapes": steps, "reps": reps,
              "inputs": "input_ids and attention_mask via torch.cat outside the step, KV cache fed back"}
    return run_modes(f"gpt2-cat-b{batch}", config, step_fn,
                     lambda step, keep: gpt2.generate_with_cat(step, prompt, kv0, steps), steps, reps,
                     modes)


# wav2vec2-base's feature encoder: 7 convolutions, 512 channels (conv_dim, conv_kernel, conv_stride
# of Wav2Vec2Config), GELU, group norm after the first.
W2V_KERNELS = (10, 3, 3, 3, 3, 2, 2)
W2V_STRIDES = (5, 2, 2, 2, 2, 2, 2)


def wav2vec2_feature_encoder(device, dtype=torch.float16, channels=512):
    g = torch.Generator(device="cpu").manual_seed(0)
    convs, c_in = [], 1
    for k in W2V_KERNELS:
        w = torch.randn(channels, c_in, k, generator=g) / (c_in * k) ** 0.5
        convs.append(w.to(device=device, dtype=dtype))
        c_in = channels
    norm_w = torch.ones(channels, device=device, dtype=dtype)
    norm_b = torch.zeros(channels, device=device, dtype=dtype)

    def encode(audio):  # [B, samples] -> [B, frames, 512]
        x = audio.unsqueeze(1)
        for i, (w, s) in enumerate(zip(convs, W2V_STRIDES)):
            x = F.conv1d(x, w, stride=s)
            if i == 0:
                x = F.group_norm(x, channels, norm_w, norm_b)
            x = F.gelu(x)
        return x.transpose(1, 2)

    return encode


def wav2vec2_case(batch, calls, reps, modes, lengths=8) -> dict:
    encode = wav2vec2_feature_encoder("cuda")
    g = torch.Generator().manual_seed(0)
    seconds = torch.linspace(1.0, 4.0, lengths).tolist()
    samples = [int(s * 16000) for s in seconds]
    host = [torch.randn(batch, n, generator=g).half().pin_memory() for n in samples]
    order = torch.randint(0, lengths, (calls,), generator=g).tolist()

    def run_pass(step, keep):
        outs = []
        for k in order:
            audio = host[k].to("cuda", non_blocking=True)
            if keep:
                outs.append(step(audio))
            else:
                step(audio)  # the output dies before the next call (held, grape would evacuate it)
        return outs if keep else None

    config = {"model": "wav2vec2-base feature encoder", "dtype": "float16", "batch": batch,
              "samples": samples, "calls": calls, "shapes": lengths, "reps": reps,
              "inputs": "pinned host batch .to('cuda', non_blocking=True) per call"}
    return run_modes("wav2vec2-host-batches", config, encode, run_pass, calls, reps, modes)


def hook_overhead_case(allocations=20000, reps=9) -> dict:
    """Host time per torch.empty (a caching allocator hit) with grape's allocator hook removed and
    installed, alternating, once a compiled function has learned a site of the 4 KiB class."""
    def per_alloc_us(nbytes):
        t0 = time.perf_counter()
        for _ in range(allocations):
            torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        return (time.perf_counter() - t0) / allocations * 1e6

    step = grape.compile(lambda x: x + 1)
    for _ in range(4):
        x = torch.zeros(1000, device="cuda")  # 4000 bytes: the 4 KiB class
        step(x)
    assert grape.stats(step)["input_sites"] == 1, grape.stats(step)
    sizes = {"class_not_served": 1 << 20, "class_served_not_a_site": 4096}
    runs = {(name, hook): [] for name in sizes for hook in (False, True)}
    for rep in range(reps + 1):
        for hook in (False, True):
            grape._C.allocator_hook(hook)
            for name, nbytes in sizes.items():
                us = per_alloc_us(nbytes)
                if rep > 0:  # the first round warms up
                    runs[name, hook].append(us)
    grape._C.allocator_hook(True)
    modes = {}
    for name in sizes:
        extra = [on - off for on, off in zip(runs[name, True], runs[name, False])]
        modes[name] = {"us_per_alloc_without_hook": harness.median(runs[name, False]),
                       "us_per_alloc_with_hook": harness.median(runs[name, True]),
                       "extra_us_per_alloc": harness.median(extra)}
    return {"name": "hook-overhead", "config": {"allocations": allocations, "reps": reps}, "modes": modes}


def main(argv=None):
    parser = harness.argument_parser(__doc__, MODES, "smoke run: 24 steps and calls, 2 reps")
    parser.add_argument("--cases", default="gpt2-cat,wav2vec2,hook",
                        help="comma-separated (default %(default)s)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="GPT-2 batches")
    parser.add_argument("--steps", type=int, default=128, help="calls per pass (default %(default)s)")
    parser.add_argument("--calls", type=int, default=64, help="wav2vec2 calls per pass")
    args, modes = harness.parse(parser, argv, MODES, "alias_sites needs a CUDA device")
    if args.quick:
        args.steps, args.calls, args.reps = 24, 24, 2
    cases, name = [], "alias_sites" + ("-quick" if args.quick else "")
    chosen = args.cases.split(",")
    if "gpt2-cat" in chosen:
        for batch in args.batch:
            print(f"gpt2-cat batch {batch}:", flush=True)
            cases.append(gpt2_cat_case(batch, args.steps, args.reps, modes, tiny=args.tiny))
            harness.print_table(cases[-1])
            path = harness.write_results(name, cases, args.out)
    if "wav2vec2" in chosen:
        print("wav2vec2 host batches:", flush=True)
        cases.append(wav2vec2_case(8, args.calls, args.reps, modes))
        harness.print_table(cases[-1])
        path = harness.write_results(name, cases, args.out)
    if "hook" in chosen:
        cases.append(hook_overhead_case(allocations=2000 if args.quick else 20000))
        print(cases[-1])
        path = harness.write_results(name, cases, args.out)
    print(f"\nwrote {path}")
    return cases


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
