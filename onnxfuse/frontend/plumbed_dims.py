"""Pass: the dims of values sized by run-time shape plumbing, where onnx's inference leaves them
unnamed and the size is exactly known.

The TorchScript exporter writes BERT's position ids as
`Slice(buffer[1, 128], starts=0, ends=Unsqueeze(Gather(Shape(input_ids), 1)), axes=1)`: the
first `seq` positions. onnx's inference names every dim of that output afresh (`unk__0, unk__1`,
even the leading 1) and so every value computed from it: the embeddings' Adds broadcast
`[batch, seq, 64]` against `[unk__0, unk__1, 64]`, their output gets new names again, and code
generation cannot bind those to anything (the group falls back). The rules, each exact:

1. `Slice` with constant axes: an axis it does not slice keeps the input's dim.
2. `Slice` of an axis of static size S ≥ 2 with start 0, step 1 and end `d` = the run-time size
   of an axis of another tensor (`DimOf` in `shape_values.py`, with a dim_param): the output's
   size there is min(d, S). That is named `d` only when the sliced axis, carried exactly through
   the ops after it (Gather/GatherElements indices, Unsqueeze, elementwise ops, Expand and
   broadcasts against 1), meets a dim surely equal to `d` (the same dim_param) in a broadcast
   (`Add`, `Mul`, `Where`, ... or an `Expand` target) whose output is used. Why that is exact:
   for d ≤ S, min(d, S) = d. For d > S, the broadcast meets S against d, both ≥ 2 and unequal,
   and the original model fails there (onnxruntime refuses to broadcast them). So for every
   input the original model accepts, the size is d. Without such a broadcast (or with S = 1,
   where min(d, 1) = 1 broadcasts against anything) the dim is left unnamed.
3. `Range(0, d, 1)` with `d` a run-time size: its length is max(d, 0) = d.
4. `Expand(x, s)` with `s`'s elements known (`shape_values.py`): each output dim is the
   broadcast of x's dim and s's element where that is one definite size (1 against anything
   gives the other; a number n ≥ 2 gives n for every input the op accepts; a dim against the same
   dim gives it).
5. `GatherElements`: the output has the indices' shape (the ONNX spec).

A dim is written only where the value's dim is unknown or one onnx's inference named itself
(`unk__N`); a dim the exporter declared is never changed.

What the fused model does for an input the original refuses (seq > S): the Slice stays with
onnxruntime and gives `[1, S]`; a kernel that takes it and a `[batch, seq]` tensor binds `seq`
twice and the runtime glue returns an error status (the same symbol must have one value), and a
broadcast left to onnxruntime fails as in the original. Tested in `tests/test_frontend_plumbed_dims.py`.
"""

from __future__ import annotations

import onnx_ir as ir

from .infer_shapes import INFERRED_SYMBOL_PREFIX
from .shape_values import DimOf, ShapeValue, constant_content, shape_values
from .tensors import constant_ints

Dim = int | str | None  # a size, a dim_param, or unknown

SAME_SHAPE_OPS = frozenset({
    "Identity", "Cast", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Not", "Sqrt", "Exp", "Log", "Erf",
    "Reciprocal", "Floor", "Ceil", "Sign", "IsNaN", "IsInf", "Softmax", "LogSoftmax", "Gelu",
})
"""Ops whose (first) output has the shape of their first input."""

BROADCAST_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Less", "LessOrEqual",
    "Greater", "GreaterOrEqual", "Max", "Min", "Sum", "Mean", "Where", "BitShift", "PRelu",
})
"""Ops whose output is the multidirectional broadcast of all their inputs' shapes."""


