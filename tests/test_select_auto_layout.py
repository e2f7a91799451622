"""`--select auto` leaves nodes in batch-last layout to onnxruntime (select/auto.py): an output with
a static first axis and the batch in its last one, where our schedule strides every access by
the batch (docs/selection.md). Only the plan is asserted here; the output still matches."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import assert_outputs_match, run_both
from onnx_builder import const_i64, model, node, weights

import onnxfuse
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.select.auto import leave_to_onnxruntime


def save(tmp_path, proto, name="m.onnx"):
    path = tmp_path / name
    onnx.save(proto, str(path))
    return path


def hummingbird_gemm():
    """W @ X^T -> Less -> Reshape -> Cast: Hummingbird's GEMM strategy, batch in the last axis."""
    return model([node("Gemm", ["W", "X"], "g", transB=1), node("Less", ["g", "T"], "lt"),
                  node("Reshape", ["lt", "shape"], "r"), node("Cast", ["r"], "Y", to=1)],
                 {"X": ["N", 28]}, {"Y": [4, 16, "N"]},
                 {"W": weights(64, 28), "T": weights(64, 1, seed=1), "shape": const_i64(4, 16, -1)})


def batch_first_gemm():
    """X @ W^T -> Relu: the same product with the batch in the rows, as the GEMM kernel wants it."""
    return model([node("Gemm", ["X", "W"], "g", transB=1), node("Relu", ["g"], "Y")],
                 {"X": ["N", 28]}, {"Y": ["N", 64]}, {"W": weights(64, 28)})


def plan_of(path):
    plan = plan_fusion(load_model(path), leave_out=leave_to_onnxruntime)
    return plan, {u.op_type: u.reason for u in plan.unfused}


def test_a_product_and_epilogue_with_the_batch_last_stay_with_onnxruntime(tmp_path):
    plan, reasons = plan_of(save(tmp_path, hummingbird_gemm()))
    assert not plan.groups
    assert set(reasons) == {"Gemm", "Less", "Reshape", "Cast"}
    assert all("batch in the last axis" in why for why in reasons.values())


def test_the_same_product_with_the_batch_first_still_fuses(tmp_path):
    plan, reasons = plan_of(save(tmp_path, batch_first_gemm()))
    assert [g.op_types for g in plan.groups] == [("Gemm", "Relu")] and not reasons


def test_a_unit_first_axis_or_a_batch_in_the_middle_is_not_batch_last(tmp_path):
    """[1, seq] position ids (BERT) and [seq, N, H] sequences keep fusing."""
    positions = model([node("Add", ["P", "B"], "s"), node("Relu", ["s"], "Y")],
                      {"P": [1, "seq"]}, {"Y": [1, "seq"]}, {"B": weights(1, 1)})
    sequence = model([node("Mul", ["X", "S"], "m"), node("Tanh", ["m"], "Y")],
                     {"X": [8, "N", 16]}, {"Y": [8, "N", 16]}, {"S": weights(16)})
    for proto, name in ((positions, "p.onnx"), (sequence, "s.onnx")):
        plan, reasons = plan_of(save(tmp_path, proto, name))
        assert len(plan.groups) == 1 and not reasons


def test_the_output_with_batch_last_nodes_left_out_matches_onnxruntime(tmp_path, cache):
    source = save(tmp_path, hummingbird_gemm())
    result = onnxfuse.optimize(source, tmp_path / "out" / "m.fused.onnx", cache_dir=cache, jobs=1)
    assert result.report["groups_total"] == 0
    feeds = {"X": np.random.default_rng(0).standard_normal((5, 28)).astype(np.float32)}
    expected, actual = run_both(source, result.model_path, feeds)
    assert_outputs_match(expected, actual)
