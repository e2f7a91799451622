"""Inputs for bench and verify (measure/inputs.py): integer ranges read from the graph, the
user's .npz checked and resized, and --ort models fed by position when their names differ."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.errors import UsageError
from onnxfuse.measure.contenders import feeds_by_name_or_position, output_names
from onnxfuse.measure.inputs import (
    InputSpec,
    check_dim_names,
    dim_values,
    index_limits,
    load_inputs,
    random_inputs,
    resize_inputs,
)


def embedding_model(rows: int = 50, through: tuple[str, ...] = ()) -> onnx.ModelProto:
    """ids [N, S] int64 → (value-preserving ops) → Gather(table [rows, 4], ids) → [N, S, 4]."""
    nodes, name = [], "ids"
    for k, op in enumerate(through):
        attrs = {"to": TensorProto.INT32} if op == "Cast" else {}
        inputs = [name, "axes"] if op == "Unsqueeze" else [name]
        nodes.append(helper.make_node(op, inputs, [f"t{k}"], **attrs))
        name = f"t{k}"
    nodes.append(helper.make_node("Gather", ["table", name], ["y"], axis=0))
    inits = [numpy_helper.from_array(np.ones((rows, 4), np.float32), "table"),
             numpy_helper.from_array(np.array([0], np.int64), "axes")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "S"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("through", [(), ("Cast",), ("Unsqueeze", "Cast")])
def test_gather_indices_span_the_gathered_axis(through):
    model = embedding_model(50, through)
    limits = index_limits(model)
    assert limits == {"ids": 50}
    ids = random_inputs([InputSpec("ids", "int64", ("N", "S"))], 64, dims={"S": 16}, limits=limits)["ids"]
    assert ids.shape == (64, 16) and ids.min() >= 0 and ids.max() < 50
    assert len(np.unique(ids)) > 40  # the vocabulary, not {0, 1}


def test_gather_elements_axis_and_the_smallest_of_several_uses():
    x = helper.make_tensor_value_info("i", TensorProto.INT64, ["N", 3])
    nodes = [helper.make_node("GatherElements", ["data", "i"], ["a"], axis=1),
             helper.make_node("Gather", ["small", "i"], ["b"], axis=0)]
    inits = [numpy_helper.from_array(np.zeros((4, 9), np.float32), "data"),
             numpy_helper.from_array(np.zeros((20,), np.float32), "small")]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
                                                helper.make_tensor_value_info("b", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    assert index_limits(model) == {"i": 9}


def test_other_integers_stay_flags():
    """An integer input that indexes nothing (a mask) keeps 0 and 1."""
    mask = random_inputs([InputSpec("mask", "int64", ("N", 8))], 32)["mask"]
    assert set(np.unique(mask)) == {0, 1}


def test_dims_name_some_dimensions_and_the_batch_takes_the_rest():
    specs = [InputSpec("x", "float32", ("N", "S", 4)), InputSpec("m", "int64", ("N", None))]
    feeds = random_inputs(specs, 3, dims={"S": 7})
    assert feeds["x"].shape == (3, 7, 4) and feeds["m"].shape == (3, 3)
    assert dim_values(specs, feeds) == {"N": 3, "S": 7, "m[1]": 3}
    check_dim_names(specs, {"S": 2})
    with pytest.raises(UsageError, match="no dimension of that name .*named: N, S"):
        check_dim_names(specs, {"seq": 2})


def test_recorded_inputs_are_repeated_along_the_axes_that_change():
    specs = [InputSpec("ids", "int64", ("batch", "seq")), InputSpec("state", "float32", (2, "batch", 3))]
    ids = np.arange(6).reshape(2, 3)
    state = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    out = resize_inputs({"ids": ids, "state": state}, specs, dims={"batch": 5})
    assert out["ids"].shape == (5, 3) and out["state"].shape == (2, 5, 3)
    np.testing.assert_array_equal(out["ids"][:, 0], [0, 3, 0, 3, 0])  # rows cycle, seq untouched
    np.testing.assert_array_equal(out["state"][1, 4], state[1, 0])
    cut = resize_inputs({"ids": ids, "state": state}, specs, batch=1)  # every free axis, cut
    assert cut["ids"].shape == (1, 1) and cut["state"].shape == (2, 1, 3)


def test_load_inputs_names_what_does_not_match(tmp_path):
    specs = [InputSpec("x", "float32", ("N", 4))]
    good, wrong_name, wrong_shape = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"
    np.savez(good, x=np.zeros((2, 4), np.float32))
    np.savez(wrong_name, input_0=np.zeros((2, 4), np.float32))
    np.savez(wrong_shape, x=np.zeros((2, 5), np.float32))
    assert load_inputs(good, specs)["x"].shape == (2, 4)
    with pytest.raises(UsageError, match=r"\['input_0'\] do not match the model's inputs \['x'\]"):
        load_inputs(wrong_name, specs)
    with pytest.raises(UsageError, match=r"x is float32\[2, 5\], the model declares float32\['N', 4\]"):
        load_inputs(wrong_shape, specs)


def test_other_models_take_inputs_and_outputs_by_position_when_names_differ():
    feeds = {"X": np.zeros(1), "Y": np.ones(1)}
    assert list(feeds_by_name_or_position(["Y", "X"], feeds)) == ["Y", "X"]  # by name, in its order
    by_position = feeds_by_name_or_position(["input_0", "input_1"], feeds)
    assert by_position["input_1"] is feeds["Y"]
    with pytest.raises(ValueError, match="neither by name nor by count"):
        feeds_by_name_or_position(["only"], feeds)
    assert output_names(["variable", "probs"], ["label", "probabilities"]) == ["label", "probabilities"]
    assert output_names(["label", "extra"], ["label", "probabilities"]) == ["label", "extra"]
