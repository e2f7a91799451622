"""`--select measured`: the decision rule and its bookkeeping (no timing assertions)."""

from __future__ import annotations

from onnxfuse.optimize import optimize
from onnxfuse.select import Measurement, alternate_medians, kernel_is_faster
from test_optimize import MODELS, assert_outputs_match, random_inputs, run_both


def test_a_kernel_must_win_at_every_batch():
    assert kernel_is_faster([Measurement(1, 1, 5.0, 6.0), Measurement(64, 1, 50.0, 50.0)])
    assert not kernel_is_faster([Measurement(1, 1, 5.0, 6.0), Measurement(64, 2, 51.0, 50.0)])


def test_contenders_run_in_alternating_rounds():
    calls = []
    medians = alternate_medians([lambda: calls.append("a"), lambda: calls.append("b")], once=[1.0, 1.0],
                                rounds=3, round_seconds=0.0)
    assert len(medians) == 2 and all(m >= 0 for m in medians)
    assert calls == ["a", "b"] * 3


def test_measured_selection_records_both_times_and_keeps_results_correct(tmp_path):
    source = MODELS / "transformer_mlp.onnx"
    result = optimize(source, tmp_path / "t.fused.onnx", cache_dir=tmp_path / "cache", jobs=1,
                      select="measured", select_batches=(1, 4), threads=(1, 2))
    for group in result.report["groups"]:
        measured = group["measured"]
        assert [(m["batch"], m["threads"]) for m in measured] == [(1, 1), (4, 1), (1, 2), (4, 2)]
        kept = group["status"] in ("compiled", "cached")
        assert kept == all(m["kernel_us"] <= m["onnxruntime_us"] for m in measured)
        if not kept:
            assert group["reason"].startswith("measured: onnxruntime is faster")
    expected, actual = run_both(source, result.model_path, random_inputs(source, 3))
    assert_outputs_match(expected, actual)


def test_measured_selection_refuses_kernels_this_machine_cannot_run(tmp_path):
    import pytest

    from onnxfuse.errors import UsageError

    with pytest.raises(UsageError, match="measured"):
        optimize(tmp_path / "not-even-read.onnx", tmp_path / "o.onnx", target="aarch64", select="measured")
