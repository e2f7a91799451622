"""ONNX-level rewrites of a group that let the kernel read its operands in place, as exporters
write cells (each measured on a PyTorch LSTMCell/GRUCell export):

1. `Gemm(x, W, b, transB=1)` (PyTorch's `nn.Linear`, `nn.LSTMCell`, `nn.GRUCell`) with W an
   initializer [out, in]: imported as it is, the kernel reads W[j, k] along the output columns it
   vectorizes over, a gather per FMA; the GEMM ran at a third of onnxruntime's speed (GRUCell at
   batch 64: 0.37x). The group gets W transposed once, as a new initializer, and transB=0: the
   kernel reads W^T[k, j] contiguously, and the copy becomes one of the kernel's own weights.
2. `Gather(state, k)` with a constant scalar index (h and c read out of a stacked state): TVM
   imports it as a `take` whose index becomes a kernel argument, read and bounds-checked at run
   time, and such a kernel gets no serial twin (compile.py). Written as `Slice(k, k+1)` then
   `Squeeze`, it is a fixed offset.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _default_domain(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx")


def _attr(node: onnx.NodeProto, name: str, default: int = 0) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _static_dims(model: onnx.ModelProto) -> dict[str, list]:
    infos = list(model.graph.input) + list(model.graph.value_info)
    return {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in infos if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}


def operands_in_place(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the rewrites above; the same object when none applies."""
    initializers = {i.name: i for i in model.graph.initializer}
    dims = _static_dims(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    new_initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    transposed: dict[str, str] = {}
    changed = False
    for index, node in enumerate(model.graph.node):
        rewrite = None
        if _default_domain(node) and node.op_type == "Gemm":
            rewrite = _gemm_weights_transposed(node, initializers, transposed, new_initializers)
        elif _default_domain(node) and node.op_type == "Gather" and opset >= 13:  # Squeeze's axes input
            rewrite = _gather_as_slice(node, initializers, dims, f"onnxfuse_gather{index}", new_initializers)
        nodes.extend(rewrite or [node])
        changed = changed or rewrite is not None
    if not changed:
        return model
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    still_read = {i for n in nodes for i in n.input}
    kept = [i for i in list(rewritten.graph.initializer) + new_initializers if i.name in still_read]
    del rewritten.graph.initializer[:]
    rewritten.graph.initializer.extend(kept)
    return rewritten


def _gemm_weights_transposed(node, initializers, transposed, new_initializers):
    if not _attr(node, "transB") or len(node.input) < 2:
        return None
    weight = initializers.get(node.input[1])
    if weight is None or len(weight.dims) != 2:
        return None
    if weight.name not in transposed:
        name = f"{weight.name}__transposed"
        array = np.ascontiguousarray(numpy_helper.to_array(weight).T)
        new_initializers.append(numpy_helper.from_array(array, name))
        transposed[weight.name] = name
    clone = onnx.NodeProto()
    clone.CopyFrom(node)
    clone.input[1] = transposed[weight.name]
    others = [a for a in clone.attribute if a.name != "transB"]
    del clone.attribute[:]
    clone.attribute.extend(others)
    return [clone]


def _gather_as_slice(node, initializers, dims, prefix: str, new_initializers):
    index = initializers.get(node.input[1])
    if index is None or len(index.dims) != 0:
        return None
    k = int(numpy_helper.to_array(index))
    axis = _attr(node, "axis")
    shape = dims.get(node.input[0])
    if shape is None or shape[axis] is None:
        return None  # TVM squeezes only an axis it can prove is 1: Slice(k, k+1) of a symbolic one is not
    if k < 0 or axis < 0:
        k = k + shape[axis] if k < 0 else k
        axis = axis + len(shape) if axis < 0 else axis
    if k < 0 or (shape is not None and shape[axis] is not None and k >= shape[axis]):
        return None  # out of range: onnxruntime rejects it, and so must the kernel
    constants = {"start": [k], "end": [k + 1], "axes": [axis]}
    for what, values in constants.items():
        new_initializers.append(numpy_helper.from_array(np.array(values, np.int64), f"{prefix}__{what}"))
    sliced = f"{prefix}__slice"
    return [
        helper.make_node("Slice", [node.input[0], f"{prefix}__start", f"{prefix}__end", f"{prefix}__axes"], [sliced],
                         name=sliced),
        helper.make_node("Squeeze", [sliced, f"{prefix}__axes"], list(node.output), name=node.name or prefix),
    ]
