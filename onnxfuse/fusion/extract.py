"""Cut one fused group out of the model as a standalone ONNX model.

The group model is what code generation compiles, what the compile cache hashes, and what
onnxruntime runs as the reference when a kernel is verified: one artefact serves all three, so
they cannot disagree about what the group means.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from ..errors import CompileError
from ..ir import Graph, Value
from .float32_boundaries import carrying_group_model
from .forward_graph import SHAPE_FROM_OUTPUT
from .onnxruntime_fused_ops import CONTRIB_DOMAIN, as_onnxruntime_computes, content_digest, in_model_names
from .plan import FusedGroup
from .rebuilt_shapes import dim_sources, shape_nodes


def extract_group(graph: Graph, group: FusedGroup) -> onnx.ModelProto:
    """`graph`: the model's; a group inside a subgraph body is cut out of that body."""
    fused_ops = graph.onnxruntime_fused_ops
    graph = graph.scope(group.scope)
    members = [graph.nodes[i] for i in group.node_indices]
    protos = [_copy(graph.model.graph.node[n.index]) for n in members]
    initializers: dict[str, onnx.TensorProto] = {}

    shape_protos: list[onnx.NodeProto] = []
    for node, proto in zip(members, protos):
        if node.op_type in SHAPE_FROM_OUTPUT and len(node.inputs) > 1 and not graph.value(node.inputs[1]).is_constant:
            out = graph.value(node.outputs[0])
            if out.is_static:  # computed at run time, but inference proved it static: bake it in
                name = f"{node.inputs[1]}__static_{node.index}"
                initializers[name] = numpy_helper.from_array(np.array(out.shape, dtype=np.int64), name)
            else:  # symbolic: rebuilt from the dims of graph inputs (rebuilt_shapes)
                name = f"{node.inputs[1]}__rebuilt_{node.index}"
                nodes, constants = shape_nodes(name, out.shape, dim_sources(graph, out.shape))
                shape_protos += nodes
                initializers.update((c.name, c) for c in constants)
            proto.input[1] = name
    produced_here = {out for node in members for out in node.outputs}
    fused_here = tuple(op for op in fused_ops if op.output in produced_here)
    if fused_here:  # the model-wide lookups only for the groups that end such a chain
        here = {name for node in members for name in [*node.inputs, *node.outputs] if name}
        if any(name not in here for op in fused_here for name, _ in op.constants):  # digests only then
            digests = _constants_read(graph, members)
            fused_here = tuple(in_model_names(op, here, digests) for op in fused_here)
        protos, constants = as_onnxruntime_computes(protos, group.outputs, fused_here, _adds(graph),
                                                    _float32_values(graph), graph.opsets.get("", 17))
        initializers.update((c.name, c) for c in constants)
    protos = shape_protos + protos

    used = {i for p in protos for i in p.input if i}
    produced = {o for p in protos for o in p.output}
    inputs: list[onnx.ValueInfoProto] = []
    shape_sources = [n for n in dict.fromkeys(i for p in shape_protos for i in p.input)
                     if n not in produced and n not in initializers and n not in group.inputs]
    for name in [*group.inputs, *shape_sources]:
        if name not in used:
            continue
        value = graph.value(name)
        if value.initializer is not None:
            initializers[name] = value.initializer
            if value.overridable and value.dtype is not None and np.dtype(value.dtype).kind == "f":
                inputs.append(_value_info(value, f"input {name!r}"))  # a weight onnxruntime does not prepack
        else:
            inputs.append(_value_info(value, f"input {name!r}"))
    outputs = [_value_info(graph.value(name), f"output {name!r}", allow_unknown_dims=True) for name in group.outputs]
    g = helper.make_graph(protos, group.name, inputs, outputs, list(initializers.values()))
    opset = graph.opsets.get("", 17)
    opsets = [helper.make_opsetid("", opset)]
    if any(p.domain == CONTRIB_DOMAIN for p in protos):  # an onnxruntime kernel in a chain's place
        opsets.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    group_model = helper.make_model(g, opset_imports=opsets, ir_version=max(graph.model.ir_version, 7))
    return carrying_group_model(_modernized(group_model) if opset < MIN_GROUP_OPSET else group_model, group)


MIN_GROUP_OPSET = 13


def _adds(graph: Graph) -> dict[tuple, str]:
    """The model's Adds by their sorted input names, and those adding a constant by their other
    input alone (a 1-tuple; onnxruntime gives equal initializers one name, so a BiasGelu of the
    second layer may name the first layer's bias), each → its output name."""
    adds = [n for n in graph.nodes if n.op_type == "Add" and n.domain in ("", "ai.onnx") and len(n.inputs) == 2]
    by_inputs: dict[tuple, str] = {tuple(sorted(n.inputs)): n.outputs[0] for n in adds}
    for n in adds:
        constant = [graph.value(name).initializer is not None for name in n.inputs]
        if constant.count(True) == 1:
            by_inputs.setdefault((n.inputs[constant.index(False)],), n.outputs[0])
    return by_inputs


def _constants_read(graph: Graph, members) -> dict[str, str]:
    """The content digest of each initializer the group's nodes read → its name."""
    names = {name for node in members for name in node.inputs if name}
    return {content_digest(graph.value(name).initializer): name for name in sorted(names)
            if graph.value(name).initializer is not None}


def _float32_values(graph: Graph) -> set[str]:
    return {name for name, value in graph.values.items() if value.dtype == "float32"}


def _modernized(model: onnx.ModelProto) -> onnx.ModelProto:
    """Old opsets (attributes where inputs are now) are upgraded: TVM's frontend and onnxruntime
    both handle opset 13 best. A group the converter cannot upgrade stays as it was."""
    try:
        return version_converter.convert_version(model, MIN_GROUP_OPSET)
    except Exception:
        return model


def _c_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _copy(proto: onnx.NodeProto) -> onnx.NodeProto:
    clone = onnx.NodeProto()
    clone.CopyFrom(proto)
    return clone


def _value_info(value: Value, what: str, allow_unknown_dims: bool = False) -> onnx.ValueInfoProto:
    if value.dtype is None:
        raise CompileError(f"extract: dtype of {what} is unknown")
    if value.shape is None:
        if allow_unknown_dims:
            return helper.make_tensor_value_info(value.name, helper.np_dtype_to_tensor_dtype(np.dtype(value.dtype)), None)
        raise CompileError(f"extract: shape of {what} is unknown")
    dims = []
    for axis, d in enumerate(value.shape):
        if d is None and not allow_unknown_dims:
            d = f"{_c_name(value.name)}_dim{axis}"  # unknown: a symbol of its own, bound at run time
        dims.append(d)
    return helper.make_tensor_value_info(value.name, helper.np_dtype_to_tensor_dtype(np.dtype(value.dtype)), dims)
