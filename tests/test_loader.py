"""The loader: opsets, unknown shapes, and malformed graphs."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper
from onnx_builder import model, node

from onnxfuse.errors import ModelLoadError
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.plan import plan_fusion

DIAMOND = [node("Relu", ["x"], "r"), node("Sigmoid", ["r"], "s"), node("Tanh", ["r"], "t"), node("Add", ["s", "t"], "y")]


@pytest.mark.parametrize("opset", [13, 15, 17, 18, 19, 21, 23])
def test_opsets_13_to_23_load_and_fuse(opset):
    graph = load_model(model(DIAMOND, {"x": ("N", 8)}, ["y"], opset=opset))
    assert graph.opsets[""] == opset
    assert graph.value("y").shape == ("N", 8)
    assert [len(g.node_indices) for g in plan_fusion(graph).groups] == [4]


def test_unknown_shapes_still_load():
    m = model([node("Mystery", ["x"], "m", domain="vendor"), node("Relu", ["m"], "y")], {"x": (2, 3)}, ["y"])
    graph = load_model(m)
    assert graph.value("m").shape is None and graph.value("m").dtype is None
    plan = plan_fusion(graph)
    assert plan.groups == [] and len(plan.unfused) == 2


def test_symbolic_dims_propagate():
    graph = load_model(model([node("Relu", ["x"], "y")], {"x": ("batch", 4)}, ["y"]))
    assert graph.value("y").shape == ("batch", 4)


def _raw(nodes, inputs=("x",), outputs=("y",)):
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
    g = helper.make_graph(nodes, "g", [vi(i) for i in inputs], [vi(o) for o in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_undefined_input_is_a_load_error():
    with pytest.raises(ModelLoadError, match="nothing defines"):
        load_model(_raw([helper.make_node("Relu", ["ghost"], ["y"])]))


def test_value_defined_twice_is_a_load_error():
    with pytest.raises(ModelLoadError, match="defined twice"):
        load_model(_raw([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]))


def test_cycle_is_a_load_error():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Neg", ["a"], ["y"])]
    with pytest.raises(ModelLoadError, match="cycle"):
        load_model(_raw(nodes))


def test_missing_external_data_is_a_load_error(tmp_path):
    m = onnx.load("models/lstm_gate.onnx")
    path = tmp_path / "gate.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="gate.bin", size_threshold=1024)
    (tmp_path / "gate.bin").unlink()
    with pytest.raises(ModelLoadError, match="external data"):
        load_model(path)


def _saved_with_external_data(m: onnx.ModelProto, path) -> None:
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=0)


def test_small_external_data_is_read_before_the_front_end_passes(tmp_path):
    """A BatchNormalization after a Conv folds into it whether the weights are inline or beside
    the model (PyTorch's dynamo exporter writes them beside it by default)."""
    m = onnx.load("models/conv_block.onnx")
    assert "BatchNormalization" in [n.op_type for n in m.graph.node]
    inline = [n.op_type for n in load_model(m).nodes]
    _saved_with_external_data(m, tmp_path / "conv.onnx")  # (moves m's tensors out)
    beside = [n.op_type for n in load_model(tmp_path / "conv.onnx").nodes]
    assert beside == inline and "BatchNormalization" not in beside


def test_large_external_data_is_read_after_the_passes(tmp_path, monkeypatch):
    from onnxfuse.frontend import loader

    monkeypatch.setattr(loader, "INLINE_EXTERNAL_DATA_BYTES", 0)
    m = onnx.load("models/conv_block.onnx")
    _saved_with_external_data(m, tmp_path / "conv.onnx")
    graph = load_model(tmp_path / "conv.onnx")
    assert "BatchNormalization" in [n.op_type for n in graph.nodes]  # unfolded, as before
    assert all(t.data_location != TensorProto.EXTERNAL for t in graph.model.graph.initializer)
