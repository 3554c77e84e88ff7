"""benchmarks/time_to_speed.py's figures from per-call counters and times, and a CPU run of the
whole script on 2-layer models (grape runs eagerly there); runs on any machine."""

import json
import statistics

import pytest
import torch

from benchmarks import harness
from benchmarks import time_to_speed as tts

WARMUP, CAPTURE, REPLAY = ({"warmup_calls": 16, "replays": 0}, {"captures": 16, "replays": 16},
                           {"replays": 16})

def test_call_times_split_the_prompts_calls_from_the_longer_prompts_and_accumulate_all():
    ms = [10.0, 4.0, 2.0, 2.0, 2.5, 6.0, 3.0]
    r = tts.call_times(ms, calls=5, new_tokens=10)
    assert r["calls_ms"] == [10.0, 4.0, 2.0, 2.0, 2.5]
    assert r["longer_prompt_calls_ms"] == [6.0, 3.0]
    assert r["cumulative_ms"] == [10.0, 14.0, 16.0, 18.0, 20.5, 26.5, 29.5]
    # Steady: the median of the last three calls with the prompt.
    assert r["first_call_ms"] == 10.0 and r["steady_ms"] == 2.0
    assert r["ms_per_step"] == 0.2  # the steady call per new token


def test_grape_figures_are_the_changes_of_its_counters_per_call():
    changes = [dict(WARMUP, warmup_seconds=0.5), dict(CAPTURE, capture_seconds=1.25,
                                                      instantiate_seconds=0.25, nodes_patched=40),
               REPLAY, REPLAY, REPLAY, {"warmup_calls": 3, "captures": 0},
               {"captures": 3, "replays": 16, "capture_seconds": 0.125}]
    f = tts.grape_figures(changes, calls=5)
    assert f["calls_to_steady"] == 3  # the longer prompt's calls do not count
    assert f["captures_per_call"] == [0, 16, 0, 0, 0, 0, 3]
    assert f["warmup_calls_per_call"] == [16, 0, 0, 0, 0, 3, 0]
    assert f["eager_calls_per_call"] == [0] * 7
    assert f["replays_per_call"] == [0, 16, 16, 16, 16, 0, 16]
    assert f["nodes_patched_per_call"] == [0, 40, 0, 0, 0, 0, 0]
    assert f["longer_prompt_captures"] == 3
    breakdown = f["breakdown_ms_per_call"]
    assert set(breakdown) == {"warmup", "capture", "capture_function", "graph_read", "join",
                              "settle", "instantiate", "chain_variant", "patch"}
    assert breakdown["warmup"] == [500.0] + [0] * 6
    assert breakdown["capture"] == [0, 1250.0, 0, 0, 0, 0, 125.0]
    assert breakdown["instantiate"] == [0, 250.0, 0, 0, 0, 0, 0]
    assert breakdown["patch"] == [0] * 7  # a build without the key: 0
    # A build without capture_function_seconds: all of a capture is its own work.
    assert f["own_ms_per_capture_per_call"] == [None, 1250.0 / 16, None, None, None, None,
                                               125.0 / 3]
    json.dumps(f)


def test_the_floor_of_call_1_is_the_plain_capture_of_each_forward_plus_the_replayed_call():
    floor = {"plain_capture_vs_eager_forward": 1.05}
    # 127 of 128 forwards captured at 1.05x, then the GPU work of a call (a fifth of eager's).
    assert tts.first_call_floor(floor, grape_steady_ms=400.0, eager_steady_ms=2000.0,
                                new_tokens=128) == pytest.approx(1.05 * 127 / 128 + 0.2)


def test_a_mode_against_eager():
    r = tts.against_eager([3000.0, 200.0, 100.0, 100.0, 100.0], [500.0, 400.0, 400.0, 400.0, 250.0],
                          eager_steady_ms=400.0)
    assert r == {"eager_steady_ms": 400.0, "first_call_vs_eager_steady": 7.5,
                 "first_call_vs_eager_first": 6.0, "second_call_speedup_vs_eager": 2.0,
                 "third_call_vs_second": 0.5, "cumulative_2_vs_eager": 3200.0 / 900.0}


