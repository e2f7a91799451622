"""The front end folds a BatchNormalization after a Conv into the Conv as onnxruntime folds it:
the same float32 weights and bias, bit for bit, and only where onnxruntime folds."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnx_builder import model, node, weights

from onnxfuse.frontend.loader import load_model


def conv_batch_norm(conv_bias: bool = False, extra_reader: bool = False, conv_output: bool = False) -> onnx.ModelProto:
    """Conv (8 -> 8 channels, 3x3) -> BatchNormalization -> Relu, with statistics whose float32
    arithmetic rounds (variances from 0.3, scales around 1)."""
    inputs = ["X", "W", "Bc"] if conv_bias else ["X", "W"]
    nodes = [node("Conv", inputs, "c", pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c", "s", "b", "m", "v"], "n", epsilon=1e-3), node("Relu", ["n"], "Y")]
    outputs = {"Y": ["N", 8, 6, 6]}
    if extra_reader:
        nodes.append(node("Sigmoid", ["c"], "Z"))
        outputs["Z"] = ["N", 8, 6, 6]
    if conv_output:
        outputs["c"] = ["N", 8, 6, 6]
    constants = {"W": weights(8, 8, 3, 3, seed=1) * 0.3, "s": 1 + 0.3 * weights(8, seed=2), "b": weights(8, seed=3),
                 "m": 0.5 * weights(8, seed=4), "v": 0.3 + np.abs(weights(8, seed=5))}
    if conv_bias:
        constants["Bc"] = weights(8, seed=6)
    return model(nodes, {"X": ["N", 8, 6, 6]}, outputs, constants)


def _onnxruntimes_folded(source: onnx.ModelProto, tmp_path) -> dict[str, np.ndarray]:
    """The Conv initializers onnxruntime's basic optimizations write for `source`."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(source.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    (conv,) = [n for n in optimized.graph.node if n.op_type == "Conv"]
    arrays = {t.name: numpy_helper.to_array(t) for t in optimized.graph.initializer}
    return {"W": arrays[conv.input[1]], "B": arrays[conv.input[2]]}


def _our_folded(source: onnx.ModelProto) -> dict[str, np.ndarray]:
    graph = load_model(source)
    (conv,) = [n for n in graph.nodes if n.op_type == "Conv"]
    return {"W": graph.constant(conv.inputs[1]), "B": graph.constant(conv.inputs[2])}


def test_the_folded_weights_and_bias_are_onnxruntimes_bit_for_bit(tmp_path):
    for conv_bias in (False, True):
        source = conv_batch_norm(conv_bias)
        ours, theirs = _our_folded(source), _onnxruntimes_folded(source, tmp_path)
        for key in ("W", "B"):
            assert ours[key].dtype == np.float32 and ours[key].tobytes() == theirs[key].tobytes(), (conv_bias, key)
        assert not np.array_equal(ours["W"], numpy_helper.to_array(source.graph.initializer[0]))  # it did fold


def test_the_folded_graph_is_one_conv_writing_the_batch_norms_output():
    graph = load_model(conv_batch_norm())
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu"]
    assert graph.nodes[1].inputs == [graph.nodes[0].outputs[0]] and graph.nodes[0].outputs == ["n"]


def test_the_canonical_model_computes_the_originals_bits_under_onnxruntime():
    """onnxruntime folds the original the same way, so both run the same Conv."""
    source = conv_batch_norm(conv_bias=True)
    x = np.random.default_rng(0).standard_normal((3, 8, 6, 6)).astype(np.float32)
    results = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
               for m in (source, load_model(source).model)]
    assert results[0].tobytes() == results[1].tobytes()


def test_no_fold_where_onnxruntime_does_not_fold():
    """The Conv's result read by another node too, or itself a graph output: onnxruntime keeps
    both ops (its rule), so the front end does."""
    for source in (conv_batch_norm(extra_reader=True), conv_batch_norm(conv_output=True)):
        assert [n.op_type for n in load_model(source).nodes][:2] == ["Conv", "BatchNormalization"]


def test_no_fold_of_statistics_given_at_run_time():
    source = conv_batch_norm()
    mean = next(t for t in source.graph.initializer if t.name == "m")
    source.graph.input.append(onnx.helper.make_tensor_value_info("m", onnx.TensorProto.FLOAT, [8]))
    source.graph.initializer.remove(mean)
    assert [n.op_type for n in load_model(source).nodes] == ["Conv", "BatchNormalization", "Relu"]
