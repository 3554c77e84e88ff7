"""The benchmark harness's own logic, which every benchmark's results rely on; runs on any machine."""

import json
import re
from pathlib import Path

import pytest
import torch

from benchmarks import harness


def test_a_failing_mode_is_recorded_and_the_others_still_run():
    def run(mode):
        if mode == "grape":
            raise RuntimeError("capture failed: " + "x" * 1000)
        return {"ms_per_step": 1.5}

    results = harness.run_modes(["eager", "grape", "ptgraph"], run)
    assert list(results) == ["eager", "grape", "ptgraph"]
    assert results["eager"] == {"ms_per_step": 1.5} and results["ptgraph"] == {"ms_per_step": 1.5}
    failed = results["grape"]
    assert failed["ms_per_step"] is None
    assert failed["error"].startswith("RuntimeError: capture failed: x")
    assert len(failed["error"]) == 500


def test_a_run_with_a_failed_mode_exits_with_an_error(capsys):
    ok = [{"name": "infer", "modes": {"eager": {"ms_per_step": 1.0}, "grape": {"ms_per_step": 0.5}}}]
    assert harness.exit_status(ok) == 0
    failed = ok + [{"name": "train", "modes": {"grape": {"ms_per_step": None, "error": "E: x"}}}]
    assert harness.exit_status(failed) == 1
    assert "train/grape" in capsys.readouterr().out


def test_a_run_whose_results_differ_from_eager_exits_with_an_error(capsys):
    checked = {"eager": {"correct": "reference"}, "grape": {"correct": True},
               "ptgraph": {"correct": None}}  # None: not compared
    assert harness.exit_status([{"name": "infer", "modes": checked}]) == 0
    wrong = dict(checked, grape_compact={"correct": False})
    assert harness.exit_status([{"name": "infer", "modes": wrong}, {"name": "hook"}]) == 1
    assert "infer/grape_compact (results differ from eager)" in capsys.readouterr().out
    # An opt-in mode that may round otherwise (plan-free attention) reports it without failing.
    rounding = dict(checked, grape_plan_free={"correct": False, "numerics_may_differ": True})
    assert harness.exit_status([{"name": "infer", "modes": rounding}]) == 0


def test_the_markdown_table_has_a_row_per_case_and_mode():
    cases = [{"name": "b1", "modes": {"eager": {"ms": 2.0}, "grape": {"ms": 0.5}}},
             {"name": "b8", "modes": {"eager": {"ms": None}}}]
    table = harness.markdown_table(cases, [harness.value_column("ms", "ms", "{:.2f}")])
    assert table == ("| case | mode | ms |\n"
                     "|---|---|---|\n"
                     "| b1 | eager | 2.00 |\n"
                     "| b1 | grape | 0.50 |\n"
                     "| b8 | eager | - |\n")


def test_results_name_the_benchmark_and_hold_every_case(tmp_path):
    cases = [{"name": "infer", "config": {}, "modes": {"eager": {"ms_per_step": 1.0}}}]
    path = harness.write_results("unit", cases, tmp_path)
    card = "cpu" if harness.environment()["device"] == "cpu" else path.stem.split("-")[-1]
    assert path.parent == tmp_path and path.name == f"unit-{card}.json"
    written = json.loads(path.read_text())
    assert written["benchmark"] == "unit" and written["cases"] == cases
    assert {"device", "torch", "cuda", "commit", "date"} <= set(written)
    # A later run of the same benchmark on the same card replaces the file.
    assert harness.write_results("unit", cases[:0], tmp_path) == path
    assert json.loads(path.read_text())["cases"] == [] and len(list(tmp_path.iterdir())) == 1


def test_no_plot_is_drawn_into_the_tracked_results(monkeypatch, tmp_path):
    monkeypatch.setattr(harness, "RESULTS_DIR", tmp_path / "results")
    drawn = []

    def plot(png):
        drawn.append(png)
        return True

    for folder in (tmp_path / "results", tmp_path / "local"):
        folder.mkdir()
        harness.write_table_and_plot(folder / "unit-cpu.json", "| table |\n", plot)
        assert (folder / "unit-cpu.md").read_text() == "| table |\n"
    assert drawn == [tmp_path / "local" / "unit-cpu.png"]


