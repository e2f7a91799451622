"""The graph fusion works on: nodes in topological order, each edge labelled with a pattern.

An edge producer → consumer carries the consumer's pattern kind, refined as TVM does: a broadcast
consumer reading an input of its own output shape is elementwise *on that edge*. Edges into
compile-time positions (a Reshape's shape, a Slice's starts) are opaque: they are not dataflow a
kernel could take over, so they never pull their producer into a group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..ir import Graph, Node
from ..ops import COMPILABLE_DTYPES, OPAQUE_REASONS, OpKind, combine, op_info
from .rebuilt_shapes import rebuildable

# Ops whose compile-time shape input can be recovered from their output shape: a static one, or
# for an Expand one whose symbolic dims graph inputs carry (rebuilt_shapes).
SHAPE_FROM_OUTPUT = frozenset({"Reshape", "Expand"})


@dataclass
class Edge:
    dst: int  # position of the consumer
    pattern: OpKind
    epilogue: OpKind  # the pattern with epilogue-safe injective consumers counted as elementwise


@dataclass
class FusionNode:
    pos: int  # position in topological order
    node: Node
    kind: OpKind
    epilogue_kind: OpKind
    opaque_reason: str | None
    outputs: list[Edge] = field(default_factory=list)
    exports: bool = False  # produces a graph output
    keeps_rows: bool = False  # a reduction that keeps the first (batch) axis: it reduces within rows
    is_view: bool = False  # its output is a block of whole rows of its input (selects_whole_rows)
    row_local: bool = False  # a GEMM by constant weights (is_row_local_gemm)


@dataclass
class ForwardGraph:
    nodes: list[FusionNode]
    graph: Graph

    def pos(self, node_index: int) -> int:
        return self._pos[node_index]

    def __post_init__(self) -> None:
        self._pos = {fn.node.index: fn.pos for fn in self.nodes}


def classify(node: Node, graph: Graph) -> tuple[OpKind, str | None]:
    """The node's pattern kind, and why it is opaque when it is."""
    if node.has_subgraph:
        return OpKind.OPAQUE, f"{node.op_type} has a subgraph; it runs as it is"
    info = op_info(node.op_type, node.domain)
    if info is None:
        if node.domain not in ("", "ai.onnx"):
            return OpKind.OPAQUE, f"op {node.op_type} of domain {node.domain!r} is not fused"
        return OpKind.OPAQUE, OPAQUE_REASONS.get(node.op_type, f"no fusion rule for {node.op_type}")
    live_outputs = [o for o in node.outputs if o]
    if node.op_type in ("Dropout", "BatchNormalization") and len(live_outputs) > 1:
        return OpKind.OPAQUE, f"{node.op_type} in training mode (extra outputs)"
    if node.op_type == "Dropout" and len(node.inputs) > 2 and node.inputs[2]:
        training = graph.constant(node.inputs[2])
        if training is None or bool(np.asarray(training).reshape(-1)[0]):
            return OpKind.OPAQUE, "Dropout whose training_mode may be true: the code generator treats it as identity"
    if node.op_type == "IsInf" and not (node.attributes.get("detect_positive", 1) and node.attributes.get("detect_negative", 1)):
        return OpKind.OPAQUE, "IsInf with detect_positive or detect_negative off: the code generator ignores them"
    for name in [n for n in node.inputs if n] + live_outputs:
        dtype = graph.value(name).dtype
        if dtype is None:
            return OpKind.OPAQUE, f"dtype of {name!r} is unknown"
        if dtype not in COMPILABLE_DTYPES:
            return OpKind.OPAQUE, f"dtype {dtype} is not compilable"
    for position in info.static_inputs:
        if position >= len(node.inputs) or not node.inputs[position]:
            continue
        if graph.value(node.inputs[position]).is_constant:
            continue
        out = graph.value(node.outputs[0])
        if node.op_type in SHAPE_FROM_OUTPUT and (out.is_static or rebuildable(graph, node.op_type, out.shape)):
            continue
        return OpKind.OPAQUE, f"input {position} of {node.op_type} is computed at run time"
    if is_row_mean_pool(node, graph):
        return OpKind.COMM_REDUCE, None
    return info.kind, None


