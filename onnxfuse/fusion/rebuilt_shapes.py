"""Target shapes a kernel can rebuild from its own inputs' dims.

Hummingbird's tree_trav broadcasts each tree's root index to every row with
`Expand(offsets, Concat(Slice(Shape(X), 0, 1), [T]))`: onnxruntime computes the shape at run
time, so the Expand could not join the tree walk's kernel, and at batch 1 its four small nodes
cost about a third of onnxruntime's TreeEnsemble op's whole call (docs/benchmarks.md, "Trees").
Shape inference knows that shape symbolically, `['N', T]`, and N is a dim of the graph input X.
So the group's model computes the shape itself from X's Shape (`shape_nodes`), the Expand joins
the kernel (TVM folds the shape into the kernel's symbolic dims), and the nodes left in
onnxruntime read by nothing any more are dropped when the model is written (package.py).

Only an Expand is rebuilt this way: its output shape is the broadcast of its input's and the
target's, so a target equal to the inferred output shape gives the same result whenever the
original ran. A symbol is taken from a graph input of the same graph, whose dims the kernel's
caller binds and checks on every call (onnxfuse_runtime.c).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..ir import Dim, Graph

REBUILT_SHAPE_OPS = frozenset({"Expand"})
MIN_OPSET = 10  # Slice takes its starts and ends as inputs


def dim_sources(graph: Graph, shape: tuple[Dim, ...] | None) -> dict[str, tuple[str, int]] | None:
    """For each symbolic dim of `shape`, a graph input and axis that carry it; None when a dim is
    unknown, no graph input carries one, or the graph's opset is too old for shape_nodes."""
    if shape is None or graph.opsets.get("", 1) < MIN_OPSET:
        return None
    sources: dict[str, tuple[str, int]] = {}
    for dim in shape:
        if isinstance(dim, int):
            continue
        if dim is None:
            return None
        source = next(((name, axis) for name in graph.inputs for axis, d in enumerate(graph.value(name).shape or ())
                       if d == dim), None)
        if source is None:
            return None
        sources[dim] = source
    return sources


def rebuildable(graph: Graph, op_type: str, shape: tuple[Dim, ...] | None) -> bool:
    """Whether a node of `op_type` with this output shape can take its target shape from
    shape_nodes instead of its computed shape input."""
    return op_type in REBUILT_SHAPE_OPS and dim_sources(graph, shape) is not None


def shape_nodes(name: str, shape: tuple[Dim, ...], sources: dict[str, tuple[str, int]],
                ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing `shape` as a 1-D int64 tensor called `name`: each symbolic dim a slice of
    its source's Shape, each static one a constant, concatenated; and the constants they read."""
    nodes, constants, parts = [], [], []

    def constant(suffix: str, values: list[int]) -> str:
        tensor = numpy_helper.from_array(np.array(values, dtype=np.int64), f"{name}__{suffix}")
        constants.append(tensor)
        return tensor.name

    for position, dim in enumerate(shape):
        if isinstance(dim, int):
            parts.append(constant(f"dim{position}", [dim]))
            continue
        source, axis = sources[dim]
        whole = f"{name}__shape{position}"
        part = f"{name}__dim{position}"
        nodes.append(helper.make_node("Shape", [source], [whole]))
        nodes.append(helper.make_node("Slice", [whole, constant(f"start{position}", [axis]),
                                                constant(f"end{position}", [axis + 1])], [part]))
        parts.append(part)
    nodes.append(helper.make_node("Concat", parts, [name], axis=0))
    return nodes, constants
