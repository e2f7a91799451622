"""Integer arithmetic on data wraps as onnxruntime's does (codegen/wrapping_integers.py): where an
add, sub or mul overflows, what reads it (a max, a comparison, a cast) sees the wrapped value, not
what LLVM may assume from TVM's no-signed-wrap flags. Fused model through onnxruntime against
onnxruntime on the original, bit for bit; and the pass itself on a kernel's TIR."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx_builder import model, node
from test_ieee_order import check_fused_matches_onnxruntime
from test_ieee_rounding import _assembly

from onnxfuse.codegen import relax_import, schedule, wrapping_integers

TYPES = {"int32": (np.int32, TensorProto.INT32), "int64": (np.int64, TensorProto.INT64)}


def _edges(dtype) -> np.ndarray:
    """Rows with the type's extremes beside ordinary values."""
    info = np.iinfo(dtype)
    return np.array([[1, -5, info.min, 1], [2, 3, 4, 5], [info.max, info.min, -1, 0], [info.max, 7, info.max, 1]],
                    dtype)


CASES = {
    # case: (nodes, initializers(dtype)); inputs a, b of shape (N, width), output y
    # -x of INT_MIN is INT_MIN; max(-a, -b) rewritten as -min(a, b) gave INT_MIN for the row's max.
    "reduce_max_of_neg": ([node("Neg", ["a"], "n"), node("ReduceMax", ["n"], "y", axes=[1], keepdims=1)],
                          lambda t: {}),
    "max_of_negs": ([node("Neg", ["a"], "na"), node("Neg", ["b"], "nb"), node("Max", ["na", "nb"], "y")],
                    lambda t: {}),
    # a + 1 > a is false for INT_MAX (the sum wraps to INT_MIN).
    "sum_compared": ([node("Add", ["a", "one"], "s"), node("Greater", ["s", "a"], "g"),
                      node("Cast", ["g"], "y", to=TensorProto.INT32)],
                     lambda t: {"one": np.array(1, t)}),
    # The wrapped difference, then cast to float: (INT_MIN - 1) is INT_MAX.
    "difference_cast": ([node("Sub", ["a", "b"], "d"), node("Cast", ["d"], "y", to=TensorProto.DOUBLE)],
                        lambda t: {}),
    "product_max": ([node("Mul", ["a", "b"], "p"), node("Max", ["p", "a"], "y")], lambda t: {}),
}


