"""Front end, end to end: models written the way exporters write them fuse, compile and match
onnxruntime as the same computation written plainly does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from frontend_helpers import as_exported
from onnx import TensorProto, helper
from onnx_builder import const_i64, model, node, weights

import onnxfuse
from onnxfuse import optimize
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.verify import quiet_session_options

MODELS = Path(__file__).resolve().parent.parent / "models"


def plan_summary(m):
    graph = load_model(m)
    plan = plan_fusion(graph)
    return [sorted(graph.nodes[i].op_type for i in g.node_indices) for g in plan.groups]


def test_tree_trav_written_with_constant_nodes_plans_as_the_original():
    """Hummingbird writes its tables as Constant nodes; our generator writes initializers."""
    original = onnx.load(str(MODELS / "tree_trav_d8.onnx"))
    exported = as_exported(original)
    assert sum(n.op_type == "Constant" for n in exported.graph.node) == len(original.graph.initializer)
    expected = plan_summary(original)
    assert plan_summary(exported) == expected
    (group,) = expected
    # Of 113 nodes (its 8 int64-to-int64 Casts are dropped), the 3 left compute the Expand's
    # batch-sized target, which the kernel rebuilds from X's dims (fusion/rebuilt_shapes.py).
    assert len(group) == 110


def exporter_style_model(with_pad=True):
    """One small network in the exporter patterns the front end reads: Constant-node shapes,
    axes and bounds, a Pad whose pads are built from constants, batch plumbing into a Reshape,
    an input dim of -1."""
    pad = [
        node("ConstantOfShape", ["two"], "zeros", value=helper.make_tensor("z", TensorProto.INT64, [1], [0])),
        node("Concat", ["zeros", "given"], "pads", axis=0),
        node("Pad", ["c", "pads"], "p", mode="constant"),
    ] if with_pad else [node("Identity", ["c"], "p")]
    def const(name, **value):
        return helper.make_node("Constant", [], [name], name=name, **value)

    return model(
        [
            const("w", value=onnx.numpy_helper.from_array(weights(8, 16), "w")),
            const("lo", value_float=0.0),
            const("hi", value_float=6.0),
            const("axes", value_ints=[1]),
            const("zero", value=onnx.numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")),
            const("m1", value_ints=[-1]),
            node("MatMul", ["x", "w"], "mm"),
            node("Clip", ["mm", "lo", "hi"], "c"),
            *pad,
            node("Shape", ["p"], "s"),
            node("Gather", ["s", "zero"], "n", axis=0),
            node("Unsqueeze", ["n", "axes0"], "n1"),
            node("Concat", ["n1", "four", "m1"], "shape", axis=0),
            node("Reshape", ["p", "shape"], "r"),
            node("ReduceSum", ["r", "axes"], "sum", keepdims=0),
            node("Sigmoid", ["sum"], "y"),
        ],
        {"x": (-1, 8)}, ["y"] if with_pad else {"y": (-1, 4)},
        {"two": const_i64(2), "given": const_i64(0, 4), "axes0": const_i64(0), "four": const_i64(4)},
    )


def test_exporter_patterns_fuse():
    m = exporter_style_model()
    graph = load_model(m)
    assert graph.value("x").shape == ("unk_0", 8) and graph.value("y").shape == ("unk_0", 5)
    # Every node fuses. A MatMul's epilogue does not run through Pad; without it, the epilogue
    # ends in the reduction that keeps each row (partition: reduction epilogues).
    assert plan_summary(m) == [["Clip", "MatMul"], ["Pad", "ReduceSum", "Reshape", "Sigmoid"]]
    assert plan_summary(exporter_style_model(with_pad=False)) == [
        ["Clip", "Identity", "MatMul", "ReduceSum", "Reshape", "Sigmoid"]]
    raw = plan_fusion(load_model(m, canonical=False))
    assert sum(len(g.node_indices) for g in raw.groups) == 0  # as the exporter wrote it: nothing fused


def test_exporter_patterns_compile_and_match_onnxruntime(tmp_path):
    source = tmp_path / "exported.onnx"
    # Without the Pad: Pad → Reshape over a symbolic batch fails in TVM (int32 vs int64 dims).
    onnx.save(exporter_style_model(with_pad=False), str(source))
    result = optimize(source, tmp_path / "fused.onnx", cache_dir=False, jobs=1)
    assert [o.status for o in result.outcomes] == ["compiled"]
    reference = ort.InferenceSession(str(source), quiet_session_options(), providers=["CPUExecutionProvider"])
    fused = onnxfuse.InferenceSession(str(result.model_path), quiet_session_options(), providers=["CPUExecutionProvider"])
    for batch in (1, 7, 64):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)}
        np.testing.assert_allclose(fused.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
