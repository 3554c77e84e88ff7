"""The GPT-2 demo: greedy decoding with a growing KV cache, eager vs grape, on the same weights.

    python -m benchmarks.demo_gpt2 [--tokens N]

With a GPU: GPT-2 small (random weights), 64 tokens, the time per decode step (one token) and the
speed-up. Without one: says so, and runs a tiny model on the CPU, where grape falls back to eager.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import grape
from benchmarks import harness
from benchmarks.models import gpt2


def ms_per_step(step, tok, kv, steps, reps=3):
    """The best of `reps` generations' wall time per step, and the tokens generated."""
    best = float("inf")
    for _ in range(reps):
        if tok.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        tokens = gpt2.generate(step, tok, kv, steps)
        if tok.is_cuda:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) * 1e3 / steps)
    return best, tokens


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens to generate (default 64 with a GPU, 16 without)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    cfg = gpt2.GPT2Config() if cuda else gpt2.GPT2Config.tiny()
    steps = (64 if cuda else 16) if args.tokens is None else args.tokens
    if not 1 <= steps <= cfg.n_positions:  # a token per position of the model
        parser.error(f"--tokens must be from 1 to {cfg.n_positions} for this model, not {steps}")
    if cuda:
        device = "cuda"
        print(f"GPU: {torch.cuda.get_device_name()}; GPT-2 small, fp16, random weights, {steps} tokens")
    else:
        device = "cpu"
        print("No CUDA GPU here: grape falls back to eager (it says why below); "
              f"running a tiny GPT-2 on the CPU, {steps} tokens.")
    dtype = torch.float16 if cuda else torch.float32
    weights = gpt2.init_weights(cfg, device, dtype=dtype)
    step = gpt2.make_decode_step(cfg, weights)
    tok = torch.tensor([[464]], device=device) % cfg.vocab_size
    kv = gpt2.empty_cache(cfg, 1, device, dtype=dtype)
    compiled = grape.compile(step)
    with torch.no_grad():
        gpt2.generate(step, tok, kv, steps)  # eager's warm-up, as grape gets two generations
        eager_ms, eager_tokens = ms_per_step(step, tok, kv, steps)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", grape.FallbackWarning)
            gpt2.generate(compiled, tok, kv, steps)  # warm-up: every shape once, eagerly
            gpt2.generate(compiled, tok, kv, steps)  # capture: one graph per shape
            grape_ms, grape_tokens = ms_per_step(compiled, tok, kv, steps)
    for w in caught:
        print(f"  grape says: {w.message}")
    results = {"eager": {"ms_per_step": eager_ms, "outputs": eager_tokens},
               "grape": {"ms_per_step": grape_ms, "outputs": grape_tokens}}
    harness.compare_with_eager(results)
    g, s = results["grape"], grape.stats(compiled)
    print(f"eager: {eager_ms:.3f} ms/step")
    # Without a replay grape ran eager's code: a ratio of two eager runs says nothing.
    speedup = f"{g['speedup_vs_eager']:.2f}x" if s["replays"] else "every call ran eagerly"
    print(f"grape: {grape_ms:.3f} ms/step  ({speedup}, {s['graphs']} graphs, "
          f"pool {s['pool_bytes'] / 2**20:.1f} MiB, {s['replays']} replays, {s['eager_calls']} eager calls)")
    print(f"tokens identical: {g['correct']}")


if __name__ == "__main__":
    main()
