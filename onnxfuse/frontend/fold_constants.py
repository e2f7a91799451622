"""Pass: nodes that read only constants become initializers holding their result.

Exporters build small tensors from constants in the graph: a Pad's pads as
`ConstantOfShape → Concat → Reshape → Slice → Transpose → Reshape → Cast`, a weight transposed
on the way in. Left as nodes they are "computed at run time" and break fusion chains there.
Each node is evaluated by onnxruntime, alone, on its constant inputs: the result is the one the
original model computes, since onnxruntime runs it. Sizes are bounded before anything runs
(shape inference must have given the outputs static shapes), so a ConstantOfShape of a huge
shape is never materialised. Nodes inside If/Loop/Scan bodies are folded the same way (the
TorchScript exporter re-packs an LSTM's gate weights with Slice/Concat inside the branch that
runs it); their results become initializers of the body they are in.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import helper

from .tensors import constant_array, replace_with_initializer, used_names_everywhere

MAX_FOLDED_ELEMENTS = 1 << 20
"""No folded tensor, nor any tensor folding reads, has more elements than this."""

_NOT_FOLDED = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
    "Constant",  # the ones left are graph outputs, which stay nodes
})


class FoldConstantsPass(ir.passes.InPlacePass):
    """Guarantee: a node of the standard domain (in the main graph or a body) whose inputs are
    all constants (not overridable graph inputs) and whose outputs have static shapes of at most
    `max_elements` each is replaced by initializers of the same names and values, in its own
    graph; random ops, nodes with subgraphs and nodes producing graph outputs are left alone."""

    def __init__(self, max_elements: int = MAX_FOLDED_ELEMENTS):
        super().__init__()
        self.max_elements = max_elements

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opset = model.opset_imports.get("", None)
        taken = used_names_everywhere(model.graph)
        folded = 0
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            inputs = self._constant_inputs(node)
            if inputs is None or opset is None:
                continue
            results = _evaluate(node, inputs, opset)
            if results is None or any(r.size > self.max_elements for r in results):
                continue
            graph = node.graph
            for output, result in zip(node.outputs, results):
                replace_with_initializer(graph, output, result, taken)
            graph.remove(node, safe=True)
            folded += 1
        return ir.passes.PassResult(model, modified=folded > 0)

    def _constant_inputs(self, node: ir.Node) -> list[np.ndarray | None] | None:
        """The node's input arrays (None for an omitted one) if it may be folded, else None."""
        if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_FOLDED:
            return None
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            return None
        if not any(v is not None for v in node.inputs):
            return None
        for out in node.outputs:
            if out.is_graph_output() or out.shape is None or not out.shape.is_static() or out.dtype is None:
                return None
            if int(np.prod(out.shape.numpy(), dtype=np.int64)) > self.max_elements:
                return None
        arrays = []
        for value in node.inputs:
            if value is None:
                arrays.append(None)
                continue
            array = constant_array(value)
            if array is None or array.size > self.max_elements:
                return None
            arrays.append(array)
        return arrays


def _evaluate(node: ir.Node, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """Run the node alone in onnxruntime; None if onnxruntime cannot."""
    import onnxruntime as ort

    proto = ir.serde.serialize_node(node)
    feeds, graph_inputs = {}, []
    for name, array in zip(proto.input, inputs):
        if array is None or name in feeds:
            continue
        feeds[name] = array
        graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape))
    outputs = [helper.make_tensor_value_info(o.name, int(o.dtype), None) for o in node.outputs]
    graph = helper.make_graph([proto], "fold", graph_inputs, outputs)
    # IR version 10: what onnxruntime 1.20+ reads
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return [np.asarray(r) for r in session.run(None, feeds)]
    except Exception:  # an op or dtype onnxruntime does not run here: leave the node
        return None

