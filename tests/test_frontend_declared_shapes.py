"""Front end: the loader's Graph knows every inferred shape, the model it writes back only the
value_info the source declared (`onnxfuse/frontend/declared_shapes.py`)."""

from __future__ import annotations

from collections import Counter

import onnx
import onnxruntime as ort
import pytest
from conftest import MODELS
from frontend_helpers import assert_same_outputs
from onnx import TensorProto, helper
from onnx_builder import model, node

from onnxfuse.frontend.canonicalize import canonicalize
from onnxfuse.frontend.declared_shapes import declared_value_names
from onnxfuse.frontend.loader import load_model

PLUMBING = {"Shape", "Gather", "Concat", "Unsqueeze", "Reshape", "Equal", "Where", "Expand", "ConstantOfShape"}
"""The ops the front end folds away from a TorchScript export's run-time shape computations."""


def value_info_names(g: onnx.GraphProto) -> set[str]:
    return {vi.name for vi in g.value_info}


def chain_with_one_declared_value() -> onnx.ModelProto:
    m = model([node("Relu", ["x"], "r"), node("Sigmoid", ["r"], "s"), node("Neg", ["s"], "y")], {"x": ("N", 4)}, ["y"])
    m.graph.value_info.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 4]))
    return m


def test_the_graph_knows_every_shape_and_its_model_declares_only_the_sources():
    source = chain_with_one_declared_value()
    assert value_info_names(canonicalize(source).graph) >= {"r", "s"}  # the passes did infer "s"
    graph = load_model(source)
    assert graph.value("s").shape == ("N", 4)
    assert value_info_names(graph.model.graph) == {"r"}
    assert value_info_names(source.graph) == {"r"}  # the caller's model is left as it was
    assert_same_outputs(source, graph.model, {"N": 3})


def test_the_same_from_a_file(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(chain_with_one_declared_value(), str(path))
    graph = load_model(path)
    assert graph.value("s").shape == ("N", 4)
    assert value_info_names(graph.model.graph) == {"r"}


def branch(name: str, op: str) -> onnx.GraphProto:
    return helper.make_graph([node(op, ["x"], f"{name}_t"), node("Neg", [f"{name}_t"], f"{name}_y")], name, [],
                             [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)])


def test_bodies_lose_the_inferred_value_info_too():
    source = model([node("If", ["cond"], "y", then_branch=branch("then", "Relu"), else_branch=branch("else", "Sigmoid"))],
                   {"x": ("N", 4)}, ["y"])
    source.graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))

    def body_value_info(m: onnx.ModelProto) -> set[str]:
        (if_node,) = m.graph.node
        return {vi.name for a in if_node.attribute for vi in a.g.value_info}

    assert body_value_info(canonicalize(source)) == {"then_t", "else_t"}  # the passes did infer them
    graph = load_model(source)
    assert graph.nodes[0].bodies["then_branch"].value("then_t").shape == ("N", 4)
    assert body_value_info(graph.model) == set()
    assert declared_value_names(source) == set()


def optimized_op_counts(m: onnx.ModelProto, tmp_path) -> Counter:
    """What onnxruntime runs of `m` after all its graph optimizations, by op, plumbing left out."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    nodes = onnx.load(options.optimized_model_filepath).graph.node
    return Counter(f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in nodes if n.op_type not in PLUMBING)


@pytest.mark.parametrize("name", ["bert_tiny_2l_ts", "bert_tiny_2l_dynamo"])
def test_onnxruntime_fuses_the_written_bert_as_it_fuses_the_original(name, tmp_path):
    """The TorchScript export declares no intermediate shape: given ours, onnxruntime fused
    Add + Add + LayerNormalization into SkipLayerNormalization, which ran the model at 0.70x.
    The dynamo export declares them all: it gets SkipLayerNormalization either way."""
    path = MODELS / "exported" / f"{name}.onnx"
    original = optimized_op_counts(onnx.load(str(path)), tmp_path)
    assert ("com.microsoft:SkipLayerNormalization" in original) == name.endswith("dynamo")
    assert optimized_op_counts(load_model(path).model, tmp_path) == original