def test_smoke_runs_write_outside_the_tracked_results_unless_told(monkeypatch, tmp_path):
    monkeypatch.delenv("GRAPE_RESULTS_DIR", raising=False)
    monkeypatch.setattr(harness, "LOCAL_RESULTS_DIR", tmp_path / "local")
    monkeypatch.setattr(harness, "RESULTS_DIR", tmp_path / "results")
    cases = [{"name": "infer", "config": {}, "modes": {}}]
    # A tiny model's run is a smoke run wherever it runs; any run on the CPU is one too.
    assert harness.write_results("unit-tiny", cases).parent == tmp_path / "local"
    on_gpu = not harness.environment()["device"] == "cpu"
    want = tmp_path / ("results" if on_gpu else "local")
    assert harness.write_results("unit", cases).parent == want
    assert harness.write_results("unit-tiny", cases, tmp_path / "out").parent == tmp_path / "out"


def tokens(*values):
    return torch.tensor([values])


def test_speedup_is_the_reference_time_over_the_modes():
    assert harness.speedup({"ms_per_step": 3.0}, {"ms_per_step": 1.5}) == 2.0
    assert harness.speedup({"ms_per_step": 1.0}, {"ms_per_step": 4.0}) == 0.25
    assert harness.speedup({"ms_per_step": None}, {"ms_per_step": 1.0}) is None
    assert harness.speedup({"ms_per_step": 1.0}, {"ms_per_step": None, "error": "E: x"}) is None
    assert harness.speedup({}, {"ms_per_step": 1.0}) is None


def test_compare_with_eager_adds_speedup_and_correctness_to_every_mode():
    results = {"eager": {"ms_per_step": 2.0, "outputs": tokens(1, 2, 3)},
               "grape": {"ms_per_step": 0.5, "outputs": tokens(1, 2, 3)},
               "ptgraph": {"ms_per_step": 4.0, "outputs": tokens(1, 2, 4)}}
    harness.compare_with_eager(results)
    assert results == {
        "eager": {"ms_per_step": 2.0, "correct": "reference", "speedup_vs_eager": 1.0},
        "grape": {"ms_per_step": 0.5, "correct": True, "speedup_vs_eager": 4.0},
        "ptgraph": {"ms_per_step": 4.0, "correct": False, "speedup_vs_eager": 0.5}}
    json.dumps(results)  # no tensors left for the results file
    assert harness.exit_status([{"name": "b1", "modes": results}]) == 1  # ptgraph differs


def test_outputs_equal_eagers_only_to_the_bit_and_in_every_part():
    def correct(output, reference):
        results = {"eager": {"outputs": reference}, "grape": {"outputs": output}}
        harness.compare_with_eager(results)
        return results["grape"]["correct"]

    assert correct((tokens(1, 2), [tokens(3)]), (tokens(1, 2), [tokens(3)]))
    assert not correct(tokens(1, 2), tokens(1, 2, 3))  # shorter: a shape of its own
    assert not correct(tokens(1, 2).view(2), tokens(1, 2))
    assert not correct(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-6]))
    assert not correct([tokens(1)], [tokens(1), tokens(2)])  # fewer outputs
    assert not correct((tokens(1), tokens(2)), (tokens(1), tokens(3)))
    assert not correct(tokens(1), [tokens(1)])


def test_outputs_that_differ_say_by_how_much_where_they_are_floating_point():
    results = {"eager": {"outputs": [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]},
               "grape": {"outputs": [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]},
               "grape_plan_free": {"outputs": [torch.tensor([1.0, 2.25]), torch.tensor([2.5])]},
               "shorter": {"outputs": [torch.tensor([1.0, 2.0])]}}
    harness.compare_with_eager(results)
    assert results["grape"] == {"correct": True}
    assert results["grape_plan_free"] == {"correct": False, "max_abs_diff": 0.5}
    assert results["shorter"] == {"correct": False}  # no difference to tell: another structure
    assert harness.largest_difference(tokens(1, 2), tokens(1, 3)) is None  # tokens: no distance
    inf, nan = float("inf"), float("nan")
    # Masked logits: infinities and NaNs in the same places are equal elements.
    assert harness.largest_difference(torch.tensor([-inf, nan, 1.0]),
                                      torch.tensor([-inf, nan, 1.5])) == 0.5
    # A NaN or an infinity against a number: no finite distance, in any part.
    assert harness.largest_difference([torch.tensor([1.0]), torch.tensor([nan])],
                                      [torch.tensor([1.5]), torch.tensor([0.0])]) is None
    assert harness.largest_difference(torch.tensor([inf]), torch.tensor([1.0])) is None


