"""The benchmark harness's own logic, which every benchmark's results rely on; runs on any machine."""

import json

from benchmarks import harness


def test_a_failing_mode_is_recorded_and_the_others_still_run():
    def run(mode):
        if mode == "grape":
            raise RuntimeError("capture failed: " + "x" * 1000)
        return {"ms_per_step": 1.5}

    results = harness.run_modes(["eager", "grape", "ptgraph"], run, "ms_per_step")
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
    assert path.parent == tmp_path and path.name.startswith("unit-")
    written = json.loads(path.read_text())
    assert written["benchmark"] == "unit" and written["cases"] == cases
    assert {"device", "torch", "cuda", "commit"} <= set(written)
