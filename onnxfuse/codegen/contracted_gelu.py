"""FastGelu's inner `(C x) x + B` as one fused multiply-add where onnxruntime's C++ contracts it.

onnxruntime's FastGelu (and Gelu with approximate="tanh") computes `x ((C x) x + B)` in a plain
C++ loop before MLAS's tanh. GCC builds onnxruntime for aarch64 with `a * b + c` contracted
(sum_orders.scalar_multiply_adds_fused), so there that sum is fma(C x, x, B); on x86-64 it is a
rounded product and an add. A group model writes the chain as ONNX ops
(fusion/onnxruntime_fused_ops.fast_gelu_nodes, onnx_semantics rule 10), which import as separate
roundings: tf2onnx's Keras encoder (its GELU fused into FastGelu by onnxruntime) came out
2.4e-7 off on the arm64 onnxruntime.

So on such levels, just before import, `Add(Mul(Mul(C, x), x), B)` with FastGelu's two constants
becomes one node of our own, MultiplyAdd(C x, x) with B as an attribute, which the importer lowers
to one fused multiply-add (onnxruntime_contrib.CONVERTERS). The group model onnxruntime runs
never holds it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from tvm import te
from tvm.relax.frontend.onnx import onnx_frontend

from ..fusion.onnxruntime_fused_ops import FAST_GELU_B, FAST_GELU_C
from . import sum_orders
from .fast_math import multiply_add

MULTIPLY_ADD = "MultiplyAdd"  # our node, seen only by the importer
_DOMAIN = "ai.onnxfuse.import"


def _scalar(initializers: dict, name: str):
    tensor = initializers.get(name)
    if tensor is None or tensor.dtype != np.float32 or tensor.size != 1:
        return None
    return tensor.reshape(-1)[0]


def _other(pair, known: str) -> str | None:
    """The input of a two-input node that is not `known` (None when neither or both are)."""
    if list(pair).count(known) != 1:
        return None
    return pair[1] if pair[0] == known else pair[0]


def _contractions(model: onnx.ModelProto) -> dict[int, onnx.NodeProto]:
    """Index of each chain's Add → the MultiplyAdd that replaces it and its Mul by x."""
    graph = model.graph
    initializers = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output}
    readers: dict[str, int] = {}
    for n in graph.node:
        for name in n.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    found = {}
    for index, add in enumerate(graph.node):
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2:
            continue
        addend = next((name for name in add.input if _scalar(initializers, name) == FAST_GELU_B), None)
        squared = _other(add.input, addend) if addend else None
        product = graph.node[producer[squared]] if squared in producer else None
        if product is None or product.op_type != "Mul" or readers.get(squared) != 1 or squared in outputs:
            continue
        for scaled in product.input:
            x = _other(product.input, scaled)
            scaling = graph.node[producer[scaled]] if scaled in producer else None
            if x is None or scaling is None or scaling.op_type != "Mul":
                continue
            constant = _other(scaling.input, x)
            if constant is not None and _scalar(initializers, constant) == FAST_GELU_C:
                found[index] = (producer[squared], helper.make_node(
                    MULTIPLY_ADD, [scaled, x], list(add.output), name=f"{add.output[0]}__multiply_add",
                    domain=_DOMAIN, addend=float(FAST_GELU_B)))
                break
    return found


def contracted(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each FastGelu inner sum one MultiplyAdd node where the current level's
    onnxruntime contracts it; the same object elsewhere or when there is none."""
    if not sum_orders.current().scalar_multiply_adds_fused:
        return model
    found = _contractions(model)
    if not found:
        return model
    dropped = {mul for mul, _ in found.values()}
    nodes = [found[i][1] if i in found else n for i, n in enumerate(model.graph.node) if i not in dropped]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    return rewritten


class MultiplyAdd(onnx_frontend.OnnxOpConverter):
    """a * b + addend, one fused multiply-add (a and b of one shape)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        addend = float(attr["addend"])

        def fused(a, b):
            return te.compute(b.shape, lambda *i: multiply_add(a(*i), b(*i), te.const(addend, "float32")),
                              name="T_multiply_add")

        return bb.emit_te(fused, inputs[0], inputs[1], primfunc_name_hint="multiply_add")
