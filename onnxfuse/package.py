"""Write the model back as ONNX: each compiled group becomes one custom-op node.

The custom node reads the kernel's arguments in order (runtime inputs and weights alike, so the
model file stays the one place weights live) and produces the group's outputs. Everything not
compiled stays as it was, for onnxruntime to run.
"""

from __future__ import annotations

import heapq

import onnx
from onnx import helper, numpy_helper

from . import __version__
from .fusion.plan import FusedGroup
from .ir import Graph, body_path
from .kernel_spec import DOMAIN, DOMAIN_VERSION, LIBRARY_METADATA_KEY, GroupKernel


def package_model(
    graph: Graph, fused: list[tuple[FusedGroup, GroupKernel]], library_name: str, target_name: str
) -> onnx.ModelProto:
    """`graph`: the model's; `fused` may hold groups of any subgraph body (FusedGroup.scope): those
    become custom nodes inside that body, which onnxruntime resolves like any other node there."""
    by_scope: dict[str, list[tuple[FusedGroup, GroupKernel]]] = {}
    for group, kernel in fused:
        by_scope.setdefault(group.scope, []).append((group, kernel))
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    _rewrite_graph(model.graph, graph, "", by_scope)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    _set_metadata(model, {LIBRARY_METADATA_KEY: library_name, "onnxfuse.version": __version__, "onnxfuse.target": target_name})
    return model


def _rewrite_graph(g: onnx.GraphProto, graph: Graph, scope: str,
                   by_scope: dict[str, list[tuple[FusedGroup, GroupKernel]]]) -> None:
    """Rewrite `g` (a copy of `graph`'s GraphProto) in place: the bodies below it first, then its
    own groups become custom nodes."""
    for node in graph.nodes:
        for attribute, body in node.bodies.items():
            path = body_path(scope, node, attribute)
            if any(s == path or s.startswith(f"{path}/") for s in by_scope):
                body_proto = next(a.g for a in g.node[node.index].attribute if a.name == attribute)
                _rewrite_graph(body_proto, body, path, by_scope)
    fused = by_scope.get(scope, [])
    if fused:
        _replace_groups(g, fused)
    _drop_unused(g)


def _replace_groups(g: onnx.GraphProto, fused: list[tuple[FusedGroup, GroupKernel]]) -> None:
    replaced = {i for group, _ in fused for i in group.node_indices}
    first_member = {min(group.node_indices): (group, kernel) for group, kernel in fused}
    nodes: list[tuple[int, onnx.NodeProto]] = []  # (original position, node)
    extra_inits: list[onnx.TensorProto] = []
    for index, proto in enumerate(g.node):
        if index in first_member:
            group, kernel = first_member[index]
            node, weights = custom_op_node(group, kernel)
            nodes.append((index, node))
            extra_inits.extend(weights)
        elif index not in replaced:
            nodes.append((index, proto))
    ordered = [_copy(n) for n in _topological(nodes)]
    del g.node[:]
    g.node.extend(ordered)
    g.initializer.extend(extra_inits)


def _copy(proto: onnx.NodeProto) -> onnx.NodeProto:
    clone = onnx.NodeProto()
    clone.CopyFrom(proto)
    return clone


def custom_op_node(group: FusedGroup, kernel: GroupKernel) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """The node that runs `kernel` in place of `group`, and the lifted constants it reads."""
    inputs, weights = [], []
    for source in kernel.arg_sources:
        if source in kernel.extra_weights:
            name = f"{group.name}__{source}"
            weights.append(numpy_helper.from_array(kernel.extra_weights[source], name))
            inputs.append(name)
        else:
            inputs.append(source)
    node = helper.make_node(kernel.spec.name, inputs, list(group.outputs), name=f"onnxfuse_{group.name}", domain=DOMAIN)
    return node, weights


def _topological(nodes: list[tuple[int, onnx.NodeProto]]) -> list[onnx.NodeProto]:
    """Order nodes so producers come first, keeping the original order where it already is."""
    producer = {o: k for k, (_, n) in enumerate(nodes) for o in n.output if o}
    deps = [{producer[i] for i in _reads(n) if i in producer} for _, n in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for k, ds in enumerate(deps):
        for d in ds:
            users[d].append(k)
    waiting = [len(ds) for ds in deps]
    ready = [(nodes[k][0], k) for k in range(len(nodes)) if waiting[k] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(nodes[k][1])
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (nodes[u][0], u))
    assert len(out) == len(nodes), "fusion produced a cycle between groups"
    return out


def _reads(node: onnx.NodeProto) -> set[str]:
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            for n in sub.node:
                names |= _reads(n)
    return names


def _drop_unused(g: onnx.GraphProto) -> None:
    """Remove initializers and value_info that no node or output refers to any more."""
    used = {i for n in g.node for i in _reads(n)} | {o.name for o in g.output}
    alive = used | {o for n in g.node for o in n.output}
    keep = [t for t in g.initializer if t.name in used]
    dropped = {t.name for t in g.initializer} - {t.name for t in keep}
    del g.initializer[:]
    g.initializer.extend(keep)
    infos = [v for v in g.value_info if v.name in alive]
    del g.value_info[:]
    g.value_info.extend(infos)
    # Old-IR models list initializers among the inputs too; the model's real inputs always stay.
    inputs = [v for v in g.input if v.name not in dropped]
    del g.input[:]
    g.input.extend(inputs)


def _set_metadata(model: onnx.ModelProto, entries: dict[str, str]) -> None:
    kept = [p for p in model.metadata_props if p.key not in entries]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in entries.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