def test_a_check_gives_correct_and_details_and_is_never_asked_about_eager():
    asked = []

    def within(output, reference):
        asked.append(output)
        diff = (output - reference).abs().max()
        return {"max_abs_diff": diff.item(), "correct": diff <= 0.1}  # a tensor, made a bool

    results = {"eager": {"outputs": torch.tensor([1.0, 2.0])},
               "grape": {"outputs": torch.tensor([1.0, 2.0625])},
               "grape_copy": {"outputs": torch.tensor([1.5, 2.0])}}
    harness.compare_with_eager(results, within)
    assert len(asked) == 2
    assert results["eager"] == {"correct": "reference"}
    assert results["grape"] == {"max_abs_diff": 0.0625, "correct": True}
    assert results["grape_copy"] == {"max_abs_diff": 0.5, "correct": False}
    assert all(type(r["correct"]) is bool for mode, r in results.items() if mode != "eager")


def test_a_check_without_correct_is_an_error():
    results = {"eager": {"outputs": tokens(1)}, "grape": {"outputs": tokens(1)}}
    with pytest.raises(KeyError):
        harness.compare_with_eager(results, lambda output, reference: {"steps_equal": 1})


def test_without_eager_nothing_is_compared():
    results = {"grape": {"ms_per_step": 0.5, "gpu_mem_bytes": 10, "outputs": tokens(1)}}
    harness.compare_with_eager(results)
    assert results == {"grape": {"ms_per_step": 0.5, "gpu_mem_bytes": 10, "correct": None}}
    assert harness.exit_status([{"name": "b1", "modes": results}]) == 0


def test_a_failed_or_untimed_mode_or_eager_is_not_compared():
    failed = {"ms_per_step": None, "error": "RuntimeError: x"}
    results = {"eager": dict(failed), "grape": {"ms_per_step": 0.5, "outputs": tokens(1)}}
    harness.compare_with_eager(results)
    assert results["eager"] == dict(failed, correct=None)
    assert results["grape"] == {"ms_per_step": 0.5, "correct": None}

    results = {"eager": {"ms_per_step": 2.0, "outputs": tokens(1)}, "grape": dict(failed),
               "ptgraph": {"ms_per_step": None, "skipped": "no way in"}}
    harness.compare_with_eager(results)
    assert results["grape"] == dict(failed, correct=None)
    assert results["ptgraph"] == {"ms_per_step": None, "skipped": "no way in", "correct": None}


def test_memory_and_other_figures_are_compared_with_eagers_where_both_were_measured():
    results = {"eager": {"ms_per_step": 2.0, "gpu_mem_bytes": 400, "first_epoch_s": 10.0,
                         "held_bytes": 0},
               "grape": {"ms_per_step": 1.0, "gpu_mem_bytes": 500, "first_epoch_s": 15.0,
                         "held_bytes": 7},
               "ptgraph": {"ms_per_step": 1.0, "gpu_mem_bytes": None}}
    harness.compare_with_eager(results, ratios={"first_epoch_s": "first_epoch_ratio_to_eager",
                                                "held_bytes": "held_ratio_to_eager"})
    grape, eager = results["grape"], results["eager"]
    assert grape["mem_ratio_to_eager"] == 1.25 and grape["first_epoch_ratio_to_eager"] == 1.5
    assert eager["mem_ratio_to_eager"] == 1.0 and eager["first_epoch_ratio_to_eager"] == 1.0
    assert "held_ratio_to_eager" not in grape  # eager's is 0: no ratio to it
    assert "mem_ratio_to_eager" not in results["ptgraph"]


