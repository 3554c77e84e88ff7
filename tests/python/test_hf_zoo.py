"""benchmarks/hf_zoo.py: every architecture of the zoo builds from its small config and runs its
workload, and the script writes every figure; on the CPU (grape runs eagerly there) and, with a
GPU, each architecture's generate or forward replayed from call 3 with eager's outputs."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from benchmarks import hf_zoo  # noqa: E402  (after the skip without transformers)


@pytest.mark.parametrize("name", list(hf_zoo.ZOO))
def test_every_architecture_builds_small_and_runs_its_workload(name):
    kind = hf_zoo.ZOO[name][0]
    model = hf_zoo.build(name, "cpu")
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with torch.no_grad():
        out = hf_zoo.call(model, kind, hf_zoo.inputs(model, kind, "cpu"), new_tokens=3)
    if kind == "encoder":
        assert [o.shape[1] for o in out] == list(hf_zoo.ENCODER_LENGTHS)
    else:
        # No EOS: every generation makes the tokens asked for.
        assert out.shape[0] == 1 and out.shape[1] >= 3


def test_the_script_runs_on_the_cpu_and_writes_every_figure(tmp_path):
    cases = hf_zoo.main(["--quick", "--device", "cpu", "--cases", "llama,t5,bert",
                         "--out", str(tmp_path)])
    written = json.loads((tmp_path / "hf_zoo-quick-cpu.json").read_text())
    assert written["cases"] == cases and [c["name"] for c in cases] == ["llama", "t5", "bert"]
    for case in cases:
        eager, grape = case["modes"]["eager"], case["modes"]["grape"]
        assert eager["correct"] == "reference" and grape["correct"] is True
        assert len(grape["calls_ms"]) == 1 + 2 + 1 and grape["first_call_ratio_to_eager"] > 0
        # Every forward runs eagerly, and says why: no CUDA, or (on a GPU machine) CPU arguments.
        assert grape["replayed_share_from_call3"] == 0.0 and grape["replays"] == 0
        expected = "unsupported_argument" if torch.cuda.is_available() else "no_cuda"
        assert grape["fallbacks"][0]["kind"] == expected
    assert (tmp_path / "hf_zoo-quick-cpu.md").read_text().count("| grape |") == 3


def test_the_cached_modes_run_processes_of_their_own_and_compare_their_tokens(tmp_path):
    cases = hf_zoo.main(["--quick", "--device", "cpu", "--cases", "whisper,bert",
                         "--modes", "eager,grape_cached,grape_plan_free_cached,eager_cold",
                         "--out", str(tmp_path)])
    for mode in ("grape_cached", "grape_plan_free_cached"):
        cached = cases[0]["modes"][mode]
        assert cached["correct"] is True and cached["first_call_ratio_to_eager"] > 0
        assert cached["first_call_ratio_to_cold_eager"] > 0
        assert cached["captures_per_call"] == [0, 0, 0, 0]  # grape runs eagerly on the CPU
        assert "filling_graph_cache" in cached and "tokens" not in cached
    assert cases[0]["modes"]["grape_plan_free_cached"]["numerics_may_differ"] is True
    assert cases[0]["modes"]["eager_cold"]["first_call_s"] > 0
    # An encoder has no generate to measure cached; its eager runs cold all the same.
    assert list(cases[1]["modes"]) == ["eager", "eager_cold"]


def test_an_architecture_that_does_not_build_is_reported_not_fatal(monkeypatch):
    def refuse(name, device):
        raise ValueError("no such config in this transformers")

    monkeypatch.setattr(hf_zoo, "build", refuse)
    case = hf_zoo.run_case("llama", ["eager", "grape"], "cpu", new_tokens=2, reps=1)
    assert case["modes"]["grape"] == {"ms_per_step": None,
                                      "error": "ValueError: no such config in this transformers"}


def test_unknown_cases_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        hf_zoo.main(["--device", "cpu", "--cases", "llama,nope"])
    assert "nope" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(hf_zoo.ZOO))
def test_each_architecture_replays_from_call_three_with_eagers_outputs(name):
    case = hf_zoo.run_case(name, ["eager", "grape"], "cuda", new_tokens=8, reps=1)
    grape = case["modes"]["grape"]
    assert grape["correct"] is True, grape.get("error")
    assert grape["replayed_share_from_call3"] >= 0.99, grape["fallbacks"]
