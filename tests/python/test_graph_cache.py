"""The graph cache's Python side, without a GPU: where the file lives, what its key and the
named tensors are, and the API's checks (docs/semantics.md, "The graph cache"). The restore
itself runs in tests/python/test_graph_cache_gpu.py."""

import gc
import os

import pytest
import torch

import grape
from grape import _graph_cache


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return self.lin(x) * self.scale


def test_the_directory_is_the_option_else_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(_graph_cache.ENVIRONMENT_VARIABLE, raising=False)
    assert _graph_cache.cache_directory(None) is None
    monkeypatch.setenv(_graph_cache.ENVIRONMENT_VARIABLE, str(tmp_path / "env"))
    assert _graph_cache.cache_directory(None) == str(tmp_path / "env")
    assert _graph_cache.cache_directory(tmp_path / "given") == str(tmp_path / "given")
    assert _graph_cache.cache_directory(False) is None


def test_a_cache_dir_of_another_type_is_refused():
    with pytest.raises(TypeError, match="cache_dir"):
        grape.compile(lambda x: x, cache_dir=3)
    with pytest.raises(TypeError, match="cache_dir"):
        grape.compile(cache_dir=True)
    assert grape.compile(lambda x: x, cache_dir=False)._hooks.cache_file is None


def test_each_function_has_a_file_of_its_own_and_keeps_it(tmp_path):
    model = Tiny()

    def first(x):
        return model(x)

    def second(x):
        return model(x)

    a = _graph_cache.CacheFile(first, str(tmp_path), first.__qualname__, {})
    again = _graph_cache.CacheFile(first, str(tmp_path), first.__qualname__, {})
    b = _graph_cache.CacheFile(second, str(tmp_path), second.__qualname__, {})
    assert a.path == again.path and a.path != b.path
    assert os.path.dirname(a.path) == str(tmp_path) and a.path.endswith(".grape")


def test_the_key_holds_the_options_and_the_tensors_are_named_where_found(tmp_path):
    model = Tiny()

    def step(x):
        return model(x)

    plain = _graph_cache.CacheFile(step, str(tmp_path), "step", {"plan_free_attention": False})
    planless = _graph_cache.CacheFile(step, str(tmp_path), "step", {"plan_free_attention": True})
    assert "option:plan_free_attention=False\n" in plain.key()
    assert plain.key() != planless.key()
    names = [name for name, _ in plain.named_tensors()]
    assert names == ["closure.model.lin.weight", "closure.model.lin.bias", "closure.model.scale"]
    path, key = plain.describe()
    assert path == plain.path and key == plain.key() and len(plain.named_tensors()) == 3
    assert os.path.isdir(tmp_path)


def test_a_compiled_module_names_its_own_tensors(tmp_path):
    model = grape.compile(Tiny(), cache_dir=tmp_path)
    cache_file = model.forward._hooks.cache_file
    assert [n for n, _ in cache_file.named_tensors()] == ["self.lin.weight", "self.lin.bias",
                                                          "self.scale"]


def test_tensors_are_named_as_named_parameters_then_named_buffers_name_them(tmp_path):
    # Tied and shared tensors under every name, an unset parameter and a non-persistent buffer,
    # in the order of Module.named_parameters and named_buffers (without removing duplicates).
    shared = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(shared, torch.nn.Sequential(shared, torch.nn.Linear(2, 2)),
                                torch.nn.BatchNorm1d(2))
    model[1][1].weight = model[0].weight
    model[1][1].register_parameter("bias", None)
    model[2].register_buffer("scratch", torch.zeros(3), persistent=False)
    cache_file = _graph_cache.CacheFile(model.forward, str(tmp_path), "forward", {})
    expected = [(f"self.{name}", t) for name, t in model.named_parameters(remove_duplicate=False)]
    expected += [(f"self.{name}", t) for name, t in model.named_buffers(remove_duplicate=False)]
    named = cache_file.named_tensors()
    assert [name for name, _ in named] == [name for name, _ in expected]
    assert all(got is want for (_, got), (_, want) in zip(named, expected))
    assert "self.1.1.weight" in dict(named) and "self.2.scratch" in dict(named)


