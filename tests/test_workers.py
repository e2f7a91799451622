"""The compile worker pool: results, deadlines, and workers that die."""

from __future__ import annotations

import onnx

from onnxfuse.optimize import optimize
from onnxfuse.workers import run_with_deadline
from test_optimize import MODELS
from worker_tasks import crash, sleep_then, square


def failed(reason):
    return f"failed: {reason}"


def test_every_task_returns_its_result():
    results = dict(run_with_deadline(square, {k: (k,) for k in range(5)}, jobs=2, timeout=None, on_failure=failed))
    assert results == {k: k * k for k in range(5)}


def test_a_task_past_its_deadline_fails_alone():
    tasks = {"slow": (sleep_then, (120, "late")), "quick": (square, (3,))}
    results = {}
    for name, (fn, args) in tasks.items():
        results.update(run_with_deadline(fn, {name: args}, jobs=1, timeout=3, on_failure=failed))
    assert results["slow"].startswith("failed: compile timed out")
    assert results["quick"] == 9


def test_a_worker_that_dies_fails_only_its_task():
    results = dict(run_with_deadline(crash, {"boom": ()}, jobs=1, timeout=60, on_failure=failed))
    assert "died" in results["boom"]
    results = dict(run_with_deadline(square, {"after": (4,)}, jobs=1, timeout=60, on_failure=failed))
    assert results["after"] == 16


def test_groups_past_the_deadline_fall_back_and_the_model_still_works(tmp_path):
    result = optimize(MODELS / "lstm_gate.onnx", tmp_path / "g.fused.onnx", cache_dir=False, jobs=1,
                      compile_timeout=0.01)
    (group,) = result.report["groups"]
    assert group["status"] == "fallback" and "timed out" in group["reason"]
    assert result.library_path is None
    assert [n.op_type for n in onnx.load(str(result.model_path)).graph.node][0] == "MatMul"
