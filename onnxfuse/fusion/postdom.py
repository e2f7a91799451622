"""The post-dominator tree, built by least-common-ancestor walks as in TVM's DominatorTree.

Nodes are visited in reverse topological order; a node's immediate post-dominator is the LCA (in
the tree built so far) of all its consumers. Along the walk we combine the patterns of every edge
and tree node passed, so each node also knows the "hardest" pattern between it and its
post-dominator — the fact the fusion phases decide on. Two patterns are tracked: the plain one,
and the epilogue one in which epilogue-safe injective ops (Split, Slice, Reshape) count as
elementwise.

One deliberate difference from TVM: a node whose result is a graph output but is also consumed
keeps its post-dominator (the group then exports that value); only a node with no consumers at all
is a root. This is what lets an LSTM cell, whose c' is both an output and an input of h', fuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ops import OpKind, combine
from .forward_graph import ForwardGraph

Patterns = tuple[OpKind, OpKind]  # (pattern, epilogue pattern)


@dataclass(frozen=True)
class DomNode:
    parent: int | None  # position of the immediate post-dominator; None for a root
    depth: int
    pattern: OpKind
    epilogue: OpKind


def _merge(a: Patterns, b: Patterns) -> Patterns:
    return combine(a[0], b[0]), combine(a[1], b[1])


def post_dominator_tree(fg: ForwardGraph) -> list[DomNode]:
    tree: list[DomNode | None] = [None] * len(fg.nodes)

    def own(pos: int) -> Patterns:
        node = tree[pos]
        return node.pattern, node.epilogue

    def lca(a: int | None, b: int | None, acc: Patterns) -> tuple[int | None, Patterns]:
        while a != b:
            if a is None or b is None:
                return None, acc
            da, db = tree[a].depth, tree[b].depth
            if da < db:
                acc, b = _merge(acc, own(b)), tree[b].parent
            elif db < da:
                acc, a = _merge(acc, own(a)), tree[a].parent
            else:
                acc = _merge(_merge(acc, own(a)), own(b))
                a, b = tree[a].parent, tree[b].parent
        return a, acc

    for pos in reversed(range(len(fg.nodes))):
        edges = fg.nodes[pos].outputs
        if not edges:
            tree[pos] = DomNode(None, 1, OpKind.OPAQUE, OpKind.OPAQUE)
            continue
        acc: Patterns = (OpKind.ELEMWISE, OpKind.ELEMWISE)
        parent: int | None = edges[0].dst
        acc = _merge(acc, (edges[0].pattern, edges[0].epilogue))
        for edge in edges[1:]:
            parent, acc = lca(parent, edge.dst, acc)
            acc = _merge(acc, (edge.pattern, edge.epilogue))
        depth = tree[parent].depth + 1 if parent is not None else 1
        tree[pos] = DomNode(parent, depth, acc[0], acc[1])
    return tree  # type: ignore[return-value]
