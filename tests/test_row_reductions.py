"""Row reductions (over the last axis) run in vector lanes: schedule.factor_row_reductions."""

from __future__ import annotations

import onnx
import pytest

import tvm
from tvm import s_tir

from onnxfuse.codegen import relax_import, schedule
from onnxfuse.codegen.compile import compile_group
from onnxfuse.target import resolve_target
from onnx_builder import const_i64, model, node

from test_codegen import check_against_ort, random_feeds


def _row_reduction(op: str, width: int = 64, keepdims: int = 1) -> onnx.ModelProto:
    """x * x, reduced over the last axis of [N, 8, width], then an elementwise op on the result."""
    reduce = node(op, ["sq", "axes"] if op != "ArgMax" else ["sq"], "r", keepdims=keepdims,
                  **({"axis": -1} if op == "ArgMax" else {}))
    tail = node("Cast", ["r"], "y", to=onnx.TensorProto.FLOAT) if op == "ArgMax" else node("Neg", ["r"], "y")
    inits = {} if op == "ArgMax" else {"axes": const_i64(-1)}
    out_shape = ("N", 8, 1) if keepdims else ("N", 8)
    return model([node("Mul", ["x", "x"], "sq"), reduce, tail], {"x": ("N", 8, width)}, {"y": out_shape}, inits, opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ArgMax"])
def test_row_reductions_match_onnxruntime(tmp_path, op):
    m = _row_reduction(op)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    if op != "ArgMax":
        assert cg.stats["reductions_factored"] == 1
    for batch in (1, 7, 33):  # 7 and 33 leave a ragged last row tile
        check_against_ort(cg, m, random_feeds(m, batch, seed=batch))


def test_without_keepdims(tmp_path):
    m = _row_reduction("ReduceSum", keepdims=0)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    assert cg.stats["reductions_factored"] == 1
    check_against_ort(cg, m, random_feeds(m, 5))


def test_rows_too_short_to_split_stay_serial(tmp_path):
    """Fewer than two vectors per row: nothing to gain from partial sums."""
    m = _row_reduction("ReduceSum", width=24)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    assert cg.stats["reductions_factored"] == 0
    check_against_ort(cg, m, random_feeds(m, 5))


def test_reduction_over_a_middle_axis_vectorizes_its_columns_instead(tmp_path):
    m = model([node("ReduceSum", ["x", "axes"], "y", keepdims=1)], {"x": ("N", 64, 32)}, {"y": ("N", 1, 32)},
              {"axes": const_i64(1)}, opset=18)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    assert cg.stats["reductions_factored"] == 0
    assert cg.stats["vectorized"] >= 1
    check_against_ort(cg, m, random_feeds(m, 3))


def test_partial_sums_take_a_row_not_the_batch():
    """The partial sums' buffer must shrink to a row once lowered. Left at the row tile, TVM kept
    it batch-sized with a symbolic batch, so each tile allocated the whole batch's: 40x slower
    at batch 1000."""
    imported = relax_import.import_group(_row_reduction("ReduceSum", width=128), "k")
    scheduled, stats = schedule.schedule_group(imported.prim_func)
    assert stats.reductions_factored == 1
    lower = tvm.transform.Sequential([
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(),
    ])
    lowered = lower(tvm.IRModule({"main": scheduled}))["main"].script()
    partial_sums = [line.strip() for line in lowered.splitlines() if "_rf = " in line and "alloc_buffer" in line]
    assert len(partial_sums) == 1, lowered
    shape = partial_sums[0].split("alloc_buffer(", 1)[1].split(")")[0]
    assert "N" not in shape, partial_sums[0]