def is_row_mean_pool(node: Node, graph: Graph) -> bool:
    """A GlobalAveragePool over a 3-D input [N, C, L]: the mean of each row of L values, kept as
    [N, C, 1], which is ReduceMean over the last axis. tf2onnx writes a Keras LayerNormalization's
    moments so (the mean, then the variance of the centred values). Planned as the row reduction
    it is, it fuses with the normalization around it like an exporter's ReduceMean does; as an
    image pool (anchor of its own, elementwise consumers only) the layer norm split in four
    groups around it."""
    if node.op_type != "GlobalAveragePool" or node.domain not in ("", "ai.onnx") or not node.inputs:
        return False
    shape = graph.value(node.inputs[0]).shape
    return shape is not None and len(shape) == 3


def reduces_within_rows(node: Node, graph: Graph) -> bool:
    """Whether a reduction keeps axis 0: each output row then depends on one input row only, so
    a row-tiled kernel can compute it tile by tile. False when the axes are unknown."""
    data = graph.value(node.inputs[0]) if node.inputs and node.inputs[0] else None
    if data is None or data.shape is None or len(data.shape) < 2:
        return False
    rank = len(data.shape)
    if node.op_type == "GlobalAveragePool":
        return True  # it reduces the spatial axes, after N and C
    if node.op_type in ("ArgMax", "ArgMin"):
        axes = [node.attributes.get("axis", 0)]
    elif "axes" in node.attributes:
        axes = list(node.attributes["axes"])
    elif len(node.inputs) > 1 and node.inputs[1]:
        constant = graph.constant(node.inputs[1])
        if constant is None:
            return False
        axes = [int(a) for a in constant.reshape(-1)]
    else:
        axes = []  # no axes: every axis (or none, with noop_with_empty_axes)
    if not axes:
        return bool(node.attributes.get("noop_with_empty_axes", 0))
    return all(0 < (int(a) % rank) for a in axes)


def selects_whole_rows(node: Node, graph: Graph) -> bool:
    """Whether the node's output is a block of its input at constant offsets, the innermost axis
    whole: `Gather` of a constant scalar index, or a step-1 `Slice`, on any axis but the last;
    `Squeeze`, `Unsqueeze`, `Identity`. How exporters read h and c out of a stacked state
    [2, N, H], or step t's input x[:, t] out of [N, T, I]. A kernel reads such a value in place,
    as contiguous rows at an offset: as an anchor's operand it costs nothing, so it may join the
    anchor's group (partition: view prologues)."""
    if node.op_type in ("Squeeze", "Unsqueeze", "Identity"):
        return True
    data = graph.value(node.inputs[0])
    rank = len(data.shape) if data.shape is not None else None
    if rank is None or rank < 2:
        return False
    if node.op_type == "Gather":
        index = graph.constant(node.inputs[1]) if len(node.inputs) > 1 else None
        return index is not None and index.ndim == 0 and node.attributes.get("axis", 0) % rank != rank - 1
    if node.op_type == "Slice":
        return _slices_outer_axes(node, graph, rank)
    return False


def _slices_outer_axes(node: Node, graph: Graph, rank: int) -> bool:
    def constant(position: int):
        if position >= len(node.inputs) or not node.inputs[position]:
            return None
        value = graph.constant(node.inputs[position])
        return [int(v) for v in value.reshape(-1)] if value is not None else False

    if "starts" in node.attributes:  # opset < 10: attributes
        axes = list(node.attributes.get("axes", range(len(node.attributes["starts"]))))
        steps = None
    else:
        starts, ends, axes, steps = constant(1), constant(2), constant(3), constant(4)
        if False in (starts, ends, axes, steps):
            return False
        axes = axes if axes is not None else list(range(len(starts)))
    outer = all(a % rank != rank - 1 for a in axes)
    return outer and (steps is None or all(s == 1 for s in steps))


def transposes_whole_rows(node: Node) -> bool:
    """A Transpose that keeps the last axis last, as attention's head split does ([b, s, h, d] ->
    [b, h, s, d]): it moves whole contiguous rows, so an anchor's kernel stores each row of its
    tile as vectors at the row's new place, and onnxruntime's copy of the whole tensor is saved
    (partition: split fan-out). A Transpose that moves the last axis scatters every element: the
    TorchScript BERT's key projection to [b, h, d, s], s known at run time only, took 0.33 ms
    fused with it against 0.13 ms for its GEMM kernel and onnxruntime's Transpose (batch 64)."""
    if node.op_type != "Transpose":
        return False
    perm = node.attributes.get("perm")
    return perm is not None and len(perm) >= 2 and list(perm)[-1] == len(perm) - 1


