"""ONNX-level rewrite of a group: int64 lookup tables stored as uint32, widened after the lookup.

Tree programs (Hummingbird's tree_trav, perf_tree_trav) keep their node tables as int64
initializers (feature ids, left and right children) and read them only through Gather. Each
walk step loads a few entries at data-dependent positions, so the tables' size is the working
set the kernel keeps in cache: a 100-tree depth-8 tree_trav reads 1.2 MB of int64 tables where
32 bits hold the same values in half. onnxruntime's TreeEnsemble keeps compact node records.

A constant int64 table (an initializer of rank >= 1, not a graph input or output) read only as
the *data* of Gather or GatherElements, whose values all lie in [0, 2^32), becomes a uint32
initializer, and each lookup `Gather(T, i)` becomes `Cast(Gather(T32, i), to=int64)`. The values
are integers, so the widened result is the same bits; the indices, and so the kernel's index
checks (bounds.py), are untouched. The uint32 copy becomes one of the kernel's own weights
(relax_import maps a lifted constant with no initializer of the same contents to an extra
weight), as operand_layout's transposed weights do.

Why uint32 and nothing else, measured on the 100-tree depth-8 forests (docs/benchmarks.md,
"Trees"): the widening is then a zero-extending load, whose value LLVM knows is >= 0, so when it
indexes the next lookup, that lookup's negative-index wrap (`i < 0 ? i + n : i`) and the lower
half of its index check fold away (the one-row kernels: tree_trav 436 -> 381 instructions,
perf_tree_trav 425 -> 399); both programs ran 3-9% faster at batch 1 and 20-26% at 1,000 and
10,000 rows. The same tables as int32 (a sign-extending load, the same instruction count as
int64) ran 2-3% *slower* at batch 1, perf_tree_trav 2-4% slower at every batch: half the bytes
alone did not pay. So tables with a negative value stay int64.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LOOKUPS = frozenset({"Gather", "GatherElements"})
_UINT32 = np.iinfo(np.uint32)


def _is_lookup(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in LOOKUPS


def _has_subgraph(model: onnx.ModelProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for n in model.graph.node for a in n.attribute)


def narrowable_tables(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The int64 tables this rewrite narrows, as uint32 arrays by initializer name."""
    g = model.graph
    if _has_subgraph(model):  # a body may read a table by name: not worth following
        return {}
    interface = {v.name for v in list(g.input) + list(g.output)}
    candidates = {t.name: t for t in g.initializer
                  if t.data_type == TensorProto.INT64 and len(t.dims) >= 1 and t.name not in interface}
    read = set()
    for node in g.node:
        for position, name in enumerate(node.input):
            if name not in candidates:
                continue
            if _is_lookup(node) and position == 0:
                read.add(name)
            else:
                candidates.pop(name)
    narrowed = {}
    for name in [t.name for t in g.initializer if t.name in read and t.name in candidates]:  # model order
        array = numpy_helper.to_array(candidates[name])
        if array.size and array.min() >= 0 and array.max() <= _UINT32.max:
            narrowed[name] = array.astype(np.uint32)
    return narrowed


def narrowed_tables(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its narrowable tables (see the module doc) stored as uint32; the same object
    when there are none."""
    tables = narrowable_tables(model)
    if not tables:
        return model
    narrow_names = {name: f"{name}__uint32" for name in tables}
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(model.graph.node):
        if not (_is_lookup(node) and node.input and node.input[0] in tables):
            nodes.append(node)
            continue
        narrow_out = f"{node.output[0]}__narrow"
        lookup = onnx.NodeProto()
        lookup.CopyFrom(node)
        lookup.input[0] = narrow_names[node.input[0]]
        lookup.output[0] = narrow_out
        widen_name = f"{node.name or f'lookup{index}'}__widen"
        nodes += [lookup, helper.make_node("Cast", [narrow_out], [node.output[0]], name=widen_name,
                                           to=TensorProto.INT64)]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    kept = [t for t in rewritten.graph.initializer if t.name not in tables]
    kept += [numpy_helper.from_array(array, narrow_names[name]) for name, array in tables.items()]
    del rewritten.graph.initializer[:]
    rewritten.graph.initializer.extend(kept)
    return rewritten