def test_over_rounds_a_modes_calls_and_ratios_are_their_medians_and_counters_the_first_rounds():
    def run(ms, ratio, correct=True, captures=16):
        return {**tts.call_times(ms, calls=3, new_tokens=10), "first_call_vs_eager_steady": ratio,
                "correct": correct, "captures_per_call": [captures, 0, 0, 0],
                "breakdown_ms_per_call": {"capture": [ms[0] / 2, 0, 0, 0]}}

    runs = [run([10.0, 4.0, 2.0, 6.0], 5.0), run([30.0, 5.0, 3.0, 7.0], 9.0, captures=99),
            run([12.0, 3.0, 2.5, 8.0], 4.0)]
    r = tts.median_over_rounds(runs, calls=3, new_tokens=10)
    assert r["calls_ms"] == [12.0, 4.0, 2.5] and r["longer_prompt_calls_ms"] == [7.0]
    assert r["cumulative_ms"] == [12.0, 16.0, 18.5, 25.5]
    assert r["calls_ms_rounds"] == [[10.0, 4.0, 2.0], [30.0, 5.0, 3.0], [12.0, 3.0, 2.5]]
    assert r["first_call_vs_eager_steady"] == 5.0
    assert r["first_call_vs_eager_steady_rounds"] == [5.0, 9.0, 4.0]
    assert r["breakdown_ms_per_call"] == {"capture": [6.0, 0, 0, 0]}
    assert r["captures_per_call"] == [16, 0, 0, 0] and r["correct"] is True
    # A round with other tokens makes the mode not correct; a failed round stands for them all.
    wrong = run([1.0] * 4, 1.0, correct=False)
    assert tts.median_over_rounds(runs + [wrong], 3, 10)["correct"] is False
    failed = {"ms_per_step": None, "error": "RuntimeError: boom"}
    assert tts.median_over_rounds(runs + [failed], 3, 10) is failed
    assert tts.median_over_rounds(runs[:1], 3, 10) is runs[0]


def test_correct_is_every_calls_tokens_equal_eagers_same_calls():
    t = torch.tensor

    def compared(outputs):
        results = {"eager": {"ms_per_step": 1.0, "outputs": [t([[1, 2]]), t([[3, 4]])]},
                   "grape": {"ms_per_step": 0.5, "outputs": outputs}}
        harness.compare_with_eager(results, tts.calls_equal)
        return results

    same = compared([t([[1, 2]]), t([[3, 4]])])
    assert same["grape"]["correct"] is True and same["grape"]["calls_equal"] == [True, True]
    differs = compared([t([[1, 2]]), t([[3, 5]])])
    assert differs["grape"]["correct"] is False and differs["grape"]["calls_equal"] == [True, False]
    assert harness.exit_status([{"name": "gpt2-b1", "modes": differs}]) == 1
    assert compared([t([[1, 2]])])["grape"]["correct"] is False  # a call missing


def test_a_plan_free_modes_tokens_are_also_compared_with_eager_on_the_same_attention():
    t = torch.tensor
    results = {"eager": {"calls_ms": [9.0, 1.0, 1.0], "steady_ms": 1.0, "outputs": [t([[1, 2]])]},
               "eager_plan_free": {"calls_ms": [9.0, 1.0, 1.0], "steady_ms": 1.0, "outputs": [t([[1, 3]])]},
               "grape_plan_free_cached": {"calls_ms": [2.0, 1.0, 1.0], "steady_ms": 1.0,
                                          "outputs": [t([[1, 3]])]},
               "grape": {"calls_ms": [2.0, 1.0, 1.0], "steady_ms": 1.0, "outputs": [t([[1, 2]])]}}
    tts.compare_modes(results, new_tokens=2)
    plan_free = results["grape_plan_free_cached"]
    assert plan_free["correct"] is False and plan_free["correct_same_attention"] is True
    assert results["grape"]["correct"] is True and "correct_same_attention" not in results["grape"]
    assert all("outputs" not in r for r in results.values())


def test_timed_calls_time_each_call_and_count_what_changed_in_it():
    class Model:
        calls = 0

        def generate(self, ids, attention_mask, **kwargs):
            assert kwargs == {"max_new_tokens": 2}
            self.calls += 1
            return ids + self.calls

    model = Model()
    ids = torch.zeros(1, 3, dtype=torch.long)
    inputs = [(ids, torch.ones_like(ids))] * 3
    counters = harness.Counters(lambda: {"calls": model.calls * 2})
    ms, outputs, changes = tts.timed_calls(model, inputs, {"max_new_tokens": 2}, counters, "test")
    assert len(ms) == 3 and all(m >= 0 for m in ms)
    assert [int(o[0, 0]) for o in outputs] == [1, 2, 3]
    assert changes == [{"calls": 2}] * 3


