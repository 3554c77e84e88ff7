"""The C++ sources keep their layers: csrc/core (torch-free) below csrc/cuda (CUDA, no torch)
below csrc/torch (libtorch and pybind11). No file includes one of a higher layer, no files include
each other in a cycle (a header and its .cpp counting as one), and no file outgrows one job."""

import os
import re

CSRC = os.path.join(os.path.dirname(__file__), "..", "..", "csrc")
LAYERS = {"core": 0, "cuda": 1, "torch": 2}
MAX_LINES = 700
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _sources(csrc):
    for layer in LAYERS:
        for name in sorted(os.listdir(os.path.join(csrc, layer))):
            if name.endswith((".h", ".cpp", ".cu", ".cuh")):
                yield f"{layer}/{name}"


def _includes(csrc, source):
    with open(os.path.join(csrc, source)) as f:
        return [i for i in INCLUDE.findall(f.read()) if i.split("/")[0] in LAYERS]


def _module(source):
    return os.path.splitext(source)[0]


def upward_includes(csrc):
    return [(s, i) for s in _sources(csrc) for i in _includes(csrc, s)
            if LAYERS[i.split("/")[0]] > LAYERS[s.split("/")[0]]]


def include_cycle(csrc):
    """A cycle of modules (a header with its sources) that include each other, or None."""
    edges = {}
    for s in _sources(csrc):
        edges.setdefault(_module(s), set()).update(
            _module(i) for i in _includes(csrc, s) if _module(i) != _module(s))
    done, path = set(), []

    def visit(m):
        if m in path:
            return path[path.index(m):] + [m]
        if m in done:
            return None
        path.append(m)
        for n in sorted(edges.get(m, ())):
            cycle = visit(n)
            if cycle:
                return cycle
        path.pop()
        done.add(m)
        return None

    for m in sorted(edges):
        cycle = visit(m)
        if cycle:
            return cycle
    return None


def test_no_file_includes_a_higher_layer():
    assert not upward_includes(CSRC)


def test_includes_form_no_cycle():
    assert include_cycle(CSRC) is None


def test_no_file_outgrows_one_job():
    long = {}
    for s in _sources(CSRC):
        with open(os.path.join(CSRC, s)) as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long[s] = n
    assert not long, f"files over {MAX_LINES} lines"


def test_the_checks_find_a_cycle_and_an_upward_include(tmp_path):
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / "torch" / "a.h").write_text('#include "torch/b.h"\n')
    (tmp_path / "torch" / "b.cpp").write_text('#include "torch/a.h"\n')
    (tmp_path / "core" / "c.h").write_text('#include "torch/a.h"\n')
    assert include_cycle(str(tmp_path)) == ["torch/a", "torch/b", "torch/a"]
    assert upward_includes(str(tmp_path)) == [("core/c.h", "torch/a.h")]
