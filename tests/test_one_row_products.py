"""Products by a run-time weight at one row: onnxruntime's one-row kernel order (one_row_products)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builder import model, node
from test_ieee_order import assert_bitwise_equal, fused_session, original_session

from onnxfuse import optimize
from onnxfuse.codegen.one_row_products import MAX_UNROLLED_K
from onnxfuse.fusion import onnxruntime_fused_ops as fused_ops_module
from onnxfuse.session import InferenceSession

F32 = np.float32


def feeds(rows: int, k: int, n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, k)).astype(F32), "w": rng.standard_normal((k, n)).astype(F32)}


def product_by_input_weight(k: int, n: int, bias: bool) -> onnx.ModelProto:
    """-(x @ w (+ b)), w a graph input: onnxruntime cannot prepack it (the Neg, exact, makes
    it a group: a lone MatMul stays with onnxruntime)."""
    nodes = [node("MatMul", ["x", "w"], "p")]
    inits = {}
    if bias:
        nodes.append(node("Add", ["p", "b"], "s"))
        inits["b"] = np.random.default_rng(k).standard_normal(n).astype(F32)
    nodes.append(node("Neg", ["s" if bias else "p"], "y"))
    return model(nodes, {"x": ("N", k), "w": (k, n)}, {"y": ("N", n)}, inits)


@pytest.mark.parametrize("k, n, rows", [(7, 5, (1, 2, 5)), (32, 96, (1, 2, 5)), (33, 17, (1, 2, 5)), (128, 32, (1, 3)),
                                         (300, 48, (1,))])
def test_a_product_by_a_run_time_weight_is_onnxruntimes_at_one_row_and_more(tmp_path, k, n, rows):
    """At one row MLAS sums k in groups of four without FMA (41 of 96 outputs of a [1, 32] @
    [32, 96] differed from TVM's chain); at more rows it is the chain as before. Past 128 k's
    onnxruntime's blocks of K over several rows depend on how its threads split the columns, so
    only one row is onnxruntime's whatever its threads (docs/numerics.md)."""
    m = product_by_input_weight(k, n, bias=False)
    fused, original = fused_session(m, tmp_path), original_session(m)
    for count in rows:
        f = feeds(count, k, n, seed=count)
        assert_bitwise_equal(fused.run(None, f)[0], original.run(None, f)[0])


@pytest.mark.parametrize("k", [16, 32])
def test_a_product_and_bias_onnxruntime_makes_a_gemm_start_from_the_bias_at_one_row(tmp_path, k):
    """onnxruntime fuses MatMul + Add into a Gemm even by a run-time weight; its one-row kernel
    then adds the groups to the bias (46 of 96 outputs differed when the bias came last)."""
    m = product_by_input_weight(k, 96, bias=True)
    assert [op.op for op in fused_ops_module.onnxruntime_fused_ops(m)] == ["Gemm"]
    fused, original = fused_session(m, tmp_path), original_session(m)
    for rows in (1, 3):
        f = feeds(rows, k, 96, seed=10 + rows)
        assert_bitwise_equal(fused.run(None, f)[0], original.run(None, f)[0])


def test_a_constant_weight_keeps_the_prepacked_order_at_one_row(tmp_path):
    """The kernel of a group takes its weights as inputs (one kernel for every group of its
    shape), but onnxruntime prepacks them: the one-row order must not reach them."""
    rng = np.random.default_rng(3)
    m = model([node("MatMul", ["x", "w"], "p"), node("Neg", ["p"], "y")], {"x": ("N", 32)}, {"y": ("N", 96)},
              {"w": rng.standard_normal((32, 96)).astype(F32)})
    fused, original = fused_session(m, tmp_path), original_session(m)
    for rows in (1, 4):
        x = rng.standard_normal((rows, 32)).astype(F32)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


def test_a_row_of_zeros_gives_onnxruntimes_positive_zero(tmp_path):
    """The one-row kernel's output starts at +0.0: products of -0.0 alone still sum to +0.0
    (negated here: -0.0)."""
    m = product_by_input_weight(8, 16, bias=False)
    fused, original = fused_session(m, tmp_path), original_session(m)
    f = {"x": np.zeros((1, 8), F32), "w": -np.ones((8, 16), F32)}
    got, expected = fused.run(None, f)[0], original.run(None, f)[0]
    assert np.signbit(expected).all()
    assert_bitwise_equal(got, expected)


def loop_over_weight(carried: bool, k: int = 16) -> onnx.ModelProto:
    """h <- tanh(h @ W + b) for 5 iterations, W and b the main graph's constants: read by the
    body from the graph around it (`carried=False`), or handed through the Loop as carried values,
    as tf2onnx writes a Keras RNN's kernels (`carried=True`)."""
    rng = np.random.default_rng(7)
    weight = "W_in" if carried else "W"
    nodes = [helper.make_node("MatMul", ["h_in", weight], ["p"]), helper.make_node("Add", ["p", "bias"], ["s"]),
             helper.make_node("Tanh", ["s"], ["h_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    inputs = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
              helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["N", k])]
    outputs = [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
               helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["N", k])]
    if carried:
        nodes.append(helper.make_node("Identity", ["W_in"], ["W_out"]))
        inputs.append(helper.make_tensor_value_info("W_in", TensorProto.FLOAT, [k, k]))
        outputs.append(helper.make_tensor_value_info("W_out", TensorProto.FLOAT, [k, k]))
    body = helper.make_graph(nodes, "body", inputs, outputs)
    loop = helper.make_node("Loop", ["steps", "", "h0"] + (["W"] if carried else []), ["h"] + (["W_last"] if carried else []),
                            body=body)
    inits = [numpy_helper.from_array((rng.standard_normal((k, k)) / 2).astype(F32), "W"),
             numpy_helper.from_array(rng.standard_normal(k).astype(F32), "bias"),
             numpy_helper.from_array(np.array(5, np.int64), "steps")]
    graph = helper.make_graph([loop], "loop", [helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["N", k])],
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", k])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("carried", [False, True])
def test_a_loop_bodys_product_is_onnxruntimes_at_one_row(tmp_path, carried):
    """onnxruntime prepacks a body's captured constant (TVM's chain at one row too) but not a
    carried one (the one-row kernel): 6 and 9 of 16 outputs tell the two orders apart."""
    m = loop_over_weight(carried)
    source = tmp_path / "loop.onnx"
    onnx.save(m, source)
    result = optimize(source, tmp_path / "loop.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups_compiled"] >= 1 and result.report["groups_fallback"] == 0
    fused = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    original = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for rows in (1, 3):
        h0 = np.random.default_rng(rows).standard_normal((rows, 16)).astype(F32)
        assert_bitwise_equal(fused.run(None, {"h0": h0})[0], original.run(None, {"h0": h0})[0])


def test_past_the_unrolled_limit_the_product_is_left_as_tvm_computes_it(tmp_path):
    """A K over MAX_UNROLLED_K keeps TVM's product: within rounding of onnxruntime's at one row
    (a documented difference), and still compiled."""
    k = MAX_UNROLLED_K + 4
    m = product_by_input_weight(k, 48, bias=False)
    fused, original = fused_session(m, tmp_path), original_session(m)
    f = feeds(1, k, 48, seed=1)
    np.testing.assert_allclose(fused.run(None, f)[0], original.run(None, f)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("biased", [False, True])
def test_an_initializer_the_model_lists_as_an_input_is_a_run_time_weight(tmp_path, biased):
    """IR-3 exports (the ONNX model zoo's) list every initializer as a graph input too:
    onnxruntime then treats the weight as one a caller may feed and does not prepack it, so at
    one row it takes the one-row kernel (74 of 96 outputs differed while the group baked it in)."""
    rng = np.random.default_rng(3)
    m = model([node("MatMul", ["x", "w"], "p"), node("Neg", ["p"], "y")], {"x": ("N", 32)}, {"y": ("N", 96)},
              {"w": rng.standard_normal((32, 96)).astype(F32)})
    if biased:  # onnxruntime makes MatMul + Add its Gemm by such a weight too: from the bias (54 of 96 differed)
        m = model([node("MatMul", ["x", "w"], "p"), node("Add", ["p", "b"], "s"), node("Neg", ["s"], "y")],
                  {"x": ("N", 32)}, {"y": ("N", 96)},
                  {"w": rng.standard_normal((32, 96)).astype(F32), "b": rng.standard_normal(96).astype(F32)})
    m.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [32, 96]))
    fused, original = fused_session(m, tmp_path), original_session(m)
    for rows in (1, 4):
        x = rng.standard_normal((rows, 32)).astype(F32)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])
    w = rng.standard_normal((32, 96)).astype(F32)  # and a caller who feeds it is heard
    x = rng.standard_normal((2, 32)).astype(F32)
    assert_bitwise_equal(fused.run(None, {"x": x, "w": w})[0], original.run(None, {"x": x, "w": w})[0])
