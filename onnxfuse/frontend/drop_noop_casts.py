"""Pass: a `Cast` to the dtype its input already has is removed.

Converters cast defensively: skl2onnx writes `Cast(to=FLOAT)` after a `Scaler`, whose output is
float already. onnxruntime copies the tensor; to fusion it was one more node that stood between
the scaler and the network's first MatMul and stayed with onnxruntime. Such a Cast returns its
input unchanged for every input (whatever `saturate` says: nothing is converted), so its uses
read the input instead. Needs dtypes: runs after shape inference.
"""

from __future__ import annotations

import onnx_ir as ir


class DropNoOpCastsPass(ir.passes.InPlacePass):
    """Guarantee: no `Cast` of the main graph or its subgraphs whose input's dtype is known and
    equal to its `to` is left, except one whose output is a graph output (its name must stay)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
                continue
            source, output, to = node.inputs[0], node.outputs[0], node.attributes.get("to")
            if to is None or source.dtype is None or source.dtype != ir.DataType(to.value):
                continue
            if output.is_graph_output():
                continue
            output.replace_all_uses_with(source)
            node.graph.remove(node, safe=True)
            modified = True
        return ir.passes.PassResult(model, modified=modified)
