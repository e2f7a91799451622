"""onnxruntime's generic float32 Sigmoid kernel, for fuzzing an ISA level this CPU's onnxruntime
does not reproduce.

On an x86-64 CPU with AVX2 and FMA, onnxruntime runs its FMA Sigmoid kernel; on one without FMA
(what the portable build's x86-64 baseline level is for) it runs its generic kernel, whose
multiplies and adds round apart and whose result is clamped to [0, 1]
(onnxfuse/codegen/sigmoid_clamp.py). The two differ by up to 6e-8 absolutely, which near x = -14
is 6% of the value, and they round to exactly 0 at different inputs. A baseline-level kernel
computes what onnxruntime computes on the CPUs it serves, so the fuzzer's reference for that
level is the original model with each Sigmoid written out as the generic kernel computes it,
in ONNX ops that round alone (Mul, Add, Div, Where): `with_generic_sigmoid`.
tests/test_sigmoid_levels.py checks that expansion against onnxruntime's own Sigmoid on an
emulated CPU without FMA, and against `generic_sigmoid` (numpy).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.codegen.fast_math import SIGMOID_CLAMP, SIGMOID_P, SIGMOID_Q


def generic_sigmoid(x: np.ndarray) -> np.ndarray:
    """onnxruntime's generic float32 Sigmoid kernel in numpy (every op rounds on its own)."""
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore"):
        v = np.where(x < -SIGMOID_CLAMP, np.float32(-SIGMOID_CLAMP), np.where(x > SIGMOID_CLAMP, np.float32(SIGMOID_CLAMP), x))
        square = v * v
        p = np.float32(SIGMOID_P[0])
        for c in SIGMOID_P[1:]:
            p = p * square + np.float32(c)
        q = np.float32(SIGMOID_Q[0])
        for c in SIGMOID_Q[1:]:
            q = q * square + np.float32(c)
        r = p * v / q + np.float32(0.5)
        return np.where(r < 0, np.float32(0), np.where(r > 1, np.float32(1), r)).astype(np.float32)


class _Writer:
    """Appends the nodes and constants of one Sigmoid's expansion, each name prefixed."""

    def __init__(self, prefix: str):
        self.prefix, self.nodes, self.constants = prefix, [], []

    def const(self, value: float) -> str:
        name = f"{self.prefix}c{len(self.constants)}"
        self.constants.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        name = f"{self.prefix}t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    def clamp(self, x: str, low: float, high: float) -> str:
        """Where(x < low, low, Where(high < x, high, x)): NaN passes (both compares are false)."""
        lo, hi = self.const(low), self.const(high)
        upper = self.op("Where", self.op("Less", hi, x), hi, x)
        return self.op("Where", self.op("Less", x, lo), lo, upper)

    def horner(self, square: str, coefficients) -> str:
        value = self.const(coefficients[0])
        for c in coefficients[1:]:
            value = self.op("Add", self.op("Mul", value, square), self.const(c))
        return value


def _expansion(node: onnx.NodeProto, index: int, float16: bool) -> tuple[list, list]:
    w = _Writer(f"_generic_sigmoid{index}_")
    x = w.op("Cast", node.input[0], to=TensorProto.FLOAT) if float16 else node.input[0]
    v = w.clamp(x, -SIGMOID_CLAMP, SIGMOID_CLAMP)
    square = w.op("Mul", v, v)
    p = w.op("Mul", w.horner(square, SIGMOID_P), v)
    ratio = w.op("Add", w.op("Div", p, w.horner(square, SIGMOID_Q)), w.const(0.5))
    result = w.clamp(ratio, 0.0, 1.0)
    last = w.nodes[-1]
    if float16:
        last = helper.make_node("Cast", [result], [node.output[0]], to=TensorProto.FLOAT16)
        w.nodes.append(last)
    else:
        last.output[0] = node.output[0]
    return w.nodes, w.constants


def with_generic_sigmoid(model: onnx.ModelProto, left_to_onnxruntime: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """`model` with each float32 or float16 Sigmoid (onnxruntime computes float16 ones in float32)
    replaced by the generic kernel's computation; other nodes untouched, and so are the Sigmoids
    whose output is in `left_to_onnxruntime`: those the fused model still runs as onnxruntime
    nodes (`sigmoids_left`), on this CPU's kernel."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.input]}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for index, node in enumerate(model.graph.node):
        dtype = types.get(node.input[0]) if node.op_type == "Sigmoid" else None
        dtype = None if node.output[0] in left_to_onnxruntime else dtype
        if dtype in (TensorProto.FLOAT, TensorProto.FLOAT16):
            nodes, constants = _expansion(node, index, dtype == TensorProto.FLOAT16)
            out.graph.node.extend(nodes)
            out.graph.initializer.extend(constants)
        else:
            out.graph.node.append(node)
    return out


def sigmoids_left(fused: onnx.ModelProto) -> frozenset[str]:
    """The outputs of the Sigmoids a fused model still runs in onnxruntime (groups that fell back,
    nodes in no group)."""
    return frozenset(n.output[0] for n in fused.graph.node if n.op_type == "Sigmoid")
