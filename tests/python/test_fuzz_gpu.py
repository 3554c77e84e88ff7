"""Differential fuzz of grape.compile against eager: the project's safety net.

Two worlds run the same random sequence of calls (seeded): the eager world calls each plain
function on its own tensors, the grape world calls the compiled function on twins of them (clones
with the same sizes, strides and offsets), and every between-call operation (mutating a held
tensor, feeding an output back, dropping references) is done to both. After every call the test
compares, bit for bit (torch.equal), every leaf of the result, every argument (mutations copied
back), and every tensor the caller still holds from earlier calls (a replay never overwrites memory
the caller holds); it also checks that results alias the arguments and each other as in eager, and
that tensors that are independent in eager occupy disjoint memory in the grape world. The first
difference fails the test, naming the call, the function, the arguments and what differed.

The functions cover: returning an input, views of inputs (slices, transposes, reshapes, diagonals),
in-place mutation of inputs (add_, index_copy_, mutation through a view), nested dict/list/tuple
outputs and a dict input, Python int and float arguments (new signatures), non-contiguous and
offset inputs, fp16, a matmul, a tensor read and written by every replay (static state), a tensor
if/else that the rewriter predicates, and a data-dependent shape (x[x > 0]), which must fall back
to eager (the only function that may).

Exact equality holds because every value is a small integer: inputs are integers in [-30, 30],
every function wraps what it computes back into that range (remainder; a returned column sum is
at most 24 * 30), and no partial sum exceeds what fp16 represents exactly (2048; the branch
condition's whole-tensor sum may round, identically in both worlds, since its fp32 accumulation is
exact). Every reduction is therefore exact, whatever order a kernel sums in (a kernel may vectorize
differently for a graph's aligned placeholder than for an offset input, and cuBLAS may pick
another algorithm for another alignment).
No op here is nondeterministic (index_copy_ gets distinct indices; no atomics, no random ops), so
no tolerance is needed anywhere.

    GRAPE_FUZZ_CALLS=10000 python3 -m pytest tests/python/test_fuzz_gpu.py -q   # as gpu_check.sh
    GRAPE_FUZZ_SEED=7 ...                                                      # another sequence

With a graph cache (test_fuzz_with_a_cache_filled_by_an_earlier_process): an earlier process runs
the same fuzz with a cache directory and writes it at exit; this one runs it again over that
directory, restoring what validates, and must match eager as ever.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import warnings
from collections import Counter, deque
from typing import Any, Callable, Optional

import pytest
import torch

import grape

# The data-dependent function falls back by design; any other fallback is checked in the test
# from grape.stats (see check_stats). conftest.py makes FallbackWarning an error elsewhere.
pytestmark = [pytest.mark.gpu, pytest.mark.expects_fallback]

DEV = "cuda"
# 1000 by default (a few seconds): enough calls per signature that replays dominate.
CALLS = int(os.environ.get("GRAPE_FUZZ_CALLS", "1000"))
SEED = int(os.environ.get("GRAPE_FUZZ_SEED", "0"))
# Calls that must be replays, of the calls of every function that is not expected to fall back.
MIN_REPLAY_FRACTION = 0.8

# --- the functions ------------------------------------------------------------------------------
# Module level, so that the rewriter has their source. Every tensor they return or write holds
# integers in [-30, 30] (wrap), column sums excepted, so that all arithmetic is exact in fp32 and
# fp16.


def wrap(t):
    """t's integer values brought back into [-30, 30]."""
    return torch.remainder(t, 61) - 30


def identity(x):
    return x


def swap(x, y):
    return y, x


def views(x):
    return x[1:], x.t(), x.reshape(-1), x[:, ::2], x.diagonal()


def mutate_add(x, y):
    x.add_(y).remainder_(61).sub_(30)
    return wrap(y * 2 - x)


def mutate_index(x, idx):
    x.index_copy_(0, idx, wrap(x.index_select(0, idx) * 2 + 1))
    return wrap(x.index_select(0, idx) + 1)


def mutate_view(x):
    x[:, 0].mul_(-1)
    x.diagonal().add_(3).remainder_(61).sub_(30)
    return x.sum(0), x[1:]


def nested(x, y):
    s = wrap(x * 3 + y)
    return {"sum": s, "parts": [x.t(), (wrap(x - y), y[0])], "n": 3, "none": None, "alias": s[1:]}


