"""Grape: CUDA graphs for dynamic PyTorch workloads.

    step = grape.compile(step_fn)      # or @grape.compile, or grape.compile(model)
    out = step(*inputs)                # new signature: eager warm-up, then capture; later: replay
    grape.stats(step)                  # graphs, replays, fallbacks with reasons, bytes copied...
"""

from grape._compile import CompiledFunction, FallbackWarning, compile, stats

__all__ = ["CompiledFunction", "FallbackWarning", "compile", "stats"]
__version__ = "0.1.0"
