"""The call signature (cache key) and tree handling, on the CPU: no GPU needed."""

import collections
import dataclasses
import enum

import pytest
import torch

from grape import _C


def words(*args, **kwargs):
    return _C.signature(*args, **kwargs)["words"]


def test_same_call_same_signature():
    x = torch.randn(2, 3)
    assert words(x, 1, k="a") == words(torch.randn(2, 3), 1, k="a")


@pytest.mark.parametrize(
    "other",
    [
        torch.randn(2, 4),  # shape
        torch.randn(2, 3, dtype=torch.float64),  # dtype
        torch.randn(3, 2).t(),  # strides
    ],
)
def test_tensor_metadata_changes_signature(other):
    assert words(torch.randn(2, 3)) != words(other)


def test_requires_grad_changes_signature():
    assert words(torch.randn(2)) != words(torch.randn(2, requires_grad=True))


@pytest.mark.parametrize("a,b", [(1, 2), (1, 1.0), (True, 1), ("a", "b"), (None, 0), (2**70, 2**70 + 1),
                                 (torch.float16, torch.float32), ((1, 2), [1, 2])])
def test_python_values_change_signature(a, b):
    assert words(a) != words(b)


def test_equal_python_values_share_signature():
    assert words(2**70, "s", torch.float16) == words(2**70, "s", torch.float16)


def test_enum_members_are_values():
    class Mode(enum.Enum):
        A = 1
        B = 2

    assert words(Mode.A) == words(Mode.A)
    assert words(Mode.A) != words(Mode.B)


def test_kwarg_names_and_structure_matter():
    x = torch.randn(2)
    assert words(a=x) != words(b=x)
    assert words(x, x) != words((x, x))
    assert words({"a": x}) != words({"a": x, "b": None})


def test_grad_mode_is_part_of_the_signature():
    x = torch.randn(2)
    with torch.no_grad():
        no_grad = words(x)
    assert no_grad != words(x)


def test_dataclass_and_namedtuple_are_flattened():
    @dataclasses.dataclass
    class Batch:
        ids: torch.Tensor
        length: int

    Pair = collections.namedtuple("Pair", "a b")
    sig = _C.signature(Batch(torch.ones(3), 3), Pair(torch.zeros(1), 5))
    assert len(sig["tensors"]) == 2
    assert words(Batch(torch.ones(3), 3)) != words(Batch(torch.ones(3), 4))


def test_unsupported_leaves_are_named_with_their_path():
    class Holder:
        def __init__(self):
            self.t = torch.ones(1)

    sig = _C.signature(1, {"cache": Holder()})
    assert "cpu" in sig["unsupported"]
    assert sig["path"] == "args[1]['cache'].t"
    sig = _C.signature(torch.ones(1), x=torch.ones(2))
    assert "cpu" in sig["unsupported"] and sig["path"] == "args[0]"


def test_tensor_subclass_is_unsupported():
    class MyTensor(torch.Tensor):
        pass

    sig = _C.signature(torch.ones(2).as_subclass(MyTensor))
    assert "subclass" in sig["unsupported"]


def test_parameter_is_a_plain_tensor_leaf():
    sig = _C.signature(torch.nn.Parameter(torch.ones(2), requires_grad=False))
    assert "subclass" not in sig["unsupported"]


def test_modules_are_keyed_by_identity():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    assert words(a) == words(a)
    assert words(a) != words(b)


def test_map_tensors_rebuilds_every_container():
    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        extra: list
        note: str = dataclasses.field(default="n", init=False)

    Pair = collections.namedtuple("Pair", "a b")
    tree = {"out": Out(torch.ones(2), [torch.zeros(1), 3]), "pair": Pair(torch.ones(1), None), "t": (1.5,)}
    rebuilt = _C.map_tensors(tree, lambda t: t + 1)
    assert list(rebuilt) == ["out", "pair", "t"]
    assert isinstance(rebuilt["out"], Out) and rebuilt["out"].note == "n"
    assert torch.equal(rebuilt["out"].logits, torch.full((2,), 2.0))
    assert rebuilt["out"].extra[1] == 3 and torch.equal(rebuilt["out"].extra[0], torch.ones(1))
    assert isinstance(rebuilt["pair"], Pair) and rebuilt["pair"].b is None
    assert rebuilt["t"] == (1.5,)


def test_a_cpu_scalar_is_part_of_the_signature_by_its_value():
    # Note [Host scalars]: a 0-dim CPU tensor (a cache's sliding window) is a value, not data.
    class Layer:
        def __init__(self, window):
            self.keys = torch.zeros(2, 3)
            self.window = torch.tensor(window)

    for make in (lambda v: torch.tensor(v), lambda v: torch.tensor(float(v)),
                 lambda v: torch.tensor(bool(v % 2))):
        sig = _C.signature(make(4))
        assert sig["unsupported"] == "" and sig["tensors"] == []
        assert words(make(4)) == words(make(4)) and words(make(4)) != words(make(5))
    layer = _C.signature(Layer(4))
    assert "cpu" in layer["unsupported"]  # its 2-D keys, not the window
    assert layer["path"] == "args[0].keys"
    assert "cpu" in _C.signature(torch.tensor([4]))["unsupported"]  # one element, not 0-dim
    assert "cpu" in _C.signature(torch.tensor(4.0, requires_grad=True))["unsupported"]
    assert "cpu" in _C.signature(torch.tensor(1 + 2j))["unsupported"]


def test_local_words_are_marked_with_what_they_stand_for():
    # Note [Signatures of stored graphs]: ids another process may number otherwise (a module's
    # identity, an interned dict key, a record's type) are marked, each after its tag, with a
    # description another process can compare; sizes and numbers are not.
    class Holder:
        def __init__(self):
            self.t = torch.ones(2)

    module = torch.nn.Linear(2, 2)
    sig = _C.signature(module, {"key": torch.ones(3)}, Holder(), 7)
    words_, locals_ = sig["words"], sig["locals"]
    described = dict(locals_)
    assert all(0 < at < len(words_) for at in described)
    assert [at for at, _ in locals_] == sorted(at for at, _ in locals_)
    texts = list(described.values())
    assert "identity torch.nn.modules.linear.Linear" in texts
    assert "interned builtins.str 'key'" in texts
    assert any(t.startswith("interned builtins.type ") and "Holder" in t for t in texts)
    assert "interned builtins.str 't'" in texts  # the record's attribute name
    assert len(locals_) == 4  # the module, the key, the record's type and its attribute's name
    for at, text in locals_:
        assert text, f"word {at} has no description"
    # The same call again: the same ids, so the same marks.
    again = _C.signature(module, {"key": torch.ones(3)}, Holder(), 7)
    assert again["locals"] == sig["locals"] and again["words"] == sig["words"]
