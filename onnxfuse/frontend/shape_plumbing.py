"""Pass: exporters' run-time shape arithmetic becomes constants where that is exactly equivalent.

Rules (numbers referred to in the code):
1. An integer (or boolean) tensor whose every element is known (`Shape` of a tensor of static shape, a
   `Gather` of a static dim...) becomes an initializer.
2. `Reshape(x, s)` (allowzero=0) where each element of `s` is a number or the size of an axis
   of a known tensor: an element that is surely the size of `x`'s axis at the same position
   becomes 0 ("copy that dim"); if exactly one other element is not a number and `s` has no -1,
   it becomes -1 (the size the others leave: equivalent for every non-empty input, the only
   inputs the original could reshape to a size it computed itself, except zero-size ones).
   The shape is then a constant. With allowzero=1 (the dynamo exporter writes it) the same,
   made allowzero=0, when no number in `s` is 0: then the two differ only on a zero-size axis.
3. `Expand(x, s)` where each element of `s` is a number or surely the size of `x`'s aligned
   axis: those elements become 1 (broadcasting a dim against 1 gives the dim). An Expand whose
   target is all 1s and not longer than `x`'s rank is `x` (TVM's importer cannot take a constant
   target with a symbolic `x`).
4. `Slice` on an axis with step 1 from 0 to an end at or past the axis's end (a known size, or
   INT64_MAX) does nothing on that axis: the axis is dropped; a Slice left with no axis is its
   input. Ends past a known size are clamped to it.

Shapes come from onnx shape inference, run before this pass (`canonicalize.py`).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .shape_values import DimOf, ShapeValue, shape_values
from .tensors import add_initializer, constant_ints, replace_with_initializer, used_names

INT64_MAX = 2**63 - 1


class ResolveShapePlumbingPass(ir.passes.InPlacePass):
    """Guarantee: every rewrite leaves each graph output's value unchanged for every input the
    original model accepts (rule 2's -1: every input without a zero-size axis)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        known = shape_values(graph)
        taken = used_names(graph)
        modified = False
        for node in list(graph):
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "Reshape":
                modified |= _constant_reshape(graph, node, known, taken)
            elif node.op_type == "Expand":
                modified |= _constant_expand(graph, node, known, taken)
                modified |= _drop_noop_expand(graph, node)
            elif node.op_type == "Slice":
                modified |= _simplify_slice(graph, node, taken)
        for value, content in known.items():  # rule 1
            producer = value.producer()
            if (content.is_constant and producer is not None and producer.op_type != "Constant"
                    and not value.is_graph_output() and value.dtype in (ir.DataType.INT64, ir.DataType.INT32, ir.DataType.BOOL)
                    and value.uses()):
                array = np.array(content.elements, dtype=value.dtype.numpy())
                replace_with_initializer(graph, value, array.reshape(()) if content.scalar else array, taken)
                modified = True
        return ir.passes.PassResult(model, modified=modified)


def _constant_reshape(graph: ir.Graph, node: ir.Node, known: dict, taken: set[str]) -> bool:
    """Rule 2."""
    data, shape = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    content: ShapeValue | None = known.get(shape)
    if data is None or content is None or content.scalar or content.is_constant or data.shape is None:
        return False
    allowzero = node.attributes.get("allowzero") is not None and bool(node.attributes["allowzero"].value)
    if allowzero and 0 in content.elements:
        return False  # a literal 0 is a zero-size axis there and a copy here
    rank = len(data.shape)
    resolved: list[int | None] = []
    for position, element in enumerate(content.elements):
        if isinstance(element, int):
            resolved.append(element)
        elif position < rank and element.is_dim(data, position):
            resolved.append(0)
        else:
            resolved.append(None)
    unresolved = [i for i, e in enumerate(resolved) if e is None]
    if len(unresolved) > 1 or (unresolved and -1 in resolved):
        return False
    for i in unresolved:
        resolved[i] = -1
    new_shape = add_initializer(graph, f"{shape.name}__const", np.array(resolved, dtype=np.int64), taken)
    node.replace_input_with(1, new_shape)
    if allowzero:
        node.attributes["allowzero"] = ir.AttrInt64("allowzero", 0)
    return True


def _constant_expand(graph: ir.Graph, node: ir.Node, known: dict, taken: set[str]) -> bool:
    """Rule 3."""
    data, shape = node.inputs[0], node.inputs[1]
    content: ShapeValue | None = known.get(shape)
    if data is None or content is None or content.scalar or content.is_constant or data.shape is None:
        return False
    offset = len(content.elements) - len(data.shape)  # the shapes align on their last axes
    resolved = []
    for position, element in enumerate(content.elements):
        if isinstance(element, int):
            resolved.append(element)
        elif isinstance(element, DimOf) and position - offset >= 0 and element.is_dim(data, position - offset):
            resolved.append(1)
        else:
            return False
    new_shape = add_initializer(graph, f"{shape.name}__const", np.array(resolved, dtype=np.int64), taken)
    node.replace_input_with(1, new_shape)
    return True


def _drop_noop_expand(graph: ir.Graph, node: ir.Node) -> bool:
    """Rule 3's second half."""
    data, output = node.inputs[0], node.outputs[0]
    target = constant_ints(node.inputs[1]) if len(node.inputs) > 1 else None
    if data is None or data.shape is None or target is None or output.is_graph_output():
        return False
    if len(target) > len(data.shape) or any(e != 1 for e in target) or output.dtype != data.dtype:
        return False
    output.replace_all_uses_with(data)
    graph.remove(node, safe=True)
    return True


def _simplify_slice(graph: ir.Graph, node: ir.Node, taken: set[str]) -> bool:
    """Rule 4."""
    data = node.inputs[0]
    if data is None or data.shape is None or len(node.inputs) < 3:
        return False
    rank = len(data.shape)
    lists = [constant_ints(v) if v is not None else None for v in node.inputs[1:5]]
    starts, ends = lists[0], lists[1]
    if starts is None or ends is None or len(starts) != len(ends):
        return False
    axes = lists[2] if len(lists) > 2 and node.inputs[3] is not None else list(range(len(starts)))
    steps = lists[3] if len(lists) > 3 and node.inputs[4] is not None else [1] * len(starts)
    if axes is None or steps is None or len(axes) != len(starts) or len(steps) != len(starts):
        return False
    kept, changed = [], False
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = axis % rank if -rank <= axis < rank else None
        if axis is None:
            return False
        size = data.shape[axis] if isinstance(data.shape[axis], int) else None
        if step == 1 and start == 0 and (end >= INT64_MAX or (size is not None and end >= size)):
            changed = True
            continue
        if step > 0 and size is not None and end > size:
            end, changed = size, True
        kept.append((start, end, axis, step))
    if not changed:
        return False
    output = node.outputs[0]
    if not kept:
        if output.is_graph_output():
            return False
        output.replace_all_uses_with(data)
        graph.remove(node, safe=True)
        return True
    columns = [np.array(c, dtype=np.int64) for c in zip(*kept)]
    new_inputs = [data] + [add_initializer(graph, f"{node.name or output.name}__{what}", column, taken)
                           for what, column in zip(("starts", "ends", "axes", "steps"), columns)]
    node.resize_inputs(5)
    for i, value in enumerate(new_inputs):
        node.replace_input_with(i, value)
    return True
