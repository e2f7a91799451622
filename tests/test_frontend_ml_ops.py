"""Front end: shapes after the ai.onnx.ml ops onnx gives none; Casts to the same dtype removed."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from frontend_helpers import apply, assert_same_outputs, op_types, with_shapes
from onnx import TensorProto, helper, numpy_helper
from onnx_builder import model, node, weights

from onnxfuse.frontend.canonicalize import canonicalize
from onnxfuse.frontend.drop_noop_casts import DropNoOpCastsPass
from onnxfuse.frontend.loader import load_model
from onnxfuse.frontend.ml_shapes import InferMlShapesPass
from onnxfuse.fusion.plan import plan_fusion

ROWS = 5


def ml_model(op, inputs, attrs, ml_opset=1, initializers=()):
    """One ai.onnx.ml node whose output `y` is a graph output with no declared type."""
    graph = helper.make_graph(
        [helper.make_node(op, [name for name, _, _ in inputs], ["y"], domain="ai.onnx.ml", **attrs)], "g",
        [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in inputs if shape is not None],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)], list(initializers))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", ml_opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def declared(m: onnx.ModelProto, name: str):
    vi = next(v for v in list(m.graph.output) + list(m.graph.value_info) if v.name == name)
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None, tt.elem_type
    return [d.dim_param or d.dim_value for d in tt.shape.dim], tt.elem_type


CASES = {
    "Scaler": ml_model("Scaler", [("x", TensorProto.FLOAT, ["N", 3])],
                       dict(offset=[0.5, -1.0, 2.0], scale=[2.0, 0.5, 1.0])),
    "Scaler of doubles": ml_model("Scaler", [("x", TensorProto.DOUBLE, ["N", 3])], dict(offset=[1.0], scale=[3.0])),
    "Normalizer": ml_model("Normalizer", [("x", TensorProto.FLOAT, ["N", 4])], dict(norm="L2")),
    "Binarizer": ml_model("Binarizer", [("x", TensorProto.FLOAT, ["N", 4])], dict(threshold=0.1)),
    "Imputer": ml_model("Imputer", [("x", TensorProto.FLOAT, ["N", 2])],
                        dict(imputed_value_floats=[0.0, 1.0], replaced_value_float=0.0)),
    "LabelEncoder, int64 → float": ml_model(
        "LabelEncoder", [("x", TensorProto.INT64, ["N"])],
        dict(keys_int64s=[0, 1, 2], values_floats=[0.5, 1.5, 2.5], default_float=-1.0), ml_opset=2),
    "LabelEncoder opset 1, int64 → string": ml_model(
        "LabelEncoder", [("x", TensorProto.INT64, ["N", 1])], dict(classes_strings=["a", "b", "c"])),
    "ArrayFeatureExtractor of a vector": ml_model(
        "ArrayFeatureExtractor", [("classes", TensorProto.INT32, None), ("idx", TensorProto.INT64, ["N", 1])], {},
        initializers=[numpy_helper.from_array(np.array([7, 9, 11], np.int32), "classes")]),
    "ArrayFeatureExtractor of a matrix": ml_model(
        "ArrayFeatureExtractor", [("x", TensorProto.FLOAT, ["N", 6]), ("idx", TensorProto.INT64, None)], {},
        initializers=[numpy_helper.from_array(np.array([[0, 2, 5]], np.int64), "idx")]),
}


def feeds_for(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in m.graph.input:
        shape = [d.dim_value or ROWS for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        feeds[vi.name] = (rng.integers(0, 3, shape) if np.issubdtype(dtype, np.integer)
                          else rng.standard_normal(shape)).astype(dtype)
    return feeds


@pytest.mark.parametrize("case", CASES)
def test_the_shape_written_is_the_one_onnxruntime_gives(case):
    m = CASES[case]
    assert declared(m, "y") == (None, TensorProto.UNDEFINED)
    after, modified = apply(InferMlShapesPass(), m)
    assert modified
    shape, elem_type = declared(after, "y")
    session = ort.InferenceSession(after.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, feeds_for(m))
    assert [ROWS if d == "N" else d for d in shape] == list(y.shape)
    assert helper.tensor_dtype_to_np_dtype(elem_type) == y.dtype
    assert not apply(InferMlShapesPass(), after)[1]  # nothing more to add


def test_a_product_of_symbols_is_not_one_dim():
    m = ml_model("ArrayFeatureExtractor", [("x", TensorProto.FLOAT, ["N", 6]), ("idx", TensorProto.INT64, ["A", "B"])],
                 {})
    after, modified = apply(InferMlShapesPass(), m)
    assert modified and declared(after, "y") == (None, TensorProto.FLOAT)  # the dtype only


def scaler_mlp():
    """skl2onnx's StandardScaler + MLPClassifier, as it writes it: Scaler, a Cast to float, MatMul."""
    nodes = [node("Scaler", ["x"], "scaled", domain="ai.onnx.ml", offset=[0.1] * 4, scale=[2.0] * 4),
             node("Cast", ["scaled"], "cast", to=TensorProto.FLOAT),
             node("MatMul", ["cast", "w"], "mm"), node("Add", ["mm", "b"], "add"), node("Relu", ["add"], "y")]
    return model(nodes, {"x": ("N", 4)}, ["y"], {"w": weights(4, 8), "b": weights(8, seed=1)})


def test_the_network_after_a_scaler_gets_shapes_and_fuses():
    before = scaler_mlp()
    after = canonicalize(before)
    assert op_types(after) == ["Scaler", "MatMul", "Add", "Relu"]
    assert declared(after, "add")[0] == ["N", 8]
    assert_same_outputs(before, after)
    graph = load_model(after)
    (group,) = plan_fusion(graph).groups
    assert [graph.nodes[i].op_type for i in group.node_indices] == ["MatMul", "Add", "Relu"]


def test_only_casts_to_the_dtype_they_have_are_dropped():
    nodes = [node("Cast", ["x"], "same", to=TensorProto.FLOAT), node("Relu", ["same"], "r"),
             node("Cast", ["r"], "to_int", to=TensorProto.INT32),
             node("Cast", ["r"], "out", to=TensorProto.FLOAT)]
    m = with_shapes(model(nodes, {"x": ("N", 4)}, ["to_int", "out"]))
    after, modified = apply(DropNoOpCastsPass(), m)
    assert modified
    # The first Cast is gone (Relu reads x); the one to int32 converts; "out" is a graph output.
    assert [(n.op_type, list(n.input)) for n in after.graph.node] == [
        ("Relu", ["x"]), ("Cast", ["r"]), ("Cast", ["r"])]
    assert_same_outputs(m, after)
    assert not apply(DropNoOpCastsPass(), after)[1]
