"""Build tiny ONNX graphs in a few lines, for tests that pin fusion results.

Every node is named after its first output, so a test can state expected groups as sets of
output names: `{"mm", "split", "sig"}`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def node(op: str, inputs: list[str], outputs: list[str] | str, domain: str = "", **attrs) -> onnx.NodeProto:
    outputs = [outputs] if isinstance(outputs, str) else outputs
    return helper.make_node(op, inputs, outputs, name=outputs[0], domain=domain, **attrs)


def model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple],
    outputs: dict[str, tuple] | list[str],
    inits: dict[str, np.ndarray] | None = None,
    dtype: int = TensorProto.FLOAT,
    opset: int = 17,
) -> onnx.ModelProto:
    """A model; `outputs` as a list leaves their types to shape inference."""
    graph_inputs = [helper.make_tensor_value_info(n, dtype, s) for n, s in inputs.items()]
    if isinstance(outputs, dict):
        graph_outputs = [helper.make_tensor_value_info(n, dtype, s) for n, s in outputs.items()]
    else:
        graph_outputs = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs]
    initializers = [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()]
    graph = helper.make_graph(nodes, "test", graph_inputs, graph_outputs, initializers)
    domains = {n.domain for n in nodes if n.domain}
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in sorted(domains)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def const_i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def weights(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def resnet_block(channels: int, size: int, batch_norm: bool = True) -> onnx.ModelProto:
    """Conv 3x3 → [BatchNormalization] → Relu → Conv 3x3 → [BatchNormalization] → + X → Relu on
    [N, channels, size, size]. onnxruntime keeps its convolutions where ours lose (more than 16
    channels) or fill no whole vectors (a width of 12); the bundled conv_block is 16 x 16 x 16."""
    def stats(k):
        return {f"s{k}": 1 + 0.1 * weights(channels, seed=k), f"b{k}": weights(channels, seed=k + 2),
                f"m{k}": 0.1 * weights(channels, seed=k + 4), f"v{k}": 0.5 + np.abs(weights(channels, seed=k + 6))}

    def conv(k, source, out):
        nodes = [node("Conv", [source, f"W{k}"], f"c{k}" if batch_norm else out, pads=[1, 1, 1, 1])]
        if batch_norm:
            nodes.append(node("BatchNormalization", [f"c{k}", f"s{k}", f"b{k}", f"m{k}", f"v{k}"], out))
        return nodes

    scale = np.float32(1.0 / np.sqrt(9 * channels))
    constants = {f"W{k}": weights(channels, channels, 3, 3, seed=k) * scale for k in (1, 2)}
    if batch_norm:
        constants.update({**stats(1), **stats(2)})
    dims = ["N", channels, size, size]
    return model([*conv(1, "X", "n1"), node("Relu", ["n1"], "r1"), *conv(2, "r1", "n2"), node("Add", ["n2", "X"], "res"),
                  node("Relu", ["res"], "Y")], {"X": dims}, {"Y": dims}, constants)
