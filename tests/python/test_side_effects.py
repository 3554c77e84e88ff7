"""Argument objects that hold tensors (Note [Argument objects]), on the CPU: their signature, and
what a capture records of the attributes f rebinds and a replay sets again. The capture protocol
runs here without a graph (grape._C._trace_effects), with clones standing in for placeholders."""

import pytest
import torch

from benchmarks import generation
from grape import _C


class Layer:
    """Like a Hugging Face DynamicLayer: lazily initialized, `keys` rebound to longer tensors."""

    def __init__(self):
        self.keys = None
        self.is_initialized = False

    def update(self, k):
        if not self.is_initialized:
            self.keys = k.new_zeros(k.shape[0], 0)
            self.is_initialized = True
        self.keys = torch.cat([self.keys, k], -1)
        return self.keys


class Cache:
    def __init__(self, n, length=0):
        self.layers = [Layer() for _ in range(n)]
        if length:
            for layer in self.layers:
                layer.update(torch.arange(float(length)).view(1, length))


def words(*args, **kwargs):
    return _C.signature(*args, **kwargs)["words"]


def trace(fn, *args, **kwargs):
    return _C._trace_effects(fn, args, kwargs, lambda t: t.clone())


def step(x, cache):
    return sum(layer.update(x)[:, -1:] for layer in cache.layers)


def test_objects_holding_tensors_are_keyed_by_structure_not_identity():
    assert words(Cache(2, 3)) == words(Cache(2, 3))
    assert words(Cache(2, 3)) != words(Cache(2, 4))  # a tensor's shape
    assert words(Cache(2, 3)) != words(Cache(3, 3))  # the list's length
    sig = _C.signature(Cache(2, 3))
    assert len(sig["tensors"]) == 2


def test_an_object_passed_twice_differs_from_two_equal_objects():
    shared = Cache(1, 2)
    assert words(shared, shared) != words(Cache(1, 2), Cache(1, 2))
    assert len(_C.signature(shared, shared)["tensors"]) == 1


def test_objects_without_tensors_stay_keyed_by_identity():
    class Options:
        def __init__(self):
            self.beams = 4

    a, b = Options(), Options()
    assert words(a) == words(a) and words(a) != words(b)


def test_rebound_attributes_are_effects_and_the_objects_are_put_back():
    cache = Cache(2, 3)
    before = [layer.keys for layer in cache.layers]
    x = torch.full((1, 1), 7.0)
    traced = trace(step, x, cache)
    assert traced["reason"] == ""
    assert traced["effects"] == [(1, "keys"), (2, "keys")]  # record 0 is the cache itself
    # f ran on placeholders (clones); the caller's objects are as they were.
    assert [layer.keys for layer in cache.layers] == before
    for value in traced["values"]:
        assert torch.equal(value, torch.tensor([[0.0, 1.0, 2.0, 7.0]]))

    # A replay on another call's objects of the same signature sets the same attributes.
    other = Cache(2, 3)
    _C._apply_effects((x, other), {}, traced["effects"], traced["values"])
    assert all(layer.keys is v for layer, v in zip(other.layers, traced["values"]))


def test_lazy_initialization_sets_constants_and_new_attributes():
    class Lazy:
        def __init__(self):
            self.t = torch.zeros(2)
            self.ready = False

    def init(obj):
        obj.ready = True
        obj.extra = obj.t + 1

    obj = Lazy()
    traced = trace(init, obj)
    assert traced["effects"] == [(0, "ready"), (0, "extra")]
    assert traced["values"][0] is True and torch.equal(traced["values"][1], torch.ones(2))
    assert obj.ready is False and not hasattr(obj, "extra")
    _C._apply_effects((obj,), {}, traced["effects"], traced["values"])
    assert obj.ready is True and torch.equal(obj.extra, torch.ones(2))


def test_a_list_changed_in_place_inside_an_object_is_an_effect():
    cache = Cache(1, 2)

    def grow(c):
        c.layers.append(Layer())

    traced = trace(grow, cache)
    assert traced["reason"] == "" and traced["effects"] == [(0, "layers")]
    assert len(cache.layers) == 1  # put back
    (layers,) = traced["values"]
    assert len(layers) == 2 and layers[0] is cache.layers[0]


def test_what_a_replay_cannot_repeat_is_refused_with_a_reason():
    def forget(c):
        del c.layers[0].keys

    cache = Cache(1, 2)
    traced = trace(forget, cache)
    assert "deletes the attribute" in traced["reason"] and "Layer.keys" in traced["reason"]
    assert cache.layers[0].keys is not None  # put back

    def append(xs):
        xs.append(xs[0] * 2)

    traced = trace(append, [torch.ones(1)])
    assert "changes a list argument in place" in traced["reason"]


def test_objects_are_put_back_when_f_raises():
    cache = Cache(2, 3)
    before = [layer.keys for layer in cache.layers]

    def boom(x, c):
        step(x, c)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        trace(boom, torch.ones(1, 1), cache)
    assert [layer.keys for layer in cache.layers] == before


def test_an_object_of_a_type_that_held_tensors_is_a_record_before_it_holds_any():
    # An HF cache before its first update holds no tensor; its type is known from earlier calls,
    # so two such caches share a signature (and a prefill graph).
    class Fresh:
        def __init__(self, t=None):
            self.t = t

    assert words(Fresh()) != words(Fresh())  # never seen holding a tensor: keyed by identity
    words(Fresh(torch.ones(1)))
    assert words(Fresh()) == words(Fresh())


def test_hugging_face_dynamic_cache_decode_step():
    transformers = pytest.importorskip("transformers")
    import copy

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 512, (2, 4))
    kv = generation.cache_keyword(transformers.GPT2LMHeadModel)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        tok = model(input_ids=ids, **{kv: cache}).logits[:, -1:].argmax(-1)
        eager_cache = copy.deepcopy(cache)
        want = model(input_ids=tok, **{kv: eager_cache}).logits

        traced = trace(lambda **kw: model(**kw), input_ids=tok, use_cache=True, **{kv: cache})
    assert traced["reason"] == ""
    # Records: the cache (0) and its layers (1, 2); each layer's keys and values are rebound.
    assert traced["effects"] == [(1, "keys"), (1, "values"), (2, "keys"), (2, "values")]
    assert cache.get_seq_length() == 4  # put back
    assert generation.cache_of(traced["result"]) is cache
    torch.testing.assert_close(traced["result"].logits, want)
    _C._apply_effects((), dict(input_ids=tok, use_cache=True, **{kv: cache}),
                      traced["effects"], traced["values"])
    for got, ref in zip(cache.layers, eager_cache.layers):
        torch.testing.assert_close(got.keys, ref.keys)
        torch.testing.assert_close(got.values, ref.values)
