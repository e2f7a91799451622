"""float16 ops computed where onnxruntime computes them: in float32, rounded only where its float16
values are rounded.

Why: onnxruntime's CPU provider has no float16 kernel for most arithmetic (Add, Mul, Div, Exp,
Where, MatMul, reductions...). Its InsertCastTransformer casts the inputs of such a node to
float32, runs the float32 kernel and casts the result back; then it removes each
`Cast(float32 -> float16) -> Cast(float16 -> float32)` pair between two such nodes. A chain
of float16 Mul -> Mul is therefore computed in float32 and rounded to float16 once, at its end
(measured, onnxruntime 1.32: `(a * b) * a` over 256 random float16 elements equals the float32
chain rounded once everywhere, and differs from per-op float16 rounding in 72). TVM computes
each float16 op in float16 (LLVM rounds after every op), so the kernel differed in the last bit.

The rewrite does what onnxruntime does, in plain ONNX before import: a node of FLOAT32_OPS with
float16 inputs or outputs reads float32 operands (the unrounded float32 result of its producer
when that is such a node too, else a Cast of the float16 value) and computes in float32; its
float16 output is a Cast of that result, which what reads float16 (a node with a float16
kernel, a group output) reads. INTERNALLY_FLOAT32 ops have a float16 kernel that converts its
float16 inputs to float32 and computes in float32: they read rounded operands and always round.

The lists were measured on onnxruntime 1.32's x86-64 CPU provider (a one-node float16 model:
does the session's optimized model hold inserted Casts). Ops in neither list (data movement,
Max, Min, Clip, Round, Sign, Cast) have float16 kernels, which TVM's float16 code matches
exactly. onnxruntime built with float16 arithmetic kernels (some ARM builds) rounds more often.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

FLOAT32_OPS = frozenset(
    "Abs Neg Relu Floor Ceil Sqrt Reciprocal Exp Log Tanh Sigmoid Erf Softplus Sin Cos Elu LeakyRelu HardSigmoid "
    "Add Sub Mul Div Pow Sum Mean Where Equal Less Greater LessOrEqual GreaterOrEqual "
    "ReduceSum ReduceMean ReduceMax ReduceMin Softmax LogSoftmax MatMul Gemm".split())
INTERNALLY_FLOAT32 = frozenset({"LayerNormalization"})
_F16, _F32 = TensorProto.FLOAT16, TensorProto.FLOAT


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    graph = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
    types.update({i.name: i.data_type for i in graph.initializer})
    return types


def _computed_in_float32(node, types) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in FLOAT32_OPS | INTERNALLY_FLOAT32:
        return False
    return any(types.get(v) == _F16 for v in list(node.input) + list(node.output) if v)


def computed_as_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with float16 arithmetic in float32 where onnxruntime computes it so (module doc);
    the same object when it has none."""
    if not any(n.op_type in FLOAT32_OPS | INTERNALLY_FLOAT32 for n in model.graph.node):
        return model
    types = _elem_types(model)
    if not any(_computed_in_float32(n, types) for n in model.graph.node):
        return model
    unrounded: dict[str, str] = {}  # float16 value -> its float32 value before rounding
    widened: dict[str, str] = {}  # float16 value -> Cast of it to float32
    nodes: list[onnx.NodeProto] = []

    def float32_of(name: str, rounded: bool) -> str:
        if not rounded and name in unrounded:
            return unrounded[name]
        if name not in widened:
            widened[name] = f"{name}__onnxfuse_f32"
            nodes.append(helper.make_node("Cast", [name], [widened[name]], name=widened[name], to=_F32))
        return widened[name]

    for node in model.graph.node:
        if not _computed_in_float32(node, types):
            nodes.append(node)
            continue
        internally = node.op_type in INTERNALLY_FLOAT32
        wide = onnx.NodeProto()
        wide.CopyFrom(node)
        wide.input[:] = [float32_of(i, internally) if i and types.get(i) == _F16 else i for i in node.input]
        narrow_outputs = [o for o in node.output if types.get(o) == _F16]
        wide.output[:] = [f"{o}__onnxfuse_unrounded" if o in narrow_outputs else o for o in node.output]
        nodes.append(wide)
        for o in narrow_outputs:
            nodes.append(helper.make_node("Cast", [f"{o}__onnxfuse_unrounded"], [o], name=f"{o}__onnxfuse_round", to=_F16))
            if not internally:
                unrounded[o] = f"{o}__onnxfuse_unrounded"
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    return rewritten