@pytest.mark.parametrize("width", [4, 64], ids=["narrow", "lanes"])  # 64: vectorized
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_overflowing_integer_arithmetic_wraps(tmp_path, case, type_name, width):
    dtype, onnx_type = TYPES[type_name]
    nodes, inits = CASES[case]
    m = model(nodes, {"a": ("N", width), "b": ("N", width)}, ["y"], inits(dtype), dtype=onnx_type, opset=17)
    casts = [n for n in nodes if n.op_type == "Cast"]
    out_type = casts[-1].attribute[0].i if casts else onnx_type
    m.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("y", out_type, None))
    a = np.tile(_edges(dtype), (1, width // 4))
    check_fused_matches_onnxruntime(m, {"a": a, "b": a[::-1].copy()}, tmp_path)


def _scheduled(nodes, outputs, dtype, inits=None, inputs=None):
    m = model(nodes, inputs or {"a": ("N", 4), "b": ("N", 4)}, outputs, inits, dtype=dtype, opset=18)
    func, _ = schedule.schedule_group(relax_import.import_group(m, "k").prim_func, allow_parallel=False)
    return func


@pytest.mark.parametrize(("onnx_type", "wide"), [(TensorProto.INT64, "int128"), (TensorProto.INT32, "int64")],
                         ids=["int64", "int32"])
def test_data_arithmetic_is_computed_wide_and_truncated(onnx_type, wide):
    """-a (a * -1) that a max reads, and a sum only stored: both computed in the wide type, so
    TVM's no-wrap flag is true there and the truncation wraps."""
    for nodes in ([node("Neg", ["a"], "n"), node("Max", ["n", "b"], "y")], [node("Add", ["a", "b"], "y")]):
        script = wrapping_integers.wrap_data_arithmetic(_scheduled(nodes, {"y": ("N", 4)}, onnx_type)).script()
        assert script.count(f'T.Cast("{wide}", a[') == 1 and "T.Cast(\"int" in script


def test_narrow_integers_and_index_arithmetic_are_left_alone():
    """int16 gets no flag from TVM; a gather's index normalization (`i < 0 ? i + n : i`, inside
    the load's indices) is index arithmetic."""
    narrow = _scheduled([node("Neg", ["a"], "n"), node("Max", ["n", "b"], "y")], {"y": ("N", 4)}, TensorProto.INT16)
    assert wrapping_integers.wrap_data_arithmetic(narrow).same_as(narrow)
    gather = _scheduled([node("Gather", ["table", "a"], "y", axis=0)], {"y": ("N", 4)}, TensorProto.INT64,
                        {"table": np.arange(5, dtype=np.int64)}, {"a": ("N", 4)})
    assert "[T.Select(" in gather.script() and " + T.int64(5)" in gather.script()
    assert wrapping_integers.wrap_data_arithmetic(gather).same_as(gather)


@pytest.mark.parametrize("width", [4, 64], ids=["narrow", "lanes"])
def test_widening_leaves_one_plain_instruction(width):
    """LLVM narrows `trunc(sext a op sext b)` back to one add, sub or mul of the original width, and
    without the no-signed-wrap flag: no 128-bit arithmetic left, so no cost."""
    nodes = [node("Mul", ["a", "b"], "p"), node("Sub", ["p", "a"], "d"), node("Add", ["d", "b"], "s"),
             node("Max", ["s", "a"], "y")]
    ir = _assembly(model(nodes, {"a": ("N", width), "b": ("N", width)}, {"y": ("N", width)},
                         dtype=TensorProto.INT64, opset=18), kind="ll")
    code = "\n".join(line for line in ir.splitlines() if not line.startswith("target datalayout"))
    assert "i128" not in code
    products = re.findall(r"= mul( nuw)?( nsw)? (<\d+ x )?i64>? ", code)  # the data's product (indices use shifts)
    assert products and not any(nuw or nsw for nuw, nsw, _ in products)


ABS_CASES = {
    # case: (nodes, constant k, output type or None for the input's); input a of shape (N, width).
    # Abs(INT_MIN) is INT_MIN in onnxruntime. TVM's select(x >= 0, x, -x) became a branch, and
    # under x < 0 LLVM took -x as positive: int64 Abs(x) < -3 was False for INT64_MIN (fuzzer).
    "less": ([node("Abs", ["a"], "m"), node("Less", ["m", "k"], "y")], -3, TensorProto.BOOL),
    "greater": ([node("Abs", ["a"], "m"), node("Greater", ["m", "k"], "y")], -1, TensorProto.BOOL),
    "max": ([node("Abs", ["a"], "m"), node("Max", ["m", "k"], "y")], 0, None),
    "reduce_max": ([node("Abs", ["a"], "m"), node("ReduceMax", ["m"], "y", axes=[1], keepdims=1)], None, None),
    "cast_to_float": ([node("Abs", ["a"], "m"), node("Cast", ["m"], "y", to=TensorProto.FLOAT)], None,
                      TensorProto.FLOAT),
}


def _abs_edges(dtype, width) -> np.ndarray:
    """INT_MIN, INT_MIN + 1, -1, 0 and INT_MAX beside ordinary values, two rows of `width`."""
    info = np.iinfo(dtype)
    row = np.array([info.min, info.min + 1, -1, 0, info.max, 1, -5, 7], dtype)
    return np.tile(row, width // 4).reshape(2, width)


@pytest.mark.parametrize("width", [4, 64], ids=["narrow", "lanes"])
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("case", list(ABS_CASES))
def test_abs_of_int_min_wraps(tmp_path, case, type_name, width):
    dtype, onnx_type = TYPES[type_name]
    nodes, k, out_type = ABS_CASES[case]
    inits = {} if k is None else {"k": np.array(k, dtype)}
    m = model(nodes, {"a": ("N", width)}, ["y"], inits, dtype=onnx_type, opset=17)
    m.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("y", out_type or onnx_type, None))
    check_fused_matches_onnxruntime(m, {"a": _abs_edges(dtype, width)}, tmp_path)


def test_signed_abs_is_a_max_and_its_negation_wraps():
    """No select on the sign (a branch where LLVM knows x < 0), and the -x the max reads wide."""
    m = model([node("Abs", ["a"], "y")], {"a": ("N", 4)}, ["y"], dtype=TensorProto.INT64, opset=18)
    func, _ = schedule.schedule_group(relax_import.import_group(m, "k").prim_func, allow_parallel=False)
    script = wrapping_integers.wrap_data_arithmetic(func).script()
    assert "T.Select" not in script and "T.max(" in script and script.count('T.Cast("int128"') == 2


@pytest.mark.parametrize("type_name", list(TYPES))
def test_negation_selected_on_sign_wraps(tmp_path, type_name):
    """A hand-written Abs, Where(x < 0, -x, x) < -3: TVM makes the Where a branch in the scalar tail,
    and under x < 0 LLVM took a flagged -x as positive (through the fence of before, too)."""
    dtype, onnx_type = TYPES[type_name]
    nodes = [node("Less", ["a", "zero"], "c"), node("Neg", ["a"], "n"), node("Where", ["c", "n", "a"], "w"),
             node("Less", ["w", "k"], "y")]
    m = model(nodes, {"a": ("N", 4)}, ["y"], {"zero": np.array(0, dtype), "k": np.array(-3, dtype)},
              dtype=onnx_type, opset=17)
    m.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("y", TensorProto.BOOL, None))
    check_fused_matches_onnxruntime(m, {"a": _abs_edges(dtype, 4)}, tmp_path)
