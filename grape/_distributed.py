"""Capture points that agree across the ranks of torch.distributed.

A rank that replays a graph holding a collective while another runs the same call eagerly, or
captures while another replays, can leave the collective waiting forever (NCCL registers the
buffers of a captured collective with its peers). So where a signature of a compiled function
leaves its warm-up (its capture point), every rank says what it did through the process group's
store, and all take the same path: every rank replays only if every rank captured; otherwise all
run that signature eagerly, with the same reason. Ranks that reach a capture point with different
signatures, or not at all, raise the same error on every rank that reached it.
See docs/semantics.md, "torch.distributed".
"""

from __future__ import annotations

import datetime
import os
import pickle
import re
from typing import Optional

import torch

__all__ = ["RanksDisagree", "active", "agree"]

# Seconds a rank waits at a capture point for the others, as ProcessGroupNCCL's default timeout.
TIMEOUT_ENV = "GRAPE_DISTRIBUTED_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0


class RanksDisagree(RuntimeError):
    """The ranks reached a capture point with different signatures, or some did not reach it."""


def active() -> bool:
    """Whether this process is one rank of an initialized torch.distributed process group."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def _timeout() -> datetime.timedelta:
    text = os.environ.get(TIMEOUT_ENV)
    seconds = float(text) if text else DEFAULT_TIMEOUT_S
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {text!r}")
    return datetime.timedelta(seconds=seconds)


def _comparable(signature: str) -> str:
    # Each rank computes on its own device: cuda:0 on rank 0 is cuda:1 on rank 1.
    return re.sub(r"cuda:\d+", "cuda", signature)


class CapturePoints:
    """The capture points of one compiled function, numbered alike on every rank: the function's
    key is its name and how many functions of that name this process compiled before it."""

    _compiled_per_name: dict[str, int] = {}

    def __init__(self, name: str):
        index = CapturePoints._compiled_per_name.get(name, 0)
        CapturePoints._compiled_per_name[name] = index + 1
        self.key = f"grape/{name}#{index}"
        self.name = name
        self.reached = 0

    def agree(self, signature: str, reason: str, out_of_memory: bool) -> Optional[tuple[str, bool]]:
        """This rank's outcome at a capture point (`reason` empty: captured) made common to all:
        None where this process is no rank of a process group; else (reason, out_of_memory), the
        reason empty where every rank captured, and out_of_memory whether any rank ran out."""
        if not active():
            return None
        dist = torch.distributed
        store = dist.distributed_c10d._get_default_store()
        rank, world = dist.get_rank(), dist.get_world_size()
        point = self.reached
        self.reached += 1
        prefix = f"{self.key}/{point}/"
        keys = [prefix + str(r) for r in range(world)]
        store.set(keys[rank], pickle.dumps((signature, reason, out_of_memory)))
        timeout = _timeout()
        try:
            store.wait(keys, timeout)
        except RuntimeError:  # the store's timeout (DistStoreError on recent torch)
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise RanksDisagree(
                f"grape: {self.name}: rank(s) {missing} did not reach capture point {point} within "
                f"{timeout.total_seconds():g} s (rank {rank} reached it with {signature}): every "
                "rank must call a compiled function with the same shapes, in the same order"
            ) from None
        outcomes = [pickle.loads(store.get(k)) for k in keys]
        if point > 0:
            # Every rank has read the previous point's outcomes once all reached this one.
            try:
                store.delete_key(f"{self.key}/{point - 1}/{rank}")
            except (RuntimeError, NotImplementedError):
                pass  # a store that cannot delete keeps a few bytes per capture point
        return common_outcome(self.name, point, outcomes)


def common_outcome(name: str, point: int, outcomes: list) -> tuple[str, bool]:
    """The path every rank takes, from each rank's (signature, reason, out_of_memory)."""
    if len({_comparable(signature) for signature, _, _ in outcomes}) > 1:
        listing = "; ".join(f"rank {r}: {s}" for r, (s, _, _) in enumerate(outcomes))
        raise RanksDisagree(
            f"grape: {name}: the ranks reached capture point {point} with different signatures "
            f"({listing}): every rank must call a compiled function with the same shapes, in the "
            "same order")
    refused = [(r, why) for r, (_, why, _) in enumerate(outcomes) if why]
    out_of_memory = any(oom for _, _, oom in outcomes)
    if not refused:
        return "", out_of_memory
    reasons = {why for _, why in refused}
    ranks = ", ".join(str(r) for r, _ in refused)
    if len(refused) == len(outcomes) and len(reasons) == 1:
        return refused[0][1], out_of_memory
    where = f"on rank {ranks}" if len(refused) == 1 else f"on ranks {ranks}"
    return (f"{refused[0][1]} ({where}; every rank runs this signature eagerly, so that their "
            "collectives match)"), out_of_memory