def nested_in(batch):
    x = batch["a"]
    y, k = batch["b"]
    return [wrap(x * k + y), torch.round(torch.sin(x) * 8)]


def scaled(x, k, s=1.0):
    return wrap(x * k + s)


def matmul(x, y):
    a = torch.remainder(x, 5) - 2
    b = torch.remainder(y, 5) - 2
    return wrap(a @ b.t())  # |sums| <= 4 * 64: exact in fp16 too


def branchy(x):
    # A branch on a CUDA tensor: predicated by the rewriter under capture (an IF/ELSE node).
    if x.sum() > 0:
        y = x * 2
    else:
        y = x - 1
    return wrap(y)


def datadep(x):
    return wrap(x[x > 0])  # a data-dependent shape: a host synchronization, cannot be captured


def make_static_state(device):
    """A function reading and writing a tensor it does not receive (fixed in the graph by address):
    every replay updates it, as every eager call does. One per world."""
    state = torch.zeros(4, device=device)

    def static_state(x):
        state.add_(x.sum(0)[:4]).remainder_(61).sub_(30)
        return state, wrap(x + state[0])

    return static_state


# --- what each function takes -------------------------------------------------------------------

F32, F16 = torch.float32, torch.float16
S1, S2, S3 = (8, 16), (16, 16), (24, 8)

# Layouts of a fresh (rows, cols) input: a contiguous tensor, a row-offset slice (contiguous
# strides, an offset: the same signature), a transpose, a slice of every other column.
CONTIG, OFFSET, TRANSPOSED, STEPPED = "contig", "offset", "transposed", "stepped"
ALL_LAYOUTS = (CONTIG, TRANSPOSED, STEPPED)
LAYOUT_WEIGHTS = {CONTIG: 0.4, OFFSET: 0.2, TRANSPOSED: 0.2, STEPPED: 0.2}


def layout_strides(shape, layout):
    rows, cols = shape
    return {CONTIG: (cols, 1), OFFSET: (cols, 1), TRANSPOSED: (1, rows), STEPPED: (2 * cols, 2)}[layout]


@dataclasses.dataclass
class Spec:
    """A function of the fuzz: which (shape, dtype) it is called at, which layouts each tensor
    argument accepts (CONTIG implies OFFSET), and how a call's arguments are built."""
    name: str
    make: Callable[[str], Callable]  # device -> the function (a new one per world where it has state)
    variants: list  # [(shape, dtype)]
    layouts: tuple  # layouts of the first tensor argument
    build: Callable  # (fuzzer, shape, dtype, first_arg_pair) -> (args pairs, kwargs pairs)
    falls_back: Optional[str] = None  # where it must fall back: words of every fallback's reason


def plain(fn):
    return lambda device: fn


def one_tensor(fz, shape, dtype, x):
    return [x], {}


def with_contiguous_second(fz, shape, dtype, x):
    # Now and then the same tensor twice (read-only aliasing is allowed; for a mutating function
    # the replay is refused and the call runs eagerly, which is correct too).
    y = x if fz.rng.random() < 0.03 else fz.tensor_arg(1, shape, dtype, (CONTIG,))
    return [x, y], {}


def with_index(fz, shape, dtype, x):
    return [x, fz.index_arg(shape[0], 4)], {}


def with_dict(fz, shape, dtype, x):
    y = fz.tensor_arg(1, shape, dtype, (CONTIG,))
    k = fz.rng.choice((1, 2))
    return [Pair({"a": x.e, "b": [y.e, k]}, {"a": x.g, "b": [y.g, k]})], {}


def with_scalars(fz, shape, dtype, x):
    k, s = fz.rng.choice(((2, 1.0), (-1, 3.0), (3, 0.0)))
    return [x, Pair(k, k)], {"s": Pair(s, s)}


