"""ReduceSum and ReduceMean over trailing axes give onnxruntime's bits (codegen/row_sums.py): each
row summed in Eigen's lanes and order, rows that start between 16-byte boundaries included.
Fused model through onnxruntime against onnxruntime on the original, bit for bit; before, about
70% of the rows differed in the last bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm_ffi
from onnx_builder import const_i64, model, node
from test_ieee_order import assert_bitwise_equal, fused_session, original_session
from tvm import s_tir

from onnxfuse.codegen import relax_import, schedule

F32 = np.float32


def _row_sum_model(op: str, shape: tuple, axes: tuple[int, ...], keepdims: int = 1) -> onnx.ModelProto:
    """x * x reduced over `axes`, then Neg (which keeps the sum's sign bit visible)."""
    kept = tuple(1 if i in [a % len(shape) for a in axes] else d for i, d in enumerate(shape))
    out = kept if keepdims else tuple(d for i, d in enumerate(shape) if i not in [a % len(shape) for a in axes])
    nodes = [node("Mul", ["x", "x"], "sq"), node(op, ["sq", "axes"], "r", keepdims=keepdims), node("Neg", ["r"], "y")]
    return model(nodes, {"x": shape}, {"y": out}, {"axes": const_i64(*axes)}, opset=18)


def _check(m: onnx.ModelProto, tmp_path, batches=(1, 5, 64), scale: float = 3.0) -> None:
    fused, original = fused_session(m, tmp_path), original_session(m)
    shape = [d.dim_value or None for d in m.graph.input[0].type.tensor_type.shape.dim]
    for batch in batches:
        x = (np.random.default_rng(batch).standard_normal([d or batch for d in shape]) * scale).astype(F32)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


# widths: under one group of four, no multiple of four (rows split four ways), a multiple of four
# but not of eight (one more group after the accumulators), whole groups of eight, wide rows
@pytest.mark.parametrize("width", [3, 5, 12, 37, 64, 100, 768, 1001])
def test_a_row_sum_is_onnxruntimes(tmp_path, width):
    _check(_row_sum_model("ReduceSum", ("N", 8, width), (-1,)), tmp_path)


@pytest.mark.parametrize("width", [37, 64])
def test_a_row_mean_divides_onnxruntimes_sum(tmp_path, width):
    _check(_row_sum_model("ReduceMean", ("N", 8, width), (-1,)), tmp_path)


def test_several_trailing_axes_are_one_row(tmp_path):
    _check(_row_sum_model("ReduceMean", ("N", 3, 5, 7), (2, 3), keepdims=0), tmp_path, batches=(1, 6))


def test_rows_of_negative_zeros_infinities_and_nans(tmp_path):
    """-0.0 at every unused position keeps a row of -0.0 at -0.0 (x * x is +0.0 there, so the
    sum is taken of the input itself)."""
    m = model([node("ReduceSum", ["x", "axes"], "r", keepdims=1), node("Neg", ["r"], "y")], {"x": ("N", 13)},
              {"y": ("N", 1)}, {"axes": const_i64(-1)}, opset=18)
    rows = np.full((6, 13), -0.0, F32)
    rows[1, 4], rows[2, 12], rows[3, 0] = np.inf, np.nan, -np.inf
    rows[4, 2], rows[4, 9] = np.inf, -np.inf
    rows[5] = np.linspace(-3e38, 3e38, 13, dtype=F32)
    fused, original = fused_session(m, tmp_path), original_session(m)
    for first in range(6):  # each row at each of the four offsets from a 16-byte boundary
        x = np.roll(rows, first, axis=0)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


def test_the_schedule_keeps_the_lanes_onnxruntime_sums_in():
    """A 768-wide row would be split into 16 vector lanes by factor_row_reductions (another order);
    the row sum's stages are left as they are."""
    func = relax_import.import_group(_row_sum_model("ReduceSum", ("N", 768), (-1,)), "k").prim_func
    scheduled, stats = schedule.schedule_group(func)
    assert stats.reductions_factored == 0
    names = set()

    def visit(block, visitor):
        names.add(block.name_hint)
        visitor.default_visit(block)

    tvm_ffi.structural_visit(scheduled, [(s_tir.SBlock, visit)])
    assert {"row_sum_lanes_update", "row_sum"} <= names and not any("_rf" in name for name in names), names


# GlobalAveragePool: Keras' LayerNorm moments through tf2onnx ([N, 16, 32]); 4-D pools onnxruntime
# keeps in NCHW (3 channels, and 24 on an AVX-512 CPU, whose channel block is 16) or moves to its
# NCHWc layout (64 channels), which sums one value after the other.
@pytest.mark.parametrize("shape", [("N", 16, 32), ("N", 3, 7, 7), ("N", 24, 5, 5), ("N", 64, 7, 7)])
def test_a_global_average_pool_is_onnxruntimes(tmp_path, shape):
    m = model([node("GlobalAveragePool", ["x"], "r"), node("Neg", ["r"], "y")], {"x": shape},
              {"y": shape[:2] + (1,) * (len(shape) - 2)})
    _check(m, tmp_path, batches=(1, 3, 64))


# Axes in the middle: onnxruntime sums as MLAS's one-row product by ones over [R, K] (groups of
# four), or in order where the batch before them is one row; Hummingbird's random forest sums its
# trees over [N, 100, 2] so.
@pytest.mark.parametrize("op, shape, axes", [("ReduceSum", ("N", 100, 2), (1,)), ("ReduceMean", ("N", 37, 5), (1,)),
                                             ("ReduceSum", ("N", 3, 10, 6), (1, 2)), ("ReduceSum", ("N", 2, 3), (1,))])
def test_a_sum_over_middle_axes_is_onnxruntimes_at_every_batch(tmp_path, op, shape, axes):
    _check(_row_sum_model(op, shape, axes, keepdims=0), tmp_path, batches=(1, 2, 7))
