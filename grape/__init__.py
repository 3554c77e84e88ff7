"""Grape: CUDA graphs for dynamic PyTorch workloads.

    step = grape.compile(step_fn)      # or @grape.compile, or grape.compile(model)
    out = step(*inputs)                # new signature: eager warm-up, then capture; later: replay
    grape.stats(step)                  # graphs, replays, fallbacks with reasons, bytes copied...
    with grape.Predicate(flag): ...    # a body the GPU skips where flag is false, inside graphs
    grape.while_loop(cond_fn, body_fn, carried)  # a loop the GPU ends, inside one graph
"""

from grape._compile import (CompiledFunction, FallbackWarning, compile, save_graph_cache,
                            set_memory_budget, stats)
from grape._predicate import Predicate, PredicateError, while_loop
from grape._rewrite import RewriteError, rewritten_source

__all__ = ["CompiledFunction", "FallbackWarning", "Predicate", "PredicateError", "RewriteError",
           "compile", "rewritten_source", "save_graph_cache", "set_memory_budget", "stats",
           "while_loop"]
__version__ = "0.1.0"
