"""The C++ sources keep their layers: csrc/core (torch-free) below csrc/cuda (CUDA, no torch)
below csrc/torch (libtorch and pybind11). Inside csrc/torch, its rooms by job: python (pybind11
glue: trees, argument objects, the hooks into grape's Python) and memory (the arena, the pool, the
allocator hook, site prediction) side by side, neither including the other; graphs (capture,
replay, training steps, conditional nodes) above both; the runtime and the bindings at the top,
in csrc/torch itself. No file includes one of a higher layer or room, no files include each other
in a cycle (a header and its .cpp counting as one), no file outgrows one job, no function outgrows
a screenful or two, and csrc/torch keeps few files of its own."""

import os
import re

CSRC = os.path.join(os.path.dirname(__file__), "..", "..", "csrc")
# A file's place: its layer, then its room inside csrc/torch (the top: the folder itself).
LAYERS = {"core": 0, "cuda": 1, "torch": 2}
ROOMS = {"torch/python": 0, "torch/memory": 0, "torch/graphs": 1, "torch": 2}
MAX_LINES = 700
MAX_FUNCTION_LINES = 120
MAX_TOP_LEVEL_TORCH_FILES = 12
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


# A body's head ends with its parameter list's ")" and qualifiers, or a constructor's initializer
# list; a head that opens a namespace, class, struct, enum or union opens no function.
FUNCTION_HEAD = re.compile(r"\)\s*((const|noexcept|override|final|mutable)\s*)*(->[^;{}]*)?$"
                           r"|\)\s*:[^;{}]*$")
TYPE_HEAD = re.compile(r"^\s*(template\s*<[^{};]*>\s*)?(namespace|class|struct|enum|union)\b",
                       re.M)


def _sources(csrc):
    for layer in LAYERS:
        for folder, _, names in sorted(os.walk(os.path.join(csrc, layer))):
            for name in sorted(names):
                if name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    yield os.path.relpath(os.path.join(folder, name), csrc).replace(os.sep, "/")


def _includes(csrc, source):
    with open(os.path.join(csrc, source)) as f:
        return [i for i in INCLUDE.findall(f.read()) if i.split("/")[0] in LAYERS]


def _module(source):
    return os.path.splitext(source)[0]


def _room(path):
    return os.path.dirname(path)


def _rank(path):
    """(layer, room): the room counts inside csrc/torch only."""
    layer = path.split("/")[0]
    return LAYERS[layer], ROOMS.get(_room(path), 0) if layer == "torch" else 0


def upward_includes(csrc):
    """Includes of a higher layer or room, and of a room of the same rank beside one's own."""
    found = []
    for s in _sources(csrc):
        for i in _includes(csrc, s):
            above = _rank(i) > _rank(s)
            beside = _rank(i) == _rank(s) and _room(i) != _room(s)
            if above or beside:
                found.append((s, i))
    return found


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


def _blank_comments_and_literals(text):
    """`text` with comments, string and character literals blanked out, its lines kept."""
    literal = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(]*)\(.*?\)\1"|"(\\.|[^"\\\n])*"'
                         r"|'(\\.|[^'\\\n])*'", re.S)
    return literal.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def function_lengths(text):
    """(name, first line, lines) of every function body in C++ source `text`, lambdas and local
    classes counted in the function they are written in."""
    code = _blank_comments_and_literals(text)
    found, opened, head_start = [], [], 0  # opened: (is a function, line, name) per open brace
    for i, c in enumerate(code):
        if c == "{":
            head = code[head_start:i]
            inside = any(is_function for is_function, _, _ in opened)
            last_statement = head[head.rfind(";") + 1:] if ";" in head else head
            is_function = (not inside and FUNCTION_HEAD.search(head.rstrip()) is not None
                           and not TYPE_HEAD.search(last_statement))
            names = re.findall(r"([~\w:]+)\s*\(", head)
            opened.append((is_function, code.count("\n", 0, i) + 1, names[0] if names else ""))
            head_start = i + 1
        elif c == "}":
            is_function, line, name = opened.pop()
            if is_function:
                found.append((name, line, code.count("\n", 0, i) + 2 - line))
            head_start = i + 1
        elif c == ";":
            head_start = i + 1
    return found


def test_no_file_includes_a_higher_layer_or_room():
    assert not upward_includes(CSRC)


def test_every_torch_source_is_in_a_known_room():
    rooms = {_room(s) for s in _sources(CSRC) if s.startswith("torch/")}
    assert rooms <= set(ROOMS), rooms - set(ROOMS)


def test_csrc_torch_keeps_few_files_of_its_own():
    top = [s for s in _sources(CSRC) if _room(s) == "torch"]
    assert len(top) <= MAX_TOP_LEVEL_TORCH_FILES, top


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


def test_no_function_outgrows_a_screenful_or_two():
    long = {}
    for s in _sources(CSRC):
        with open(os.path.join(CSRC, s)) as f:
            for name, line, n in function_lengths(f.read()):
                if n > MAX_FUNCTION_LINES:
                    long[f"{s}:{line} {name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines"


def test_function_lengths_count_bodies_not_types_lambdas_or_comments():
    source = """namespace a {
struct S {
  int f() const { return 1; }
};
// a comment with a brace {
int g(int x) {
  auto h = [](int y) {
    return y;
  };
  const char* s = "}";
  return h(x);
}
S::S(int v) : v_(v) {
}
}  // namespace a
"""
    assert function_lengths(source) == [("f", 3, 1), ("g", 6, 7), ("S::S", 13, 2)]


def test_the_checks_find_a_cycle_and_an_upward_include(tmp_path):
    for folder in ("core", "cuda", "torch/memory", "torch/python", "torch/graphs"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "torch" / "a.h").write_text('#include "torch/b.h"\n')
    (tmp_path / "torch" / "b.cpp").write_text('#include "torch/a.h"\n')
    (tmp_path / "core" / "c.h").write_text('#include "torch/a.h"\n')
    (tmp_path / "torch" / "memory" / "m.h").write_text('#include "torch/python/p.h"\n')
    (tmp_path / "torch" / "python" / "p.h").write_text("")
    (tmp_path / "torch" / "graphs" / "g.h").write_text('#include "torch/a.h"\n'
                                                       '#include "torch/memory/m.h"\n')
    assert include_cycle(str(tmp_path)) == ["torch/a", "torch/b", "torch/a"]
    assert sorted(upward_includes(str(tmp_path))) == [
        ("core/c.h", "torch/a.h"), ("torch/graphs/g.h", "torch/a.h"),
        ("torch/memory/m.h", "torch/python/p.h")]
