"""Step on the ModelProto before onnx-ir reads it: sparse Constant nodes become dense ones.

onnx-ir 1.1 cannot read a `sparse_value` attribute or a sparse initializer at all. Small sparse
constants are written out dense (the same tensor); a model that still holds a sparse tensor
afterwards is not canonicalized (`has_sparse_tensors`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def densify_sparse_constants(model: onnx.ModelProto, max_elements: int) -> bool:
    """Rewrite in place every Constant(sparse_value) of at most `max_elements` (dense); True if any."""
    changed = False
    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
                continue
            attr = next((a for a in node.attribute if a.name == "sparse_value"), None)
            if attr is None or int(np.prod(list(attr.sparse_tensor.dims), dtype=np.int64)) > max_elements:
                continue
            dense = numpy_helper.from_array(_to_dense(attr.sparse_tensor))
            node.attribute.remove(attr)
            node.attribute.append(helper.make_attribute("value", dense))
            changed = True
    return changed


def has_sparse_tensors(model: onnx.ModelProto) -> bool:
    for graph in _graphs(model.graph):
        if graph.sparse_initializer:
            return True
        for node in graph.node:
            if any(a.type in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS) for a in node.attribute):
                return True
    return False


def _to_dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    dims = [int(d) for d in sparse.dims]
    values = numpy_helper.to_array(sparse.values).reshape(-1)
    indices = numpy_helper.to_array(sparse.indices)
    dense = np.zeros(int(np.prod(dims, dtype=np.int64)), dtype=values.dtype)
    # Indices are either linear ([NNZ]) or one coordinate tuple per value ([NNZ, rank]).
    flat = indices.reshape(-1) if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), dims)
    dense[flat] = values
    return dense.reshape(dims)


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)
