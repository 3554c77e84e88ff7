"""grape.compile's API and its behaviour where graphs are impossible; runs on any machine."""

import gc
import warnings
import weakref

import pytest
import torch

import grape
from grape import _C


def test_rejects_bad_arguments():
    with pytest.raises(TypeError, match="function or an nn.Module"):
        grape.compile(42)
    with pytest.raises(TypeError, match="function or an nn.Module, got NoneType"):
        grape.compile(None)  # a model variable still unset, not a request for options
    with pytest.raises(TypeError, match="warmup must be an int"):
        grape.compile(lambda x: x, warmup=True)
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        grape.compile(lambda x: x, warmup=-1)
    f = grape.compile(lambda x: x)
    with pytest.raises(TypeError, match="already compiled"):
        grape.compile(f)
    with pytest.raises(TypeError, match="grape.stats expects"):
        grape.stats(lambda x: x)


def test_decorator_forms_keep_the_function_identity():
    @grape.compile
    def double(x):
        """Doubles."""
        return 2 * x

    @grape.compile(warmup=3)
    def triple(x):
        return 3 * x

    assert isinstance(double, grape.CompiledFunction) and isinstance(triple, grape.CompiledFunction)
    assert double.__name__ == "double" and double.__doc__ == "Doubles."
    assert "double" in repr(double)


def test_method_decorator_binds_self():
    class Scaler:
        def __init__(self, k):
            self.k = k

        @grape.compile
        def scale(self, x):
            return self.k * x

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", grape.FallbackWarning)
        assert torch.equal(Scaler(3).scale(torch.ones(2)), torch.full((2,), 3.0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the machine without CUDA")
def test_without_cuda_every_call_runs_eagerly_with_one_warning():
    calls = []

    @grape.compile
    def f(x, n):
        calls.append(n)
        return x * n

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [f(torch.ones(2), n) for n in range(3)]
    assert calls == [0, 1, 2]
    assert [o.tolist() for o in outs] == [[0, 0], [1, 1], [2, 2]]
    messages = [str(w.message) for w in caught if issubclass(w.category, grape.FallbackWarning)]
    reason = "CUDA is not available" if _C.built_with_cuda else "grape was built without CUDA"
    assert len(messages) == 1 and reason in messages[0]
    assert "test_compile_api.py" in messages[0]  # names the call site
    s = grape.stats(f)
    assert s["calls"] == 3 and s["eager_calls"] == 3 and s["replays"] == 0
    assert s["fallbacks"][0]["reason"] == reason


def test_a_fallback_warning_cuts_a_long_signature_that_stats_keep_whole():
    # The runtime reports a signature's fallback through its hooks; a KV cache of 28 layers makes
    # a signature of thousands of characters.
    f = grape.compile(lambda *xs: xs[0])
    signature = "(" + ", ".join(["Half[1, 16, 33, 256] cuda:0"] * 56) + ")"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f._hooks.report_fallback(signature, "capture_error", "capture failed: why", None)
    (message,) = [str(w.message) for w in caught if issubclass(w.category, grape.FallbackWarning)]
    assert signature[:240] in message and signature not in message
    assert f"{len(signature) - 240} more characters in grape.stats()" in message
    assert "runs eagerly: capture failed: why" in message and len(message) < 500
    assert grape.stats(f)["fallbacks"][-1]["signature"] == signature
    short = "(Float[8, 64] cuda:0)"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f._hooks.report_fallback(short, "capture_error", "why", None)
    assert f"{short} runs eagerly: why" in str(caught[-1].message)


def test_function_errors_propagate_and_the_function_keeps_working():
    @grape.compile
    def f(x):
        if x.shape[0] == 3:
            raise ValueError("no threes")
        return x + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", grape.FallbackWarning)
        with pytest.raises(ValueError, match="no threes"):
            f(torch.ones(3))
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))


def test_compiled_module_forward_and_stats():
    model = torch.nn.Linear(4, 2)
    same = grape.compile(model)
    assert same is model and isinstance(model.forward, grape.CompiledFunction)
    with pytest.raises(TypeError, match="already compiled"):
        grape.compile(model)
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", grape.FallbackWarning)
        with torch.no_grad():
            expected = torch.nn.functional.linear(x, model.weight, model.bias)
            assert torch.allclose(model(x), expected)
    assert grape.stats(model)["calls"] == 1
    assert grape.stats(model)["name"] == "Linear.forward"


def test_compiled_module_is_garbage_collected():
    model = grape.compile(torch.nn.Linear(2, 2))
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_alias_prediction_must_be_a_bool():
    with pytest.raises(TypeError, match="alias_prediction must be a bool"):
        grape.compile(lambda x: x, alias_prediction="yes")
    assert grape.stats(grape.compile(lambda x: x, alias_prediction=False))["alias_prediction"] is False