def test_tables_show_the_comparison_with_eager(capsys):
    modes = {"eager": {"ms_per_step": 2.0, "outputs": tokens(1), "gpu_mem_bytes": 2**20},
             "grape": {"ms_per_step": 0.5, "outputs": tokens(1), "gpu_mem_bytes": 3 * 2**20},
             "ptgraph": {"ms_per_step": None, "error": "E: x"}}
    harness.compare_with_eager(modes)
    case = {"name": "b1", "config": {}, "modes": modes}
    harness.print_table(case)
    rows = capsys.readouterr().out.splitlines()[-3:]
    assert rows[0].split() == ["eager", "2.000", "1.00x", "1.0", "reference"]
    assert rows[1].split() == ["grape", "0.500", "4.00x", "3.0", "True"]
    assert rows[2].split() == ["ptgraph", "-", "-", "-", "-"]
    table = harness.markdown_table([case], [harness.STEP_COLUMN, harness.SPEEDUP_COLUMN,
                                            *harness.MEMORY_COLUMNS, harness.CORRECT_COLUMN])
    assert table.splitlines()[0] == "| case | mode | ms/step | vs eager | GPU MB | mem vs eager | correct |"
    assert table.splitlines()[3] == "| b1 | grape | 0.500 | 4.00x | 3.0 | 3.00x | True |"
    assert table.splitlines()[4] == "| b1 | ptgraph | - | - | - | - | - |"


WARMUP, CAPTURE, REPLAY = ({"warmup_calls": 16, "replays": 0}, {"captures": 16, "replays": 16},
                           {"replays": 16})


def test_grape_is_steady_from_the_call_after_which_nothing_warms_up_runs_eagerly_or_captures():
    assert harness.steady_by_counters([WARMUP, CAPTURE, REPLAY, REPLAY, REPLAY]) == 3
    assert harness.steady_by_counters([REPLAY] * 5) == 1
    # a chain variant captured at call 4: steady only from call 5
    assert harness.steady_by_counters([WARMUP, CAPTURE, REPLAY, {"captures": 1}, REPLAY]) == 5
    assert harness.steady_by_counters([WARMUP, CAPTURE, REPLAY, REPLAY, {"captures": 2}]) is None
    assert harness.steady_by_counters([{"eager_calls": 16}] * 5) is None  # fallen back (no CUDA)
    assert harness.steady_by_counters([WARMUP, REPLAY, {"eager_calls": 1}, REPLAY, REPLAY]) == 4


def test_other_modes_are_steady_from_the_first_call_within_the_tolerance_of_the_fastest():
    assert harness.steady_by_time([20000.0, 500.0, 300.0, 310.0, 370.0]) == 3  # 500 > 1.25 x 300
    assert harness.steady_by_time([300.0, 330.0, 300.0, 310.0, 320.0]) == 1
    assert harness.steady_by_time([300.0, 300.0, 300.0, 300.0, 400.0]) is None  # the last is slow
    assert harness.steady_by_time([300.0, 400.0, 300.0, 300.0, 300.0]) == 3
    assert harness.steady_by_time([300.0, 700.0], tolerance=3.0) == 1


def test_time_to_steady_is_every_call_before_the_first_steady_one():
    assert harness.time_to_steady([3.0, 1.0, 0.2, 0.2], 3) == {"time_to_steady_s": 4.0,
                                                              "calls_to_steady": 3}
    assert harness.time_to_steady([0.2, 0.2], 1) == {"time_to_steady_s": 0, "calls_to_steady": 1}
    # Not steady by the last call: all of them count.
    assert harness.time_to_steady([3.0, 1.0], None) == {"time_to_steady_s": 4.0,
                                                        "calls_to_steady": None}
    # Against a given steady time rather than the fastest call.
    assert harness.steady_by_time([3.0, 0.3, 0.2], steady=0.25) == 2


def test_grape_counters_give_each_calls_change():
    import grape

    f = grape.compile(lambda x: x + 1)
    counters = harness.GrapeCounters(f)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    f(torch.zeros(2, device=device))
    first = counters.change()
    f(torch.zeros(2, device=device))
    second = counters.change()
    # The first call warms up (without CUDA: runs eagerly), the second captures (runs eagerly).
    assert set(first) == set(harness.UNSTEADY_COUNTERS) and sum(first.values()) == 1
    assert sum(second.values()) == 1 and harness.steady_by_counters([first, second]) is None


