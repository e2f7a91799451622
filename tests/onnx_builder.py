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
