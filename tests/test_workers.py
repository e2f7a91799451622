"""The compile worker pool: results, deadlines, and workers that die."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from test_optimize import MODELS, assert_outputs_match, run_both
from worker_tasks import crash, sleep_then, square

from onnxfuse import optimize
from onnxfuse.workers import run_with_deadline


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


def _run_piped_script(script: str, tmp_path) -> subprocess.CompletedProcess:
    """Run `script` as `python -` reads it from a pipe: its main module has no file, so spawned
    workers (which re-import the main module) cannot start."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-"], input=script, text=True, capture_output=True, cwd=tmp_path,
                          env=env, timeout=600)


def test_tasks_run_in_process_when_workers_cannot_start(tmp_path):
    proc = _run_piped_script(
        "from onnxfuse.workers import run_with_deadline\n"
        "from worker_tasks import square\n"
        "print(sorted(run_with_deadline(square, {k: (k,) for k in range(4)}, jobs=2, timeout=60,\n"
        "                               on_failure=lambda reason: reason)))\n", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[(0, 0), (1, 1), (2, 4), (3, 9)]"
    assert "compiling in this process, without deadlines" in proc.stderr


def test_optimize_from_a_piped_script_compiles_and_the_model_works(tmp_path):
    proc = _run_piped_script(
        "from onnxfuse import optimize\n"
        f"r = optimize({str(MODELS / 'lstm_gate.onnx')!r}, 'g.fused.onnx', cache_dir=False, jobs=2)\n"
        "print(r.report['groups_compiled'], r.report['groups_fallback'])\n", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1", "0"]
    fused = tmp_path / "g.fused.onnx"
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    assert_outputs_match(*run_both(MODELS / "lstm_gate.onnx", fused, {"X": x}))