def test_a_generation_benchmark_reports_the_time_to_steady_state(monkeypatch):
    from benchmarks import generation

    class Counters:  # a grape function's counters: warm-up, capture, then replays only
        changes = iter([{"warmup_calls": 1}, {"captures": 1}] + [{}] * 4)

        def change(self):
            return next(self.changes)

    seconds = iter([3.0, 1.0, 0.2, 0.2, 0.2, 0.2])
    monkeypatch.setattr(harness, "timed", lambda fn: (torch.zeros(1), next(seconds)))
    r = generation.measure(lambda: None, new_tokens=10, reps=3, steady_calls=2, desc="grape",
                           counters=Counters())
    assert r["first_call_s"] == 3.0 and r["ms_per_step"] == pytest.approx(20.0)
    assert r["time_to_steady_s"] == 4.0 and r["calls_to_steady"] == 3
    # Without counters: steady from the first call within the tolerance of the timed median.
    seconds = iter([3.0, 0.24, 0.2, 0.2, 0.2, 0.2])
    r = generation.measure(lambda: None, new_tokens=10, reps=3, steady_calls=2, desc="eager")
    assert r["time_to_steady_s"] == 3.0 and r["calls_to_steady"] == 2


def test_call_sites_in_results_name_no_machine_path():
    root = Path(harness.__file__).resolve().parent.parent
    assert harness.portable_path(f"{root}/benchmarks/hf_zoo.py:12") == "benchmarks/hf_zoo.py:12"
    assert harness.portable_path(
        "/opt/venv/lib/python3.12/site-packages/transformers/generation/utils.py:3030") == \
        "transformers/generation/utils.py:3030"
    assert harness.portable_path("<unknown>") == "<unknown>"


BENCHMARKS = sorted(p.stem for p in (Path(harness.__file__).parent).glob("*.py")
                    if p.stem not in ("__init__", "harness", "generation"))


def undocumented_flags(help_text: str) -> list[str]:
    """The options of an argparse --help text that have no help of their own."""
    options = help_text[help_text.index("options:"):]
    blocks = re.split(r"\n  (?=-)", options)[1:]  # one per option, its help lines with it
    return [block.split()[0].rstrip(",") for block in blocks if len(block.split()) < 3]


def test_a_flag_without_help_is_found():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--said", help="has its help")
    parser.add_argument("--silent")
    assert undocumented_flags(parser.format_help()) == ["--silent"]


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_explains_each_flag(name, capsys):
    pytest.importorskip("transformers")
    module = __import__(f"benchmarks.{name}", fromlist=["main"])
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert not undocumented_flags(capsys.readouterr().out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="would run the benchmark on the GPU")
@pytest.mark.parametrize("name", [n for n in BENCHMARKS if n != "demo_gpt2"])
def test_every_benchmark_says_it_needs_a_gpu_the_same_way(name):
    pytest.importorskip("transformers")
    module = __import__(f"benchmarks.{name}", fromlist=["main"])
    with pytest.raises(SystemExit) as done:
        module.main(["--quick"])
    # A message and exit status 1, as SystemExit("...") gives, from every script.
    assert isinstance(done.value.code, str) and "CUDA" in done.value.code


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--tokens", "-3"], ["--tokens", "100000"]])
def test_the_demo_refuses_a_token_count_its_model_cannot_take(argv, capsys):
    from benchmarks import demo_gpt2
    with pytest.raises(SystemExit) as done:
        demo_gpt2.main(argv)
    assert done.value.code == 2 and "--tokens must be from 1 to" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["train_lm", "train_ddp"])
def test_the_training_scripts_run_only_tiny_models_on_the_cpu(name, capsys):
    module = __import__(f"benchmarks.{name}", fromlist=["main"])
    with pytest.raises(SystemExit) as done:
        module.main(["--device", "cpu", "--quick"])
    assert done.value.code == 2 and "add --tiny" in capsys.readouterr().err