def specs():
    # Without IF/ELSE conditional nodes (CUDA 12.8 runtime and driver) the predicated if/else
    # cannot be captured: then branchy falls back too, saying so.
    branchy_falls_back = "conditional" if grape._C.conditional_unsupported_reason("if_else") else None
    return [
        Spec("identity", plain(identity), [(S1, F32), (S3, F16)], ALL_LAYOUTS, one_tensor),
        Spec("swap", plain(swap), [(S2, F32)], (CONTIG, TRANSPOSED), with_contiguous_second),
        Spec("views", plain(views), [(S1, F32), (S2, F16)], (CONTIG, STEPPED), one_tensor),
        Spec("mutate_add", plain(mutate_add), [(S1, F32), (S3, F32)], ALL_LAYOUTS,
             with_contiguous_second),
        Spec("mutate_index", plain(mutate_index), [(S2, F32), (S1, F16)], (CONTIG, TRANSPOSED),
             with_index),
        Spec("mutate_view", plain(mutate_view), [(S3, F32), (S2, F16)], (CONTIG, STEPPED),
             one_tensor),
        Spec("nested", plain(nested), [(S1, F32)], (CONTIG, TRANSPOSED), with_contiguous_second),
        Spec("nested_in", plain(nested_in), [(S2, F32)], (CONTIG,), with_dict),
        Spec("scaled", plain(scaled), [(S1, F32), (S1, F16)], (CONTIG,), with_scalars),
        Spec("matmul", plain(matmul), [(S1, F32), (S2, F16)], (CONTIG, TRANSPOSED),
             with_contiguous_second),
        Spec("static_state", make_static_state, [(S1, F32), (S3, F16)], (CONTIG,), one_tensor),
        Spec("branchy", plain(branchy), [(S1, F32), (S2, F16)], (CONTIG, TRANSPOSED), one_tensor,
             falls_back=branchy_falls_back),
        Spec("datadep", plain(datadep), [(S2, F32)], (CONTIG,), one_tensor,
             falls_back="synchroniz"),
    ]


# --- the two worlds -----------------------------------------------------------------------------


@dataclasses.dataclass
class Pair:
    """A value of the eager world and its twin in the grape world."""
    e: Any
    g: Any


@dataclasses.dataclass
class Held:
    """A tensor the caller keeps across calls, in both worlds, and where it came from."""
    e: torch.Tensor
    g: torch.Tensor
    label: str


def describe(t) -> str:
    if isinstance(t, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in t.items()) + "}"
    if isinstance(t, (list, tuple)):
        return "[" + ", ".join(describe(v) for v in t) + "]"
    if not isinstance(t, torch.Tensor):
        return repr(t)
    dtype = str(t.dtype).replace("torch.", "")
    return f"{dtype}{list(t.shape)} stride {t.stride()} offset {t.storage_offset()}"


def tensor_difference(e, g) -> Optional[str]:
    """None where e and g are equal (torch.equal, same dtype), else what differs."""
    if not isinstance(g, torch.Tensor):
        return f"grape gives a {type(g).__name__}, eager a tensor"
    if e.dtype != g.dtype or e.shape != g.shape:
        return f"eager {describe(e)}, grape {describe(g)}"
    if torch.equal(e, g):
        return None
    diff = (e != g).nonzero()
    first = tuple(diff[0].tolist())
    return (f"{diff.shape[0]} of {e.numel()} elements differ, first at {first}: eager "
            f"{e[first].item()} grape {g[first].item()} ({describe(e)})")


def leaves(tree, path="result"):
    """(path, leaf) of a nested result, containers included as (path, container type)."""
    if isinstance(tree, dict):
        yield path, ("dict", tuple(tree.keys()))
        for k, v in tree.items():
            yield from leaves(v, f"{path}[{k!r}]")
    elif isinstance(tree, (list, tuple)):
        yield path, (type(tree).__name__, len(tree))
        for i, v in enumerate(tree):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, tree


def tree_difference(e, g) -> Optional[str]:
    e_leaves, g_leaves = list(leaves(e)), list(leaves(g))
    if [p for p, _ in e_leaves] != [p for p, _ in g_leaves]:
        return f"structure: eager {[p for p, _ in e_leaves]}, grape {[p for p, _ in g_leaves]}"
    for (path, a), (_, b) in zip(e_leaves, g_leaves):
        if isinstance(a, torch.Tensor):
            why = tensor_difference(a, b)
        elif isinstance(b, torch.Tensor) or type(a) is not type(b) or a != b:
            why = f"eager {a!r}, grape {b!r}"
        else:
            why = None
        if why is not None:
            return f"{path}: {why}"
    return None


def tensors_of(tree):
    return [leaf for _, leaf in leaves(tree) if isinstance(leaf, torch.Tensor)]


def byte_span(t):
    """[first, last) bytes t's elements occupy."""
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()


