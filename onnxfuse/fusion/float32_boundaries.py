"""float16 values that cross a group boundary unrounded, as float32.

Why: onnxruntime's CPU provider computes most float16 arithmetic in float32 and removes the
Cast pairs between two such nodes (codegen/float16_as_onnxruntime.py), so a float16 value that a
float32 node computes reaches the next float32 node unrounded. A group output is a float16
tensor, rounded: where a reader outside the group is such a node, it read 65504 (or inf) where
onnxruntime's reads 70000, and a Cast to int32 of a sum 76.99 read 77. So such an output (the
group's `float32_outputs`; codegen/float16_boundaries.py decides which) leaves its group as the
float32 value `carried_name(v)`, and the written model rounds it back with a Cast node of its
own: onnxruntime treats that Cast as it treats its own, its float32 readers read the float32
value, and the rest (a float16 kernel, a graph output) the rounded one.

Here: the group model's side (the node producing such an output computes in float32, on float32
operands, and the group outputs its result; a group reading such a value takes the float32
value and rounds it with a Cast itself) and the written model's side (the Cast nodes around the
custom nodes). The group model stays what onnxruntime, as the kernel's reference, computes the
same as onnxruntime on the original: a Cast(float32 -> float16) read only by float32 nodes, or a
Cast(float16 -> float32) of a float32 node's result, is a Cast pair onnxruntime removes.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from .plan import FusedGroup

_F16, _F32 = TensorProto.FLOAT16, TensorProto.FLOAT


def carried_name(value: str) -> str:
    """The name of float16 `value`'s unrounded float32 value, in the group and written models."""
    return f"{value}__onnxfuse_float32"


def carries_float32(group: FusedGroup) -> bool:
    return bool(group.float32_outputs or group.float32_inputs)


def carrying_group_model(model: onnx.ModelProto, group: FusedGroup) -> onnx.ModelProto:
    """`model` (the group cut out) with its float32 boundaries: each of `group.float32_outputs` is
    computed by its node in float32 and output unrounded under carried_name; each of
    `group.float32_inputs` is read as float32 and rounded by a Cast inside. The same object when
    the group has none."""
    if not carries_float32(group):
        return model
    types = _elem_types(model)
    g = model.graph
    float32 = {v: carried_name(v) for v in group.float32_inputs}  # float16 value -> its float32 value
    nodes: list[onnx.NodeProto] = [helper.make_node("Cast", [carried_name(v)], [v], name=f"{v}__onnxfuse_round", to=_F16)
                                   for v in group.float32_inputs]
    read = {i for n in g.node for i in n.input}

    def widened(name: str) -> str:
        if name not in float32:
            float32[name] = f"{name}__onnxfuse_wide"
            nodes.append(helper.make_node("Cast", [name], [float32[name]], name=float32[name], to=_F32))
        return float32[name]

    for node in g.node:
        carried = [o for o in node.output if o in group.float32_outputs]
        if not carried:
            nodes.append(node)
            continue
        if node.op_type == "Cast":  # a Cast to float16 (float16_boundaries): its source, cast to float32
            wide = helper.make_node("Cast", [node.input[0]], [carried_name(carried[0])], name=node.name, to=_F32)
        else:
            wide = onnx.NodeProto()
            wide.CopyFrom(node)
            wide.input[:] = [widened(i) if i and types.get(i) == _F16 else i for i in node.input]
            wide.output[:] = [carried_name(o) if o in carried else o for o in node.output]
        nodes.append(wide)
        nodes.extend(helper.make_node("Cast", [carried_name(o)], [o], name=f"{o}__onnxfuse_round", to=_F16)
                     for o in carried if o in read)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    for value in list(rewritten.graph.input) + list(rewritten.graph.output):
        if value.name in group.float32_inputs or value.name in group.float32_outputs:
            value.name = carried_name(value.name)
            value.type.tensor_type.elem_type = _F32
    return rewritten


def written_boundary(graph_nodes: list[onnx.NodeProto], fused: list[FusedGroup]) -> tuple[
        list[tuple[FusedGroup | None, onnx.NodeProto]], dict[int, onnx.NodeProto]]:
    """The written model's side, for the groups `fused` (those that become custom nodes):
    the Cast nodes to add (with the group whose custom node they follow; None when they round a
    value for a reader group, ahead of it) and the unfused Casts rewired to read a float32 value
    (node index -> the new node). A float32 output is rounded back under its own name, for every
    reader that is not a group reading it as float32; a group reading a value as float32 whose
    producer is no custom node gets a Cast of it to float32 (onnxruntime removes that Cast and its
    own rounding Cast after a float32 node, so the group still reads the unrounded value)."""
    added: list[tuple[FusedGroup | None, onnx.NodeProto]] = []
    provided = {v for g in fused for v in g.float32_outputs}
    for group in fused:
        added += [(group, helper.make_node("Cast", [carried_name(v)], [v], name=f"{v}__onnxfuse_round", to=_F16))
                  for v in group.float32_outputs]
    widened = dict.fromkeys(v for g in fused for v in g.float32_inputs if v not in provided)
    added += [(None, helper.make_node("Cast", [v], [carried_name(v)], name=carried_name(v), to=_F32)) for v in widened]
    rewired = {}
    for group in fused:
        for index in group.unrounded_casts:
            node = onnx.NodeProto()
            node.CopyFrom(graph_nodes[index])
            node.input[0] = carried_name(node.input[0])
            rewired[index] = node
    return added, rewired


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    graph = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
    types.update({i.name: i.data_type for i in graph.initializer})
    return types
