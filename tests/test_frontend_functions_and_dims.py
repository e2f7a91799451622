"""Front end: local functions are inlined; unknown graph-input dims become named symbols."""

from __future__ import annotations

import numpy as np
import onnx
from frontend_helpers import apply, assert_same_outputs, op_types, random_feeds, run
from onnx import helper
from onnx_builder import model, node

from onnxfuse.frontend.canonicalize import canonicalize
from onnxfuse.frontend.loader import load_model
from onnxfuse.frontend.name_input_dims import NameUnknownInputDimsPass
from onnxfuse.fusion.plan import plan_fusion


def gelu_function_model():
    """What the dynamo exporter writes: the computation inside a model-local function."""
    body = [
        helper.make_node("Mul", ["x", "half"], ["h"]),
        helper.make_node("Tanh", ["x"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["t1"]),
        helper.make_node("Mul", ["h", "t1"], ["out"]),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Constant", [], ["one"], value_float=1.0),
    ]
    body = body[4:] + body[:4]
    fn = helper.make_function("pkg.local", "Gelu", ["x"], ["out"], body, [helper.make_opsetid("", 17)])
    m = model([node("Gelu", ["x"], "g", domain="pkg.local"), node("Relu", ["g"], "y")], {"x": ("N", 8)}, ["y"])
    m.functions.append(fn)
    return m


def test_local_functions_are_inlined_and_fuse():
    m = gelu_function_model()
    after = canonicalize(m)
    assert not after.functions
    assert op_types(after) == ["Mul", "Tanh", "Add", "Mul", "Relu"]
    assert {o.domain for o in after.opset_import} == {""}  # the function's domain is no longer used
    assert_same_outputs(m, after)
    (group,) = plan_fusion(load_model(m)).groups
    assert len(group.node_indices) == 5


def input_dims(m, name="x"):
    vi = next(v for v in m.graph.input if v.name == name)
    return [d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
            for d in vi.type.tensor_type.shape.dim]


def test_unknown_input_dims_get_symbols_of_their_own():
    m = model([node("Relu", ["x"], "y")], {"x": (-1, 4, 0, 5)}, ["y"])
    m.graph.input[0].type.tensor_type.shape.dim.add()  # a dim with neither value nor name
    m.graph.input[0].type.tensor_type.shape.dim[3].dim_param = ""
    after, modified = apply(NameUnknownInputDimsPass(), m)
    assert modified
    # -1 and missing → symbols; 0 off the first axis is kept (it can be real).
    assert input_dims(after) == ["unk_0", 4, 0, "unk_1", "unk_2"]


def test_zero_on_the_first_axis_is_unknown_and_names_do_not_clash():
    m = model([node("Add", ["x", "z"], "y")], {"x": (0, 4), "z": ("unk_0", 4)}, ["y"])
    after, _ = apply(NameUnknownInputDimsPass(), m)
    assert input_dims(after) == ["unk_1", 4]


def test_declared_dims_are_left_alone():
    m = model([node("Relu", ["x"], "y")], {"x": ("batch", 4)}, ["y"])
    _, modified = apply(NameUnknownInputDimsPass(), m)
    assert not modified


def test_a_minus_one_input_dim_gives_symbolic_shapes_downstream():
    m = model([node("Relu", ["x"], "r"), node("ReduceSum", ["r", "axes"], "y", keepdims=1)], {"x": (-1, 8)}, ["y"],
              {"axes": np.array([1], dtype=np.int64)})
    graph = load_model(m)
    assert graph.value("x").shape == ("unk_0", 8) and graph.value("y").shape == ("unk_0", 1)
    feeds = random_feeds(m, {"unk_0": 5})
    np.testing.assert_allclose(run(canonicalize(m), feeds)[0], run(m, feeds)[0], rtol=1e-6)


def test_canonical_function_model_checks():
    onnx.checker.check_model(canonicalize(gelu_function_model()), full_check=True)


