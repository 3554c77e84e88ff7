"""Every key of :func:`grape.stats`, with its meaning: the one table they are defined in.

The runtime's counters (csrc/torch/runtime_stats.cpp) and the keys the Python side adds must all
be here; tests/python/test_stats_table.py fails on a key missing from this table, and on a
docs/semantics.md table that differs from :func:`markdown_table` (``python -m grape._stats``
prints it). The docstring of :func:`grape.stats` is made from it.
"""

from __future__ import annotations

__all__ = ["KEYS", "TABLE", "Stats", "docstring", "markdown_table"]

# (keys, meaning): keys that are read together share a row.
TABLE: list[tuple[tuple[str, ...], str]] = [
    (('calls',),
     'every call, including calls made inside another capture'),
    (('replays',),
     'calls answered by a graph (the capturing call included)'),
    (('captures',),
     'successful captures, recaptures included'),
    (('warmup_calls',),
     'eager calls of the warm-up phase, and calls whose capture at first sight failed'),
    (('warmup_each_signature',),
     "whether each new signature warms up before its capture: the option, or true once two captures at first sight failed"),
    (('first_sight_failures',),
     'captures at first sight that failed and were mended by a warm-up (at two, each new signature warms up first)'),
    (('eager_calls',),
     'calls of fallen-back signatures, refused replays, and calls without CUDA'),
    (('recaptures',),
     'graphs dropped because static state changed: a parameter, buffer or optimizer state tensor moved, a gradient is not where the capture found it, or an optimizer setting changed'),
    (('last_recapture_reason',),
     'what changed for the last recapture, else `None`'),
    (('capture_failures',),
     'captures that failed (the signature fell back, or warmed up to capture again)'),
    (('raised_under_capture',),
     "calls whose function raised its own exception while it was captured: the GPU work it "
     'queued before the raise ran once, and the exception reached the caller (docs/semantics.md, '
     '"Faults and threads")'),
    (('capture_seconds',),
     'wall time spent in successful captures'),
    (('warmup_seconds',),
     'wall time of warm-up calls'),
    (('graph_read_seconds', 'join_seconds', 'instantiate_seconds'),
     "of the captures' time, reading captured graphs node by node, joining groups of shared executables (alignment, unions; the patch a join makes is in `patch_seconds`), and instantiating executables (also rebuilds after eviction, outside captures)"),
    (('settle_seconds',),
     "what joins leave until their graph's first launch is queued, done then: destroying the "
     "joined graphs, and compressing the new shapes' parameters on a worker thread while the "
     "caller goes on (the next join waits for it, where it is not done)"),
    (('chain_variant_seconds',),
     "of `capture_seconds`, chain variants' captures"),
    (('capture_function_seconds',),
     "of `capture_seconds`, in the function itself, between the CUDA capture's begin and end (the "
     'rest is the capture\'s own work: placeholders, reading and joining the graph, bookkeeping)'),
    (('bytes_copied_in',),
     'bytes copied into placeholders (copy in and move in)'),
    (('bytes_copied_back',),
     'bytes copied from placeholders back to mutated inputs'),
    (('bytes_evacuated', 'evacuations'),
     'live outputs copied out of the pool before a replay'),
    (('eager_for_other_threads',),
     'calls that ran eagerly because their replay would have moved an output another thread '
     'holds (docs/semantics.md, "Faults and threads")'),
    (('bytes_copied_out', 'outputs_copied_out'),
     'outputs copied out of the pool before their call returned, which a function does once a '
     'call found an output of another thread in its way'),
    (('inputs_moved',),
     'inputs moved into their placeholder'),
    (('inputs_in_place',),
     'inputs that already were their placeholder (no copy)'),
    (('graphs',),
     'signatures that currently hold a captured graph'),
    (('signatures',),
     'signatures seen (warming up, captured, or eager)'),
    (('pool_bytes', 'arena_bytes', 'arena_lane_bytes'),
     "device bytes of the function's pool (its arena's mapped lanes and its private pool); of them, the arena's mapped lanes; and those per lane (`large`, `small`, `placeholder`, `input`, `output`)"),
    (('alias_prediction',),
     'whether alias prediction is on'),
    (('plan_free_attention',),
     "whether every call of the function runs attention on backends that build no per-shape plan (grape.compile's plan_free_attention)"),
    (('alias_predictions',),
     'placeholders captured in place: an earlier output (chained) or an input buffer'),
    (('alias_hits', 'alias_misses'),
     'predicted inputs found in place at a replay, or copied in'),
    (('bytes_avoided',),
     'input bytes the hits did not copy'),
    (('chain_variants',),
     'extra graphs captured so that a signature reads chained inputs or input buffers in place'),
    (('chain_variants_deferred',),
     'calls whose graph copied inputs that a chain variant, not yet worth its capture, would read '
     'in place (docs/design.md, "Capture")'),
    (('input_sites',),
     "code positions learned as allocating this function's inputs"),
    (('site_allocations',),
     "allocations served from the function's input buffers"),
    (('site_buffers_busy',),
     'allocations at a learned site served by PyTorch because its buffers were held'),
    (('input_buffer_bytes',),
     "device bytes of the input buffers (in the arena's `input` lane)"),
    (('live_outputs',),
     'handed-out storages still alive in pool memory'),
    (('shapes',),
     'graphs held (one per captured signature and chain variant)'),
    (('topology_groups', 'unshareable_groups'),
     'groups of graphs sharing executables; and of them, the groups holding a graph that cannot share'),
    (('unshareable_reason',),
     'why some graphs cannot share an executable, else `None`'),
    (('graphs_joined',),
     'graphs that joined an existing group instead of being instantiated'),
    (('graphs_joined_near', 'topology_unions'),
     "of those, graphs joined by alignment (of another, near topology, or into a union); and the joins that grew the group's graph into a union"),
    (('kernels_swapped_near', 'union_extra_nodes'),
     "kernel nodes that near joins paired with a node of another kernel; and the nodes unions hold beyond their smallest member's (which it runs as no-ops)"),
    (('near_join_refusals',),
     "why graphs of a new topology did not join a near group: `far` (per graph: no group's node count near its own), and per group tried, `unaligned` (no alignment order: programmatic or port edges), `edits` (too many nodes differ), `no_noop` (a copy or 2-D memset would be absent), `driver` (the driver refused its parameters)"),
    (('resident_executables', 'executable_bytes'),
     'executables instantiated now, and their device memory (measured at instantiation)'),
    (('cached_executable_bytes', 'executable_cache'),
     "of that memory, the executables beyond one per topology; and the function's `executable_cache` (`None`: no limit)"),
    (('instantiations', 'evictions'),
     'executables instantiated (rebuilds after eviction included), and freed for the budget'),
    (('executable_switches', 'nodes_patched', 'kernels_swapped', 'patch_seconds'),
     "patches of an executable to another shape (a capture's join included: its parameters patched into the executable it replays in), nodes written, of them kernel nodes that now run another kernel (each makes the next launch slower), and the CPU time it took"),
    (('patches_ahead',),
     'patches made right after a launch, for the graph that followed it the last two times'),
    (('replay_seconds', 'launch_seconds'),
     'host time of replays (preparing the executable, copies, launch), and of it in graph launches; where the GPU is the bottleneck, a launch also waits for room in the launch queue'),
    (('params_bytes', 'params_raw_bytes'),
     "host bytes of the graphs' kept parameters, compressed, and what they would take uncompressed"),
    (('capture_oom_retries',),
     'captures retried after running out of memory'),
    (('replanned_captures', 'replans_diverged'),
     'captures taken again along a planned layout of the pool, and those of them whose allocations did not all come as planned (placed first fit from there)'),
    (('arena_lane_peak_bytes',),
     'per lane of the arena, the most bytes allocated at once: what no layout can go below (`arena_lane_bytes` is what is mapped)'),
    (('pinned_host_constants',),
     'signatures whose captures make device tensors of Python values in pinned memory (a capture of theirs needed it)'),
    (('memory_budget',),
     "the function's budget in bytes, or `None`"),
    (('fallback',),
     'the reason every call runs eagerly (no CUDA), else `None`'),
    (('name',),
     "the function's qualified name (`Linear.forward` for a module)"),
    (('fallbacks',),
     'list of `{"signature", "kind", "reason", "call_site"}`, one per reported fallback; `kind` names the reason\'s kind (`host_sync`, `pageable_copy`, `legacy_stream`, `cpu_tensor`, `out_of_memory`, `unsupported_argument`, `results`, `capture_error`, `instantiation`, `replay_refused`, `no_cuda`, `forked`)'),
    (('graph_cache',),
     'the graph cache (docs/semantics.md, "The graph cache"), `None` without a cache directory: `{"file", "status": "read" | "no file" | "miss: <the key line that differs>" | "unreadable: <why>", "stored_groups", "stored_shapes" (in the file read), "validated_groups" (groups a live capture matched), "leftover_halves" (4-byte units validation took for halves of host addresses, bytes no code set), "taken_from_live" (bytes every stored shape of a group holds alike in which the live capture differs, taken from it for every restored shape), "unread_bytes" (bytes in which the live capture differed and a run with the stored bytes gave the same outputs: bytes no kernel reads), "restored_shapes" (shapes replaying without a capture), "dropped_groups" (why each group a live capture did not match was dropped), "unrestored" (shapes of validated groups not restored, by reason), "file_bytes" (of the file read), "cache_load_seconds", "restore_seconds" (validating and restoring; of it "restore_validate_seconds": matching live captures against the file, and runs with stored bytes; "restore_relocate_seconds": rewriting the stored words of restored shapes for this process; "restore_join_seconds": restored shapes joining their executable groups, where the driver checks their parameters), "saved_shapes" (at the last save that wrote, else -1), "unstored" (shapes not stored at the last save, by reason), "store_seconds", "kernel_images" (the watch of the images of generated kernels, Note [Kernel images], for the whole process: "watching", "why_not", "seen" (images of modules loaded while watching), "kept_bytes", "loaded" (stored images loaded back))}`'),
    (('entries',),
     'per signature: `{"signature", "state": "warmup" | "graph" | "eager" | "deferred", "kind", "reason", "replays", "chain_variants", "nodes", "seconds"}` (`deferred`: its capture ran out of memory, and it runs eagerly until it is captured again; `chain_variants`: the signature\'s variants held; `nodes`: of its graph); `seconds` is what the signature cost on its way to replays: `warmup`, `capture` (every try, failed ones and chain variants included), and of it `read`, `join`, `instantiate` and `variants`'),
]