def sharing_difference(pairs) -> Optional[str]:
    """Tensors share a storage in the grape world exactly where their eager twins do, and twins of
    independent eager tensors occupy disjoint bytes (nothing the caller holds is laid over)."""
    pairs = [(label, e, g) for label, e, g in pairs if e.numel() > 0]
    groups: dict = {}  # eager storage -> (grape storage, label)
    spans = []
    for label, e, g in pairs:
        key = e.untyped_storage().data_ptr()
        storage = g.untyped_storage().data_ptr()
        seen = groups.setdefault(key, (storage, label))
        if seen[0] != storage:
            return f"{label} and {seen[1]} share a storage in eager but not in grape"
        spans.append((*byte_span(g), key, label))
    owner: dict = {}
    for _, (storage, label) in groups.items():
        if storage in owner:
            return f"{label} and {owner[storage]} share a storage in grape but not in eager"
        owner[storage] = label
    spans.sort()
    active = []
    for start, end, key, label in spans:
        active = [a for a in active if a[0] > start]
        for a_end, a_key, a_label in active:
            if a_key != key:
                return f"{label} overlaps {a_label} in grape memory, independent tensors in eager"
        active.append((end, key, label))
    return None


def compile_twins(spec: Spec, options: dict, device: str):
    eager = spec.make(device)
    compiled = grape.compile(spec.make(device), **options)
    return eager, compiled


def make_cloner(name: str) -> Callable:
    """x.clone() from a code position of its own: the grape world's inputs for one argument of one
    function are allocated at one place, as a caller's loop allocates them (allocation-site
    prediction learns such places)."""
    namespace: dict = {}
    exec(compile("def clone(t):\n    return t.clone()\n", f"<fuzz inputs: {name}>", "exec"),
         namespace)
    return namespace["clone"]


