"""The benchmark harness's logic: alternating rounds, refusing wrong outputs, inputs, table and JSON.

No assertion here depends on how fast anything runs.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from onnxfuse_cli.main import main

from onnxfuse.bench import BenchOptions, ModelBench, format_table, fused_refusals, report_json, with_speedups
from onnxfuse.measure.contenders import BASELINE, FUSED, TVM
from onnxfuse.measure.inputs import InputSpec, random_inputs
from onnxfuse.measure.timing import Contender, Timing, bitwise_equal, check_outputs, race

REFERENCE = {"y": np.arange(6, dtype=np.float32).reshape(2, 3)}


def logged(name: str, log: list[str], outputs=REFERENCE) -> Contender:
    def call():
        log.append(name)
        return outputs

    return Contender(name, call)


def test_race_gives_one_timing_per_contender_in_the_given_order():
    log: list[str] = []
    results = race([logged("b", log), logged("a", log)], REFERENCE, rounds=3, round_seconds=0.0)
    assert list(results) == ["b", "a"]
    assert all(isinstance(t, Timing) and t.rounds == 3 and t.p10 <= t.median <= t.p90 for t in results.values())


def test_race_alternates_contenders_round_by_round():
    log: list[str] = []
    race([logged("a", log), logged("b", log)], REFERENCE, rounds=4, round_seconds=0.0)  # one call per round
    timed = log[4:]  # each contender: check call + one sizing call first
    assert log[:4] == ["a", "a", "b", "b"]
    assert timed == ["a", "b", "b", "a", "a", "b", "b", "a"]  # the order flips every round


def test_speedups_pair_each_round_so_a_slow_phase_cancels(monkeypatch):
    """Scripted call times on a fake clock. onnxruntime takes twice onnxfuse's time whenever both
    run at the same machine speed; the machine is 10x slower in round 1 for both, and in round 2
    only while onnxfuse runs. Paired round by round the speedup is 2x; the ratio of the medians
    (2 / 10) would call onnxfuse 5x slower."""
    clock = [0.0]
    monkeypatch.setattr("onnxfuse.measure.timing.time.perf_counter", lambda: clock[0])

    def scripted(name, seconds):
        pending = list(seconds)

        def call():
            clock[0] += pending.pop(0)
            return REFERENCE

        return Contender(name, call)

    # each contender: a check call and a sizing call, then rounds 0, 1, 2
    ort_side = scripted("onnxruntime", [1, 2, 2, 20, 2])
    fused = scripted("onnxfuse", [1, 1, 1, 10, 10])
    results = race([ort_side, fused], REFERENCE, rounds=3, round_seconds=0.0)
    assert results["onnxfuse"].paired_speedup == 2.0 and results["onnxruntime"].paired_speedup == 1.0
    assert results["onnxruntime"].median / results["onnxfuse"].median == 0.2
    cells = with_speedups({"onnxruntime": results["onnxruntime"].to_json(), "onnxfuse": results["onnxfuse"].to_json()})
    assert cells["onnxfuse"]["speedup"] == 2.0


def test_race_refuses_to_time_a_contender_whose_outputs_differ():
    log: list[str] = []
    wrong = {"y": REFERENCE["y"] + 1.0}
    results = race([logged("ok", log), logged("wrong", log, wrong)], REFERENCE, rounds=3, round_seconds=0.0)
    assert isinstance(results["ok"], Timing)
    assert results["wrong"].startswith("refused: output y differs")
    assert log.count("wrong") == 1  # the check call only: never timed


def test_race_times_an_unchecked_yardstick_that_computes_something_else():
    """A contender with checked=False (a model's MatMuls alone, timed beside it) is timed and
    paired like the others although its outputs share nothing with the reference."""
    from dataclasses import replace

    log: list[str] = []
    other = {"partial": np.zeros(3, np.float32)}
    results = race([logged("ok", log), replace(logged("yardstick", log, other), checked=False)], REFERENCE,
                   rounds=3, round_seconds=0.0)
    assert isinstance(results["yardstick"], Timing) and results["yardstick"].paired_speedup is not None
    assert log.count("yardstick") == 2 + 3  # warm-up, sizing, three rounds
    checked = race([logged("ok", log), logged("yardstick", log, other)], REFERENCE, rounds=3, round_seconds=0.0)
    assert checked["yardstick"].startswith("refused: no output in common")


def test_race_says_which_contenders_match_the_reference_bit_for_bit():
    """Within tolerance is not the same answers: one ulp off every element passes the check, and
    the timing says it is not bit for bit; a yardstick (unchecked) says nothing."""
    from dataclasses import replace

    log: list[str] = []
    one_ulp = {"y": np.nextafter(REFERENCE["y"], np.float32(np.inf))}
    results = race([logged("same", log), logged("close", log, one_ulp),
                    replace(logged("yardstick", log, one_ulp), checked=False)], REFERENCE, rounds=3, round_seconds=0.0)
    assert results["same"].bitwise_equal is True and results["close"].bitwise_equal is False
    assert results["yardstick"].bitwise_equal is None
    assert results["close"].to_json()["bitwise_equal"] is False and "bitwise_equal" not in results["yardstick"].to_json()


def test_bitwise_equal_compares_bits_dtypes_and_shapes():
    y = REFERENCE["y"]
    assert bitwise_equal(REFERENCE, {"y": y.copy(), "extra": np.ones(2)})
    assert not bitwise_equal(REFERENCE, {"y": -0.0 * y})  # 0.0 and -0.0 compare equal, but are not the same bits
    assert not bitwise_equal(REFERENCE, {"y": y.astype(np.float64)})
    assert not bitwise_equal(REFERENCE, {"y": y.reshape(3, 2)})
    assert not bitwise_equal(REFERENCE, {"z": y})
    nan = {"y": np.full(3, np.nan, np.float32)}
    assert bitwise_equal(nan, {"y": np.full(3, np.nan, np.float32)})


def test_table_marks_a_contender_that_is_not_bit_for_bit_and_explains_the_mark():
    r = sample_result()
    assert "≠" not in format_table([r])
    r.runs[0]["contenders"][FUSED]["bitwise_equal"] = False
    lines = format_table([r]).splitlines()
    assert lines[2].count("≠") == 1 and "(2.00×) ≠" in lines[2]
    assert lines[-1].startswith("≠: outputs within tolerance of onnxruntime's")


def test_race_reports_a_failing_contender_instead_of_raising():
    def broken():
        raise RuntimeError("some backend error\nlast line says why")

    results = race([Contender("broken", broken)], REFERENCE, rounds=2, round_seconds=0.0)
    assert results["broken"] == "failed: last line says why"


def test_check_outputs_matches_by_name_and_needs_a_shared_output():
    swapped = {"extra": np.zeros(1), "y": REFERENCE["y"].copy()}
    assert check_outputs(REFERENCE, swapped) is None
    assert "no output in common" in check_outputs(REFERENCE, {"z": REFERENCE["y"]})
    assert check_outputs({"label": np.array([1, 0])}, {"label": np.array([1, 1])}) is not None


def test_random_inputs_bind_the_batch_and_are_seeded():
    specs = [InputSpec("x", "float32", ("N", 4)), InputSpec("idx", "int64", (None, 2)), InputSpec("w", "float32", (3,))]
    a, b = random_inputs(specs, 5, seed=1), random_inputs(specs, 5, seed=1)
    assert a["x"].shape == (5, 4) and a["idx"].shape == (5, 2) and a["w"].shape == (3,)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert a["idx"].min() >= 0 and a["idx"].max() < 8
    assert not np.array_equal(random_inputs(specs, 5, seed=2)["x"], a["x"])


def sample_result() -> ModelBench:
    r = ModelBench("m", "m.onnx", "m.fused.onnx", compile={"optimize": {"seconds": 1.0}})
    cells = {BASELINE: {"median_ms": 2.0}, FUSED: {"median_ms": 1.0}, TVM: {"na": "TVM build failed: why"}}
    r.runs.append({"batch": 64, "threads": 1, "contenders": with_speedups(cells)})
    return r


def test_speedup_is_onnxruntime_over_contender():
    cells = sample_result().runs[0]["contenders"]
    assert cells[FUSED]["speedup"] == 2.0 and cells[BASELINE]["speedup"] == 1.0 and "speedup" not in cells[TVM]


def test_table_has_a_row_per_run_and_a_column_per_contender():
    text = format_table([sample_result()])
    header, _, row = text.splitlines()
    assert header.split() == ["model", "batch", "thr", "onnxruntime", "ms", "onnxfuse", "ms", "tvm", "ms"]
    assert "1.000 (2.00×)" in row and "n/a (TVM build failed: why)" in row
    markdown = format_table([sample_result()], markdown=True).splitlines()
    assert markdown[0].startswith("| model") and len(markdown) == 3


def test_json_report_shape():
    report = json.loads(json.dumps(report_json([sample_result()], BenchOptions(batches=(64,)))))
    assert set(report) >= {"machine", "options", "models", "ratio"}
    model = report["models"][0]
    assert model["runs"][0]["contenders"][FUSED]["speedup"] == 2.0
    assert model["compile"]["optimize"]["seconds"] == 1.0


def test_fused_refusals_lists_only_refused_fused_runs():
    r = sample_result()
    assert fused_refusals([r]) == []
    r.runs[0]["contenders"][FUSED] = {"na": "refused: output y differs from the original (max abs error 1)"}
    assert fused_refusals([r]) == ["m batch 64, 1 thread(s): refused: output y differs from the original (max abs error 1)"]


def unary_model(path, op: str) -> str:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


@pytest.mark.parametrize("fused_op, exit_code", [("Relu", 0), ("Sigmoid", 1)])
def test_cli_times_a_matching_fused_model_and_refuses_a_wrong_one(tmp_path, fused_op, exit_code):
    original = unary_model(tmp_path / "m.onnx", "Relu")
    fused = unary_model(tmp_path / "m.fused.onnx", fused_op)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["bench", original, "--fused", fused, "--batch", "2", "--no-tvm",
                                       "--rounds", "2", "--json", str(out)])
    assert result.exit_code == exit_code, result.output
    cell = json.loads(out.read_text())["models"][0]["runs"][0]["contenders"][FUSED]
    if exit_code == 0:
        assert cell["median_ms"] > 0
    else:
        assert cell["na"].startswith("refused") and "differ" in result.output


@pytest.mark.parametrize("call_style", ["iobinding", "run"])
def test_both_call_styles_give_the_models_outputs(tmp_path, call_style):
    """The IOBinding contender (inputs and pre-allocated outputs bound once) returns what
    session.run returns, call after call, with the arrays numpy computes."""
    from onnxfuse.measure.contenders import ort_contender

    path = unary_model(tmp_path / "m.onnx", "Sigmoid")
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    contender = ort_contender("m", path, {"x": x}, threads=1, call_style=call_style)
    for _ in range(2):
        y = contender.outputs(contender.call())["y"]
        np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-5)


def test_unknown_call_style_is_refused(tmp_path):
    from onnxfuse.measure.contenders import ort_contender

    with pytest.raises(ValueError, match="call style"):
        ort_contender("m", unary_model(tmp_path / "m.onnx", "Relu"), {"x": np.zeros((1, 8), np.float32)}, 1, "grpc")


def test_cli_call_style_is_recorded(tmp_path):
    model = unary_model(tmp_path / "m.onnx", "Relu")
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["bench", model, "--fused", model, "--batch", "2", "--no-tvm", "--rounds", "2",
                                       "--call", "run", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["options"]["call_style"] == "run"


def test_floor_model_takes_the_models_inputs_and_copies_the_first(tmp_path):
    """The yardstick for onnxruntime's call floor: bound with the model's own feeds, it returns its
    first input unchanged (a second, unused input is bound too)."""
    from onnxfuse.measure.contenders import floor_model, ort_contender

    graph = helper.make_graph([helper.make_node("Add", ["x", "z"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
    original = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(original))
    floor = tmp_path / "floor.onnx"
    onnx.save(floor_model(original), str(floor))
    feeds = {"x": np.arange(24, dtype=np.float32).reshape(3, 8), "z": np.ones((3, 8), np.float32)}
    contender = ort_contender("floor", floor, feeds, threads=1)
    (out,) = contender.outputs(contender.call()).values()
    np.testing.assert_array_equal(out, feeds["x"])


def test_bench_times_the_floor_unchecked_beside_the_contenders(tmp_path):
    from onnxfuse.bench import bench_model
    from onnxfuse.measure.contenders import FLOOR

    original = unary_model(tmp_path / "m.onnx", "Sigmoid")
    options = BenchOptions(batches=(2,), tvm=False, rounds=2, budget_seconds=2.0, floor=True,
                           cache_dir=str(tmp_path / "cache"))
    result = bench_model(original, original, options=options, work_dir=tmp_path / "work")
    cells = result.runs[0]["contenders"]
    assert cells[FLOOR]["median_ms"] > 0, cells[FLOOR]  # its output (the input) differs from Sigmoid's: unchecked
    assert cells[FUSED]["median_ms"] > 0