KEYS: tuple[str, ...] = tuple(key for keys, _ in TABLE for key in keys)


class Stats(dict):
    """What :func:`grape.stats` returns: a dict of every key above, printed as a short summary
    (``print(grape.stats(f))``); ``repr`` and ``dict(...)`` give the whole dict."""

    def __str__(self) -> str:
        return summary(self)


def _mib(nbytes) -> str:
    return f"{(nbytes or 0) / 2**20:.1f} MiB"


def summary(s: dict) -> str:
    """A few lines: calls and how they ran, graphs and what they cost on the way, memory, and every
    fallback with its reason."""
    calls = s.get("calls", 0)
    lines = [f"grape.stats({s.get('name', '?')}): {calls} call{'' if calls == 1 else 's'}: "
             f"{s.get('replays', 0)} replayed, {s.get('warmup_calls', 0)} warm-up, "
             f"{s.get('eager_calls', 0)} eager"]
    if s.get("fallback"):
        lines.append(f"  every call runs eagerly: {s['fallback']}")
    lines.append(f"  graphs: {s.get('graphs', 0)} for {s.get('signatures', 0)} signatures; "
                 f"{s.get('captures', 0)} captures, {s.get('recaptures', 0)} recaptures; "
                 f"the way there: warm-up {s.get('warmup_seconds', 0.0):.2f} s, captures "
                 f"{s.get('capture_seconds', 0.0):.2f} s")
    budget = s.get("memory_budget")
    lines.append(f"  memory: pool {_mib(s.get('pool_bytes'))}, executables "
                 f"{_mib(s.get('executable_bytes'))}"
                 + (f", budget {_mib(budget)}" if budget is not None else ""))
    # The line above already gives a whole function's fallback.
    fallbacks = [f for f in s.get("fallbacks") or []
                 if f["signature"] or f["reason"] != s.get("fallback")]
    if fallbacks:
        lines.append(f"  fallbacks ({len(fallbacks)}):")
        lines.extend(f"    {f['signature'] or 'every call'} {f['kind']}: {f['reason']}"
                     for f in fallbacks)
    elif not s.get("fallback"):
        lines.append("  fallbacks: none")
    lines.append(f"  ({len(s)} keys in all: dict(grape.stats(f)); docs/semantics.md, \"grape.stats\")")
    return "\n".join(lines)


def markdown_table() -> str:
    """The table as docs/semantics.md shows it."""
    lines = ["| key | meaning |", "|---|---|"]
    for keys, meaning in TABLE:
        lines.append("| " + ", ".join(f"`{k}`" for k in keys) + " | " + meaning.replace("|", "\\|") + " |")
    return "\n".join(lines)


def docstring() -> str:
    """The keys as a list for a docstring."""
    return "\n".join(f"    * ``{'``, ``'.join(keys)}``: {meaning}" for keys, meaning in TABLE)


if __name__ == "__main__":
    print(markdown_table())