def test_plan_free_attention_is_a_checked_bool_whose_calls_leave_cudnn_attention_out():
    with pytest.raises(TypeError, match="plan_free_attention must be a bool"):
        grape.compile(lambda x: x, plan_free_attention=1)
    backends = torch.backends.cuda
    switches = (backends.enable_cudnn_sdp, backends.enable_flash_sdp,
                backends.enable_mem_efficient_sdp, backends.enable_math_sdp)

    def allowed(x):
        return (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled(),
                backends.mem_efficient_sdp_enabled(), backends.math_sdp_enabled())

    before = allowed(None)
    x = torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")
    try:
        for switch in switches:
            switch(True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", grape.FallbackWarning)  # no CUDA: eager calls
            plain = grape.compile(allowed)
            assert grape.stats(plain)["plan_free_attention"] is False
            assert [plain(x) for _ in range(3)] == [(True, True, True, True)] * 3
            planless = grape.compile(allowed, plan_free_attention=True)
            assert grape.stats(planless)["plan_free_attention"] is True
            # Every call leaves cuDNN's attention out: warm-ups and eager calls as captures do.
            assert [planless(x) for _ in range(3)] == [(False, True, True, True)] * 3
            assert allowed(None) == (True, True, True, True)
            # The caller's own choice among the others stands.
            backends.enable_flash_sdp(False)
            caller_chose = grape.compile(allowed, plan_free_attention=True)
            assert caller_chose(x) == (False, False, True, True)
            assert allowed(None) == (True, False, True, True)
            with pytest.raises(ZeroDivisionError):  # the switch comes back when the call raises
                grape.compile(lambda t: 1 // 0, plan_free_attention=True)(x)
            assert allowed(None) == (True, False, True, True)
    finally:
        for switch, was in zip(switches, before):
            switch(was)


def test_warmup_each_signature_is_a_checked_bool_reported_in_stats():
    with pytest.raises(TypeError, match="warmup_each_signature must be a bool"):
        grape.compile(lambda x: x, warmup_each_signature=0)
    assert grape.stats(grape.compile(lambda x: x))["warmup_each_signature"] is False
    each = grape.compile(warmup_each_signature=True)(lambda x: x)
    assert grape.stats(each)["warmup_each_signature"] is True


def test_graph_memory_options_are_checked():
    with pytest.raises(TypeError, match="share_executables must be a bool, .topology. or .near."):
        grape.compile(lambda x: x, share_executables=1)
    with pytest.raises(TypeError, match="share_executables must be"):
        grape.compile(lambda x: x, share_executables="none")
    with pytest.raises(TypeError, match="memory_budget must be an int"):
        grape.compile(lambda x: x, memory_budget=1.5)
    with pytest.raises(TypeError, match="memory_budget must be an int"):
        grape.compile(lambda x: x, memory_budget=True)
    with pytest.raises(ValueError, match="memory_budget must be >= 0"):
        grape.compile(lambda x: x, memory_budget=-1)
    with pytest.raises(ValueError, match="memory_budget must be >= 0"):
        grape.set_memory_budget(-5)
    with pytest.raises(TypeError, match="executable_cache must be an int"):
        grape.compile(lambda x: x, executable_cache="1G")
    with pytest.raises(ValueError, match="executable_cache must be >= 0"):
        grape.compile(lambda x: x, executable_cache=-1)
    assert grape.stats(grape.compile(lambda x: x))["executable_cache"] == 256 << 20
    assert grape.stats(grape.compile(lambda x: x, executable_cache=None))["executable_cache"] is None
    assert grape.stats(grape.compile(lambda x: x, executable_cache=0))["executable_cache"] == 0


def test_the_default_memory_budget_applies_to_functions_compiled_after_it():
    before = grape.compile(lambda x: x)
    grape.set_memory_budget(1 << 30)
    try:
        after = grape.compile(lambda x: x)
        decorated = grape.compile(warmup=2)(lambda x: x)
        explicit = grape.compile(lambda x: x, memory_budget=None)
        assert grape.stats(after)["memory_budget"] == 1 << 30
        assert grape.stats(decorated)["memory_budget"] == 1 << 30
        assert grape.stats(explicit)["memory_budget"] is None
        assert grape.stats(before)["memory_budget"] is None
    finally:
        grape.set_memory_budget(None)
    assert grape.stats(grape.compile(lambda x: x))["memory_budget"] is None


def test_pinned_host_constants_leave_host_tensors_alone():
    from grape._host_constants import PinnedHostConstants

    with PinnedHostConstants() as mode:
        t = torch.tensor([1.0, 2.0])
        u = torch.as_tensor(3, device="cpu")
        v = u.to(torch.float16).to("cpu")
    assert t.device.type == "cpu" and u.item() == 3 and v.item() == 3 and mode.kept == []


def test_what_pinned_host_constants_move_to_the_device():
    from grape._host_constants import _moved_to_cuda

    t = torch.tensor(3)
    cuda = torch.device("cuda")
    assert _moved_to_cuda(torch.Tensor.to, (t, "cuda"), {}) == (cuda, None, torch.preserve_format)
    assert _moved_to_cuda(torch.Tensor.to, (t,), {"device": "cuda:1", "dtype": torch.half}) == \
        (torch.device("cuda", 1), torch.half, torch.preserve_format)
    # Not a move from pageable host memory to a GPU: left to PyTorch.
    assert _moved_to_cuda(torch.Tensor.to, (t, torch.half), {}) is None
    assert _moved_to_cuda(torch.Tensor.to, (t, "cpu"), {}) is None
    assert _moved_to_cuda(torch.Tensor.add, (t, 1), {}) is None
    assert _moved_to_cuda(torch.Tensor.to, (torch.zeros(2, requires_grad=True), "cuda"), {}) is None


def test_an_indexing_on_the_device_assigns_what_pytorch_assigns():
    from grape._host_constants import _indexing_on_device

    moved = []

    def through_pinned(host, device):
        moved.append((host.tolist(), device))
        return host.clone()

    for value in (2.7, 3, True):
        for dtype in (torch.int64, torch.float16, torch.bool):
            expected, x = torch.zeros(4, dtype=dtype), torch.zeros(4, dtype=dtype)
            expected[[0, 2]] = value
            moved.clear()
            args = _indexing_on_device((x, [0, 2], value), through_pinned)
            assert moved == [([0, 2], x.device)]
            assert args[2].dim() == 0 and args[2].dtype == dtype  # made as a tensor of x's dtype
            torch.Tensor.__setitem__(*args)
            assert torch.equal(x, expected), (value, dtype)
    # A boolean mask (PyTorch fills without a copy), a basic index, or an int beyond 64 bits: the
    # number stays a number.
    x = torch.zeros(4)
    for index in (x > 0, [True, False, True, False], 1, slice(0, 2), (Ellipsis, None)):
        assert _indexing_on_device((x, index, 2.5), through_pinned)[2] == 2.5
    assert _indexing_on_device((x, [0], 2**64), through_pinned)[2] == 2**64
    # A read: no value to make.
    x = torch.arange(6).reshape(2, 3)
    assert torch.equal(torch.Tensor.__getitem__(*_indexing_on_device((x, (Ellipsis, [-1])),
                                                                     through_pinned)), x[..., [-1]])


def test_the_parts_of_an_index_that_pinned_host_constants_move_and_what_they_index():
    from grape._host_constants import _device_index

    moved = []

    def move(host):
        moved.append(host)
        return host.clone()

    x = torch.arange(24).reshape(2, 3, 4)
    host_built = [(Ellipsis, [-2]), (slice(None), [True, False, True]), [1, 0],
                  (torch.tensor([0, 1, 1]), slice(None), 2), (0, torch.tensor([[2], [0]]))]
    for index in host_built:
        moved.clear()
        on_device = _device_index(index, move)
        assert moved and on_device is not index
        assert torch.equal(x[on_device], x[index])  # what PyTorch gives for the original index
    # No host-built part: the same object, nothing made.
    moved.clear()
    for index in [(slice(None), 1, None), (Ellipsis, 0), [[0, 1], [1, 0]], [1, True],
                  torch.tensor(1), (torch.tensor(0.5),)]:
        assert _device_index(index, move) is index
    assert moved == []


def test_advice_follows_the_kind_of_a_reason_not_its_words():
    from grape._hooks import advice

    said = advice("host_sync", "capture failed: RuntimeError: boom")
    assert said.startswith("capture failed: RuntimeError: boom (") and ".item()" in said
    # Words alone add nothing: the kind is set where the reason arises (csrc/core/reasons.h).
    assert advice("capture_error", "a synchronizing call") == "a synchronizing call"
    f = grape.compile(lambda x: x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f._hooks.report_fallback("(Float[2] cuda:0)", "pageable_copy", "capture failed: copy", None)
    assert "pin the CPU tensor" in str(caught[-1].message)
    assert grape.stats(f)["fallbacks"][-1]["kind"] == "pageable_copy"
