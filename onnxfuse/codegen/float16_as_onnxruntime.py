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

Isolated nodes: onnxruntime also runs a node that has a float16 kernel (ISOLATABLE_OPS) in
float32 when it produces no graph output, every node reading its float16 outputs has no float16
kernel, it reads at least one value some node produces, and each operand it checks is a graph
input or comes from a node computed in float32. It checks the first value of each typed
parameter of the op's schema, so only the first operand of a variadic op (measured: after a Mul
p, `Max(p, c)` and `Max(a, r)` run in float32 for a graph input a, a Round r and a Cast c;
`Max(c, p)`, `Max(r, p)`, `Clip(p, r, k)` and `Max(a, b)` of graph inputs stay float16; a Max
read by another Max stays float16).

Casts (onnxruntime 1.32 removes duplicate Casts after inserting its own; measured on one-Cast
models by their optimized graphs, `SessionOptions.optimized_model_filepath`, and their values).
A float16 value c rounded by a Cast: a model's Cast(x -> float16) of a non-float16 x, or the
Cast back to float16 after a node computed in float32 (x its float32 result). Nodes read x
instead of c (a Cast of x to float32 for a float32 node) here:
- x is float32: the float32 nodes reading c, and a model's Cast(c -> float32) whose output is
  no graph output (the pairs cancel, whatever else reads c);
- every reader of c is a Cast or a float32 node and c is no graph output: all of them (the
  rounding Cast goes, so a Cast(c -> int64 or bool) casts the unrounded x). So Cast(int64 ->
  float16) of INT64_MAX read only by a float16 Add is int64 -> float32, finite, and Add(-inf) is
  -inf (inf and NaN when the cast rounds to float16); the same for int8/16/32/64, uint8/16/32/64,
  bool and float64 sources. When c is also read by a float16 kernel (Max, LayerNormalization) or is
  a graph output, the float32 nodes read c rounded (for non-float32 x);
- neither, when a model's Cast to float16 that loses precision (from anything but bool, int8,
  uint8) is read by a model Cast from float16 to anything but bool, int8, uint8: onnxruntime
  then keeps every Cast, so `Cast(x -> float16)` read by an Add and by a `Cast(-> float64)` adds
  the rounded c; nor, when such a Cast is read by a Cast to bool, does the rounding Cast go.
A group output stands for a graph output throughout (what reads it outside the group is not known).

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
# Cast targets (and sources) onnxruntime counts as exact for float16 values: a Cast to float16 from
# one of them does not lose precision, and a Cast from float16 to one of them does not block removals.
_EXACT_FOR_FLOAT16 = frozenset({TensorProto.BOOL, TensorProto.INT8, TensorProto.UINT8})


def _cast_to(node) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None


def _onnx(node) -> bool:
    return node.domain in ("", "ai.onnx")


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    graph = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
    types.update({i.name: i.data_type for i in graph.initializer})
    return types


def _touches_float16(node, types) -> bool:
    return _onnx(node) and any(types.get(v) == _F16 for v in list(node.input) + list(node.output) if v)


def _checked_operands(node, opset: int) -> list[str]:
    """The operands onnxruntime looks at to decide whether a node is isolated: the first value of
    each of its schema's typed parameters (only the first of a variadic one: Max(c, p) checks c,
    Max(p, c) checks p)."""
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    typed = {c.type_param_str for c in schema.type_constraints}
    checked, start = [], 0
    for formal in schema.inputs:
        if start >= len(node.input):
            break
        if formal.type_str in typed and node.input[start]:
            checked.append(node.input[start])
        start = len(node.input) if formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic else start + 1
    return checked


