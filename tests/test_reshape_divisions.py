"""A Reshape that splits a symbolic dim: the kernel checks it divides (reshape_divisions)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx_builder import const_i64, model, node
from test_ieee_order import assert_bitwise_equal

from onnxfuse import optimize
from onnxfuse.codegen.reshape_divisions import exact_dim, requirements
from onnxfuse.errors import CompileError
from onnxfuse.kernel_spec import DerivedDim
from onnxfuse.session import InferenceSession

F32 = np.float32
N = tvm.tirx.Var("N", "int64")
M = tvm.tirx.Var("M", "int64")


def c(value: int):
    return tvm.tirx.IntImm("int64", value)


def test_each_division_asks_its_symbol_to_be_a_multiple():
    """`N * 64 // 48` needs N a multiple of 3; `N // 16` a multiple of 16 (lcm with the first)."""
    assert requirements([tvm.tirx.floordiv(N * c(64), c(48))]) == (("N", 3),)
    assert requirements([tvm.tirx.floordiv(N * c(64), c(48)), tvm.tirx.floordiv(N, c(16))]) == (("N", 48),)
    assert requirements([tvm.tirx.floordiv(N * c(8), c(4))]) == ()  # always divides
    assert requirements([tvm.tirx.floordiv(N * M * c(64), c(256))]) == (("N*M", 4),)  # the product
    with pytest.raises(CompileError, match="cannot check"):
        requirements([tvm.tirx.floordiv(N * M * N, c(4))])


def test_a_split_and_merge_back_is_the_symbol_itself_where_it_divides():
    assert exact_dim(tvm.tirx.floordiv(N, c(16)) * c(16), (("N", 16),)) == "N"
    assert exact_dim(tvm.tirx.floordiv(N, c(16)) * c(8), (("N", 16),)) == DerivedDim("N", 1, 2)
    assert exact_dim(tvm.tirx.floordiv(N * c(64), c(48)) * c(48), (("N", 3),)) == DerivedDim("N", 64)
    assert exact_dim(tvm.tirx.floordiv(N, c(16)) * c(16), ()) is None  # not known to divide: refused
    assert exact_dim(tvm.tirx.floordiv(N * M, c(4)) * c(4), (("N*M", 4),)) == DerivedDim("N", times="M")


def _sessions(m: onnx.ModelProto, tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(m, source)
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    (group,) = result.report["groups"]
    assert group["status"] == "compiled", group.get("reason")
    return (InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"]),
            ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]))


def split_and_merge_model() -> onnx.ModelProto:
    """x[N, 8] -> [-1, 4, 8] (N // 4 blocks) -> Sigmoid -> [-1, 8] -> Relu: the output's rows
    are TVM's `N // 4 * 4`, which is N where N splits; onnxruntime fails any other N."""
    nodes = [node("Reshape", ["x", "blocks"], "b"), node("Sigmoid", ["b"], "s"),
             node("Reshape", ["s", "rows"], "r"), node("Relu", ["r"], "y")]
    return model(nodes, {"x": ("N", 8)}, {"y": ("N", 8)}, {"blocks": const_i64(-1, 4, 8), "rows": const_i64(-1, 8)})


def test_a_split_and_merge_back_compiles_and_gives_onnxruntimes_bits(tmp_path):
    """It fell back before: "dimension s0 // 4 * 4 is an expression, not a named dim" (the
    feed-forward block of a Keras encoder through tf2onnx)."""
    fused, original = _sessions(split_and_merge_model(), tmp_path)
    for rows in (4, 12, 64):
        x = np.random.default_rng(rows).standard_normal((rows, 8)).astype(F32)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


@pytest.mark.parametrize("build, rows", [(split_and_merge_model, 6), (split_and_merge_model, 1)])
def test_a_dim_that_does_not_split_is_an_error_as_in_onnxruntime(tmp_path, build, rows):
    """The kernel computed N // 4 * 4 rows, and its output had 4 where the original fails."""
    fused, original = _sessions(build(), tmp_path)
    x = np.ones((rows, 8), F32)
    with pytest.raises(Exception, match="cannot be reshaped"):
        original.run(None, {"x": x})
    with pytest.raises(Exception, match="not a multiple of 4.*cannot be reshaped"):
        fused.run(None, {"x": x})


def test_a_fold_of_a_flat_input_that_does_not_divide_is_an_error(tmp_path):
    """f[M] -> [-1, 4]: at M = 6 the fused model returned one row of four, silently."""
    m = model([node("Reshape", ["f", "fold"], "folded"), node("Sigmoid", ["folded"], "y")],
              {"f": ("M",)}, {"y": ("R", 4)}, {"fold": const_i64(-1, 4)})
    fused, original = _sessions(m, tmp_path)
    f = np.arange(8, dtype=F32)
    assert_bitwise_equal(fused.run(None, {"f": f})[0], original.run(None, {"f": f})[0])
    with pytest.raises(Exception, match="not a multiple of 4"):
        fused.run(None, {"f": np.arange(6, dtype=F32)})
