"""Write the model back as ONNX: each compiled group becomes one custom-op node.

The custom node reads the kernel's arguments in order (runtime inputs and weights alike, so the
model file stays the one place weights live) and produces the group's outputs. Groups with one
kernel identity (kernel_identity.py) become nodes of one op_type, each passing its own values.
Everything not compiled stays as it was, for onnxruntime to run.
"""

from __future__ import annotations

import heapq

import onnx
from onnx import helper, numpy_helper

from . import __version__
from .fusion.float32_boundaries import carried_name, written_boundary
from .fusion.plan import FusedGroup
from .ir import Graph, body_path
from .kernel_spec import DOMAIN, DOMAIN_VERSION, LIBRARY_DIGEST_METADATA_KEY, LIBRARY_METADATA_KEY, GroupKernel
from .report import ops_summary
from .target import Target


def package_model(
    graph: Graph, fused: list[tuple[FusedGroup, GroupKernel]], library_name: str, target: Target | str,
    *, consume: bool = False, library_digest: str | None = None,
) -> onnx.ModelProto:
    """The model with each fused group replaced by its custom node. `consume=True` rewrites
    `graph.model` itself instead of a copy, so a 2 GB model is held once, not twice (the
    pipeline's last use of the graph; the graph is unusable after).

    `fused` may hold groups of any If/Loop/Scan body (FusedGroup.scope): those become custom nodes
    inside that body, which onnxruntime resolves like any other node there."""
    by_scope: dict[str, list[tuple[FusedGroup, GroupKernel]]] = {}
    for group, kernel in fused:
        by_scope.setdefault(group.scope, []).append((group, kernel))
    if consume:
        model = graph.model
    else:
        model = onnx.ModelProto()
        model.CopyFrom(graph.model)
    _rewrite_graph(model.graph, graph, "", by_scope)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    digest = {LIBRARY_DIGEST_METADATA_KEY: library_digest} if library_digest else {}
    _set_metadata(model, {LIBRARY_METADATA_KEY: library_name, **digest, "onnxfuse.version": __version__,
                          **target_metadata(target)})
    return model


def _rewrite_graph(g: onnx.GraphProto, graph: Graph, scope: str,
                   by_scope: dict[str, list[tuple[FusedGroup, GroupKernel]]]) -> None:
    """Rewrite `g` (`graph`'s GraphProto, or a copy) in place: the bodies below it first, then
    its own groups become custom nodes, then what nothing reads any more goes."""
    for node in graph.nodes:
        for attribute, body in node.bodies.items():
            path = body_path(scope, node, attribute)
            if any(s == path or s.startswith(f"{path}/") for s in by_scope):
                body_proto = next(a.g for a in g.node[node.index].attribute if a.name == attribute)
                _rewrite_graph(body_proto, body, path, by_scope)
    extra_inits = _replace_groups(g, graph, by_scope[scope]) if scope in by_scope else []
    _drop_unread_nodes(g)
    used = {i for n in g.node for i in _reads(n)} | {o.name for o in g.output}
    dropped = {t.name for t in g.initializer if t.name not in used}
    for position in reversed([k for k, t in enumerate(g.initializer) if t.name in dropped]):
        del g.initializer[position]  # in place: the kept weights are never copied
    g.initializer.extend(extra_inits)
    _drop_unused(g, used, dropped)


