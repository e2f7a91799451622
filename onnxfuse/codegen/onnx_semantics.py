"""ONNX-level rewrites of a group, before TVM imports it, where TVM's importer gives an op another
meaning than onnxruntime does. Each rewrite states the op in plain ONNX ops that the importer
translates faithfully.

1. Clip with a bound left out: onnxruntime (and the spec) clamp to the type's lowest and
   largest finite value, so +inf becomes 3.4e38 (float32; 65504 in float16); TVM's importer
   leaves that side unbounded. The missing bounds are written in. An explicit ±inf or NaN bound stays
   unbounded in both.
2. Cast from a float to an integer type: TVM's importer turns NaN and ±inf into 0 and wraps
   out-of-range values modulo 2^bits (and for 64 bits leaves them undefined). onnxruntime on
   x86-64 converts as the CPU's truncating conversion does (`cvttss2si`/`cvttsd2si`), measured
   with onnxruntime 1.31 for every integer type:
   - int64 and int32: the value truncated toward zero if it fits, else the "integer
     indefinite" INT_MIN (NaN, ±inf and out of range alike);
   - int16, int8, uint16, uint8: the 32-bit conversion above, then its low bits;
   - uint32 (uint64): `x >= 2^31 ? cvt32(x - 2^31) ^ 2^31 : cvt32(x)` (the same with 63 and
     the 64-bit conversion): NaN and -inf give 2^31 (2^63), +inf and too large give 0,
     negatives wrap.
   The rewrite first replaces every value the conversion cannot take by the one whose
   conversion is onnxruntime's result, so the importer only ever converts in-range values.
   float16 and bfloat16 sources go through float32 first (exact).
   A NaN that becomes a Gather index is therefore INT64_MIN, which the kernel's index check
   rejects (bounds.py), as onnxruntime rejects it.
3. Softplus: TVM's importer writes `max(x, 0) + log(1 + exp(-|x|))`. Below x = -17, 1 + exp(x)
   rounds to 1 and the result is 0 (so a reciprocal of it is inf), where onnxruntime computes
   `log1p(exp(x))`, about exp(x) there (2.06e-9 at x = -20). The rewrite keeps the importer's
   form with log1p in place of log(1 + t), in plain ops: with u = 1 + t,
   `log1p(t) = u == 1 ? t : t * (log(u) / (u - 1))` (the quotient corrects the rounding of u;
   u - 1 is exact for t in [0, 1]). It is the same formula Eigen's log1p uses, which
   onnxruntime calls.
4. Sign of a float16 NaN: onnxruntime's float16 Sign gives 0 (it tests x > 0 and x < 0), its
   float32 and float64 Sign give NaN, as TVM's does for every type. A float16 Sign is written
   `Where(IsNaN(x), 0, Sign(x))` (fuzzer, November 26: `Sign(1 / HardSigmoid(x))`, x NaN).
5. Sigmoid far below 0: onnxruntime's float32 Sigmoid (MLAS) clamps its input at -18 and gives
   exactly 0 there and below; its float64 Sigmoid (0.5 + 0.5 tanh(x / 2)) gives exactly 0 from
   x = -0x1.25e4f7b2737fbp+5 (-36.7368...) down (measured with onnxruntime 1.32: every input at
   or below those edges, none above). Computed as 1 / (1 + exp(-x)), ours was about exp(x) there
   (8.6e-35 at -78.5), so Sigmoid -> Cast -> MatMul with an inf weight gave inf where onnxruntime
   gives NaN (fuzzer, November 26). float32 (and float16, which onnxruntime and we compute in
   float32) is onnxruntime's own rational function in the fast sigmoid (fast_math.py), 0 wherever
   onnxruntime's is, at scattered inputs between -18 and -15.8 too (sigmoid_clamp.py: which
   kernel, per CPU). A float64 Sigmoid is rewritten here as `Sigmoid(x) * Cast(x > edge)` (NaN
   stays NaN; a Where would need a 0 constant, one more kernel argument).
6. float64 Tanh near 0: TVM lowers it as (1 - exp(-2|x|)) / (1 + exp(-2|x|)) with the sign of x,
   whose subtraction cancels: about eps / (2|x|) relative error, 7,000 ulps at x = 1.5e-5 (fuzzer,
   November 26: Reciprocal(Tanh(MatMul)) -66161.65964974 where onnxruntime, std::tanh, gives
   -66161.65964984), and 0 for |x| under 1e-16. Below |x| = 1/8 it is written as its Taylor series
   x (1 + c1 x^2 + ... + c9 x^18), whose next term is under 1e-20 relative there; above, the
   formula's error is under 4 ulps. float32 Tanh is fast_math.py's polynomial.
7. Gemm with alpha other than 1: TVM's importer scales A by alpha before the product; onnxruntime
   scales the product. Where A @ B overflows, onnxruntime's result is inf, the importer's finite
   (alpha = 0.5, a row holding -3.4e38: inf, so Cos gave NaN, where the kernel's Cos gave 0.80;
   fuzzer, November 26), and a product alpha brings back into range the other way round. The
   Gemm is written as the product (alpha = 1, no C), a Mul by alpha, then the Add of beta * C.
8. Where picking -0.0 from its first branch: onnxruntime's float Where gives +0.0 there (float16,
   float32 and float64; from its second branch -0.0 stays, and every other value is kept; measured
   with onnxruntime 1.32, pinned by test_ieee_special_ops), which the spec's select does not;
   a Pow(-1) after it is +inf, where a plain select gives -inf (fuzzer, November 26, seed 61). The
   first branch is written `x + 0.0`, which maps -0.0 to +0.0 and keeps every other value.
9. (No rewrite any more.) A MatMul, or a Gemm without C, over a K of 1: onnxruntime's GEMM
   fuses the product into a sum started from +0.0, so a product of -0.0 (x = -0.0 times a
   positive weight) comes out +0.0, while an underflowing one (1e-45 x -0.25) keeps its sign; the
   kernel's lone product kept -0.0 and a Div by it gave -inf for +inf (fuzzer, November 26, seed
   92). It was written `MatMul + 0.0`; since every dot product starts from +0.0
   (reduction_identities.py), the kernel computes that fused product itself, and the extra add
   turned the underflowing product's -0.0 into +0.0.
10. float32 Gelu (opset 20; PyTorch's dynamo exporter writes nn.GELU so): TVM's importer writes
   `0.5 x (1 + erf(x / sqrt 2))` with its own erf; onnxruntime's kernel computes
   `e = Erf(x * float(1 / sqrt 2))` with MLAS's erf, then `(0.5 x) (e + 1)`, and for
   approximate="tanh" `t = Tanh(x ((C x) x + B))` with MLAS's tanh (B = sqrt(2 / pi),
   C = 0.044715 B, as floats), then `(0.5 x) (t + 1)`. Written in those steps, whose Erf and Tanh
   are onnxruntime's (fast_math.py); with the importer's form a dynamo-exported FFN differed
   in the last bit in a third of its outputs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..fusion.onnxruntime_fused_ops import fast_gelu_nodes, gelu_nodes

_FLOATS = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}
_FLOATS_AND_HALF = {**_FLOATS, TensorProto.FLOAT16: np.float16}
_NARROW_FLOATS = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
_INTEGER_BITS = {
    TensorProto.INT64: (64, True), TensorProto.INT32: (32, True), TensorProto.INT16: (16, True),
    TensorProto.INT8: (8, True), TensorProto.UINT64: (64, False), TensorProto.UINT32: (32, False),
    TensorProto.UINT16: (16, False), TensorProto.UINT8: (8, False),
}


class _Builder:
    """Appends nodes and scalar constants with fresh names under one prefix."""

    def __init__(self, prefix: str, float_type):
        self.prefix, self.float_type = prefix, float_type
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def _name(self, what: str) -> str:
        return f"{self.prefix}__{what}{len(self.nodes) + len(self.initializers)}"

    def constant(self, value, dtype=None) -> str:
        name = self._name("c")
        self.initializers.append(numpy_helper.from_array(np.array(value, dtype or self.float_type), name))
        return name

    def op(self, op_type: str, *inputs: str, output: str | None = None, **attrs) -> str:
        output = output or self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output, **attrs))
        return output


def _lowest_converted(float_type, bits: int):
    """The smallest value of float_type that truncates to at least -2^(bits-1)."""
    below = -(2 ** (bits - 1)) - 1
    exact = float_type(below)
    return np.nextafter(exact, float_type(0)) if int(exact) == below else float_type(-(2 ** (bits - 1)))


def _in_range(b: _Builder, x: str, bits: int) -> str:
    low = b.op("GreaterOrEqual", x, b.constant(_lowest_converted(b.float_type, bits)))
    high = b.op("Less", x, b.constant(2.0 ** (bits - 1)))
    return b.op("And", low, high)


def _truncatable(b: _Builder, x: str, bits: int) -> str:
    """x where the signed `bits`-wide conversion takes it, else -2^(bits-1) (INT_MIN's value)."""
    return b.op("Where", _in_range(b, x, bits), x, b.constant(-(2.0 ** (bits - 1))))


def _cast_as_onnxruntime(b: _Builder, x: str, to: int, output: str) -> None:
    bits, signed = _INTEGER_BITS[to]
    if signed or bits <= 16:
        b.op("Cast", _truncatable(b, x, max(bits, 32)), output=output, to=to)
    elif bits == 32:  # values the importer's int64 conversion, taken modulo 2^32, maps right
        top = b.constant(2.0 ** 31)
        upper = b.op("Where", b.op("Less", x, b.constant(2.0 ** 32)), x, b.constant(0.0))
        lower = b.op("Where", _in_range(b, x, 32), x, top)
        b.op("Cast", b.op("Where", b.op("GreaterOrEqual", x, top), upper, lower), output=output, to=to)
    else:  # uint64: non-negatives convert unsigned, negatives through int64
        zero = b.constant(0.0)
        non_negative = b.op("GreaterOrEqual", x, zero)
        fits = b.op("And", non_negative, b.op("Less", x, b.constant(2.0 ** 64)))
        unsigned = b.op("Cast", b.op("Where", fits, x, zero), to=to)
        wrapped = b.op("Cast", b.op("Cast", _truncatable(b, x, 64), to=TensorProto.INT64), to=to)
        b.op("Where", non_negative, unsigned, wrapped, output=output)


def _rewrite_cast(node, elem_types, prefix: str):
    source, to = elem_types.get(node.input[0]), next(a.i for a in node.attribute if a.name == "to")
    if to not in _INTEGER_BITS or (source not in _FLOATS and source not in _NARROW_FLOATS):
        return None
    b = _Builder(prefix, _FLOATS.get(source, np.float32))
    x = node.input[0] if source in _FLOATS else b.op("Cast", node.input[0], to=TensorProto.FLOAT)
    _cast_as_onnxruntime(b, x, to, node.output[0])
    return b


def _rewrite_clip(node, elem_types, prefix: str, opset: int):
    float_type = _FLOATS_AND_HALF.get(elem_types.get(node.input[0]))
    if float_type is None:
        return None  # integers: their limits clamp nothing; bfloat16: rare, left as it was
    lowest, largest = np.finfo(float_type).min, np.finfo(float_type).max
    if opset < 11:
        if float_type is np.float64:
            return None  # attributes are float32: they cannot hold float64's limits
        attrs = {a.name: a for a in node.attribute}
        clipped = helper.make_node("Clip", list(node.input), list(node.output), name=node.name,
                                   min=float(attrs["min"].f) if "min" in attrs else float(lowest),
                                   max=float(attrs["max"].f) if "max" in attrs else float(largest))
        b = _Builder(prefix, float_type)
        b.nodes.append(clipped)
        return b
    inputs = list(node.input) + [""] * (3 - len(node.input))
    if inputs[1] and inputs[2]:
        return None
    b = _Builder(prefix, float_type)
    low = inputs[1] or b.constant(lowest)
    high = inputs[2] or b.constant(largest)
    b.nodes.append(helper.make_node("Clip", [inputs[0], low, high], list(node.output), name=node.name))
    return b


def _rewrite_softplus(node, elem_types, prefix: str):
    float_type = _FLOATS.get(elem_types.get(node.input[0]))
    if float_type is None:
        return None
    b = _Builder(prefix, float_type)
    x = node.input[0]
    t = b.op("Exp", b.op("Neg", b.op("Abs", x)))  # in [0, 1]; NaN for NaN
    u = b.op("Add", b.constant(1.0), t)
    corrected = b.op("Mul", t, b.op("Div", b.op("Log", u), b.op("Sub", u, b.constant(1.0))))
    log1p = b.op("Where", b.op("Equal", u, b.constant(1.0)), t, corrected)
    b.op("Add", b.op("Relu", x), log1p, output=node.output[0])
    return b


def _rewrite_float16_sign(node, elem_types, prefix: str):
    if elem_types.get(node.input[0]) != TensorProto.FLOAT16:
        return None
    b = _Builder(prefix, np.float16)
    x = node.input[0]
    b.op("Where", b.op("IsNaN", x), b.constant(0.0), b.op("Sign", x), output=node.output[0])
    return b


SIGMOID_FLOAT64_ZERO_FROM = float.fromhex("-0x1.25e4f7b2737fbp+5")  # onnxruntime's float64 Sigmoid is 0 from here down


def _rewrite_float64_sigmoid(node, elem_types, prefix: str):
    if elem_types.get(node.input[0]) != TensorProto.DOUBLE:
        return None
    b = _Builder(prefix, np.float64)
    x = node.input[0]
    above = b.op("Cast", b.op("Greater", x, b.constant(SIGMOID_FLOAT64_ZERO_FROM)), to=TensorProto.DOUBLE)
    b.op("Mul", b.op("Sigmoid", x), above, output=node.output[0])
    return b


# tanh x = x (1 + sum c_k x^2k): the Taylor coefficients 2^2k (2^2k - 1) B_2k / (2k)!, k = 1..9
_TANH_SERIES = (-1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925, 21844 / 6081075, -929569 / 638512875,
                6404582 / 10854718875, -443861162 / 1856156927625)
_TANH_SERIES_BELOW = 0.125


def _rewrite_float64_tanh(node, elem_types, prefix: str):
    if elem_types.get(node.input[0]) != TensorProto.DOUBLE:
        return None
    b = _Builder(prefix, np.float64)
    x = node.input[0]
    square = b.op("Mul", x, x)
    poly = b.constant(_TANH_SERIES[-1])
    for c in reversed(_TANH_SERIES[:-1]):
        poly = b.op("Add", b.op("Mul", poly, square), b.constant(c))
    series = b.op("Mul", x, b.op("Add", b.constant(1.0), b.op("Mul", poly, square)))  # keeps the sign of ±0
    near_zero = b.op("Less", b.op("Abs", x), b.constant(_TANH_SERIES_BELOW))
    b.op("Where", near_zero, series, b.op("Tanh", x), output=node.output[0])
    return b


def _rewrite_float32_gelu(node, elem_types, prefix: str):
    """onnxruntime's Gelu kernel as ops (fusion/onnxruntime_fused_ops writes them for its fused
    GELU chains too): MLAS's erf, or for approximate="tanh" FastGelu's tanh."""
    if elem_types.get(node.input[0]) != TensorProto.FLOAT:
        return None
    approximate = next((a.s.decode() for a in node.attribute if a.name == "approximate"), "none")
    if approximate not in ("none", "tanh"):
        return None
    b = _Builder(prefix, np.float32)
    nodes, scalars = (gelu_nodes if approximate == "none" else fast_gelu_nodes)(node.input[0], node.output[0])
    b.nodes.extend(nodes)
    b.initializers.extend(scalars)
    return b


def _rewrite_gemm_alpha(node, elem_types, prefix: str, opset: int):
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    float_type = _FLOATS.get(elem_types.get(node.input[0]))
    if alpha == 1.0 or float_type is None or opset < 11:  # before opset 11 a Gemm must have C
        return None
    b = _Builder(prefix, float_type)
    product = b.op("Gemm", node.input[0], node.input[1], transA=attrs.get("transA", 0), transB=attrs.get("transB", 0))
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias is None:
        b.op("Mul", product, b.constant(alpha), output=node.output[0])
        return b
    scaled = b.op("Mul", product, b.constant(alpha))
    b.op("Add", scaled, bias if beta == 1.0 else b.op("Mul", bias, b.constant(beta)), output=node.output[0])
    return b


def _rewrite_where(node, elem_types, prefix: str, constants: dict):
    float_type = _FLOATS_AND_HALF.get(elem_types.get(node.input[1]))
    if float_type is None:
        return None
    chosen = constants.get(node.input[1])
    if chosen is not None and not np.any(np.signbit(chosen) & (chosen == 0)):
        return None  # a constant without -0.0 (a tree program's 0/1 table): nothing to turn
    b = _Builder(prefix, float_type)
    positive_zero = b.op("Add", node.input[1], b.constant(0.0))
    b.nodes.append(helper.make_node("Where", [node.input[0], positive_zero, node.input[2]], list(node.output),
                                    name=node.name))
    return b


def _where_branches(model: onnx.ModelProto) -> set[str]:
    return {n.input[1] for n in model.graph.node if n.op_type == "Where" and n.domain in ("", "ai.onnx")}


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Every value's element type, from one shape inference."""
    graph = onnx.shape_inference.infer_shapes(model).graph
    values = list(graph.input) + list(graph.value_info) + list(graph.output)
    types = {v.name: v.type.tensor_type.elem_type for v in values}
    types.update({i.name: i.data_type for i in graph.initializer})
    return types


def as_onnxruntime_computes(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (a group) with Clip, float→int Cast, Softplus, float16 Sign, float64 Sigmoid,
    float64 Tanh, scaled Gemm, float Where and float32 Gelu nodes rewritten as above; the
    same object when there is nothing to rewrite."""
    rewritten_ops = ("Clip", "Cast", "Softplus", "Sign", "Sigmoid", "Tanh", "Gemm", "Where", "Gelu")
    if not any(n.op_type in rewritten_ops and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    elem_types = _element_types(model)
    where_branches = _where_branches(model)
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name in where_branches}
    nodes, initializers, changed = [], [], False
    for index, node in enumerate(model.graph.node):
        prefix = f"onnxfuse_ort{index}"
        rewrite = None
        if node.domain in ("", "ai.onnx") and node.op_type == "Cast":
            rewrite = _rewrite_cast(node, elem_types, prefix)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Clip":
            rewrite = _rewrite_clip(node, elem_types, prefix, opset)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Softplus":
            rewrite = _rewrite_softplus(node, elem_types, prefix)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Sign":
            rewrite = _rewrite_float16_sign(node, elem_types, prefix)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Sigmoid":
            rewrite = _rewrite_float64_sigmoid(node, elem_types, prefix)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Tanh":
            rewrite = _rewrite_float64_tanh(node, elem_types, prefix)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Gemm":
            rewrite = _rewrite_gemm_alpha(node, elem_types, prefix, opset)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Where":
            rewrite = _rewrite_where(node, elem_types, prefix, constants)
        elif node.domain in ("", "ai.onnx") and node.op_type == "Gelu":
            rewrite = _rewrite_float32_gelu(node, elem_types, prefix)
        if rewrite is None:
            nodes.append(node)
            continue
        nodes.extend(rewrite.nodes)
        initializers.extend(rewrite.initializers)
        changed = True
    if not changed:
        return model
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    rewritten.graph.initializer.extend(initializers)
    return rewritten
