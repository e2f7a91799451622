"""Which float16 values cross a group's boundary unrounded, as float32.

Why: onnxruntime computes a float16 node without a float16 kernel in float32 and hands its
result unrounded to the next such node (float16_as_onnxruntime.py); a group output is rounded
(fusion/float32_boundaries.py says what carrying it as float32 changes). An output is carried
when, in the original model:
- the node producing it is computed in float32 by onnxruntime, or is a model's Cast to float16
  (of a float32, float64 or integer value), and has no other output;
- some reader outside the group reads it unrounded and is an unfused float32 node, an unfused
  Cast (rewired to read the float32 value: onnxruntime keeps a model's Cast(float32 -> float16)
  read by a Cast to int32, so the written model's own rounding Cast would round it), or a node
  of another group whose readers of it are all float32 nodes (that group reads it as float32);
- inside the group, only float32 nodes read it (they read the written Cast back to float16
  unrounded, as onnxruntime removes the pair; an isolatable node, Max or Clip, would no longer
  be isolated after a Cast), and none of the producer's float16 operands is a Cast or an
  isolated node of the group (its new Cast to float32 would keep a lossy Cast's rounding, or end
  the isolation).
A value an unfused float32 node computes is read as float32 by the groups whose readers of it are
all float32 nodes: the written model casts it to float32, and onnxruntime removes that Cast with
the rounding one it inserts after the node (so also when a carrying group falls back).
Elsewhere the boundary stays as it was: rounded. Groups inside If/Loop/Scan bodies are left so,
and so are values a body reads.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from onnx import TensorProto, helper

from ..fusion.plan import FusionPlan
from ..ir import Graph
from .float16_as_onnxruntime import FLOAT32_OPS, onnxruntime_float32

_F16_NAME = "float16"


def carry_float32(graph: Graph, plan: FusionPlan) -> FusionPlan:
    """`plan` with each top-level group's float32_outputs, float32_inputs and unrounded_casts set
    (module doc); the same object when no group carries any."""
    groups = [g for g in plan.groups if not g.scope]
    if not groups or not any(v.dtype == _F16_NAME for v in graph.values.values()):
        return plan
    types = {name: helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype)) for name, v in graph.values.items() if v.dtype}
    float32, unrounded = onnxruntime_float32(graph.model, types)
    if not float32:
        return plan
    member = {i: g.name for g in groups for i in g.node_indices}
    outputs: dict[str, list[str]] = {}
    inputs: dict[str, list[str]] = {}
    casts: dict[str, list[int]] = {}

    def float32_node(index: int) -> bool:
        node = graph.nodes[index]
        return node.op_type in FLOAT32_OPS and node.domain in ("", "ai.onnx") and index in float32

    for group in groups:
        for v in group.outputs:
            value = graph.value(v)
            n = value.producer
            computes = n is not None and (n in float32 or _rounding_cast(graph, n))
            if (value.dtype != _F16_NAME or not computes or len(graph.nodes[n].outputs) != 1 or v not in unrounded
                    or _read_by_a_body(graph, v)):
                continue
            readers = unrounded[v][1]
            inside = [c for c in value.consumers if member.get(c) == group.name]
            if not all(float32_node(c) for c in inside) or not _operands_keep(graph, n, group.name, member, float32):
                continue
            outside = set(value.consumers) - set(inside)
            rewired = sorted(c for c in outside if c in readers and c not in member and graph.nodes[c].op_type == "Cast"
                             and graph.nodes[c].domain in ("", "ai.onnx"))
            reading = _reading_groups(value.consumers, readers, member, float32_node, group.name)
            if not (reading or rewired or any(c in readers and c not in member and float32_node(c) for c in outside)):
                continue
            outputs.setdefault(group.name, []).append(v)
            casts.setdefault(group.name, []).extend(rewired)
            for other in reading:
                inputs.setdefault(other, []).append(v)
    for n in sorted(float32 - set(member)):  # unfused float32 nodes: the groups reading them read float32
        node = graph.nodes[n]
        if not float32_node(n) or len(node.outputs) != 1 or node.outputs[0] not in unrounded or _read_by_a_body(
                graph, node.outputs[0]):
            continue
        v = node.outputs[0]
        for other in _reading_groups(graph.value(v).consumers, unrounded[v][1], member, float32_node, None):
            inputs.setdefault(other, []).append(v)
    if not outputs and not inputs:
        return plan
    carried = [dataclasses.replace(g, float32_outputs=tuple(outputs.get(g.name, ())),
                                   float32_inputs=tuple(v for v in g.inputs if v in inputs.get(g.name, ())),
                                   unrounded_casts=tuple(casts.get(g.name, ())))
               if not g.scope and (g.name in outputs or g.name in inputs) else g for g in plan.groups]
    return dataclasses.replace(plan, groups=carried)


def _rounding_cast(graph: Graph, index: int) -> bool:
    """Whether node `index` is a model's Cast to float16 of a non-float16 value: onnxruntime drops
    it where its readers take the source unrounded (float16_as_onnxruntime's `unrounded` reads),
    so a group ending in it carries the source, cast to float32 (seed 95: Cast(float32 -> float16)
    read by an unfused Reciprocal and Sin, which read the float32 value in onnxruntime)."""
    node = graph.nodes[index]
    to = node.attributes.get("to") if node.op_type == "Cast" and node.domain in ("", "ai.onnx") else None
    source = graph.value(node.inputs[0]).dtype if to is not None else None
    return to == TensorProto.FLOAT16 and source is not None and source != _F16_NAME


def _read_by_a_body(graph: Graph, value: str) -> bool:
    """Whether an If/Loop/Scan body reads `value`: float16_as_onnxruntime counts only the readers
    that name it as an input, so what it says of such a value's Casts is not sure."""
    return any(value in graph.nodes[c].implicit_inputs for c in graph.value(value).consumers)


def _reading_groups(consumers: list[int], readers: set[int], member: dict[int, str], float32_node,
                    producer_group: str | None) -> set[str]:
    """The groups (but the producer's) that read a value only in float32 nodes onnxruntime gives
    it unrounded: they can take it as float32."""
    groups = {member[c] for c in consumers if c in member and member[c] != producer_group}
    return {g for g in groups if all(c in readers and float32_node(c) for c in consumers if member.get(c) == g)}


def _operands_keep(graph: Graph, index: int, group: str, member: dict[int, str], float32: set[int]) -> bool:
    """Whether node `index`'s float16 operands keep their values when it reads them through a Cast
    to float32 (module doc): none is produced in the group by a Cast or an isolated node."""
    for name in graph.nodes[index].inputs:
        if not name or graph.value(name).dtype != _F16_NAME:
            continue
        producer = graph.value(name).producer
        if producer is None or member.get(producer) != group:
            continue
        node = graph.nodes[producer]
        if node.op_type == "Cast" or (producer in float32 and node.op_type not in FLOAT32_OPS):
            return False
    return True