class NamePlumbedDimsPass(ir.passes.InPlacePass):
    """Guarantee: each dim written is the value's size at run time for every input the original
    model accepts (rules 1-5 above); `modified` only if a dim was written."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        known = shape_values(graph)
        live = _live_nodes(graph)
        modified = False
        for node in graph:
            if node.domain not in ("", "ai.onnx") or not node.outputs:
                continue
            dims = None
            if node.op_type == "Slice":
                dims = _slice_dims(node, known, live)
            elif node.op_type == "Range":
                dims = _range_dims(node, known)
            elif node.op_type == "Expand":
                dims = _expand_dims(node, known)
            elif node.op_type == "GatherElements" and len(node.inputs) > 1 and node.inputs[1] is not None:
                dims = _dims(node.inputs[1])
            if dims is not None:
                modified |= _write_dims(node.outputs[0], dims)
        return ir.passes.PassResult(model, modified=modified)


def _content(value: ir.Value | None, known: dict[ir.Value, ShapeValue]) -> ShapeValue | None:
    """What an integer tensor holds: computed from shapes (`shape_values`), or a constant."""
    if value is None:
        return None
    return known[value] if value in known else constant_content(value)


def _dims(value: ir.Value | None) -> list[Dim] | None:
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) else (d.value or None) for d in value.shape]


def _is_inferred(dim) -> bool:
    return dim is None or (isinstance(dim, ir.SymbolicDim) and (not dim.value or dim.value.startswith(INFERRED_SYMBOL_PREFIX)))


def _write_dims(value: ir.Value, dims: list[Dim]) -> bool:
    """Write the known dims of `dims` where `value`'s are unknown or onnx-named; False if none was.

    A name onnx gave (`unk__N`) is never written: onnx names afresh each round, and writing its
    names back would keep the fixed point from settling."""
    current = list(value.shape) if value.shape is not None else [None] * len(dims)
    if len(current) != len(dims):
        return False  # a rank onnx disagrees with: leave it
    new, changed = [], False
    for old, dim in zip(current, dims):
        old_dim = old if isinstance(old, int) else (old.value if isinstance(old, ir.SymbolicDim) else None)
        if isinstance(dim, str) and dim.startswith(INFERRED_SYMBOL_PREFIX):
            dim = None
        if dim is not None and _is_inferred(old) and old_dim != dim:
            new.append(dim)
            changed = True
        else:
            new.append(old)
    if changed:
        value.shape = ir.Shape(new)
    return changed


def _range_dims(node: ir.Node, known: dict[ir.Value, ShapeValue]) -> list[Dim] | None:
    """Rule 3."""
    if len(node.inputs) != 3:
        return None
    start, delta = constant_ints(node.inputs[0]), constant_ints(node.inputs[2])
    limit = _content(node.inputs[1], known)
    if start != [0] or delta != [1] or limit is None or not limit.scalar:
        return None
    (element,) = limit.elements
    if isinstance(element, DimOf) and element.symbol:
        return [element.symbol]
    return None


def _expand_dims(node: ir.Node, known: dict[ir.Value, ShapeValue]) -> list[Dim] | None:
    """Rule 4."""
    data_dims = _dims(node.inputs[0])
    target = _content(node.inputs[1], known) if len(node.inputs) > 1 else None
    if data_dims is None or target is None or target.scalar:
        return None
    rank = max(len(data_dims), len(target.elements))
    x = [1] * (rank - len(data_dims)) + data_dims
    s = [1] * (rank - len(target.elements)) + [_element_dim(e) for e in target.elements]
    return [_broadcast_dim(a, b) for a, b in zip(x, s)]


def _element_dim(element) -> Dim:
    if isinstance(element, int):
        return element if element >= 0 else None
    return element.symbol or None


def _broadcast_dim(a: Dim, b: Dim) -> Dim:
    """The broadcast of two dims where it is one definite size for every input the op accepts."""
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and a >= 2:
        return a if b is None or isinstance(b, str) or b == a else None
    if isinstance(b, int) and b >= 2:
        return b if a is None or isinstance(a, str) else None
    if a is not None and a == b:
        return a
    return None


def _slice_dims(node: ir.Node, known: dict[ir.Value, ShapeValue], live: set[ir.Node]) -> list[Dim] | None:
    """Rules 1 and 2."""
    data = node.inputs[0] if node.inputs else None
    data_dims = _dims(data)
    if data_dims is None or len(node.inputs) < 4 or node.inputs[3] is None:
        return None
    rank = len(data_dims)
    axes = constant_ints(node.inputs[3])
    if axes is None or any(not -rank <= a < rank for a in axes):
        return None
    axes = [a % rank for a in axes]
    if len(set(axes)) != len(axes):
        return None
    dims: list[Dim] = [None if axis in axes else dim for axis, dim in enumerate(data_dims)]
    starts, ends = _content(node.inputs[1], known), _content(node.inputs[2], known)
    steps = constant_ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1] * len(axes)
    if starts is None or ends is None or steps is None:
        return dims
    if not len(starts.elements) == len(ends.elements) == len(steps) == len(axes):
        return dims
    for i, axis in enumerate(axes):
        end, size = ends.elements[i], data_dims[axis]
        if (starts.elements[i] == 0 and steps[i] == 1 and isinstance(end, DimOf) and end.symbol
                and isinstance(size, int) and size >= 2
                and _meets_in_broadcast(node.outputs[0], axis, end.symbol, known, live)):
            dims[axis] = end.symbol
    return dims


def _meets_in_broadcast(value: ir.Value, axis: int, symbol: str, known: dict, live: set[ir.Node]) -> bool:
    """Whether axis `axis` of `value`, carried exactly by the ops that use it, is broadcast
    against a dim named `symbol` by a live node (rule 2)."""
    seen: set[tuple[ir.Value, int]] = set()
    todo = [(value, axis)]
    while todo:
        value, axis = todo.pop()
        if (value, axis) in seen or value.shape is None:
            continue
        seen.add((value, axis))
        for node, index in value.uses():
            if node.domain not in ("", "ai.onnx") or not node.outputs or node not in live:
                continue
            carried, met = _carry(node, index, value, axis, symbol, known)
            if met:
                return True
            todo.extend(carried)
    return False


def _carry(node: ir.Node, index: int, value: ir.Value, axis: int, symbol: str, known: dict):
    """Where `node` puts axis `axis` of its input `index` in its output: ([(output, axis)...],
    whether the node broadcasts it against a dim named `symbol`)."""
    op, out = node.op_type, node.outputs[0]
    rank = len(value.shape)
    if op in SAME_SHAPE_OPS and index == 0:
        return [(out, axis)], False
    if op == "LayerNormalization" and index == 0:
        return [(out, axis)], False
    if op == "GatherElements" and index == 1:
        return [(out, axis)], False
    if op == "Gather" and index == 1:
        gather_axis = node.attributes.get_int("axis", 0)
        data = node.inputs[0]
        if data is None or data.shape is None:
            return [], False
        return [(out, gather_axis % len(data.shape) + axis)], False
    if op == "Unsqueeze" and index == 0:
        new_axes = constant_ints(node.inputs[1]) if len(node.inputs) > 1 else None
        if new_axes is None:
            return [], False
        out_rank = rank + len(new_axes)
        inserted = sorted(a % out_rank for a in new_axes)
        position = axis
        for a in inserted:
            if a <= position:
                position += 1
        return [(out, position)], False
    if op in BROADCAST_OPS:
        if any(v is not None and v.shape is None for v in node.inputs):
            return [], False
        out_rank = max(len(v.shape) for v in node.inputs if v is not None)
        aligned = axis + out_rank - rank
        for other_index, other in enumerate(node.inputs):
            if other is None or other_index == index or other is value:
                continue
            position = aligned - (out_rank - len(other.shape))
            if position < 0:
                continue
            dim = other.shape[position]
            if dim == 1:
                continue
            if isinstance(dim, ir.SymbolicDim) and dim.value == symbol:
                return [], True
            return [], False  # an unknown size against min(d, S): the output is not exactly known
        return [(out, aligned)], False
    if op == "Expand" and index == 0:
        target = _content(node.inputs[1], known) if len(node.inputs) > 1 else None
        if target is None or target.scalar:
            return [], False
        out_rank = max(rank, len(target.elements))
        position = axis + len(target.elements) - rank  # the target's element aligned with `axis`
        if position < 0:
            return [(out, axis + out_rank - rank)], False
        element = target.elements[position]
        if element == 1:
            return [(out, axis + out_rank - rank)], False
        if isinstance(element, DimOf) and element.symbol == symbol:
            return [], True
        return [], False
    return [], False


def _live_nodes(graph: ir.Graph) -> set[ir.Node]:
    """The nodes some graph output depends on (onnxruntime may drop the others)."""
    live: set[ir.Node] = set()
    todo = [v.producer() for v in graph.outputs]
    while todo:
        node = todo.pop()
        if node is None or node in live or node.graph is not graph:
            continue
        live.add(node)
        todo.extend(v.producer() for v in node.inputs if v is not None)
    return live
