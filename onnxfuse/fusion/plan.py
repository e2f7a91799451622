"""The fusion plan: which original nodes form which group, and why the rest stay alone.

`plan_fusion` is the whole analysis (forward graph → post-dominator tree → partition); the plan it
returns speaks only in terms of the user's model (indices into `graph.node`), so it can be printed,
serialised, and handed to code generation without exposing the analysis internals.

If branches and Loop/Scan bodies are planned the same way, each as a graph of its own (a body's
body too): their groups carry the body's path as `scope` (`If_3/then_branch`), index that body's
`node` list, and are named `If_3/then_branch/group_0`. A body reads its enclosing scopes' values
by name, so a group in it simply has them among its inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir import Graph
from ..ops import OpKind, compiled_alone
from .forward_graph import _make_opaque, build_forward_graph
from .onnxruntime_fused_ops import scaled_product_nodes, skip_layer_norm_chains
from .partition import FusionOptions, Partitioner
from .postdom import post_dominator_tree


@dataclass(frozen=True)
class FusedGroup:
    name: str
    node_indices: tuple[int, ...]  # in topological order
    op_types: tuple[str, ...]
    inputs: tuple[str, ...]  # values read from outside the group (weights included), first-use order
    outputs: tuple[str, ...]  # values used after the group or returned by the graph
    anchored: bool  # contains a MatMul/Conv-like op
    reuse: dict[str, int] = field(default_factory=dict)
    """Values produced inside the group and read by several of its nodes → how many readers.
    Re-emitting such a producer into each reader is what blows up deep tree chains; the code
    generator computes each of them once (bounded by its duplication limit)."""
    scope: str = ""
    """"" in the model's graph; else the path of the subgraph body it lives in (ir.Graph.scopes)."""
    float32_outputs: tuple[str, ...] = ()
    """float16 outputs the group hands on unrounded, as float32 (fusion/float32_boundaries.py):
    onnxruntime computes them in float32 and some reader outside the group reads them so."""
    float32_inputs: tuple[str, ...] = ()
    """float16 inputs the group reads unrounded, as float32: another group's float32_outputs, or
    the result of an unfused node onnxruntime computes in float32."""
    unrounded_casts: tuple[int, ...] = ()
    """Unfused Casts (node indices) that read one of float32_outputs unrounded, as onnxruntime's
    Cast removal makes them in the original model."""

    def materialised(self, max_duplication: int) -> int:
        """How many reused values the duplication bound makes the kernel compute once."""
        return sum(1 for readers in self.reuse.values() if readers > max_duplication)

    def to_json(self, max_duplication: int | None = None) -> dict:
        out = {
            "name": self.name,
            "node_indices": list(self.node_indices),
            "op_types": list(self.op_types),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "size": len(self.node_indices),
            "reused_values": len(self.reuse),
            "max_reuse": max(self.reuse.values(), default=0),
        }
        if self.scope:
            out["scope"] = self.scope
        if self.float32_outputs or self.float32_inputs:
            out.update(float32_outputs=list(self.float32_outputs), float32_inputs=list(self.float32_inputs))
        if max_duplication is not None:
            out["materialised_values"] = self.materialised(max_duplication)
        return out


@dataclass(frozen=True)
class UnfusedNode:
    node_index: int
    op_type: str
    reason: str
    scope: str = ""  # as FusedGroup.scope

    @property
    def where(self) -> str:
        """`#5`, or `If_3/then_branch#5` inside a body."""
        return f"{self.scope}#{self.node_index}"

    def to_json(self) -> dict:
        out = {"node_index": self.node_index, "op_type": self.op_type, "reason": self.reason}
        return {**out, "scope": self.scope} if self.scope else out


@dataclass
class FusionPlan:
    groups: list[FusedGroup]
    unfused: list[UnfusedNode]
    options: FusionOptions
    node_count: int  # in the model's graph and every body
    kinds: dict[int, OpKind] = field(default_factory=dict)  # node index → pattern kind (model's graph)

    def group_of(self) -> dict[int, str]:
        """Node index → group name, in the model's graph."""
        return {i: g.name for g in self.groups if not g.scope for i in g.node_indices}

    def options_json(self) -> dict:
        o = self.options
        return {"max_depth": o.max_depth, "max_inputs": o.max_inputs, "max_duplication": o.max_duplication}

    def to_json(self) -> dict:
        return {
            "node_count": self.node_count,
            "fused_node_count": sum(len(g.node_indices) for g in self.groups),
            "options": self.options_json(),
            "groups": [g.to_json(self.options.max_duplication) for g in self.groups],
            "unfused": [u.to_json() for u in self.unfused],
        }


LeaveOut = Callable[[Graph], dict[int, str]]
"""Nodes of one graph (by index) that must stay with onnxruntime, each with the reason."""


