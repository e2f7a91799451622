"""Union-find grouping driven by the post-dominator tree: TVM's GraphPartitioner, and past it.

Phase 0 fuses anchors (MatMul, Conv, ...) with their elementwise epilogues and elementwise or
broadcast ops into their post-dominators; phase 1 fuses injective ops (deferred so anchors finish
first). A node fuses into its post-dominator only if every node on every path between them passes
the phase's condition (`_check_path`): that, and merging *all* of those nodes, is what keeps groups
convex and the group graph acyclic.

Beyond TVM (each switchable in `FusionOptions`):
- split fan-out: an anchor's epilogue may pass through epilogue-safe injective ops, so
  MatMul -> Split -> gates -> Mul/Add is one group;
- multi-anchor: a second anchor may join a group that already has one when they meet at an
  elementwise sink (the two MatMuls of a GRU/LSTM cell);
- view prologues: an op that selects whole rows of its input at a constant offset (h and c
  gathered out of a stacked state, forward_graph.selects_whole_rows) joins the anchored group
  that reads it;
- enclosed GEMMs: a GEMM by constant weights (row-local: row i of its output needs row i of
  its input only) that lies *between* another such GEMM and that GEMM's post-dominator joins
  their group (a GRU cell's W_hn (r * h) with linear_before_reset=0; the steps of an unrolled
  cell loop). Anchors in sequence, where the later one is the post-dominator itself (an MLP),
  stay apart in the phases as in TVM (GEMM chains below join them), and so does a
  transformer's LayerNorm → FFN → residual Add (its enclosing anchor is a LayerNorm);
- injective into reduce: injective chains may end in a reduction (a tree ensemble's leaf gather
  feeding its mean over trees);
- row reductions: a reduction that keeps the batch axis takes its elementwise and broadcast
  consumers up to its post-dominator, and the row reductions on the way, so a LayerNorm or a
  softmax written as plain ops is one group (TVM never fuses a reduction's result);
- reduction epilogues: an anchor's epilogue may end in a row reduction that post-dominates it
  through elementwise and broadcast ops only (Hummingbird's per-tree leaf values, one-hot times
  values summed over the leaves; an MLP's ArgMax), which TVM leaves to a group of its own;
- row prologues: a group of row-local ops (elementwise, broadcast, row reductions: a LayerNorm)
  whose results are read by one row-local GEMM alone, as its data operand, joins that GEMM's
  group after both phases. A row tile of the kernel computes its rows of the prologue, then
  multiplies them: one call instead of two, and the prologue's result never goes to memory;
- GEMM chains: the same for a group whose anchors are row-local GEMMs (an MLP's first layer with
  its activation): the hidden layer of a row tile stays in cache (schedule.py materialises a
  GEMM's computed operand per row tile rather than inlining it);
- view epilogues: a group that only moves whole rows of data (forward_graph.moves_whole_rows:
  reshapes, row selections, transposes whose last axis is static or stays last) and reads nothing but one
  anchored group's results (and constants) joins that group, as further outputs. PyTorch's
  nn.MultiheadAttention projects q, k and v with one MatMul and then takes each apart with
  Gather, Reshape and Transpose into heads; the three branches never rejoin before the attention
  products, so each was a group of its own that `auto` leaves to onnxruntime (a kernel that
  only copies is no faster), and the projection's result went to memory once more for each.
  The group graph stays acyclic: the view group's every input comes from the anchored group, so
  no path leaves that group and comes back through the view group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..frontend.validate import tensor_bytes
from ..ops import OpKind, combine
from .forward_graph import ForwardGraph, moves_whole_rows
from .postdom import DomNode

GROUP_WEIGHT_LIMIT = 512 * 2**20
"""A group whose weights take more bytes stays with onnxruntime (pipeline.py): compiling it would
serialize its weights into the group model, hash them, send them to a worker and load them into a
verifying onnxruntime session, several copies of a tensor that may be most of the model. So no row
prologue or GEMM chain is joined past it: the prologue would go back to onnxruntime with the GEMM."""


def weight_bytes(graph, names) -> int:
    """Bytes of the initializers among the value `names` of `graph` (one scope): the weights a
    kernel over them holds, which GROUP_WEIGHT_LIMIT bounds."""
    tensors = [graph.value(name).initializer for name in set(names) if name]
    return sum(tensor_bytes(t) or 0 for t in tensors if t is not None)


@dataclass(frozen=True)
class FusionOptions:
    max_depth: int = 256
    """At most this many ops in one group (TVM's max_fuse_depth)."""
    max_inputs: int = 64
    """At most this many distinct input values (weights included) in one group."""
    max_duplication: int = 1
    """At most this many copies of one producer's expression in a kernel (XLA's duplication bound):
    a value read by more ops inside a group is computed once into a tile-local buffer. Applied by
    code generation; it is what keeps deep tree chains from exploding."""
    split_fanout: bool = True
    multi_anchor: bool = True
    injective_into_reduce: bool = True
    row_reductions: bool = True
    view_prologues: bool = True
    enclosed_gemms: bool = True
    row_prologues: bool = True
    gemm_chains: bool = True
    view_epilogues: bool = True
    reduction_epilogues: bool = True

    def __post_init__(self) -> None:
        for name in ("max_depth", "max_inputs", "max_duplication"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


@dataclass
class Group:
    pattern: OpKind  # TVM's group pattern: the root op's, raised when an anchor joins
    epilogue: OpKind  # the max epilogue kind over members
    epilogue_around: OpKind  # the same with row-local GEMMs left out: what an enclosing anchor passes
    members: list[int] = field(default_factory=list)
    anchored: bool = False
    keeps_rows: bool = True  # every reduction in the group keeps the batch axis
    view: bool = False  # every member selects whole rows of its input (a state read)
    gemm_anchored: bool = True  # every anchor in it is a row-local GEMM (none counts)
    parent: Group | None = None

    def root(self) -> Group:
        node = self
        while node.parent is not None:
            node = node.parent
        while self.parent is not None:  # path compression
            self.parent, self = node, self.parent
        return node


class Partitioner:
    def __init__(self, fg: ForwardGraph, tree: list[DomNode], options: FusionOptions):
        self.fg, self.tree, self.options = fg, tree, options
        self.groups = [
            Group(n.kind, n.epilogue_kind, OpKind.ELEMWISE if n.row_local else n.epilogue_kind, [n.pos],
                  anchored=n.kind == OpKind.OUT_EWISE_FUSABLE,
                  keeps_rows=n.kind != OpKind.COMM_REDUCE or n.keeps_rows, view=n.is_view,
                  gemm_anchored=n.kind != OpKind.OUT_EWISE_FUSABLE or n.row_local)
            for n in fg.nodes
        ]
        self.reasons: dict[int, str] = {}

    def run(self) -> list[Group]:
        for phase in (0, 1):
            for pos in range(len(self.fg.nodes)):
                self._try_fuse(pos, phase)
        if self.options.row_prologues:
            self._fuse_row_prologues()
        if self.options.view_epilogues:
            self._fuse_view_epilogues()
        return [g.root() for g in self.groups]

    # -- view epilogues ----------------------------------------------------------------------------
    def _fuse_view_epilogues(self) -> None:
        """Each group that only moves whole rows of one anchored group's results merges into it
        (module doc)."""
        self._merge_each_into(self._viewed_group)

    def _viewed_group(self, group: Group) -> Group | None:
        """The anchored group whose results alone `group` reads (besides constants), when every
        op of `group` moves whole rows (forward_graph.moves_whole_rows says which, and why);
        else None."""
        members = set(group.members)
        if not members or any(self.fg.nodes[m].kind != OpKind.INJECTIVE
                               or not moves_whole_rows(self.fg.nodes[m].node, self.fg.graph) for m in members):
            return None
        produced_inside = {o for m in members for o in self.fg.nodes[m].node.outputs if o}
        sources: dict[int, Group] = {}
        for name in {i for m in members for i in self.fg.nodes[m].node.inputs if i and i not in produced_inside}:
            value = self.fg.graph.value(name)
            if value.is_constant:
                continue
            if value.producer is None:
                return None  # a graph input
            source = self.groups[self.fg.pos(value.producer)].root()
            sources[id(source)] = source
        if len(sources) != 1:
            return None
        (target,) = sources.values()
        return target if target.anchored and target is not group else None

    # -- row prologues ---------------------------------------------------------------------------
    def _fuse_row_prologues(self) -> None:
        """Each group that qualifies (module doc) merges into the group of the GEMM it feeds. The
        group graph stays acyclic: every edge out of the prologue ends at that GEMM, so no path
        leaves the merged group and comes back."""
        self._merge_each_into(self._prologue_of)

    def _merge_each_into(self, target_of) -> None:
        """Merges each group into the group `target_of` names for it (None: none), unless the
        merged group would pass the depth, input or weight bounds."""
        for group in {id(g.root()): g.root() for g in self.groups}.values():
            target = target_of(group)
            if target is None:
                continue
            members = group.members + target.members
            if self._bound_exceeded(members) or self._weight_bytes(members) > GROUP_WEIGHT_LIMIT:
                continue
            self._merge(group, target)

    def _row_local(self, pos: int) -> bool:
        """Row i of the op's result needs row i of its operands only, and it is no graph output."""
        fnode = self.fg.nodes[pos]
        gemm = self.options.gemm_chains and fnode.row_local
        return not fnode.exports and (fnode.kind <= OpKind.BROADCAST or fnode.keeps_rows or gemm)

    def _prologue_of(self, group: Group) -> Group | None:
        """The group of the row-local GEMM that alone reads `group`'s results as its data
        operand, when `group` is a row-local prologue (or, with gemm_chains, a row-local GEMM
        with its epilogue); else None."""
        members = set(group.members)
        if (group.anchored and not self.options.gemm_chains) or not all(self._row_local(m) for m in members):
            return None
        readers = {e.dst for m in members for e in self.fg.nodes[m].outputs if e.dst not in members}
        if len(readers) != 1:
            return None
        gemm = readers.pop()
        fnode = self.fg.nodes[gemm]
        target = self.groups[gemm].root()
        if not fnode.row_local or not target.anchored:
            return None
        produced = {o for m in members for o in self.fg.nodes[m].node.outputs if o}
        operands = fnode.node.inputs
        if operands[0] not in produced or any(name in produced for name in operands[1:]):
            return None
        return target

    # -- one node, one phase -------------------------------------------------------------------
    def _try_fuse(self, pos: int, phase: int) -> None:
        fnode, group, dom = self.fg.nodes[pos], self.groups[pos], self.tree[pos]
        if group.pattern == OpKind.OPAQUE:
            self.reasons[pos] = f"opaque: {fnode.opaque_reason}"
            return
        if dom.parent is None:
            self.reasons[pos] = self._no_dominator_reason(pos)
            return
        sink = dom.parent
        if self.groups[sink].root() is group.root():
            return
        if group.pattern == OpKind.OUT_EWISE_FUSABLE:
            if phase == 0:
                self._fuse_anchor(pos, sink, dom)
        elif group.pattern <= OpKind.BROADCAST:
            self._fuse_elementwise(pos, sink, dom)
        elif group.pattern == OpKind.INJECTIVE:
            if phase == 1:
                self._fuse_injective(pos, sink)
        elif not self.options.row_reductions:
            self.reasons[pos] = "a reduction's result is not fused into its consumers"
        elif phase == 0:
            self._fuse_row_reduction(pos, sink)

    def _fuse_anchor(self, pos: int, sink: int, dom: DomNode) -> None:
        if self.fg.nodes[sink].kind == OpKind.OUT_EWISE_FUSABLE:
            self.reasons[pos] = (f"{self._op(pos)}'s post-dominator {self._label(sink)} is another anchor: "
                                 f"anchors in sequence stay apart")
            return
        edge = dom.epilogue if self.options.split_fanout else dom.pattern
        if edge == OpKind.COMM_REDUCE and self.options.reduction_epilogues and self._is_row_reduction(sink):
            self._fuse_if_path(pos, sink, lambda root, is_sink: root.pattern == OpKind.COMM_REDUCE and not root.anchored
                               if is_sink else root.pattern <= OpKind.BROADCAST)
            return
        if edge != OpKind.ELEMWISE:
            self.reasons[pos] = (
                f"{self._op(pos)} absorbs only elementwise consumers; the way to its "
                f"post-dominator {self._label(sink)} is of kind {edge.label}"
            )
            return
        sink_root = self.groups[sink].root()
        encloses = self.options.enclosed_gemms and self.groups[pos].root().gemm_anchored

        def allowed(root: Group, is_sink: bool) -> bool:
            kind = root.epilogue if self.options.split_fanout else combine(root.pattern, root.epilogue)
            if kind <= OpKind.BROADCAST:
                return True
            if encloses and not is_sink and root.gemm_anchored and root.epilogue_around <= OpKind.BROADCAST:
                return True  # a row-local GEMM between a GEMM and its post-dominator
            return self.options.multi_anchor and root is sink_root and root.anchored
        self._fuse_if_path(pos, sink, allowed)

    def _fuse_elementwise(self, pos: int, sink: int, dom: DomNode) -> None:
        def allowed(root: Group, is_sink: bool) -> bool:
            return root.pattern != OpKind.OPAQUE if is_sink else root.pattern <= OpKind.INJECTIVE

        if not (dom.pattern <= OpKind.INJECTIVE or dom.pattern == OpKind.COMM_REDUCE):
            _, blocker = self._walk_paths(pos, sink, allowed)
            if blocker is not None and blocker != sink:
                self.reasons[pos] = self._cycle_reason(blocker, sink)
            else:
                self.reasons[pos] = (
                    f"its post-dominator {self._label(sink)} is reached through an edge of kind {dom.pattern.label}"
                )
            return
        self._fuse_if_path(pos, sink, allowed)

    def _fuse_injective(self, pos: int, sink: int) -> None:
        into_reduce = self.options.injective_into_reduce
        sink_root = self.groups[sink].root()
        view = self.options.view_prologues and self.groups[pos].root().view

        def allowed(root: Group, is_sink: bool) -> bool:
            if root.pattern <= OpKind.INJECTIVE:
                return True
            if view and root is sink_root and root.anchored:
                return True  # a state read: its readers are all in the anchored group already
            return is_sink and into_reduce and root.pattern == OpKind.COMM_REDUCE and not root.anchored
        self._fuse_if_path(pos, sink, allowed)

    def _fuse_row_reduction(self, pos: int, sink: int) -> None:
        if not self.groups[pos].root().keeps_rows:
            self.reasons[pos] = "it reduces over the batch axis: its result is not fused into its consumers"
            return

        def allowed(root: Group, is_sink: bool) -> bool:
            if root.anchored or root.pattern == OpKind.OPAQUE:
                return False
            return root.keeps_rows if root.pattern == OpKind.COMM_REDUCE else root.pattern <= OpKind.BROADCAST
        self._fuse_if_path(pos, sink, allowed)

    def _is_row_reduction(self, pos: int) -> bool:
        """A reduction that keeps the batch axis: an anchor's epilogue may end in it (reduction
        epilogues)."""
        fnode = self.fg.nodes[pos]
        return fnode.kind == OpKind.COMM_REDUCE and fnode.keeps_rows

    # -- the path check and the commit ----------------------------------------------------------
    def _fuse_if_path(self, src: int, sink: int, allowed) -> None:
        on_path, blocker = self._walk_paths(src, sink, allowed)
        if blocker is not None:
            self.reasons[src] = (
                self._cycle_reason(blocker, sink)
                if blocker != sink else f"its post-dominator {self._label(sink)} cannot take it"
            )
            return
        roots = {id(r): r for r in (self.groups[p].root() for p in on_path | {src, sink})}
        exceeded = self._bound_exceeded([m for r in roots.values() for m in r.members])
        if exceeded:
            self.reasons[src] = exceeded
            return
        target = self.groups[sink].root()
        for root in roots.values():
            self._merge(root, target)

    def _walk_paths(self, src: int, sink: int, allowed) -> tuple[set[int], int | None]:
        """Every node on a path src → sink (excluding src), or the first node that fails `allowed`.

        An opaque edge (into a compile-time input) on the way fails too: it is not dataflow.
        """
        seen: set[int] = set()
        stack = [(src, e) for e in self.fg.nodes[src].outputs]
        while stack:
            frm, edge = stack.pop()
            if edge.pattern == OpKind.OPAQUE:
                return seen, edge.dst
            node = edge.dst
            if node in seen:
                continue
            seen.add(node)
            root = self.groups[node].root()
            if not allowed(root, node == sink):
                return seen, node
            if node != sink:
                stack.extend((node, e) for e in self.fg.nodes[node].outputs)
        return seen, None

    def _merge(self, child: Group, parent: Group) -> None:
        child, parent = child.root(), parent.root()
        if child is parent:
            return
        parent.members.extend(child.members)
        child.members = []
        child.parent = parent
        parent.epilogue = combine(parent.epilogue, child.epilogue)
        parent.epilogue_around = combine(parent.epilogue_around, child.epilogue_around)
        parent.keeps_rows = parent.keeps_rows and child.keeps_rows
        parent.view = parent.view and child.view
        parent.gemm_anchored = parent.gemm_anchored and child.gemm_anchored
        if child.pattern == OpKind.COMM_REDUCE and not child.anchored:  # a row reduction's group
            parent.pattern = combine(parent.pattern, child.pattern)
        if child.anchored:
            parent.anchored = True
            parent.pattern = combine(parent.pattern, child.pattern)

    # -- reporting helpers -------------------------------------------------------------------------
    def _distinct_inputs(self, members: list[int]) -> int:
        nodes = [self.fg.nodes[m].node for m in members]
        produced = {o for n in nodes for o in n.outputs}
        return len({i for n in nodes for i in n.inputs if i and i not in produced})

    def _bound_exceeded(self, members: list[int]) -> str | None:
        """Why a group of these members would pass max_depth or max_inputs, or None."""
        if len(members) > self.options.max_depth:
            return f"depth bound: the group would have {len(members)} ops > max depth {self.options.max_depth}"
        inputs = self._distinct_inputs(members)
        if inputs > self.options.max_inputs:
            return f"input bound: the group would read {inputs} values > max inputs {self.options.max_inputs}"
        return None

    def _weight_bytes(self, members: list[int]) -> int:
        """Bytes of the constant tensors (initializers) the members read."""
        return weight_bytes(self.fg.graph, [i for m in members for i in self.fg.nodes[m].node.inputs])

    def _no_dominator_reason(self, pos: int) -> str:
        fnode = self.fg.nodes[pos]
        if not fnode.outputs:
            return "it produces only graph outputs; nothing after it to fuse with"
        return "its results flow to several places that never rejoin (no post-dominator)"

    def _cycle_reason(self, blocker: int, sink: int) -> str:
        return (
            f"would create a cycle: {self._label(blocker)} lies between it and "
            f"{self._label(sink)} and cannot join"
        )

    def _op(self, pos: int) -> str:
        return self.fg.nodes[pos].node.op_type

    def _label(self, pos: int) -> str:
        return self.fg.nodes[pos].node.label
