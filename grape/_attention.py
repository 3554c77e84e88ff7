"""Note [Attention without plans]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Under a CUDA stream capture, transformers (up to at least 5.17) builds the attention mask it skips
in eager calls (its is_tracing counts a capture), so scaled_dot_product_attention takes a masked
path. On Hopper, torch 2.11 prefers cuDNN's attention there, which builds an execution plan for
each new shape: tens of milliseconds per decode length, paid inside grape's captures, in a cold
process and again after eager ran (eager's unmasked plans do not serve the masked calls).
With ``grape.compile(..., plan_free_attention=True)`` every call of the function runs without
cuDNN's attention, on the backends that build no per-shape plan (flash, memory-efficient and
math attention, as far as the caller allows them), so that a masked call takes memory-efficient
attention. It changes which kernel the calls run, and so their rounding: an opt-in, off by
default (docs/semantics.md, "Attention without plans").
Warm-ups and eager calls run on the same backends as captures, so that a call's result does not
depend on whether it replayed: with cuDNN's attention in a warm-up and flash attention in the
replays, a generate's tokens differed from the same function's replayed ones.
The switch is PyTorch's, process-wide: while a compiled call runs, another thread's eager
attention leaves cuDNN out too.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import torch


@contextlib.contextmanager
def plan_free_attention() -> Iterator[None]:
    """A context in which scaled_dot_product_attention builds no per-shape plan: cuDNN's backend
    is left out, the others stay as the caller set them."""
    allowed = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(allowed)


def calling_plan_free(fn: Callable) -> Callable:
    """`fn`, each call of it in :func:`plan_free_attention` (warm-ups, captures and eager calls
    alike; a replay calls no Python)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with plan_free_attention():
            return fn(*args, **kwargs)

    return call
