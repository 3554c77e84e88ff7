"""benchmarks/train_lm.py: its schedules, its comparisons with eager, and a CPU run of the whole
script on tiny models (grape runs eagerly there); runs on any machine."""

import json

import pytest
import torch

from benchmarks import harness
from benchmarks import train_lm


def test_the_cosine_case_warms_up_linearly_then_decays_to_a_tenth():
    opt = torch.optim.AdamW([torch.zeros(2, requires_grad=True)], lr=1.0)
    sched = train_lm.scheduler("gpt2-cosine", opt, total=100)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_the_one_cycle_case_leaves_the_betas_alone():
    opt = torch.optim.AdamW([torch.zeros(2, requires_grad=True)], lr=1e-4)
    sched = train_lm.scheduler("wav2vec2-onecycle", opt, total=10)
    betas = opt.param_groups[0]["betas"]
    opt.step()
    sched.step()
    assert opt.param_groups[0]["betas"] == betas  # AdamW reads them on the host


def mode(losses, lrs, ms=1.0, **more):
    return {"losses": losses, "lrs": lrs, "lr_is_float": all(type(x) is float for x in lrs),
            "ms_per_step": ms, **more}


def test_comparisons_with_eager_and_the_default_optimizer():
    results = {"eager": mode([2.0, 1.0001], [0.1, 0.2], ms=8.0),
               "eager_device_lr": mode([2.0, 1.0], [0.1, 0.2], ms=8.0),
               "eager_default": mode([2.0, 1.0005], [0.1, 0.2], ms=8.0),
               "grape": mode([2.0, 1.0], [0.1, 0.2], ms=2.0)}
    train_lm.compare("gpt2-cosine", results)
    g = results["grape"]
    # Bit for bit against the same update (lr in device memory); by how much against the others.
    assert g["losses_bit_identical"] and g["lr_float_equal_to_eager"]
    assert g["max_loss_rel_diff_eager"] == pytest.approx(0.0001 / 1.0001)
    assert g["max_loss_rel_diff_default_optimizer"] == pytest.approx(0.0005 / 1.0005)
    assert g["within_default_optimizer_tolerance"]
    assert g["speedup_vs_eager"] == 4.0 and g["meets_target_speedup"] and g["correct"]
    assert results["eager"]["correct"] == "reference"
    # Another loss, or an lr the user's group no longer holds as a float, is not correct.
    results["grape"] = mode([2.0, 1.0 + 1e-6], [0.1, 0.2], ms=2.5)
    train_lm.compare("gpt2-cosine", results)
    assert not results["grape"]["losses_bit_identical"] and not results["grape"]["correct"]
    assert not results["grape"]["meets_target_speedup"]
    results["grape"] = mode([2.0, 1.0], [0.1, torch.tensor(0.2)])
    train_lm.compare("gpt2-cosine", results)
    assert not results["grape"]["lr_float_equal_to_eager"] and not results["grape"]["correct"]


def test_the_script_runs_on_the_cpu_and_writes_every_figure(tmp_path):
    pytest.importorskip("transformers")
    cases = train_lm.main(["--tiny", "--device", "cpu", "--steps", "6", "--reps", "1",
                           "--out", str(tmp_path)])
    assert harness.exit_status(cases) == 0
    [written] = tmp_path.glob("train_lm-tiny-*.json")
    results = json.loads(written.read_text())
    assert {"device", "torch", "cuda", "commit"} <= set(results)
    assert [c["name"] for c in results["cases"]] == ["gpt2-cosine", "wav2vec2-onecycle"]
    for case in results["cases"]:
        assert case["config"]["distinct_shapes"] >= 2
        grape = case["modes"]["grape"]
        # Without a GPU grape runs the step eagerly: the same losses and lrs as eager's.
        assert grape["losses_bit_identical"] and grape["lr_float_equal_to_eager"]
        assert len(grape["losses"]) == 6 and len(grape["step_ms"]) == 6
        assert {"ms_per_step", "first_call_s", "time_to_steady_s", "first_pass_s",
                "max_loss_rel_diff_default_optimizer", "fallbacks"} <= set(grape)
    assert written.with_suffix(".md").exists()