def plan_fusion(graph: Graph, options: FusionOptions | None = None, leave_out: LeaveOut | None = None) -> FusionPlan:
    """The plan of the model's graph, then of every subgraph body below it (see the module doc).

    `leave_out`: nodes to plan as opaque, in every graph, so that no group holds them but their
    neighbours still fuse among themselves (`--select auto` leaves convolutions to onnxruntime)."""
    options = options or FusionOptions()
    groups: list[FusedGroup] = []
    unfused: list[UnfusedNode] = []
    kinds: dict[int, OpKind] = {}
    for scope, scope_graph in graph.scopes():
        scope_groups, scope_unfused, scope_kinds = _plan_scope(scope_graph, scope, options, leave_out,
                                                               graph.onnxruntime_fused_ops)
        groups += scope_groups
        unfused += scope_unfused
        if not scope:
            kinds = scope_kinds
    node_count = sum(len(g.nodes) for _, g in graph.scopes())
    return FusionPlan(groups, unfused, options, node_count, kinds)


def _plan_scope(graph: Graph, scope: str, options: FusionOptions, leave_out: LeaveOut | None,
                fused_ops: tuple = ()):
    """Groups, unfused nodes and pattern kinds of one graph (the model's, or one body)."""
    prefix = f"{scope}/" if scope else ""
    fg = build_forward_graph(graph, options.enclosed_gemms)
    chains = [chain for chain in skip_layer_norm_chains(graph, fused_ops) if len(chain) <= options.max_depth]
    in_chain = {index for chain in chains for index in chain}
    reasons = {index: "a SkipLayerNormalization chain (a group of its own)" for index in in_chain}
    reasons = {**scaled_product_nodes(graph, fused_ops), **reasons}
    if leave_out is not None:
        reasons = {**leave_out(graph), **reasons}
    if reasons:
        marked = [fnode.node.index in reasons for fnode in fg.nodes]
        _make_opaque(fg, marked, lambda fnode: reasons[fnode.node.index])
    tree = post_dominator_tree(fg)
    partitioner = Partitioner(fg, tree, options)
    roots = partitioner.run()

    by_root: dict[int, list[int]] = {}
    for pos, root in enumerate(roots):
        by_root.setdefault(id(root), []).append(pos)
    position = {fnode.node.index: pos for pos, fnode in enumerate(fg.nodes)}
    units = [(sorted(positions), roots[positions[0]].anchored) for positions in by_root.values()
             if not in_chain & {fg.nodes[p].node.index for p in positions}]
    units += [(sorted(position[index] for index in chain), True) for chain in chains]

    groups: list[FusedGroup] = []
    unfused: list[UnfusedNode] = []
    for positions, anchored in sorted(units, key=lambda unit: unit[0][0]):
        nodes = [fg.nodes[p].node for p in positions]
        if len(nodes) == 1 and not compiled_alone(nodes[0].op_type, nodes[0].domain):
            pos = positions[0]
            reason = partitioner.reasons.get(pos, "nothing next to it could fuse with it")
            unfused.append(UnfusedNode(nodes[0].index, nodes[0].op_type, reason, scope))
            continue
        inputs, outputs = _boundary(graph, nodes)
        groups.append(
            FusedGroup(
                name=f"{prefix}group_{len(groups)}",
                node_indices=tuple(n.index for n in nodes),
                op_types=tuple(n.op_type for n in nodes),
                inputs=tuple(inputs),
                outputs=tuple(outputs),
                anchored=anchored,
                reuse=_reuse(graph, nodes),
                scope=scope,
            )
        )
    unfused.sort(key=lambda u: u.node_index)
    return groups, unfused, {fn.node.index: fn.kind for fn in fg.nodes}


def _reuse(graph: Graph, nodes) -> dict[str, int]:
    members = {n.index for n in nodes}
    counts = {}
    for n in nodes:
        for name in n.outputs:
            readers = [c for c in graph.value(name).consumers if c in members] if name else []
            if len(readers) > 1:
                counts[name] = len(readers)
    return counts


def _boundary(graph: Graph, nodes) -> tuple[list[str], list[str]]:
    """The values a group reads from outside, and the values it must hand back."""
    members = {n.index for n in nodes}
    produced = {o for n in nodes for o in n.outputs if o}
    inputs: list[str] = []
    for n in nodes:
        for name in n.inputs:
            if name and name not in produced and name not in inputs:
                inputs.append(name)
    outputs: list[str] = []
    for n in nodes:
        for name in n.outputs:
            if not name:
                continue
            v = graph.value(name)
            if v.is_graph_output or any(c not in members for c in v.consumers):
                outputs.append(name)
    return inputs, outputs
