"""Note [Attention without plans under capture]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Under a CUDA stream capture, transformers (up to at least 5.17) builds the attention mask it skips
in eager calls (its is_tracing counts a capture), so scaled_dot_product_attention takes a masked
path. On Hopper, torch 2.11 prefers cuDNN's attention there, which builds an execution plan for
each new shape: tens of milliseconds per decode length, paid inside grape's captures, in a cold
process and again after eager ran (eager's unmasked plans do not serve the masked calls).
With ``grape.compile(..., plan_free_attention=True)`` every call of the function runs with the
backends that build no per-shape plan (flash, memory-efficient and math attention), so that a
masked call takes memory-efficient attention. It changes which kernel the calls run, and so their
rounding: an opt-in, off by default (docs/semantics.md, "Attention without plans").
Warm-ups and eager calls run on the same backends as captures, so that a call's result does not
depend on whether it replayed: with cuDNN's attention in a warm-up and flash attention in the
replays, a generate's tokens differed from the same function's replayed ones.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch

# What SDPA may choose among in a function compiled with plan_free_attention: every backend but
# cuDNN's, in PyTorch's order.
PLAN_FREE_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def plan_free_attention() -> contextlib.AbstractContextManager:
    """A context in which scaled_dot_product_attention builds no per-shape plan."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name) for name in PLAN_FREE_BACKENDS])



def calling_plan_free(fn: Callable) -> Callable:
    """`fn`, each call of it in :func:`plan_free_attention` (warm-ups, captures and eager calls
    alike; a replay calls no Python)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with plan_free_attention():
            return fn(*args, **kwargs)

    return call
