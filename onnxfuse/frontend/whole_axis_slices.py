"""Pass: a Slice forgets the axes it takes whole (from 0 to the end, step 1).

tf2onnx writes a Keras `x[:, 32:64]` as a Slice over both axes, the first from 0 to INT_MAX. To
onnx's shape inference a symbolic dim sliced so is a new unknown dim (`unk__0`), so the Adds
after it no longer saw their operands' batch dims as one, and a GRU cell's gates in a Loop body
read tensors whose batch dims had different names. Without those axes the Slice computes the same
tensor and keeps the dim; a Slice left with no axis at all is an Identity.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .last_element_gathers import TO_THE_END
from .tensors import add_initializer, constant_ints, take_over, used_names_everywhere


class WholeAxisSlicesPass(ir.passes.InPlacePass):
    """Guarantee: no Slice (main graph or body) with constant starts, ends, axes and steps takes
    an axis whole (start 0, end at least INT_MAX, step 1) among others it cuts; a Slice taking
    every axis it names whole is an Identity."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        taken = used_names_everywhere(model.graph)
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.op_type == "Slice" and node.domain in ("", "ai.onnx") and node.graph is not None:
                modified |= _rewrite(node, taken)
        return ir.passes.PassResult(model, modified=modified)


def _rewrite(node: ir.Node, taken: set[str]) -> bool:
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = constant_ints(inputs[1]), constant_ints(inputs[2])
    axes = constant_ints(inputs[3]) if inputs[3] is not None else list(range(len(starts or [])))
    steps = constant_ints(inputs[4]) if inputs[4] is not None else [1] * len(starts or [])
    if None in (starts, ends, axes, steps) or not len(starts) == len(ends) == len(axes) == len(steps):
        return False
    cut = [i for i in range(len(axes)) if not (starts[i] == 0 and ends[i] >= TO_THE_END and steps[i] == 1)]
    if len(cut) == len(axes):
        return False
    graph = node.graph
    if not cut:
        take_over(graph, ir.Node("", "Identity", [node.inputs[0]], name=node.name, num_outputs=1), node.outputs[0], [node])
        return True
    base = node.outputs[0].name or node.name or "slice"
    kept = [add_initializer(graph, f"{base}__{part}", np.array([values[i] for i in cut], np.int64), taken)
            for part, values in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
    take_over(graph, ir.Node("", "Slice", [node.inputs[0], *kept], name=node.name, num_outputs=1), node.outputs[0], [node])
    return True