def _replace_groups(g: onnx.GraphProto, graph: Graph, fused: list[tuple[FusedGroup, GroupKernel]],
                    ) -> list[onnx.TensorProto]:
    """Each group's nodes in `g` replaced by its custom node; returns the constants they lift."""
    replaced = {i for group, _ in fused for i in group.node_indices}
    first_member = {min(group.node_indices): (group, kernel) for group, kernel in fused}
    nodes: list[tuple[int, onnx.NodeProto]] = []  # (original position, node)
    extra_inits: dict[str, onnx.TensorProto] = {}  # by name: groups that share a kernel may share a lifted weight
    boundary_casts, rewired = written_boundary(list(g.node), [group for group, _ in fused])
    for index, proto in enumerate(g.node):
        if index in first_member:
            group, kernel = first_member[index]
            node, weights = custom_op_node(group, kernel, graph)
            nodes.append((index, node))
            extra_inits.update((w.name, w) for w in weights)
        elif index not in replaced:
            nodes.append((index, rewired.get(index, proto)))
    nodes += [(min(group.node_indices) if group else 0, cast) for group, cast in boundary_casts]
    ordered = [_copy(n) for n in _topological(nodes)]  # copies: the node list is rebuilt below
    del g.node[:]
    g.node.extend(ordered)
    return list(extra_inits.values())


def target_metadata(target: Target | str) -> dict[str, str]:
    """What the model's metadata says about the CPU its kernels were built for."""
    if isinstance(target, str):
        return {"onnxfuse.target": target}
    return {"onnxfuse.target": target.name, "onnxfuse.target.triple": target.triple,
            "onnxfuse.target.cpu": target.mcpu or "", "onnxfuse.target.features": ",".join(target.mattr)}


def _copy(proto: onnx.NodeProto) -> onnx.NodeProto:
    clone = onnx.NodeProto()
    clone.CopyFrom(proto)
    return clone


def custom_op_node(group: FusedGroup, kernel: GroupKernel, graph: Graph | None = None,
                   ) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """The node that runs `kernel` in place of `group`, and the lifted constants it reads: the
    kernel's own (named after it, so the nodes sharing the kernel share them too) and this
    group's (a transposed weight). Its doc_string names the nodes it replaced, so a model viewer
    shows more than a hash."""
    inputs, weights = [], []
    for source in kernel.arg_sources:
        if source in kernel.extra_weights:
            name = source if source.startswith(f"{kernel.spec.name}__") else f"{group.name}__{source}"
            weights.append(numpy_helper.from_array(kernel.extra_weights[source], name))
            inputs.append(name)
        else:
            inputs.append(source)
    outputs = [carried_name(o) if o in group.float32_outputs else o for o in group.outputs]
    node = helper.make_node(kernel.spec.name, inputs, outputs, name=f"onnxfuse_{group.name}", domain=DOMAIN,
                            doc_string=describe_group(group, graph))
    return node, weights


DOC_NODE_NAMES = 24  # a 2,000-node tree chain names its first ones and counts the rest


def describe_group(group: FusedGroup, graph: Graph | None = None) -> str:
    """`onnxfuse kernel for group_0: 14 nodes [Sigmoid×3, MatMul×2, ...] replaced: mm1 (MatMul), ...`"""
    labels = []
    for index, op in zip(group.node_indices[:DOC_NODE_NAMES], group.op_types):
        name = graph.nodes[index].name if graph is not None else ""
        labels.append(f"{name or '#' + str(index)} ({op})")
    more = len(group.node_indices) - len(labels)
    return (f"onnxfuse kernel for {group.name}: {len(group.node_indices)} nodes [{ops_summary(group.op_types)}] "
            f"replaced: {', '.join(labels)}" + (f", … and {more} more" if more > 0 else ""))


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


def _drop_unread_nodes(g: onnx.GraphProto) -> None:
    """Remove nodes whose results nothing reads, transitively: the ones that fed only a group's
    computed shape, which its kernel now rebuilds itself (fusion/rebuilt_shapes.py), would still
    run in onnxruntime. (The front end already dropped what the model itself left unread.)"""
    while True:
        read = {i for n in g.node for i in _reads(n)} | {o.name for o in g.output}
        kept = [n for n in g.node if read & set(n.output)]
        if len(kept) == len(g.node):
            return
        del g.node[:]
        g.node.extend(kept)


def _drop_unused(g: onnx.GraphProto, used: set[str], dropped: set[str]) -> None:
    """Remove the value_info no node or output refers to any more, and the graph inputs that
    named dropped initializers."""
    alive = used | {o for n in g.node for o in n.output}
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
