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

One more case: onnxruntime also runs a node that has a float16 kernel (ISOLATABLE_OPS) in
float32, on its unrounded operands, when it sits between such float32 nodes (measured: Mul ->
Max -> Mul computes the Max on the float32 product): when it produces no graph output, every
node reading its float16 outputs has no float16 kernel, and at least one of its float16
operands comes from a node computed in float32. A Max -> Max -> Mul after a Mul keeps both
Max in float16 (the first is read by a float16 kernel, the second by none computed in float32),
and so does a Max reading only graph inputs or a Round of them. A group output stands for a
graph output here (what reads it outside the group is not known).

Casts in the model take part too: onnxruntime removes a model's `Cast(float32 -> float16)`
together with the Cast it inserts after it, so a float32-computed node reading a Cast of a
float32 value reads that value unrounded (measured: `Cast(x) -> Softplus` computes on x, also
when the Cast's output is read by a float16 kernel or is a graph output, which then get it
rounded). Likewise a model's `Cast(float16 -> float32 or float64)` of a float32-computed value
casts the unrounded value, unless that value is a graph output.

The lists were measured on onnxruntime 1.32's x86-64 CPU provider, at its default optimization
level (a float16 model of one node, or of the chains above: does the session's optimized model
hold inserted Casts). Ops in neither list have float16 kernels, which TVM's float16 code matches
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
ISOLATABLE_OPS = frozenset(
    "Max Min Clip Round Sign Transpose Reshape Concat Slice Gather GatherElements Expand Squeeze Unsqueeze "
    "Flatten LayerNormalization".split())
_F16, _F32 = TensorProto.FLOAT16, TensorProto.FLOAT
_FLOAT32, _INTERNAL = "float32", "internal"  # how a node computes: on unrounded / on rounded operands
_NARROWING, _WIDENING = "narrowing", "widening"  # a model's Cast to float16 / from float16 to a wider float
_WIDER = (TensorProto.FLOAT, TensorProto.DOUBLE)


def _cast_to(node) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    graph = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
    types.update({i.name: i.data_type for i in graph.initializer})
    return types


def _touches_float16(node, types) -> bool:
    return node.domain in ("", "ai.onnx") and any(types.get(v) == _F16 for v in list(node.input) + list(node.output) if v)


def _modes(model: onnx.ModelProto, types) -> dict[int, str]:
    """Node index -> _FLOAT32 or _INTERNAL for the nodes onnxruntime computes in float32, and
    _NARROWING / _WIDENING for the model's Casts whose rounding it removes."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    modes: dict[int, str] = {}
    computed_by: dict[str, str] = {}  # value -> mode of its producer
    for index, n in enumerate(graph.node):
        if not _touches_float16(n, types):
            continue
        narrow_in = [i for i in n.input if i and types.get(i) == _F16]
        narrow_out = [o for o in n.output if types.get(o) == _F16]
        if _cast_to(n) == _F16 and types.get(n.input[0]) == _F32:
            modes[index] = _NARROWING
            continue
        if (_cast_to(n) in _WIDER and computed_by.get(n.input[0]) == _FLOAT32 and n.input[0] not in outputs):
            modes[index] = _WIDENING
            continue
        if n.op_type in FLOAT32_OPS:
            mode = _FLOAT32
        elif (n.op_type in ISOLATABLE_OPS and not outputs & set(n.output)
              and all(c.op_type in FLOAT32_OPS and c.domain in ("", "ai.onnx") for o in narrow_out for c in consumers.get(o, []))
              and any(computed_by.get(i) == _FLOAT32 for i in narrow_in)):
            mode = _FLOAT32
        elif n.op_type in INTERNALLY_FLOAT32:
            mode = _INTERNAL
        else:
            continue
        modes[index] = mode
        for o in n.output:
            computed_by[o] = mode
    return modes


def computed_as_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with float16 arithmetic in float32 where onnxruntime computes it so (module doc);
    the same object when it has none."""
    if not any(n.op_type in FLOAT32_OPS | INTERNALLY_FLOAT32 for n in model.graph.node):
        return model
    types = _elem_types(model)
    modes = _modes(model, types)
    if not modes:
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

    for index, node in enumerate(model.graph.node):
        mode = modes.get(index)
        if mode is None or mode == _NARROWING:
            nodes.append(node)
            if mode == _NARROWING:
                unrounded[node.output[0]] = node.input[0]
            continue
        if mode == _WIDENING:
            wide = onnx.NodeProto()
            wide.CopyFrom(node)
            wide.input[0] = unrounded[node.input[0]]
            nodes.append(wide)
            continue
        wide = onnx.NodeProto()
        wide.CopyFrom(node)
        wide.input[:] = [float32_of(i, mode == _INTERNAL) if i and types.get(i) == _F16 else i for i in node.input]
        narrow_outputs = [o for o in node.output if types.get(o) == _F16]
        wide.output[:] = [f"{o}__onnxfuse_unrounded" if o in narrow_outputs else o for o in node.output]
        nodes.append(wide)
        for o in narrow_outputs:
            nodes.append(helper.make_node("Cast", [f"{o}__onnxfuse_unrounded"], [o], name=f"{o}__onnxfuse_round", to=_F16))
            if mode == _FLOAT32:
                unrounded[o] = f"{o}__onnxfuse_unrounded"
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    return rewritten