class Fuzzer:
    """Runs `calls` random calls of the functions in both worlds, checking after every one."""

    HOLD_OUTPUT = 0.5       # a result tensor is kept by the caller
    HOLD_INPUT_VIEW = 0.25  # ... a result that is a view of an argument (it keeps that alive)
    HOLD_FRESH = 0.1        # a fresh argument is kept
    MAX_HELD = 12
    FROM_HELD = 0.45        # a tensor argument is taken from what the caller holds
    CHAIN = 0.3             # the next call feeds this call's result to the same function
    MUTATE = 0.15           # between calls, the caller writes a tensor it holds
    DROP_ALL = 0.03         # between calls, the caller drops most of what it holds

    def __init__(self, spec_list, options=None, seed=SEED, device=DEV):
        self.rng = random.Random(seed)
        torch.manual_seed(seed)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device
        self.seed = seed
        self.options = dict(options or {})
        self.specs = spec_list
        self.eager, self.compiled = {}, {}
        for spec in spec_list:
            self.eager[spec.name], self.compiled[spec.name] = compile_twins(spec, self.options, device)
        self.cloners: dict = {}
        self.held: list[Held] = []
        self.calls = Counter()
        self.history: deque = deque(maxlen=6)
        self.call_index = -1
        self.fresh_bases: list = []  # bases of this call's fresh view arguments
        self.last: Optional[tuple] = None  # (spec, result pair) of the previous call
        self.spec: Optional[Spec] = None  # the function of the current call

    # --- arguments ------------------------------------------------------------------------------
    def cloner(self, spec_name: str, position: int) -> Callable:
        key = (spec_name, position)
        if key not in self.cloners:
            self.cloners[key] = make_cloner(f"{spec_name} argument {position}")
        return self.cloners[key]

    def random_values(self, shape, dtype):
        return torch.randint(-30, 31, shape, generator=self.gen, device=self.device, dtype=dtype)

    def fresh(self, position, shape, dtype, layouts) -> Pair:
        rows, cols = shape
        allowed = [lay for lay in LAYOUT_WEIGHTS if lay in layouts or (lay == OFFSET and CONTIG in layouts)]
        layout = self.rng.choices(allowed, [LAYOUT_WEIGHTS[lay] for lay in allowed])[0]
        base_shape, view = {
            CONTIG: (shape, lambda b: b),
            OFFSET: ((rows + 1, cols), lambda b: b[1:]),
            TRANSPOSED: ((cols, rows), lambda b: b.t()),
            STEPPED: ((rows, 2 * cols), lambda b: b[:, ::2]),
        }[layout]
        base_e = self.random_values(base_shape, dtype)
        base_g = self.cloner(self.spec.name, position)(base_e)
        pair = Pair(view(base_e), view(base_g))
        label = f"fresh args[{position}] ({layout}) of call {self.call_index}"
        if layout != CONTIG:
            self.fresh_bases.append(Held(base_e, base_g, f"base of {label}"))
        if self.rng.random() < self.HOLD_FRESH:
            self.hold(pair.e, pair.g, label)
        return pair

    def accepts(self, t: torch.Tensor, shape, dtype, layouts) -> bool:
        return (tuple(t.shape) == tuple(shape) and t.dtype == dtype
                and t.stride() in {layout_strides(shape, lay) for lay in layouts})

    def tensor_arg(self, position, shape, dtype, layouts) -> Pair:
        if self.rng.random() < self.FROM_HELD:
            candidates = [h for h in self.held if self.accepts(h.e, shape, dtype, layouts)]
            if candidates:
                h = self.rng.choice(candidates)
                return Pair(h.e, h.g)
        return self.fresh(position, shape, dtype, layouts)

    def index_arg(self, rows, k) -> Pair:
        # Distinct indices: index_copy_ with duplicates would be nondeterministic.
        idx = torch.tensor(self.rng.sample(range(rows), k), device=self.device)
        return Pair(idx, self.cloner(self.spec.name, 1)(idx))

    def chained_arg(self, spec, shape, dtype) -> Optional[Pair]:
        """A tensor of the previous call's result that `spec` accepts as its first argument."""
        if self.last is None:
            return None
        _, result = self.last
        for e, g in zip(tensors_of(result.e), tensors_of(result.g)):
            if self.accepts(e, shape, dtype, spec.layouts):
                return Pair(e, g)
        return None

    # --- the caller's tensors -------------------------------------------------------------------
    def hold(self, e, g, label):
        self.held.append(Held(e, g, label))
        if len(self.held) > self.MAX_HELD:
            # Keep the newest few; drop one of the older at random.
            del self.held[self.rng.randrange(len(self.held) - 3)]

    def between_calls(self):
        if self.held and self.rng.random() < self.DROP_ALL:
            keep = self.rng.randrange(len(self.held) + 1) // 3
            self.held = self.rng.sample(self.held, keep)
        writable = [h for h in self.held if h.e.is_floating_point() and h.e.numel() > 0]
        if writable and self.rng.random() < self.MUTATE:
            h = self.rng.choice(writable)
            op = self.rng.randrange(3) if h.e.dim() > 0 else self.rng.randrange(2)
            for t in (h.e, h.g):
                if op == 0:
                    t.neg_()
                elif op == 1:
                    t.add_(7).remainder_(61).sub_(30)
                else:
                    t[0].fill_(11)
            self.history.append(f"  then the caller wrote {h.label} ({['neg_', 'add_', 'fill_'][op]})")

    # --- one call -------------------------------------------------------------------------------
    def choose(self):
        if self.last is not None and self.rng.random() < self.CHAIN:
            spec = self.last[0]
            for shape, dtype in self.rng.sample(spec.variants, len(spec.variants)):
                x = self.chained_arg(spec, shape, dtype)
                if x is not None:
                    return spec, shape, dtype, x, "chained"
        spec = self.rng.choice(self.specs)
        shape, dtype = self.rng.choice(spec.variants)
        return spec, shape, dtype, None, None

    def step(self):
        self.call_index += 1
        self.fresh_bases = []
        spec, shape, dtype, x, how = self.choose()
        self.spec = spec
        if x is None:
            x = self.tensor_arg(0, shape, dtype, spec.layouts)
        args, kwargs = spec.build(self, shape, dtype, x)
        e_args = [a.e for a in args]
        g_args = [a.g for a in args]
        e_kwargs = {k: v.e for k, v in kwargs.items()}
        g_kwargs = {k: v.g for k, v in kwargs.items()}
        desc = (f"{spec.name}(" + ", ".join([describe(a) for a in e_args]
                                            + [f"{k}={v!r}" for k, v in e_kwargs.items()]) + ")"
                + (f" [{how}]" if how else ""))
        self.history.append(f"call {self.call_index}: {desc}")
        self.calls[spec.name] += 1

        result_e = self.eager[spec.name](*e_args, **e_kwargs)
        try:
            result_g = self.compiled[spec.name](*g_args, **g_kwargs)
        except Exception as error:
            self.fail(f"the compiled function raised {type(error).__name__}: {error}")

        why = tree_difference(result_e, result_g)
        if why is not None:
            self.fail(f"the result differs: {why}")
        arg_pairs = [(f"args{path[len('result'):]}", e, g)
                     for (path, e), (_, g) in zip(leaves(e_args), leaves(g_args))
                     if isinstance(e, torch.Tensor)]
        arg_pairs += [(f"kwargs[{k!r}]", v.e, v.g) for k, v in kwargs.items()
                      if isinstance(v.e, torch.Tensor)]
        for label, e, g in arg_pairs:
            why = tensor_difference(e, g)
            if why is not None:
                self.fail(f"argument {label} after the call differs (a mutation not copied "
                          f"back, or an input overwritten): {why}")
        for h in self.fresh_bases:
            why = tensor_difference(h.e, h.g)
            if why is not None:
                self.fail(f"the {h.label} differs after the call (the argument is a view of "
                          f"it): {why}")
        self.check_held("after the call")
        result_pairs = [(f"result{path[len('result'):]}", e, g)
                        for (path, e), (_, g) in zip(leaves(result_e), leaves(result_g))
                        if isinstance(e, torch.Tensor)]
        why = sharing_difference(arg_pairs + result_pairs + [(h.label, h.e, h.g) for h in self.held]
                                 + [(h.label, h.e, h.g) for h in self.fresh_bases])
        if why is not None:
            self.fail(f"memory: {why}")

        # The caller keeps some of the result, and the whole result until the next call.
        input_storages = {e.untyped_storage().data_ptr() for _, e, _ in arg_pairs if e.numel()}
        for label, e, g in result_pairs:
            aliases_input = e.numel() > 0 and e.untyped_storage().data_ptr() in input_storages
            if self.rng.random() < (self.HOLD_INPUT_VIEW if aliases_input else self.HOLD_OUTPUT):
                self.hold(e, g, f"{label} of call {self.call_index} ({spec.name})")
        self.last = (spec, Pair(result_e, result_g))
        self.between_calls()

    def check_held(self, when):
        for h in self.held:
            why = tensor_difference(h.e, h.g)
            if why is not None:
                self.fail(f"a tensor the caller holds, {h.label}, differs {when} (overwritten by "
                          f"a replay?): {why}")

    def fail(self, what):
        pytest.fail(f"grape fuzz (seed {self.seed}, options {self.options}), call {self.call_index} "
                    f"of {self.spec.name}: {what}\nlast calls:\n" + "\n".join(self.history),
                    pytrace=False)

    def run(self, calls):
        for _ in range(calls):
            self.step()


