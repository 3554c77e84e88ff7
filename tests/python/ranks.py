"""Runs a test function on several ranks of one torch.distributed process group, each rank a
process of its own, and gives back what each rank returned or raised."""

from __future__ import annotations

import io
import os
import tempfile
import traceback
from typing import Any, Callable

import torch
import torch.multiprocessing as mp


def _rank_main(rank: int, world: int, backend: str, store_path: str, fn: Callable, args: tuple,
               env: dict, results) -> None:
    os.environ.update(env)
    # NVLink multicast stays off: the GPU machines' hosts require it.
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    import torch.distributed as dist

    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        store = dist.FileStore(store_path, world)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
        try:
            outcome = ("returned", fn(rank, world, *args))
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # reported to the parent, which asserts
        outcome = ("raised", (type(e).__name__, str(e), traceback.format_exc()))
    # As bytes: tensors a queue shares by file descriptor die with this process.
    buffer = io.BytesIO()
    torch.save(outcome, buffer)
    results.put((rank, buffer.getvalue()))


def run_ranks(fn: Callable, world: int, *args, backend: str = "gloo", env: dict | None = None,
              timeout_s: float = 120.0) -> list[tuple[str, Any]]:
    """fn(rank, world, *args) on `world` ranks (fn and args picklable: a module-level function);
    returns, per rank, ("returned", value) or ("raised", (type name, message, traceback))."""
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        processes = [context.Process(target=_rank_main, args=(rank, world, backend, store_path, fn,
                                                              args, env or {}, results))
                     for rank in range(world)]
        for p in processes:
            p.start()
        outcomes: dict[int, tuple[str, Any]] = {}
        try:
            for _ in range(world):
                rank, data = results.get(timeout=timeout_s)
                outcomes[rank] = torch.load(io.BytesIO(data), weights_only=False)
        finally:
            for p in processes:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    return [outcomes[rank] for rank in range(world)]


def returned(outcomes: list[tuple[str, Any]]) -> list[Any]:
    """Each rank's return value; fails with the rank's traceback where one raised."""
    for rank, (kind, value) in enumerate(outcomes):
        assert kind == "returned", f"rank {rank} raised {value[0]}: {value[1]}\n{value[2]}"
    return [value for _, value in outcomes]
