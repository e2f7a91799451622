"""Pass: the last element of an axis taken by `Slice` and then `Squeeze`d is one `Gather` of index -1.

tf2onnx writes a Keras RNN's last step (`return_sequences=False`) as `Slice(starts=-1,
ends=INT_MAX)` on the time axis, then `Squeeze` of that axis. Over a symbolic time axis the
slice's extent is `min(T, 1)` to shape inference and to TVM, which refused to squeeze an axis it
could not prove to be 1, and the Dense layer after it stayed with onnxruntime. `Gather(x, -1,
axis)` computes the same tensor with that axis dropped, and a static shape. Where T is 0, both
fail at run time (a Squeeze of an empty axis, an index out of range), so nothing that ran before
fails now, nor the other way.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .tensors import add_initializer, constant_ints, take_over, used_names_everywhere

TO_THE_END = 2**31 - 1  # an `ends` this large (INT_MAX, INT64_MAX) means "through the last element"


def _sliced_axis(node: ir.Node) -> int | None:
    """The axis a Slice takes only the last element of, else None."""
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = constant_ints(inputs[1]), constant_ints(inputs[2])
    axes = constant_ints(inputs[3]) if inputs[3] is not None else [0]
    steps = constant_ints(inputs[4]) if inputs[4] is not None else [1]
    if starts != [-1] or ends is None or len(ends) != 1 or ends[0] < TO_THE_END or axes is None or steps != [1]:
        return None
    return axes[0] if len(axes) == 1 else None


def _squeezed_axes(node: ir.Node) -> list[int] | None:
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return constant_ints(node.inputs[1])
    attribute = node.attributes.get("axes")
    return list(attribute.value) if attribute is not None else None


def _normalized(axis: int, rank: int | None) -> int | None:
    if axis >= 0:
        return axis
    return axis + rank if rank is not None else None


class LastElementGathersPass(ir.passes.InPlacePass):
    """Guarantee: no `Slice` of the last element of one axis (step 1) whose only reader is a
    `Squeeze` of exactly that axis is left, in the main graph or a body, where the data's rank is
    known; each such pair is one `Gather` writing the Squeeze's output."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        taken = used_names_everywhere(model.graph)
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or node.graph is None:
                continue
            modified |= _rewrite(node, taken)
        return ir.passes.PassResult(model, modified=modified)


def _rewrite(slice_node: ir.Node, taken: set[str]) -> bool:
    sliced = slice_node.outputs[0]
    readers = list(sliced.uses())
    if len(readers) != 1 or sliced.is_graph_output():
        return False
    squeeze = readers[0].node
    if squeeze.graph is not slice_node.graph:  # read inside a body
        return False
    data = slice_node.inputs[0]
    rank = len(data.shape) if data is not None and data.shape is not None else None
    axis, squeezed = _sliced_axis(slice_node), _squeezed_axes(squeeze) if squeeze.op_type == "Squeeze" else None
    if (squeeze.domain not in ("", "ai.onnx") or axis is None or squeezed is None or len(squeezed) != 1
            or rank is None or _normalized(axis, rank) != _normalized(squeezed[0], rank)):
        return False
    graph = slice_node.graph
    index = add_initializer(graph, f"{sliced.name}__last", np.array(-1, np.int64), taken)
    gather = ir.Node("", "Gather", [data, index], attributes=[ir.AttrInt64("axis", _normalized(axis, rank))],
                     name=squeeze.name or slice_node.name, num_outputs=1)
    take_over(graph, gather, squeeze.outputs[0], [slice_node, squeeze])
    return True