def is_refused_replay(fallback: dict) -> bool:
    return fallback.get("kind") == "replay_refused" or "replay refused" in fallback["reason"]


def check_stats(fz: Fuzzer, min_calls_to_fall_back: int):
    """Every call is accounted for; the functions that can be captured were, and most of their
    calls replayed (a fuzz that ran eagerly proves nothing); the data-dependent one fell back."""
    calls = replays = 0
    report = []
    for spec in fz.specs:
        s = grape.stats(fz.compiled[spec.name])
        n = fz.calls[spec.name]
        report.append(f"{spec.name}: calls {n} replays {s['replays']} warmup {s['warmup_calls']} "
                      f"eager {s['eager_calls']} signatures {s['signatures']} captures "
                      f"{s['captures']} chain_variants {s['chain_variants']} evacuations "
                      f"{s['evacuations']} fallbacks {[f['reason'] for f in s['fallbacks']]}")
        assert s["calls"] == n, report[-1]
        assert s["calls"] == s["replays"] + s["warmup_calls"] + s["eager_calls"], report[-1]
        if spec.falls_back:
            assert s["replays"] == 0, report[-1]
            if n >= min_calls_to_fall_back:
                assert s["fallbacks"], report[-1]
            assert all(spec.falls_back in f["reason"] for f in s["fallbacks"]), report[-1]
            continue
        # A refused replay (the caller holds a tensor in the graph's input buffer, or a mutated
        # argument aliases another) runs that call eagerly, correctly: docs/semantics.md. Any
        # other fallback of a function that can be captured is a failure.
        unexpected = [f for f in s["fallbacks"] if not is_refused_replay(f)]
        assert not unexpected, f"unexpected fallbacks: {unexpected}\n" + report[-1]
        calls += n
        replays += s["replays"]
    summary = "\n".join(report)
    assert calls > 0 and replays >= MIN_REPLAY_FRACTION * calls, (
        f"only {replays} of {calls} calls replayed\n{summary}")
    return summary


