"""Fused kernels evaluate float expressions in the order the model wrote them (codegen/ieee_order.py,
codegen/scalar_operands.py): TVM's simplifier used to cancel `(a + b) - b` to `a`, `x - x` and
`x * 0` to 0, and `a - (b + a)` to `-b`, on ordinary inputs a real model can see. Each case runs the
optimized model through onnxruntime with our library and compares with onnxruntime on the original,
bit for bit (any NaN equals any NaN)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx_builder import model, node
from tvm import tirx

from onnxfuse import optimize
from onnxfuse.codegen import ieee_order, relax_import
from onnxfuse.session import InferenceSession

F32 = np.float32


def assert_bitwise_equal(got: np.ndarray, expected: np.ndarray) -> None:
    """Same shape, dtype and bits everywhere, NaN matching NaN whatever its payload."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, expected)
        return
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    mismatch = got[~nan].view(bits) != expected[~nan].view(bits)
    assert not mismatch.any(), f"got {got[~nan][mismatch][:8]}, onnxruntime {expected[~nan][mismatch][:8]}"


def fused_session(onnx_model: onnx.ModelProto, tmp_path) -> InferenceSession:
    """onnxruntime on the optimized model, every node in a compiled kernel (a fallback would
    compare onnxruntime with itself)."""
    source = tmp_path / "m.onnx"
    onnx.save(onnx_model, str(source))
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    report = result.report
    assert report["groups_fallback"] == 0, report["groups"]
    assert report["fused_node_count"] == len(onnx_model.graph.node)
    return InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])


def original_session(onnx_model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])


def check_fused_matches_onnxruntime(onnx_model, feeds, tmp_path) -> None:
    expected = original_session(onnx_model).run(None, feeds)
    got = fused_session(onnx_model, tmp_path).run(None, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_bitwise_equal(g, e)


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e8, 3e38, -3e38, 1e-40, 2.5], F32)
ZERO = {"zero": np.array(0.0, F32)}
ZERO_TENSOR = {"zero": np.array([0.0], F32)}  # as exporters often write a scalar

CASES = {
    # case: (nodes, initializers, a, b)
    "sum_minus_addend": ([node("Add", ["a", "b"], "s"), node("Sub", ["s", "b"], "y")], {},
                         np.array([1.0, 2.0, -3.0, 0.5], F32), np.array([1e8, 1e8, 1e8, 3e7], F32)),
    "difference_with_itself": ([node("Sub", ["a", "a"], "d"), node("Add", ["d", "b"], "y")], {},
                               SPECIALS, np.ones_like(SPECIALS)),
    "times_zero_plus": ([node("Mul", ["a", "zero"], "m"), node("Add", ["m", "b"], "y")], ZERO,
                        SPECIALS, np.ones_like(SPECIALS)),
    "times_zero_tensor_plus": ([node("Mul", ["a", "zero"], "m"), node("Add", ["m", "b"], "y")], ZERO_TENSOR,
                               SPECIALS, np.ones_like(SPECIALS)),
    "zero_divided": ([node("Div", ["zero", "a"], "q"), node("Mul", ["q", "b"], "y")], ZERO,
                     SPECIALS, np.ones_like(SPECIALS)),
    "plus_zero_keeps_sign_rule": ([node("Add", ["a", "zero"], "s"), node("Mul", ["s", "b"], "y")], ZERO,
                                  SPECIALS, np.ones_like(SPECIALS)),
    "minus_overflowing_sum": ([node("Add", ["b", "a"], "s"), node("Sub", ["a", "s"], "y")], {},
                              np.array([3e38, 3e38, -3e38, 1.0], F32), np.array([3e38, 1e38, -1e38, 1e-8], F32)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_float_expressions_keep_ieee_order(tmp_path, case):
    nodes, inits, a, b = CASES[case]
    n = len(a)
    m = model(nodes, {"a": ("N", n), "b": ("N", n)}, {"y": ("N", n)}, inits, opset=18)
    feeds = {"a": np.stack([a, a[::-1]]), "b": np.stack([b, b[::-1]])}
    check_fused_matches_onnxruntime(m, feeds, tmp_path)


def test_integer_index_arithmetic_is_still_simplified():
    """The fences keep the simplifier off float values only: a reshape's index `v_i1 // 32 + v_i0`
    must still become `v_i0` (ieee_order.simplify: compute_at cannot bound a tile otherwise)."""
    m = model([node("Reshape", ["x", "shape"], "r"), node("Sub", ["r", "r"], "d"), node("Add", ["d", "r"], "y")],
              {"x": ("N", 4, 8)}, {"y": ("N", 32)}, {"shape": np.array([-1, 32], np.int64)}, opset=18)
    func = relax_import.import_group(m, "k").prim_func
    before, after = func.script(), ieee_order.simplify(func).script()
    assert "x[v_i1 // T.int64(32) + v_i0," in before
    assert "x[v_i0, v_i1 // T.int64(8), v_i1 % T.int64(8)]" in after
    assert "T_reshape_intermediate[v_ax0, v_ax1] - T_reshape_intermediate[v_ax0, v_ax1]" in after


@pytest.mark.parametrize("width", [4, 64], ids=["narrow", "lanes"])
@pytest.mark.parametrize("type_name", ["int32", "int64"])
def test_integer_min_of_a_difference_with_itself(tmp_path, type_name, width):
    """Min(Sub(x, x), y): the min's operand is fenced, and the simplifier folds x - x to 0 inside
    the fence; TVM's code generator rejected reinterpret(uint, 0) and the group fell back to
    onnxruntime (fuzzer). fused_session asserts the group compiled."""
    dtype = np.dtype(type_name)
    info = np.iinfo(dtype)
    onnx_type = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    m = model([node("Sub", ["x", "x"], "d"), node("Min", ["d", "y"], "m")], {"x": ("N", width), "y": ("N", width)},
              {"m": ("N", width)}, dtype=onnx_type, opset=17)
    row = np.tile(np.array([info.min, -1, 0, info.max], dtype), width // 4)
    check_fused_matches_onnxruntime(m, {"x": np.stack([row, row[::-1]]), "y": np.stack([row[::-1], row])}, tmp_path)


def test_a_reinterpreted_zero_is_the_zero_of_its_type():
    """fold_zero_reinterprets: scalar and vector zeros of another type; other reinterprets stay."""
    x = tirx.Var("x", "int64")
    folded = [ieee_order.fold_zero_reinterprets(tirx.PrimFunc([x], tirx.Evaluate(e))).body.value for e in (
        tirx.reinterpret("uint64", tirx.const(0, "int64")),
        tirx.reinterpret("int32x4", tirx.reinterpret("uint32x4", tirx.Broadcast(tirx.const(0, "int32"), 4))),
        tirx.reinterpret("float64", tirx.const(0, "int64")),
        tirx.reinterpret("uint64", x), tirx.reinterpret("uint64", tirx.const(3, "int64")))]
    assert [str(e) for e in folded[:3]] == ["T.uint64(0)", "T.Broadcast(0, 4)", "T.float64(0.0)"]
    assert all(isinstance(e, tvm.ir.Call) for e in folded[3:])