def moves_whole_rows(node: Node, graph: Graph) -> bool:
    """Whether a kernel can write the op's result row by row (a view epilogue, partition.py): a
    Reshape or Flatten (the same memory under other dims), a selection of whole rows
    (selects_whole_rows), a Transpose that keeps the last axis (transposes_whole_rows), or one
    whose new last axis has a static size. A Transpose that brings a symbolic axis last scatters
    every element with a stride known at run time only: a dynamo BERT's key projection to
    [b, h, d, seq] took 91 us with it against 72 us for the kernel and onnxruntime's Transpose
    (batch 64 x seq 16), where with Keras's key to [N, 4, 1, 8, 16] (tf2onnx, seq static) its
    encoder went 1.87x -> 2.31x onnxruntime at batch 64 (default sweeps 1128e -> 1128f)."""
    if node.op_type == "Reshape":
        return not divides_a_symbolic_size(node, graph)
    if node.op_type == "Flatten" or selects_whole_rows(node, graph) or transposes_whole_rows(node):
        return True
    if node.op_type != "Transpose":
        return False
    shape = graph.value(node.outputs[0]).shape
    return shape is not None and len(shape) > 0 and isinstance(shape[-1], int)


def divides_a_symbolic_size(node: Node, graph: Graph) -> bool:
    """Whether a Reshape's inferred dim (-1) divides symbolic sizes by a number that does not
    divide out of the static ones: `[seq, batch, 64] -> [16, -1, 16]` (a TorchScript export that
    baked seq = 16) is `seq * batch // 4`, which the kernel must check at run time
    (codegen/reshape_divisions.py), where `[seq, batch, 64] -> [0, -1, 16]` is batch * 4. A
    kernel with a GEMM and such a Reshape fails to build in TVM 0.27 (its LLVM lowering binds a
    floor-modulo's `rmod` twice), so a view epilogue that has one stays out of the GEMM's group.
    True when it cannot tell (no constant shape, an unknown input shape)."""
    data = graph.value(node.inputs[0]).shape
    target = graph.constant(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
    if data is None or target is None:
        return True
    target = [int(v) for v in target.reshape(-1)]
    if -1 not in target:
        return False
    allowzero = bool(node.attributes.get("allowzero", 0))
    copied = {i for i, v in enumerate(target) if v == 0 and not allowzero and i < len(data)}
    static_in = math.prod(dim for axis, dim in enumerate(data) if axis not in copied and isinstance(dim, int))
    static_out = math.prod(v for i, v in enumerate(target) if i not in copied and v > 0)
    return static_in % static_out != 0


def is_row_local_gemm(node: Node, graph: Graph) -> bool:
    """A MatMul or Gemm of a run-time A by constant weights (and a constant or no bias): row i of
    its output needs row i of A only, so a row-tiled kernel computes it tile by tile, like an
    elementwise op. What lets a GRU cell's W_hn (r * h) (linear_before_reset=0) stay inside the
    cell's kernel (partition: enclosed GEMMs)."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return False
    a, b = graph.value(node.inputs[0]), graph.value(node.inputs[1])
    if not b.is_constant or b.shape is None or len(b.shape) != 2 or a.shape is None or len(a.shape) < 2:
        return False
    if node.op_type == "Gemm":
        bias = node.inputs[2] if len(node.inputs) > 2 else ""
        return not node.attributes.get("transA", 0) and (not bias or graph.value(bias).is_constant)
    return True


def build_forward_graph(graph: Graph, enclosed_gemms: bool = True) -> ForwardGraph:
    """enclosed_gemms: the edge into a row-local GEMM counts as elementwise for the epilogue
    pattern, so an anchor's epilogue may run around it (partition: enclosed GEMMs)."""
    order = graph.topological_order
    nodes: list[FusionNode] = []
    for pos, index in enumerate(order):
        node = graph.nodes[index]
        kind, reason = classify(node, graph)
        info = op_info(node.op_type, node.domain)
        epilogue_safe = (info and info.epilogue_safe) or transposes_whole_rows(node)
        epilogue_kind = OpKind.ELEMWISE if (epilogue_safe and kind != OpKind.OPAQUE) else kind
        row_local = kind == OpKind.OUT_EWISE_FUSABLE and is_row_local_gemm(node, graph)
        exports = any(o and graph.value(o).is_graph_output for o in node.outputs)
        keeps_rows = kind == OpKind.COMM_REDUCE and reduces_within_rows(node, graph)
        is_view = kind == OpKind.INJECTIVE and selects_whole_rows(node, graph)
        nodes.append(FusionNode(pos, node, kind, epilogue_kind, reason, exports=exports, keeps_rows=keeps_rows,
                                is_view=is_view, row_local=row_local))
    fg = ForwardGraph(nodes, graph)
    _add_edges(fg, enclosed_gemms)
    _mark_constant_computations(fg)
    _mark_shape_computations(fg)
    return fg


def _make_opaque(fg: ForwardGraph, marked: list[bool], reason) -> None:
    """Marked nodes become opaque (reason(fnode) says why), with every edge into or out of them."""
    for fnode in fg.nodes:
        if marked[fnode.pos] and fnode.kind != OpKind.OPAQUE:
            fnode.kind = fnode.epilogue_kind = OpKind.OPAQUE
            fnode.opaque_reason = reason(fnode)
    for fnode in fg.nodes:
        for edge in fnode.outputs:
            if marked[fnode.pos] or marked[edge.dst]:
                edge.pattern = edge.epilogue = OpKind.OPAQUE


def _mark_constant_computations(fg: ForwardGraph) -> None:
    """Nodes that read only constants (initializers, or results of such nodes) compute constants.

    onnxruntime folds them once when the session loads; a kernel would recompute them on every
    call, and a group of them has no run-time input at all for TVM to build a function over."""
    graph = fg.graph
    constant_values: set[str] = set()
    marked = [False] * len(fg.nodes)
    for fnode in fg.nodes:
        node = fnode.node
        reads = graph.data_inputs(node)
        if reads and all(v in constant_values or _is_initializer(graph, v) for v in reads):
            marked[fnode.pos] = True
            constant_values.update(o for o in node.outputs if o)
    _make_opaque(fg, marked, lambda fnode: "it reads only constants; onnxruntime folds it when the session loads")


def _is_initializer(graph: Graph, name: str) -> bool:
    value = graph.values.get(name)
    return value is not None and value.is_constant


def _mark_shape_computations(fg: ForwardGraph) -> None:
    """Nodes whose results only ever feed compile-time inputs compute shapes, not data.

    onnxruntime evaluates those in microseconds; compiling them as kernels would only add work,
    and fusing them would pull run-time shape arithmetic into a group.
    """
    shape_only = [False] * len(fg.nodes)
    for fnode in reversed(fg.nodes):
        if fnode.exports or not fnode.outputs:
            continue
        if all(shape_only[e.dst] or _feeds_static(fg, fnode, e.dst) for e in fnode.outputs):
            shape_only[fnode.pos] = True
    _make_opaque(fg, shape_only, lambda fnode: (
        f"it computes a shape (for {fg.nodes[fnode.outputs[0].dst].node.label}); onnxruntime does that"))


def _feeds_static(fg: ForwardGraph, producer: FusionNode, consumer_pos: int) -> bool:
    """True when every use of `producer`'s outputs by the consumer is at a compile-time position."""
    consumer = fg.nodes[consumer_pos].node
    info = op_info(consumer.op_type, consumer.domain)
    static = set(info.static_inputs) if info else set()
    produced = set(producer.node.outputs)
    uses = [p for p, n in enumerate(consumer.inputs) if n in produced]
    return bool(uses) and all(p in static for p in uses)


def _add_edges(fg: ForwardGraph, enclosed_gemms: bool) -> None:
    graph = fg.graph
    for consumer in fg.nodes:
        node = consumer.node
        info = op_info(node.op_type, node.domain)
        static = set(info.static_inputs) if info else set()
        out_shape = graph.value(node.outputs[0]).shape if node.outputs and node.outputs[0] else None
        edges: dict[int, tuple[OpKind, OpKind]] = {}
        reads = [(p, n) for p, n in enumerate(node.inputs) if n] + [(-1, n) for n in node.implicit_inputs]
        for position, name in reads:
            value = graph.value(name)
            if value.producer is None:
                continue
            if position in static or position < 0 or consumer.kind == OpKind.OPAQUE:
                pattern = epilogue = OpKind.OPAQUE
            else:
                pattern, epilogue = consumer.kind, consumer.epilogue_kind
                same_shape = value.shape is not None and value.shape == out_shape and None not in value.shape
                if pattern == OpKind.BROADCAST and same_shape:
                    pattern = epilogue = OpKind.ELEMWISE
                if enclosed_gemms and consumer.row_local:
                    epilogue = OpKind.ELEMWISE
            src = fg.pos(value.producer)
            if src in edges:
                old_p, old_e = edges[src]
                pattern, epilogue = combine(old_p, pattern), combine(old_e, epilogue)
            edges[src] = (pattern, epilogue)
        for src, (pattern, epilogue) in edges.items():
            fg.nodes[src].outputs.append(Edge(consumer.pos, pattern, epilogue))
