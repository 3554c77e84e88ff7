"""What grape needs of torch.distributed: collectives that stay interchangeable across ranks
whatever path each call takes, and DistributedDataParallel's timed first iterations.

Note [Ranks decide alone]
~~~~~~~~~~~~~~~~~~~~~~~~~
Each rank warms up, captures, replays and falls back on its own signatures, at its own calls:
data-parallel ranks see batches of their own lengths, so their signatures differ in the same
step. That is sound because a call runs each collective it makes exactly once on every path: a
warm-up or eager call runs it, a capture that succeeds launches its graph once (a capture records
without running), one that fails is thrown away and the call runs eagerly, and one where f raised
runs the recorded part once. A collective a graph launches is the same NCCL operation as the eager
one, as long as NCCL does not register the buffers of captured collectives with their peers
(NCCL_GRAPH_REGISTER): a registered and an unregistered buffer must never meet in one collective,
which happens where one rank replays while another runs the call eagerly. So grape turns that
registration off where the user did not choose (NCCL reads it when its first communicator is made,
after grape is imported in the usual order). The ranks agree on nothing per call: none waits for
another at a capture, and collectives order the ranks as they do eagerly.

Note [DDP under capture]
~~~~~~~~~~~~~~~~~~~~~~~~
DistributedDataParallel's reducer times its first iterations (and every sample_rate-th) with CUDA
events, and its next forward waits for them on the host (torch's c10d Logger). Under capture that
wait fails the capture, and an event recorded while capturing fails the eager forward that waits
for it later. So a compiled function that ran a DDP module warms up until the reducer passed its
timed iterations, grape sets the module's sample rate past any run's length, and a DDP module's
forward that would be timed inside a capture stops that capture before the reducer records
anything.
"""

from __future__ import annotations

import os
import weakref

import torch

__all__ = ["DDPWatch", "active", "ddp_class"]

# Off unless the user chose (Note [Ranks decide alone]).
os.environ.setdefault("NCCL_GRAPH_REGISTER", "0")

# The reducer times its iterations 1 to 10 (Reducer::should_collect_runtime_stats); the Logger
# reads the last timed one as "iteration".
DDP_TIMED_ITERATIONS = 10
# A sample rate no run reaches: later iterations are not timed.
DDP_NEVER_SAMPLED = 2**31 - 1


def active() -> bool:
    """Whether this process is one rank of an initialized torch.distributed process group."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def ddp_class():
    """torch's DistributedDataParallel, or None in a build without torch.distributed."""
    if not torch.distributed.is_available():
        return None
    return torch.nn.parallel.DistributedDataParallel


def _times_next_forward(ddp) -> bool:
    """Whether `ddp`'s next forward with gradient sync may wait on the host for events of its
    timed iterations (Note [DDP under capture])."""
    try:
        iteration = ddp._get_ddp_logging_data().get("iteration", 0)
    except (AttributeError, RuntimeError):  # no C++ reducer (its Python one times nothing)
        return False
    return iteration < DDP_TIMED_ITERATIONS


class DDPWatch:
    """The DistributedDataParallel modules a compiled function's warm-ups and captures ran, held
    weakly (Note [DDP under capture])."""

    def __init__(self):
        self.modules: weakref.WeakSet = weakref.WeakSet()

    def saw(self, module: torch.nn.Module, capturing: bool) -> None:
        """DDP `module` about to run a forward: it is remembered, its later iterations untimed;
        inside a capture, one still timing stops the capture."""
        if module not in self.modules:
            self.modules.add(module)
            try:
                module._set_ddp_runtime_logging_sample_rate(DDP_NEVER_SAMPLED)
            except (AttributeError, RuntimeError):
                pass
        if capturing and module.require_backward_grad_sync and torch.is_grad_enabled() and \
                _times_next_forward(module):
            raise RuntimeError(
                "grape: DistributedDataParallel synchronizes with the host in its first "
                f"{DDP_TIMED_ITERATIONS} iterations (it times them with CUDA events); the step "
                "warms up until they have passed")

    def defers_capture(self) -> bool:
        """Whether a capture now would meet a DDP module still timing its iterations."""
        return any(_times_next_forward(m) for m in list(self.modules))
