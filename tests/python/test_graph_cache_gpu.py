"""The graph cache across processes (docs/semantics.md, "The graph cache"): one process fills a
cache directory, a later one restores from it, and anything that makes a stored graph wrong for
the later process is a miss or a drop, never a wrong result. Every process is a fresh one
(tests/python/graph_cache_worker.py), which compares each output with eager on the same weights."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu]

WORKER = os.path.join(os.path.dirname(__file__), "graph_cache_worker.py")


def run(cache_dir, *options, background=False, env=None):
    command = [sys.executable, WORKER, str(cache_dir), *options]
    env = {**os.environ, **(env or {})}
    if background:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    return report(done.returncode, done.stdout, done.stderr)


def report(returncode, stdout, stderr):
    assert returncode == 0, stderr[-4000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    result["stderr"] = stderr
    return result


def cache_files(cache_dir):
    return [os.path.join(cache_dir, f) for f in os.listdir(cache_dir) if f.endswith(".grape")]


def test_a_later_process_restores_the_shapes_one_live_capture_validates(tmp_path):
    first = run(tmp_path)
    assert first["error"] < 1e-5
    assert first["stats"]["captures"] == 3
    cache = first["stats"]["graph_cache"]
    assert cache["status"] == "no file" and cache["saved_shapes"] == 3, cache
    assert len(cache_files(tmp_path)) == 1

    later = run(tmp_path)
    cache = later["stats"]["graph_cache"]
    assert cache["status"] == "read" and cache["stored_shapes"] == 3, cache
    assert cache["file_bytes"] == os.path.getsize(cache_files(tmp_path)[0]), cache
    assert cache["validated_groups"] == 1 and cache["dropped_groups"] == [], cache
    assert cache["restored_shapes"] == 2, cache
    assert 0 < cache["restore_join_seconds"] <= cache["restore_seconds"], cache
    parts = ("restore_validate_seconds", "restore_relocate_seconds", "restore_join_seconds")
    assert all(cache[part] > 0 for part in parts), cache
    assert sum(cache[part] for part in parts) <= cache["restore_seconds"] + 1e-9, cache
    # One live capture (length 3, after its warm-up); 5 and 9 replay from their first call.
    assert later["stats"]["captures"] == 1
    assert later["stats"]["replays"] == 5
    assert later["error"] < 1e-5
    assert later["saved"] == "nothing new to write"


def test_dtypes_and_devices_in_a_result_are_stored_and_restored(tmp_path):
    # The worker checks each call's dtype and device against eager's, restored shapes' too.
    first = run(tmp_path, "--variant", "described")
    filled = first["stats"]["graph_cache"]
    assert filled["unstored"] == {} and filled["saved_shapes"] == 3, filled
    later = run(tmp_path, "--variant", "described")
    cache = later["stats"]["graph_cache"]
    assert cache["validated_groups"] == 1 and cache["restored_shapes"] == 2, cache
    assert later["stats"]["captures"] == 1
    assert later["error"] < 1e-5


def test_another_width_is_a_miss(tmp_path):
    run(tmp_path, "--width", "32")
    later = run(tmp_path, "--width", "48")
    cache = later["stats"]["graph_cache"]
    assert cache["status"].startswith("miss: ") and "module:closure.model" in cache["status"]
    assert cache["restored_shapes"] == 0 and later["stats"]["captures"] == 3
    assert "is not used" in later["stderr"]
    assert later["error"] < 1e-5


def test_another_dtype_is_a_miss(tmp_path):
    run(tmp_path, "--dtype", "float32")
    later = run(tmp_path, "--dtype", "float16")
    cache = later["stats"]["graph_cache"]
    assert cache["status"].startswith("miss: "), cache
    assert cache["restored_shapes"] == 0 and later["stats"]["captures"] == 3
    assert later["error"] < 1e-2


def test_a_changed_code_line_is_a_miss(tmp_path):
    run(tmp_path, "--variant", "plain")
    later = run(tmp_path, "--variant", "scaled")
    cache = later["stats"]["graph_cache"]
    # The function's qualified name and file are the same, so it finds the file: its key differs.
    assert cache["status"].startswith("miss: stored with 'code="), cache
    assert cache["restored_shapes"] == 0 and later["stats"]["captures"] == 3


def test_another_torch_version_is_a_miss(tmp_path):
    run(tmp_path)
    later = run(tmp_path, "--fake-torch-version", "0.0.0+faked")
    cache = later["stats"]["graph_cache"]
    assert cache["status"].startswith("miss: stored with 'torch="), cache
    assert "here 'torch=0.0.0+faked'" in cache["status"]
    assert cache["restored_shapes"] == 0 and later["stats"]["captures"] == 3


def test_a_truncated_file_is_ignored_with_a_warning(tmp_path):
    run(tmp_path)
    (path,) = cache_files(tmp_path)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    later = run(tmp_path)
    cache = later["stats"]["graph_cache"]
    assert cache["status"].startswith("unreadable: "), cache
    assert "is not used" in later["stderr"]
    assert cache["restored_shapes"] == 0 and later["stats"]["captures"] == 3
    assert later["error"] < 1e-5
    # It wrote a whole file again, which the next process restores from.
    assert run(tmp_path)["stats"]["graph_cache"]["restored_shapes"] == 2


def test_two_processes_writing_at_once_leave_a_whole_file(tmp_path):
    cache_dir = tmp_path / "cache"
    writers = [run(cache_dir, "--barrier", str(tmp_path / "barrier"), background=True)
               for _ in range(2)]
    for writer in writers:
        out, err = writer.communicate(timeout=300)
        assert report(writer.returncode, out, err)["stats"]["graph_cache"]["saved_shapes"] == 3
    assert len(cache_files(cache_dir)) == 1 and len(os.listdir(cache_dir)) == 1, "no leftovers"
    later = run(cache_dir)
    cache = later["stats"]["graph_cache"]
    # A whole file, one writer's: read, and its group validated by the live capture or dropped
    # with the reason (processes sharing the GPU at capture time may record other parameters).
    assert cache["status"] == "read" and cache["stored_shapes"] == 3, json.dumps(cache)
    assert cache["restored_shapes"] == 2 or len(cache["dropped_groups"]) == 1, json.dumps(cache)
    assert later["error"] < 1e-5


@pytest.mark.parametrize("variant", ["chained", "site"])
def test_inputs_alias_prediction_reads_in_place_are_stored_and_restored(tmp_path, variant):
    # chained: each call's input is the previous call's output, a row shorter (chain
    # prediction), stored as a plain placeholder where it was. site: the caller grows each input
    # by a row (torch.cat), in the site's buffers (site prediction), stored as a site buffer. A
    # later process's chain and site put them at the same places; a replay copies an input found
    # elsewhere, and never into a site buffer that a tensor holds.
    first = run(tmp_path, "--variant", variant, "--lengths", "3,10")
    assert first["error"] < 1e-5 and first["stats"]["alias_hits"] > 0, first["stats"]
    if variant == "site":
        assert first["stats"]["site_allocations"] > 0, "the site handed out buffers"
    filled = first["stats"]["graph_cache"]
    # One stored shape per length called (a signature's chain variants are not stored).
    assert filled["unstored"] == {} and filled["saved_shapes"] == 10 - 3 + 1, filled
    later = run(tmp_path, "--variant", variant, "--lengths", "3,10")
    assert later["error"] < 1e-5
    cache = later["stats"]["graph_cache"]
    assert cache["dropped_groups"] == [] and cache["restored_shapes"] > 0, json.dumps(cache)
    assert later["stats"]["captures"] < first["stats"]["captures"]
    # Restored shapes (most of the replays) find their inputs in place, as the stored ones did.
    assert later["stats"]["inputs_in_place"] > 0, later["stats"]


def test_random_numbers_are_not_stored(tmp_path):
    first = run(tmp_path, "--variant", "dropout")
    cache = first["stats"]["graph_cache"]
    assert cache["unstored"] == {"it draws random numbers": 3}, cache
    assert cache["saved_shapes"] == -1 and cache_files(tmp_path) == []
    later = run(tmp_path, "--variant", "dropout")
    assert later["stats"]["captures"] == 3
    assert later["stats"]["graph_cache"]["status"] == "no file"


def test_a_rewrite_keeps_the_stored_shapes_this_process_did_not_use(tmp_path):
    run(tmp_path, "--lengths", "3,5,9")
    # Length 9 is not called here; length 7 is new, so the file is written again.
    middle = run(tmp_path, "--lengths", "3,5,7")
    cache = middle["stats"]["graph_cache"]
    assert cache["restored_shapes"] == 1 and cache["saved_shapes"] >= 4, json.dumps(cache)
    assert "written" in middle["saved"]
    later = run(tmp_path, "--lengths", "3,9")
    cache = later["stats"]["graph_cache"]
    assert cache["restored_shapes"] == 1 and later["stats"]["captures"] == 1, json.dumps(cache)
    assert later["error"] < 1e-5


def test_a_number_the_key_does_not_see_that_a_kernel_reads_is_a_drop(tmp_path):
    # The scale comes from the environment: the key is the same, and only the kernel's arguments
    # differ. A run of the live capture with the stored bytes gives other outputs: dropped.
    first = run(tmp_path, "--variant", "env_scaled", env={"GRAPE_TEST_SCALE": "0.5"})
    assert first["error"] < 1e-5 and first["stats"]["graph_cache"]["saved_shapes"] == 3
    same = run(tmp_path, "--variant", "env_scaled", env={"GRAPE_TEST_SCALE": "0.5"})
    cache = same["stats"]["graph_cache"]
    assert cache["validated_groups"] == 1 and cache["restored_shapes"] == 2, cache
    other = run(tmp_path, "--variant", "env_scaled", env={"GRAPE_TEST_SCALE": "0.25"})
    cache = other["stats"]["graph_cache"]
    assert cache["status"] == "read" and cache["validated_groups"] == 0, cache
    assert cache["restored_shapes"] == 0 and cache["unread_bytes"] == 0, cache
    assert len(cache["dropped_groups"]) == 1, cache
    assert "a run with the stored bytes gave other outputs" in cache["dropped_groups"][0], cache
    assert other["stats"]["captures"] == 3
    assert other["error"] < 1e-5


@pytest.mark.parametrize("alias_prediction", [False, True])
def test_a_later_process_generates_eagers_tokens_from_restored_shapes(tmp_path, alias_prediction):
    # Hugging Face GPT-2 (tiny, random weights): each new length of generate is a shape; a later
    # process captures one shape per group live and restores the others. With alias prediction,
    # the graphs read the cache in place (chain prediction) and the attention mask from the
    # site's buffers (site prediction), and so do the restored ones.
    pytest.importorskip("transformers")
    worker = os.path.join(os.path.dirname(__file__), "graph_cache_generate_worker.py")
    flags = ["--alias-prediction"] if alias_prediction else []

    def generate():
        done = subprocess.run([sys.executable, worker, str(tmp_path), *flags],
                              capture_output=True, text=True, timeout=300)
        return report(done.returncode, done.stdout, done.stderr)

    first = generate()
    assert first["equal"] == [True, True]
    filled = first["stats"]["graph_cache"]
    assert filled["saved_shapes"] > 2, filled
    assert not any("constant of type" in why for why in filled["unstored"]), filled

    later = generate()
    assert later["equal"] == [True, True]
    cache = later["stats"]["graph_cache"]
    assert cache["status"] == "read" and cache["dropped_groups"] == [], cache
    assert cache["validated_groups"] == cache["stored_groups"], cache
    assert cache["restored_shapes"] > 0, cache
    # Restored shapes are not captured: fewer captures than the filling process made.
    assert later["stats"]["captures"] < first["stats"]["captures"]
    if alias_prediction:
        assert first["stats"]["alias_hits"] > 0 and later["stats"]["alias_hits"] > 0


def test_generated_attention_kernels_are_stored_with_their_images(tmp_path):
    # PyTorch's default attention on Hopper is cuDNN's, which compiles a module per plan (per
    # length), all of one kernel name: stored by name and image (Note [Kernel images]), and a
    # later process loads the images of the lengths its live captures did not plan for.
    pytest.importorskip("transformers")
    import torch

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("cuDNN's attention is PyTorch's default on Hopper and later")
    worker = os.path.join(os.path.dirname(__file__), "graph_cache_generate_worker.py")

    def generate():
        done = subprocess.run([sys.executable, worker, str(tmp_path), "--default-attention",
                               "--new-tokens", "40"], capture_output=True, text=True, timeout=300)
        return report(done.returncode, done.stdout, done.stderr)

    first = generate()
    assert first["equal"] == [True, True]
    filled = first["stats"]["graph_cache"]
    images = filled["kernel_images"]
    assert images["watching"] and images["seen"] > 0 and images["kept_bytes"] > 0, images
    assert not any("two kernels are named" in why for why in filled["unstored"]), filled
    assert filled["saved_shapes"] > 2, filled

    later = generate()
    assert later["equal"] == [True, True]
    cache = later["stats"]["graph_cache"]
    assert cache["status"] == "read" and cache["dropped_groups"] == [], cache
    assert cache["restored_shapes"] > 0, cache
    # Lengths whose plans this process never built ran kernels loaded from the file: each
    # found there (none "nor is found") and taken by the driver (none "refused").
    assert cache["kernel_images"]["loaded"] > 0, cache
    assert not any("nor is found" in why or "refused" in why for why in cache["unrestored"]), cache
    assert later["stats"]["captures"] < first["stats"]["captures"]


def test_the_kernel_image_watch_yields_cupti_to_torch_profiler(tmp_path):
    # The watch holds the process's one CUPTI subscriber (docs/semantics.md, "Generated
    # kernels"): torch.profiler, started after it, stops it and traces the kernels replays run.
    script = f"""
import json, torch, grape
model = grape.compile(torch.nn.Linear(64, 64).cuda(), cache_dir={str(tmp_path)!r})
x = torch.randn(8, 64, device="cuda")
with torch.no_grad():
    model(x)
    before = grape.stats(model)["graph_cache"]["kernel_images"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()
kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
stats = grape.stats(model)
print(json.dumps({{"kernels": len(kernels), "before": before, "replays": stats["replays"],
                  "after": stats["graph_cache"]["kernel_images"]}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    result = report(done.returncode, done.stdout, done.stderr)
    assert result["before"]["watching"], result
    assert result["replays"] > 0, result
    assert result["kernels"] > 0, result["stderr"][-2000:]
    after = result["after"]
    assert not after["watching"] and "torch.profiler" in after["why_not"], after
    assert after["kept_bytes"] == 0, after
