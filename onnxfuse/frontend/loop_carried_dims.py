"""Pass: a Loop's carried state keeps the dims of its initial value where its body proves it.

tf2onnx writes a Keras RNN as a Loop whose body declares the carried state with a fresh dim
(`h: [unk__172, 32]`) while the step's input slice has the model's batch dim (`x_t: [unk__175,
16]`). The gate math adds the two, and with two names for one batch the group's kernel could not
be built (TVM: the Add's broadcast shape is unknown). The state's dim is the initial value's
wherever the body maps that dim to itself: if the body, given the initial value's dim D on its
input, writes D on the matching output, every iteration sees D (by induction). So each carried
input's symbolic dim is renamed to the initial value's dim, shape inference runs, and the rename
stays only where the body's output comes out with that dim; otherwise it is undone.
"""

from __future__ import annotations

import onnx_ir as ir

from .infer_shapes import InferShapesPass

FIRST_CARRIED = 2  # Loop inputs: trip count, condition, then the carried values


class LoopCarriedDimsPass(ir.passes.InPlacePass):
    """Guarantee: a Loop body's carried input has the initial value's dim (static or named)
    wherever shape inference shows the body writes that dim back on the matching output."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.op_type == "Loop" and node.domain in ("", "ai.onnx"):
                modified |= _unify(model, node)
        return ir.passes.PassResult(model, modified=modified)


def _candidates(loop: ir.Node, body: ir.Graph) -> list[tuple[int, int, object]]:
    """(carried index, axis, the initial value's dim) where the body's input names another dim."""
    found = []
    for k, initial in enumerate(loop.inputs[FIRST_CARRIED:]):
        carried = body.inputs[FIRST_CARRIED + k] if FIRST_CARRIED + k < len(body.inputs) else None
        if initial is None or carried is None or initial.shape is None or carried.shape is None:
            continue
        if len(initial.shape) != len(carried.shape):
            continue
        for axis, (outer, inner) in enumerate(zip(initial.shape, carried.shape)):
            known = isinstance(outer, int) or (isinstance(outer, ir.SymbolicDim) and outer.value)
            if known and isinstance(inner, ir.SymbolicDim) and not _same(inner, outer):
                found.append((k, axis, outer))
    return found


def _same(a, b) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return isinstance(a, ir.SymbolicDim) and isinstance(b, ir.SymbolicDim) and a.value is not None and a.value == b.value


def _renamed(body: ir.Graph, renames: list[tuple[int, int, object]], original: dict) -> None:
    """The carried inputs' shapes as `original`, with `renames` applied."""
    for k, shape in original.items():
        dims = list(shape)
        for kk, axis, outer in renames:
            if kk == k:
                dims[axis] = outer
        body.inputs[FIRST_CARRIED + k].shape = ir.Shape(dims)


def _unify(model: ir.Model, loop: ir.Node) -> bool:
    """Keep the largest set of renames that is consistent: given all of them on the inputs, the
    body writes each renamed dim back (a failed one may have been what proved another)."""
    body_attr = loop.attributes.get("body")
    body = body_attr.value if body_attr is not None else None
    if body is None:
        return False
    renames = _candidates(loop, body)
    original = {k: body.inputs[FIRST_CARRIED + k].shape for k, _, _ in renames}
    while renames:
        _renamed(body, renames, original)
        InferShapesPass()(model)
        held = [(k, axis, outer) for k, axis, outer in renames
                if 1 + k < len(body.outputs) and body.outputs[1 + k].shape is not None
                and len(body.outputs[1 + k].shape) > axis and _same(body.outputs[1 + k].shape[axis], outer)]
        if len(held) == len(renames):
            return True
        renames = held
    _renamed(body, [], original)
    return False