def test_the_markdown_table_has_a_row_per_case_and_mode():
    grape = {"calls_ms": [30.0, 20.0, 10.0, 10.0, 10.0],
             "cumulative_ms": [30.0, 50.0, 60.0, 70.0, 80.0, 95.0, 105.0],
             "longer_prompt_calls_ms": [15.0, 10.0], "calls_to_steady": 3,
             "captures_per_call": [0, 16, 0, 0, 0, 0, 3], "correct": True}
    cases = [{"name": "gpt2-b1", "config": {"calls": 5},
              "modes": {"grape": grape, "static_compile": {"ms_per_step": None, "error": "E: x"}}}]
    lines = tts.markdown(cases).splitlines()
    assert lines[0] == ("| case | mode | call 1 ms | call 2 ms | call 3 ms | call 4 ms | "
                        "call 5 ms | cum. 2 ms | cum. 5 ms | longer prompt ms | calls to steady | "
                        "captures per call | correct |")
    assert lines[2] == ("| gpt2-b1 | grape | 30.0 | 20.0 | 10.0 | 10.0 | 10.0 | 50.0 | 80.0 | "
                        "15.0 10.0 | 3 | 0 16 0 0 0 / 0 3 | True |")
    assert lines[3] == "| gpt2-b1 | static_compile |" + " - |" * 11


def test_the_script_runs_on_the_cpu_and_writes_every_figure(tmp_path):
    pytest.importorskip("transformers")
    cases = tts.main(["--tiny", "--quick", "--device", "cpu", "--modes", "eager,grape",
                      "--rounds", "2", "--out", str(tmp_path)])
    assert harness.exit_status(cases) == 0
    [written] = tmp_path.glob("time_to_speed-quick-*.json")
    results = json.loads(written.read_text())
    assert {"device", "torch", "cuda", "commit"} <= set(results)
    [case] = results["cases"]
    assert case["name"] == "gpt2-b1" and case["config"]["new_tokens"] == 16
    eager, grape = case["modes"]["eager"], case["modes"]["grape"]
    assert eager["correct"] == "reference" and grape["correct"] is True
    for mode in (eager, grape):
        assert len(mode["calls_ms"]) == 5 and len(mode["longer_prompt_calls_ms"]) == 2
        assert len(mode["cumulative_ms"]) == 7
        assert mode["steady_ms"] == statistics.median(mode["calls_ms"][-3:])
    assert len(grape["captures_per_call"]) == 7
    assert all(len(v) == 7 for v in grape["breakdown_ms_per_call"].values())
    assert {"first_call_vs_eager_steady", "second_call_speedup_vs_eager", "cumulative_2_vs_eager",
            "longer_prompt_captures", "calls_to_steady"} <= set(grape)
    assert case["config"]["rounds"] == 2
    for mode in (eager, grape):
        assert len(mode["calls_ms_rounds"]) == 2
        assert mode["calls_ms"] == [statistics.median(ms) for ms in zip(*mode["calls_ms_rounds"])]
    assert len(grape["first_call_vs_eager_steady_rounds"]) == 2
    assert written.with_suffix(".md").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without CUDA")
def test_without_cuda_the_script_says_so():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        tts.main(["--tiny", "--quick"])


def test_a_captures_cost_is_the_median_over_captured_signatures_without_their_variants():
    def entry(state, capture, variants=0.0):
        return {"state": state, "seconds": {"capture": capture, "variants": variants}}

    entries = [entry("graph", 0.010), entry("graph", 0.030, variants=0.010), entry("graph", 0.012),
               entry("eager", 0.5), entry("warmup", 0.0)]
    assert tts.capture_ms_median(entries) == pytest.approx(12.0)
    assert tts.capture_ms_median([entry("warmup", 0.0)]) is None


def test_flags_a_cold_run_gives_each_process_are_the_run_s_but_its_own_mode_and_folder():
    argv = ["--tiny", "--cold", "--modes", "eager,grape", "--out=x", "--quick"]
    assert tts.without_flags(argv, ("--modes", "--out")) == ["--tiny", "--cold", "--quick"]


def test_a_cold_run_runs_each_mode_in_a_process_of_its_own_and_compares_them_in_one_file(tmp_path):
    pytest.importorskip("transformers")
    cases = tts.main(["--tiny", "--quick", "--device", "cpu", "--cold", "--reps", "2",
                      "--new-tokens", "4", "--modes", "eager,grape", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "time_to_speed-quick-cold-cpu.json").read_text())
    assert written["cases"] == cases
    case, = cases
    assert case["config"]["cold"] is True and case["config"]["processes"] == "one per mode"
    eager, grape = case["modes"]["eager"], case["modes"]["grape"]
    # Tokens made in two processes, compared call by call; ratios against eager's calls.
    assert eager["correct"] == "reference" and grape["correct"] is True
    assert all("tokens" not in r and "outputs" not in r for r in (eager, grape))
    assert grape["first_call_vs_eager_first"] == grape["calls_ms"][0] / eager["calls_ms"][0]
