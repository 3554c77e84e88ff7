"""The graph cache's key (Note [Graph cache keys] in grape/_cache_key.py): whatever would change a
captured graph changes the key, and the line that differs says what; what a graph reads in place
(weights' values) does not."""

import importlib.util
import textwrap

import torch

from grape._cache_key import cache_key, environment_facts

FACTS = {"grape": "0.1.0", "python": "3.12.0", "torch": "2.11.0+cu130", "cuda": "13.0",
         "cudnn": "91000", "driver": "13000", "gpu": "NVIDIA H200 sm_90", "rank": "0", "world": "1"}


def differing(a: str, b: str) -> list[str]:
    """The names of the lines that differ between two keys."""
    lines_a = dict(line.split("=", 1) for line in a.splitlines())
    lines_b = dict(line.split("=", 1) for line in b.splitlines())
    return sorted(n for n in lines_a.keys() | lines_b.keys() if lines_a.get(n) != lines_b.get(n))


class Block(torch.nn.Module):
    def __init__(self, width=8, eps=1e-5):
        super().__init__()
        self.proj = torch.nn.Linear(4, width)
        self.norm = torch.nn.LayerNorm(width, eps=eps)

    def forward(self, x):
        return self.norm(self.proj(x))


def test_the_same_function_and_model_give_the_same_key_and_weights_values_do_not_count():
    torch.manual_seed(0)
    model = Block()
    first = cache_key(model, FACTS)
    assert first == cache_key(model, FACTS)
    with torch.no_grad():
        model.proj.weight.add_(1.0)  # read in place by a graph: not part of what it captures
    assert cache_key(model, FACTS) == first
    assert all("=" in line for line in first.splitlines())
    assert differing(first, cache_key(Block(), FACTS)) == []


def test_a_changed_weight_shape_dtype_or_plain_attribute_changes_the_module_line():
    base = cache_key(Block(), FACTS)
    assert differing(base, cache_key(Block(width=16), FACTS)) == ["module:self"]
    assert differing(base, cache_key(Block().half(), FACTS)) == ["module:self"]
    assert differing(base, cache_key(Block(eps=1e-6), FACTS)) == ["module:self"]
    assert differing(base, cache_key(Block().eval(), FACTS)) == ["module:self"]


def test_a_setting_of_a_config_object_changes_the_module_line():
    class Settings:
        def __init__(self, rope_theta):
            self.rope_theta = rope_theta
            self.rope_scaling = {"type": "linear", "factor": 2.0}

    def with_config(theta):
        block = Block()
        block.config = Settings(theta)
        return cache_key(block, FACTS)

    assert with_config(10000.0) == with_config(10000.0)
    assert differing(with_config(10000.0), with_config(500000.0)) == ["module:self"]


def test_another_library_version_or_gpu_changes_its_own_line():
    base = cache_key(Block(), FACTS)
    assert differing(base, cache_key(Block(), {**FACTS, "torch": "2.14.1+cu130"})) == ["torch"]
    assert differing(base, cache_key(Block(), {**FACTS, "gpu": "NVIDIA H100 sm_90"})) == ["gpu"]
    assert differing(base, cache_key(Block(), {**FACTS, "rank": "1", "world": "2"})) == \
        ["rank", "world"]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_changed_code_line_changes_the_code_and_source_lines(tmp_path):
    path = tmp_path / "user_step.py"
    source = textwrap.dedent("""
        import torch
        model = torch.nn.Linear(4, 4)
        def step(x):
            return model(x).relu()
    """)
    path.write_text(source)
    before = cache_key(_load(path, "user_step_a").step, FACTS)
    assert "module:global.model" in {line.split("=")[0] for line in before.splitlines()}
    path.write_text(source.replace(".relu()", ".sigmoid()"))
    after = cache_key(_load(path, "user_step_b").step, FACTS)
    assert differing(before, after) == ["code", f"source:{path}"]
    # An edit elsewhere in the file, which the function does not run, still changes the source line:
    # a model's forward may call it.
    path.write_text(source + "\ndef unused():\n    return 1\n")
    elsewhere = cache_key(_load(path, "user_step_c").step, FACTS)
    assert differing(before, elsewhere) == [f"source:{path}"]


def test_modules_in_a_closure_are_part_of_the_key():
    def make(width):
        model = Block(width=width)

        def step(x):
            return model(x)
        return step

    a, b = cache_key(make(8), FACTS), cache_key(make(16), FACTS)
    assert differing(a, b) == ["module:closure.model"]


def test_this_process_facts_are_named():
    facts = environment_facts()
    assert facts["torch"] == torch.__version__
    assert {"grape", "python", "cuda", "cudnn", "driver", "gpu", "rank", "world"} <= set(facts)
    # grape by what it is built from, not its version number (equal across builds).
    assert len(facts["grape"]) == 32 and int(facts["grape"], 16) >= 0
    assert facts["grape"] == environment_facts()["grape"]
    assert cache_key(Block()).startswith("grape=")


def test_a_decorated_forward_is_keyed_by_the_code_beneath_the_decorator():
    import functools

    def returns_as_is(forward):  # as transformers' can_return_tuple wraps forwards
        @functools.wraps(forward)
        def wrapper(*args, **kwargs):
            return forward(*args, **kwargs)
        return wrapper

    class Relu(torch.nn.Module):
        @returns_as_is
        def forward(self, x):
            return x.relu()

    class Sigmoid(torch.nn.Module):
        @returns_as_is
        def forward(self, x):
            return x.sigmoid()

    # The classes differ in name (module line) and, beneath the shared wrapper, in code.
    assert "code" in differing(cache_key(Relu(), FACTS), cache_key(Sigmoid(), FACTS))


def test_a_decorated_function_reading_a_global_model_and_threshold_is_keyed_by_them(tmp_path):
    path = tmp_path / "decorated_step.py"
    source = textwrap.dedent("""
        import torch
        model = torch.nn.Linear(4, WIDTH)
        LIMIT = 64
        @torch.no_grad()
        def step(x):
            return model(x) if x.shape[0] < LIMIT else model(x).relu()
    """)
    keys = []
    for width, limit in ((4, 64), (8, 64), (4, 32)):
        path.write_text(source.replace("WIDTH", str(width)).replace("= 64", f"= {limit}"))
        keys.append(cache_key(_load(path, f"decorated_step_{width}_{limit}").step, FACTS))
    assert differing(keys[0], keys[1]) == ["module:global.model", f"source:{path}"]
    assert differing(keys[0], keys[2]) == [f"source:{path}", "value:global.LIMIT"]


def test_process_settings_hooks_and_nested_configs_change_the_key():
    base = cache_key(Block(), FACTS)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = not previous
    try:
        assert differing(base, cache_key(Block(), FACTS)) == ["settings"]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    hooked = Block()
    hooked.proj.register_forward_hook(lambda module, args, out: out * 2)
    assert differing(base, cache_key(hooked, FACTS)) == ["module:self"]

    class Inner:
        def __init__(self, theta):
            self.rope_theta = theta

    class Outer:
        def __init__(self, theta):
            self.text_config = Inner(theta)

    def with_nested(theta):
        block = Block()
        block.config = Outer(theta)
        return cache_key(block, FACTS)

    assert differing(with_nested(1e4), with_nested(5e5)) == ["module:self"]