def run_fuzz(calls, options, spec_list):
    fz = Fuzzer(spec_list, options)
    assert fz.compiled["branchy"].rewritten, fz.compiled["branchy"].rewrite_note
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", grape.FallbackWarning)
        fz.run(calls)
    # The warnings the caller saw: of the function expected to fall back, or refused replays.
    expected = [f"grape: {fz.compiled[spec.name].__qualname__}(" for spec in spec_list
                if spec.falls_back]
    for w in caught:
        message = str(w.message)
        if issubclass(w.category, grape.FallbackWarning):
            assert message.startswith(tuple(expected)) or "replay refused" in message, message
    # A signature falls back at its capture: after `warmup` eager calls, and (the default) after
    # the function's first call and a failed capture at first sight (which warms that signature
    # up); with warmup_each_signature=True after its own `warmup` eager calls.
    warmup = options.get("warmup", 1)
    first_sight = not options.get("warmup_each_signature", False)
    summary = check_stats(fz, min_calls_to_fall_back=warmup + 1 + (1 if first_sight else 0))
    for spec in spec_list:
        s = grape.stats(fz.compiled[spec.name])
        if options.get("alias_prediction") is False:
            assert s["alias_predictions"] == 0 and s["input_sites"] == 0, (spec.name, summary)
        if options.get("share_executables") is False:
            assert s["graphs_joined"] == 0, (spec.name, summary)
        if options.get("warmup") == 0:
            assert s["warmup_calls"] == 0, (spec.name, summary)
        if first_sight and not spec.falls_back:
            assert s["warmup_calls"] <= warmup, (spec.name, summary)
    return fz, summary


def test_fuzz_compiled_functions_match_eager():
    fz, summary = run_fuzz(CALLS, {}, specs())
    stats = [grape.stats(fn) for fn in fz.compiled.values()]
    # The paths the fuzz is for were taken: held outputs moved out of a replay's way, and outputs
    # or input buffers read in place by a graph.
    assert sum(s["evacuations"] for s in stats) > 0, summary
    assert sum(s["alias_predictions"] for s in stats) > 0, summary
    print(summary)


# Options that take other paths: copies instead of chained placeholders and input buffers, one
# executable per graph, one per topology patched to every shape, a warm-up for every signature, no
# warm-up. Fewer calls each, and only the first (shape, dtype) of each function (fewer signatures).
OPTIONS = [
    dict(alias_prediction=False),
    dict(share_executables=False),
    dict(share_executables="topology", executable_cache=0),
    dict(warmup_each_signature=True),
    dict(warmup=0),
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_fuzz_with_compile_options(options):
    spec_list = specs()
    for spec in spec_list:
        spec.variants = spec.variants[:1]
    calls = max(400, CALLS // 4)
    _, summary = run_fuzz(calls, options, spec_list)
    print(summary)


@pytest.mark.parametrize("alias_prediction", [False, True])
def test_fuzz_with_a_cache_filled_by_an_earlier_process(tmp_path, alias_prediction):
    # With alias prediction, restored shapes read chained inputs and site buffers in place.
    options = dict(alias_prediction=alias_prediction, cache_dir=str(tmp_path))
    calls = max(400, CALLS // 4)
    fill = (f"from tests.python import test_fuzz_gpu as f; "
            f"f.run_fuzz({calls}, {options!r}, f.specs())")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", fill], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert any(f.endswith(".grape") for f in os.listdir(tmp_path)), "the first process wrote none"
    fz, summary = run_fuzz(calls, options, specs())
    caches = {name: grape.stats(fn)["graph_cache"] for name, fn in fz.compiled.items()}
    read = {name: c for name, c in caches.items() if c["status"] == "read"}
    # The cache was used: files found, and groups validated (shapes restored) or dropped.
    assert read, caches
    assert sum(c["validated_groups"] + len(c["dropped_groups"]) for c in read.values()) > 0, caches
    print(summary, {name: (c["restored_shapes"], c["dropped_groups"]) for name, c in read.items()})
