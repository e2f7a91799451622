"""The exporters' If models (models/exported/branchy_cell_*): the network lives in the branches.

`if mean(x) > 0`: the then-branch is an LSTMCell step, the else-branch a small MLP. Each model is
optimized and checked against onnxruntime on its recorded batch (then-branch) and on the same
batch with x negated (else-branch)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MODELS

import onnxfuse
from onnxfuse import optimize

CORPUS = MODELS / "exported"


def _both_branches(name: str, tmp_path) -> list:
    recorded = CORPUS / f"{name}.inputs.npz"
    feeds = dict(np.load(recorded))
    assert feeds["x"].mean() > 0  # the recorded batch takes the then-branch
    negated = tmp_path / "else.npz"
    np.savez(negated, **{**feeds, "x": -feeds["x"]})
    return [recorded, negated]


@pytest.mark.parametrize("name", ["branchy_cell_dynamo", "branchy_cell_ts"])
def test_branchy_cells_optimize_and_verify_on_both_branches(name, tmp_path, cache):
    result = optimize(CORPUS / f"{name}.onnx", tmp_path / f"{name}.fused.onnx", cache_dir=cache, jobs=1)
    report = result.report
    assert report["groups_fallback"] == 0, [g.get("reason") for g in report["groups"]]
    assert any(g.get("scope", "").startswith("If_") for g in report["groups"])
    for inputs in _both_branches(name, tmp_path):
        check = onnxfuse.verify_models(CORPUS / f"{name}.onnx", result.model_path, inputs=inputs)
        assert check.ok, check.worst


def test_dynamo_branch_cell_is_one_kernel(tmp_path, cache):
    result = optimize(CORPUS / "branchy_cell_dynamo.onnx", tmp_path / "b.fused.onnx", cache_dir=cache, jobs=1)
    cells = [g for g in result.report["groups"] if g.get("scope") == "If_3/then_branch"]
    assert len(cells) == 1 and cells[0]["status"] != "fallback"
    assert sorted(cells[0]["op_types"]) == sorted(
        ["Gemm", "Gemm", "Add", "Split", "Sigmoid", "Sigmoid", "Sigmoid", "Tanh", "Tanh", "Mul", "Mul", "Mul", "Add"])
