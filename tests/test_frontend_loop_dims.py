"""Front end: Slices forget the axes they take whole (whole_axis_slices), a Loop's carried state
keeps its initial value's dims where the body proves it (loop_carried_dims), shape inference
re-runs inside bodies, and a group writing a value and its Identity compiles (identity_copies):
together they let a Keras GRU's gate math in tf2onnx's Loop body become one kernel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from frontend_helpers import run
from onnx import TensorProto, helper, numpy_helper
from onnx_builder import const_i64, model, node
from test_ieee_order import assert_bitwise_equal

from onnxfuse import InferenceSession, optimize
from onnxfuse.frontend.canonicalize import canonicalize

F32 = np.float32
INT_MAX = 2**31 - 1
CORPUS = Path(__file__).resolve().parent.parent / "models" / "exported"


def dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def sliced(starts, ends, axes) -> onnx.ModelProto:
    inits = {"starts": const_i64(*starts), "ends": const_i64(*ends), "axes": const_i64(*axes)}
    return model([node("Slice", ["x", "starts", "ends", "axes"], "s"), node("Neg", ["s"], "y")],
                 {"x": ("N", 96)}, ["y"], inits)


def test_a_slice_taking_an_axis_whole_keeps_its_dim_and_values():
    """tf2onnx's `x[:, 32:64]`: the batch axis from 0 to INT_MAX is dropped, the dim stays N."""
    m = sliced((0, 32), (INT_MAX, 64), (0, 1))
    c = canonicalize(m)
    (slice_node,) = [n for n in c.graph.node if n.op_type == "Slice"]
    axes = {t.name: numpy_helper.to_array(t) for t in c.graph.initializer}[slice_node.input[3]]
    assert axes.tolist() == [1]
    assert dims(c.graph.output[0]) == ["N", 32]
    x = np.random.default_rng(0).standard_normal((3, 96)).astype(F32)
    np.testing.assert_array_equal(run(c, {"x": x})[0], run(m, {"x": x})[0])


def test_a_slice_taking_every_axis_whole_is_an_identity_and_others_stay():
    assert [n.op_type for n in canonicalize(sliced((0,), (INT_MAX,), (0,))).graph.node] == ["Identity", "Neg"]
    for starts, ends in (((1, 32), (INT_MAX, 64)), ((0, 32), (5, 64))):  # cut on both axes: kept as it is
        c = canonicalize(sliced(starts, ends, (0, 1)))
        (slice_node,) = [n for n in c.graph.node if n.op_type == "Slice"]
        assert {t.name: numpy_helper.to_array(t) for t in c.graph.initializer}[slice_node.input[3]].tolist() == [0, 1]


def loop_model(grow: bool) -> onnx.ModelProto:
    """h <- tanh(h @ W + x_i) over x [T, B, 8], h declared in the body with a dim of its own
    (`unk__9`), as tf2onnx declares it. With `grow`, the body concatenates a row to h: its dim
    changes every step, and no rename may hold (its scan output is then h's first row)."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Gather", ["x", "i"], ["x_i"], axis=0), helper.make_node("MatMul", ["h_in", "W"], ["p"]),
             helper.make_node("Add", ["p", "x_i"], ["s"]), helper.make_node("Tanh", ["s"], ["t"])]
    if grow:
        nodes += [helper.make_node("Slice", ["t", "zero", "one", "zero"], ["first"]),
                  helper.make_node("Concat", ["t", "first"], ["h_out"], axis=0)]
    else:
        nodes.append(helper.make_node("Identity", ["t"], ["h_out"]))
    nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["unk__9", 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["unk__10", 8]),
         helper.make_tensor_value_info("first" if grow else "t", TensorProto.FLOAT, ["unk__11", 8])],
        [numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1], np.int64), "one")])
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero_i"], ["steps"]),
         helper.make_node("Loop", ["steps", "", "h0"], ["h", "all"], body=body)],
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "B", 8]),
         helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["B", 8])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("all", TensorProto.FLOAT, None)],
        [numpy_helper.from_array((rng.standard_normal((8, 8)) / 3).astype(F32), "W"),
         numpy_helper.from_array(np.array(0, np.int64), "zero_i")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def body_input_dims(m: onnx.ModelProto) -> list:
    (loop,) = [n for n in m.graph.node if n.op_type == "Loop"]
    return dims(loop.attribute[0].g.input[2])


def test_the_carried_state_takes_the_initial_values_dim_where_the_body_keeps_it():
    assert body_input_dims(loop_model(grow=False)) == ["unk__9", 8]
    assert body_input_dims(canonicalize(loop_model(grow=False))) == ["B", 8]


def test_a_state_whose_dim_changes_each_step_keeps_its_own():
    c = canonicalize(loop_model(grow=True))
    assert body_input_dims(c)[0] != "B"
    x, h0 = np.ones((3, 2, 8), F32), np.ones((2, 8), F32)
    for got, expected in zip(run(c, {"x": x[:, :1], "h0": h0[:1]}), run(loop_model(grow=True), {"x": x[:, :1], "h0": h0[:1]})):
        np.testing.assert_array_equal(got, expected)


def test_the_loop_bodys_cell_is_one_kernel_with_onnxruntimes_bits(tmp_path):
    """The body's MatMul, Add, Tanh and the Identity writing the state: one group (it read h
    with one batch dim and x_i with another, and fell back)."""
    m = loop_model(grow=False)
    source = tmp_path / "loop.onnx"
    onnx.save(m, source)
    result = optimize(source, tmp_path / "loop.fused.onnx", cache_dir=False, jobs=1, select="all")
    body_groups = [g for g in result.report["groups"] if g.get("scope")]
    assert body_groups and all(g["status"] == "compiled" for g in body_groups), body_groups
    fused = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    original = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        rng = np.random.default_rng(batch)
        feeds = {"x": rng.standard_normal((5, batch, 8)).astype(F32), "h0": rng.standard_normal((batch, 8)).astype(F32)}
        for got, expected in zip(fused.run(None, feeds), original.run(None, feeds)):
            assert_bitwise_equal(got, expected)


def test_a_group_writing_a_value_and_its_identity_compiles(tmp_path):
    m = model([node("Sigmoid", ["x"], "s"), node("Identity", ["s"], "copy")], {"x": ("N", 4)}, {"s": ("N", 4), "copy": ("N", 4)})
    source = tmp_path / "m.onnx"
    onnx.save(m, source)
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert [g["status"] for g in result.report["groups"]] == ["compiled"], result.report["groups"]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(F32)
    got = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    expected = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, e in zip(got, expected):
        assert_bitwise_equal(g, e)


@pytest.mark.skipif(not (CORPUS / "keras_gru.onnx").exists(), reason="the exported corpus is not in this checkout")
def test_the_keras_gru_body_is_fused_whole():
    """tf2onnx's Keras GRU: the Loop body's gate group compiles (22 ops with the state's copy)."""
    from onnxfuse import plan

    fused_plan = plan(CORPUS / "keras_gru.onnx")
    body = [g for g in fused_plan.groups if g.scope]
    assert max(len(g.node_indices) for g in body) >= 20