@pytest.mark.usefixtures("quiet_fallbacks")
def test_without_a_gpu_nothing_is_written_and_calls_run_eagerly(tmp_path):
    model = Tiny()
    step = grape.compile(lambda x: model(x), cache_dir=tmp_path)
    x = torch.randn(2, 4)
    assert torch.equal(step(x), model(x))
    said = grape.save_graph_cache(step)
    assert isinstance(said, str) and "written" not in said
    assert [f for f in os.listdir(tmp_path) if f.endswith(".grape")] == []


def test_no_cache_directory_means_no_graph_cache(monkeypatch):
    monkeypatch.delenv(_graph_cache.ENVIRONMENT_VARIABLE, raising=False)
    step = grape.compile(lambda x: x + 1)
    assert step.save_graph_cache() == ""
    assert grape.stats(step)["graph_cache"] is None


def test_save_graph_cache_wants_a_compiled_function():
    with pytest.raises(TypeError, match="compiled function"):
        grape.save_graph_cache(lambda x: x)


def test_each_rank_has_a_file_of_its_own(tmp_path, monkeypatch):
    def step(x):
        return x

    cache_file = _graph_cache.CacheFile(step, str(tmp_path), "step", {})
    alone = cache_file.path
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    assert cache_file.path != alone
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    assert cache_file.path == alone


def test_a_directory_removed_after_it_was_made_is_not_made_again(tmp_path):
    def step(x):
        return x + 1

    directory = tmp_path / "cache"
    cache_file = _graph_cache.CacheFile(step, str(directory), "step", {})
    path, _ = cache_file.describe()
    assert directory.is_dir() and path.startswith(str(directory))
    directory.rmdir()  # a test's directory, say, gone before the process exits
    assert cache_file.describe() is None
    assert not directory.exists()


def test_namesakes_alive_at_once_keep_a_file_each_in_the_order_compiled(tmp_path):
    # An encoder's and a decoder's stack: one class, one forward, compiled each.
    encoder = grape.compile(Tiny(), cache_dir=tmp_path)
    decoder = grape.compile(Tiny(), cache_dir=tmp_path)
    first, second = (m.forward._hooks.cache_file.path for m in (encoder, decoder))
    assert first != second
    del encoder
    gc.collect()  # a compiled module is in a cycle with its forward
    again = grape.compile(Tiny(), cache_dir=tmp_path)  # in the place the first one left
    assert again.forward._hooks.cache_file.path == first
    elsewhere = grape.compile(Tiny(), cache_dir=tmp_path / "other")
    assert os.path.basename(elsewhere.forward._hooks.cache_file.path) == os.path.basename(first)


def test_the_kernel_image_watch_yields_to_a_profile_of_cuda_activities(monkeypatch):
    # CUPTI serves one subscriber: a profile of CUDA activities stops the watch before Kineto
    # asks for it, a CPU-only one does not, and a second wrapping is not stacked.
    from torch.autograd import profiler

    ProfilerActivity = torch.profiler.ProfilerActivity
    happened = []

    def recorded(name):
        original = getattr(profiler, name)

        def start(config, activities, *args, **kwargs):
            happened.append(name)
            # Kineto itself only where no GPU is asked for (this machine may have none).
            if ProfilerActivity.CUDA not in activities:
                return original(config, activities, *args, **kwargs)
        return start

    for name in ("_prepare_profiler", "_enable_profiler"):
        monkeypatch.setattr(profiler, name, recorded(name))
    _graph_cache.yield_to_profilers(happened.append)
    wrapped = profiler._prepare_profiler
    _graph_cache.yield_to_profilers(happened.append)
    assert profiler._prepare_profiler is wrapped
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]):  # a real one passes through
        torch.ones(2).sum()
    assert happened == ["_prepare_profiler", "_enable_profiler"]
    happened.clear()
    # What a profile asks on a GPU machine (without a GPU, torch.profiler drops CUDA itself).
    profiler._prepare_profiler(None, {ProfilerActivity.CPU, ProfilerActivity.CUDA})
    profiler._enable_profiler(None, {ProfilerActivity.CPU, ProfilerActivity.CUDA})
    stop = _graph_cache.PROFILER_TOOK_CUPTI
    assert happened == [stop, "_prepare_profiler", stop, "_enable_profiler"]
