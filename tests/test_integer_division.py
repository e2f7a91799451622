"""integer_division: a zero divisor from data is an error, not a SIGFPE, and -1 never traps.

onnxruntime refuses a zero integer divisor with an error and computes int8/int16 in wider
registers (-128 % -1 is 0 there). Our kernels used to kill the process on both (x86's idiv
traps), found by a dtype sweep."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx_builder import model, node
from test_codegen import check_against_ort

from onnxfuse import optimize
from onnxfuse.codegen.compile import compile_group
from onnxfuse.session import InferenceSession
from onnxfuse.target import resolve_target

ONNX_TYPES = {np.int8: onnx.TensorProto.INT8, np.int16: onnx.TensorProto.INT16,
              np.int32: onnx.TensorProto.INT32, np.int64: onnx.TensorProto.INT64}
OPS = {"div": ("Div", {}), "mod": ("Mod", {"fmod": 0}), "fmod": ("Mod", {"fmod": 1})}


def _division_model(op: str, dtype) -> onnx.ModelProto:
    onnx_op, attrs = OPS[op]
    return model([node(onnx_op, ["x", "z"], "q", **attrs), node("Neg", ["q"], "y")],
                 {"x": ("N", 8), "z": ("N", 8)}, {"y": ("N", 8)}, dtype=ONNX_TYPES[dtype], opset=18)


def _operands(dtype):
    low = np.iinfo(dtype).min
    x = np.array([[7, -7, 7, -7, 100, -100, low, low + 1], [0, 1, -1, 5, -5, 9, 3, low]], dtype)
    z = np.array([[2, 2, -2, -2, 7, -7, -1, -1], [3, -1, -1, 3, 3, -4, -1, 2]], dtype)
    return x, z


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_narrow_types_divide_by_minus_one_as_onnxruntime(tmp_path, op, dtype):
    """-128 / -1 wraps to -128 and -128 % -1 is 0, as in onnxruntime; it used to be SIGFPE."""
    m = _division_model(op, dtype)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    x, z = _operands(dtype)
    check_against_ort(cg, m, {"x": x, "z": z})


@pytest.mark.parametrize("op,expected_at_min", [("div", "min"), ("mod", 0), ("fmod", 0)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_wide_types_do_not_trap_on_min_over_minus_one(tmp_path, op, expected_at_min, dtype):
    """onnxruntime itself dies on INT_MIN / -1 and INT_MIN % -1 (int32/int64); we wrap (the
    quotient is INT_MIN) and give 0 for the remainders, and match numpy everywhere else."""
    m = _division_model(op, dtype)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    x, z = _operands(dtype)
    (got,) = cg.run({"x": x, "z": z})
    x64, z64 = x.astype(object), z.astype(object)  # exact integers
    quotient = np.array([[abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1) for a, b in zip(ra, rb)]
                         for ra, rb in zip(x64, z64)], dtype=object)
    exact = {"div": quotient, "mod": x64 % z64, "fmod": x64 - quotient * z64}[op]
    at_min = (x == np.iinfo(dtype).min) & (z == -1)
    exact[at_min] = np.iinfo(dtype).min if expected_at_min == "min" else 0
    bits = np.iinfo(dtype).bits
    negated = (-exact + 2 ** (bits - 1)) % 2 ** bits - 2 ** (bits - 1)  # the model's Neg, wrapping
    np.testing.assert_array_equal(got.astype(object), negated)


@pytest.mark.parametrize("op", list(OPS))
def test_zero_divisor_is_an_error_through_onnxruntime(tmp_path, op):
    m = _division_model(op, np.int32)
    onnx.save(m, str(tmp_path / "m.onnx"))
    result = optimize(tmp_path / "m.onnx", tmp_path / "f.onnx", cache_dir=False, select="all")
    assert result.report["groups_compiled"] == 1
    session = InferenceSession(str(tmp_path / "f.onnx"), providers=["CPUExecutionProvider"])
    x, z = _operands(np.int32)
    session.run(None, {"x": x % 50, "z": np.abs(z % 50) + 1})
    z[1, 3] = 0
    with pytest.raises(Exception, match="integer division by zero"):
        session.run(None, {"x": x, "z": z})


def test_a_gathered_divisor_gets_both_checks(tmp_path):
    """x / table[idx]: one block with a data-dependent index and a data divisor guards both."""
    table = np.array([1, 2, 3, -1, 5, 0, 7, 8], np.int32)
    m = model([node("Gather", ["table", "idx"], "d", axis=0), node("Div", ["x", "d"], "q"), node("Neg", ["q"], "y")],
              {"x": ("N", 8)}, {"y": ("N", 8)}, {"table": table}, dtype=onnx.TensorProto.INT32, opset=18)
    m.graph.input.append(onnx.helper.make_tensor_value_info("idx", onnx.TensorProto.INT64, ["N", 8]))
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    assert cg.stats["index_checks"] >= 1
    x = np.arange(-8, 8, dtype=np.int32).reshape(2, 8) * 7
    idx = np.array([[0, 1, 2, 3, 4, 6, 7, 3], [7, 6, 4, 3, 2, 1, 0, -1]], np.int64)
    check_against_ort(cg, m, {"x": x, "idx": idx})
    with pytest.raises(Exception, match="integer division by zero"):
        cg.run({"x": x, "idx": np.where(idx == 4, 5, idx)})
    with pytest.raises(Exception, match="index out of range"):
        cg.run({"x": x, "idx": np.where(idx == 4, 99, idx)})