def _modes(model: onnx.ModelProto, types) -> dict[int, str]:
    """Node index -> _FLOAT32 or _INTERNAL for the nodes onnxruntime computes in float32."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    produced = {o for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    modes: dict[int, str] = {}
    computed_by: dict[str, str] = {}  # value -> mode of its producer
    for index, n in enumerate(graph.node):
        if not _touches_float16(n, types):
            continue
        narrow_out = [o for o in n.output if types.get(o) == _F16]
        if n.op_type in FLOAT32_OPS:
            mode = _FLOAT32
        elif (n.op_type in ISOLATABLE_OPS and not outputs & set(n.output)
              and any(i in produced for i in n.input)
              and all(computed_by.get(i) == _FLOAT32 for i in _checked_operands(n, opset)
                      if i in produced and types.get(i) == _F16)
              and all(c.op_type in FLOAT32_OPS and _onnx(c) for o in narrow_out for c in consumers.get(o, []))):
            mode = _FLOAT32
        elif n.op_type in INTERNALLY_FLOAT32:
            mode = _INTERNAL
        else:
            continue
        modes[index] = mode
        for o in n.output:
            computed_by[o] = mode
    return modes


def _unrounded_reads(model: onnx.ModelProto, types, modes) -> dict[str, tuple[str, set[int]]]:
    """float16 value -> (what it was rounded from, the nodes that read that instead), for each value
    rounded by a Cast: the model's Cast to float16 of a non-float16 value, or the Cast back to float16
    onnxruntime inserts after a node it computes in float32 (module doc, "Casts")."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    readers: dict[str, dict[int, onnx.NodeProto]] = {}
    for index, n in enumerate(graph.node):
        for i in n.input:
            readers.setdefault(i, {})[index] = n
    result = {}
    for index, n in enumerate(graph.node):
        if modes.get(index) == _FLOAT32:
            rounded = [(o, f"{o}__onnxfuse_unrounded", _F32, False) for o in n.output if types.get(o) == _F16]
        elif _cast_to(n) == _F16 and _onnx(n) and types.get(n.input[0]) not in (None, _F16):
            source_type = types[n.input[0]]
            rounded = [(n.output[0], n.input[0], source_type, source_type not in _EXACT_FOR_FLOAT16)]
        else:
            continue
        for value, source, source_type, lossy in rounded:
            reading = readers.get(value, {})
            casts = {i: r for i, r in reading.items() if _cast_to(r) is not None and _onnx(r)}
            float32 = {i for i in reading if modes.get(i) == _FLOAT32}
            if lossy and any(_cast_to(r) not in _EXACT_FOR_FLOAT16 for r in casts.values()):
                continue  # a lossy Cast read by a Cast back to a wider type: onnxruntime keeps them all
            unrounded = {i for i, r in casts.items() if _cast_to(r) == source_type and r.output[0] not in outputs}
            if source_type == _F32:
                unrounded |= float32  # its Cast to float16 and the inserted Cast back cancel
            kept_casts = {i: r for i, r in casts.items() if i not in unrounded}
            if (set(reading) <= set(casts) | float32 and value not in outputs
                    and not (lossy and any(_cast_to(r) == TensorProto.BOOL for r in kept_casts.values()))):
                unrounded = set(reading)  # the rounding Cast goes: every Cast reading it reads its source
            if unrounded:
                result[value] = (source, unrounded)
    return result


def onnxruntime_float32(model: onnx.ModelProto, types: dict[str, int]) -> tuple[set[int], dict[str, tuple[str, set[int]]]]:
    """The nodes onnxruntime computes in float32 on unrounded operands (indices into
    `model.graph.node`), and for each float16 value rounded by a Cast, the nodes that read its
    unrounded source instead (see `_unrounded_reads`). `types`: element type by value name."""
    modes = _modes(model, types)
    float32 = {i for i, mode in modes.items() if mode == _FLOAT32}
    return float32, _unrounded_reads(model, types, modes) if float32 else {}


def computed_as_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with float16 arithmetic in float32 where onnxruntime computes it so (module doc);
    the same object when it has none."""
    if not any(n.op_type in FLOAT32_OPS | INTERNALLY_FLOAT32 for n in model.graph.node):
        return model
    types = _elem_types(model)
    modes = _modes(model, types)
    if not modes:
        return model
    types = dict(types)
    types.update({f"{o}__onnxfuse_unrounded": _F32 for i, n in enumerate(model.graph.node) if modes.get(i) == _FLOAT32
                  for o in n.output if types.get(o) == _F16})
    unrounded_reads = _unrounded_reads(model, types, modes)
    outputs = {o.name for o in model.graph.output}
    nodes: list[onnx.NodeProto] = []
    widened: dict[str, str] = {}  # value -> Cast of it to float32

    def float32_of(name: str) -> str:
        if types.get(name) == _F32:
            return name
        if name not in widened:
            widened[name] = f"{name}__onnxfuse_f32"
            nodes.append(helper.make_node("Cast", [name], [widened[name]], name=widened[name], to=_F32))
        return widened[name]

    def operand(index: int, name: str) -> str:
        """What node `index` reads for the float16 value `name`, in float32."""
        source, readers = unrounded_reads.get(name, (None, ()))
        return float32_of(source if index in readers else name)

    for index, node in enumerate(model.graph.node):
        mode = modes.get(index)
        if mode is None:
            if _cast_to(node) is not None and node.input[0] in unrounded_reads:
                source, readers = unrounded_reads[node.input[0]]
                if index in readers:
                    node = _copy(node)
                    node.input[0] = source
            drop = (_cast_to(node) == _F16 and node.output[0] in unrounded_reads and node.output[0] not in outputs
                    and len(unrounded_reads[node.output[0]][1]) == sum(node.output[0] in n.input for n in model.graph.node))
            if not drop:
                nodes.append(node)
            continue
        wide = _copy(node)
        wide.input[:] = [(operand(index, i) if mode == _FLOAT32 else float32_of(i)) if i and types.get(i) == _F16 else i
                         for i in node.input]
        narrow_outputs = [o for o in node.output if types.get(o) == _F16]
        wide.output[:] = [f"{o}__onnxfuse_unrounded" if o in narrow_outputs else o for o in node.output]
        nodes.append(wide)
        for o in narrow_outputs:
            nodes.append(helper.make_node("Cast", [f"{o}__onnxfuse_unrounded"], [o], name=f"{o}__onnxfuse_round", to=_F16))
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    return rewritten


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy
