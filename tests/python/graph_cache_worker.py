"""One process of a graph cache test (tests/python/test_graph_cache_gpu.py): compiles a block with
a cache directory, calls it at the lengths given (twice each, so each length captures or restores,
then replays), compares every output with eager on the same weights, saves the cache and prints
one JSON line: the compiled function's stats, the largest difference from eager and what saving
did.

    python graph_cache_worker.py CACHE_DIR [--width N] [--dtype float32] [--lengths 3,5,9]
        [--variant plain|scaled|env_scaled|dropout|chained|site] [--fake-torch-version V]
        [--barrier DIR]

--variant chained: alias prediction on, and each output one row longer than its input, fed to
the next call (as a decoder's cache grows): from the first length on, each call's input is the
previous call's output, read in place (chain prediction); --lengths gives the first length and
the last (the chain runs twice).

--variant site: alias prediction on, and the caller grows each input by a row of the output
(`torch.cat`, as generate grows its attention mask): once learned, the allocation site hands out
the function's own buffers, which the graphs read in place (site prediction); --lengths as for
chained.

--variant env_scaled: scales the output by GRAPE_TEST_SCALE, read from the environment at each call
(which the key does not see), times the length: a number each shape's graph holds in its kernel's
arguments.

--barrier DIR: before its first call and again before saving, waits until every process given
the same DIR (two) is there, so that none reads a file another wrote and their writes overlap.
"""

import argparse
import json
import os
import sys
import time

import torch


class Block(torch.nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


def barrier(folder: str, stage: str, processes: int = 2) -> None:
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, f"{stage}.{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 120
    while sum(f.startswith(stage + ".") for f in os.listdir(folder)) < processes:
        if time.monotonic() > deadline:
            raise SystemExit(f"barrier {stage}: the other process never came")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache_dir")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--lengths", default="3,5,9")
    parser.add_argument("--variant", default="plain",
                        choices=["plain", "scaled", "env_scaled", "dropout", "chained",
                                 "site", "described"])
    parser.add_argument("--fake-torch-version")
    parser.add_argument("--barrier")
    args = parser.parse_args()
    if args.fake_torch_version:
        torch.__version__ = args.fake_torch_version  # another torch, as the key sees it
    import grape

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = Block(args.width, 0.5 if args.variant == "dropout" else 0.0).cuda().to(dtype)
    if args.variant != "dropout":
        model.eval()

    if args.variant == "scaled":
        def step(x):
            return model(x) * 1.0  # another code line than plain's
    elif args.variant == "env_scaled":
        def step(x):
            return model(x) * (float(os.environ["GRAPE_TEST_SCALE"]) * x.shape[0])
    elif args.variant == "chained":
        def step(x):
            return torch.cat([model(x), x[-1:]])  # a row longer
    elif args.variant == "described":
        def step(x):  # constants of torch's own types in the result
            return {"out": model(x), "dtype": x.dtype, "device": x.device}
    else:
        def step(x):
            return model(x)

    # Alias prediction only where the variant tests it (the others count captures as if off).
    compiled = grape.compile(step, cache_dir=args.cache_dir,
                             alias_prediction=args.variant in ("chained", "site"))
    if args.barrier:
        barrier(args.barrier, "start")
    error = 0.0
    generator = torch.Generator(device="cuda").manual_seed(1)
    lengths = [int(n) for n in args.lengths.split(",")]
    with torch.no_grad():
        if args.variant == "chained":
            for _ in range(2):
                x = torch.randn(lengths[0], args.width, device="cuda", dtype=dtype,
                                generator=generator)
                while x.shape[0] <= lengths[-1]:
                    want = step(x)  # before the call: x is read in place, and then replaced
                    x = compiled(x)
                    error = max(error, (x - want).abs().max().item())
        elif args.variant == "site":
            for _ in range(2):
                x = torch.randn(lengths[0], args.width, device="cuda", dtype=dtype,
                                generator=generator)
                while x.shape[0] <= lengths[-1]:
                    out = compiled(x)
                    error = max(error, (out - step(x)).abs().max().item())
                    x = torch.cat([x, out[-1:]])  # the site: one code position, every call
        else:
            for length in lengths:
                for _ in range(2):
                    x = torch.randn(length, args.width, device="cuda", dtype=dtype,
                                    generator=generator)
                    out = compiled(x)
                    if args.variant == "described":
                        got, want = out, step(x)
                        if (got["dtype"], got["device"]) != (want["dtype"], want["device"]):
                            raise AssertionError(f"{got['dtype']}, {got['device']} returned")
                        out = got["out"]
                        error = max(error, (out - want["out"]).abs().max().item())
                    elif args.variant != "dropout":
                        error = max(error, (out - step(x)).abs().max().item())
    if args.barrier:
        barrier(args.barrier, "save")
    saved = compiled.save_graph_cache()
    stats = dict(grape.stats(compiled))
    print(json.dumps({"stats": stats, "error": error, "saved": saved}, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
