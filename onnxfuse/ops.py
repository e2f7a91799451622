"""The op registry: what fusion needs to know about each ONNX op, one entry per op.

Pattern kinds follow TVM (`op_attr_types.h`), ordered so that a larger kind is "harder to fuse":
combining two patterns takes the max. Unknown ops are opaque, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class OpKind(IntEnum):
    ELEMWISE = 0  # out[i] = f(in[i])
    BROADCAST = 1  # out[i] = f(in[broadcast(i)])
    INJECTIVE = 2  # each output element reads from one computed input position (reshape, gather)
    COMM_REDUCE = 3  # a commutative reduction (sum, max, mean)
    OUT_EWISE_FUSABLE = 4  # a complex op that can absorb an elementwise epilogue (MatMul, Conv)
    OPAQUE = 8  # never fused

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


def combine(a: OpKind, b: OpKind) -> OpKind:
    return a if a >= b else b


@dataclass(frozen=True)
class OpInfo:
    kind: OpKind
    static_inputs: tuple[int, ...] = ()
    """Input positions that must be compile-time constants (shapes, axes, pads): not dataflow."""
    epilogue_safe: bool = False
    """An injective op that only selects, reinterprets or places elements (Split, Slice, Reshape,
    Concat), so an anchor's elementwise epilogue may run through it: the basis of split fan-out
    fusion, and of a cell that stacks its new state (Unsqueeze → Concat) in its own kernel."""
    competitive: bool = True
    """False where onnxruntime's own kernel is still much faster than ours (measured: convolutions
    and pooling, 10-50x). `--select auto` leaves groups with such ops to onnxruntime."""


def _table() -> dict[str, OpInfo]:
    E, B, I, R, O = (OpKind.ELEMWISE, OpKind.BROADCAST, OpKind.INJECTIVE, OpKind.COMM_REDUCE, OpKind.OUT_EWISE_FUSABLE)
    t: dict[str, OpInfo] = {}
    for op in (
        "Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Elu Erf Exp Floor HardSigmoid HardSwish "
        "Identity IsInf IsNaN LeakyRelu Log Mish Neg Not Reciprocal Relu Round Selu Sigmoid Sign Sin "
        "Sinh Softplus Softsign Sqrt Tan Tanh Celu Gelu Cast Dropout"
    ).split():
        t[op] = OpInfo(E)
    t["Clip"] = OpInfo(E, static_inputs=(1, 2))
    for op in (
        "Add Sub Mul Div Pow Max Min Sum Mean Mod Where Equal Less LessOrEqual Greater GreaterOrEqual "
        "And Or Xor BitShift PRelu BatchNormalization CastLike"
    ).split():
        t[op] = OpInfo(B)
    for op in "Transpose Gather GatherElements DepthToSpace SpaceToDepth".split():
        t[op] = OpInfo(I)
    t["Concat"] = OpInfo(I, epilogue_safe=True)
    t["Reshape"] = OpInfo(I, static_inputs=(1,), epilogue_safe=True)
    t["Flatten"] = OpInfo(I, epilogue_safe=True)
    t["Squeeze"] = OpInfo(I, static_inputs=(1,), epilogue_safe=True)
    t["Unsqueeze"] = OpInfo(I, static_inputs=(1,), epilogue_safe=True)
    t["Split"] = OpInfo(I, static_inputs=(1,), epilogue_safe=True)
    t["Slice"] = OpInfo(I, static_inputs=(1, 2, 3, 4), epilogue_safe=True)
    t["Expand"] = OpInfo(I, static_inputs=(1,))
    t["Tile"] = OpInfo(I, static_inputs=(1,))
    t["Pad"] = OpInfo(I, static_inputs=(1, 2, 3))
    for op in (
        "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum "
        "ReduceLogSumExp ReduceSumSquare"
    ).split():
        t[op] = OpInfo(R, static_inputs=(1,))
    t["ArgMax"] = OpInfo(R)
    t["ArgMin"] = OpInfo(R)
    for op in "MatMul Gemm Softmax LogSoftmax LayerNormalization InstanceNormalization".split():
        t[op] = OpInfo(O)
    for op in "Conv ConvTranspose MaxPool AveragePool GlobalAveragePool GlobalMaxPool".split():
        t[op] = OpInfo(O, competitive=False)
    return t


REGISTRY: dict[str, OpInfo] = _table()

# Ops we know and deliberately keep opaque, with the reason shown to the user.
OPAQUE_REASONS: dict[str, str] = {
    "Constant": "a constant: onnxruntime folds it",
    "Shape": "a shape computation: cheap in onnxruntime",
    "Size": "a shape computation: cheap in onnxruntime",
    "ConstantOfShape": "its output shape depends on input data",
    "Range": "its output shape depends on input data",
    "NonZero": "its output shape depends on input data",
    "TopK": "a sort: no fusable pattern",
    "NonMaxSuppression": "its output shape depends on input data",
    "Resize": "not supported by the code generator yet",
    "Upsample": "not supported by the code generator yet",
    "LRN": "not supported by the code generator yet",
    "ThresholdedRelu": "TVM lowers it as (x > alpha) * x, which turns -inf into NaN",
    "LSTM": "a recurrent op: compiled alone, as one sequence kernel",
    "GRU": "a recurrent op: compiled alone, as one sequence kernel",
    "RNN": "a recurrent op: compiled alone, as one sequence kernel",
}

# Opaque to fusion, yet compiled: each such node is a group of its own (codegen/recurrent.py).
COMPILED_ALONE = frozenset({"LSTM", "GRU", "RNN"})


def compiled_alone(op_type: str, domain: str = "") -> bool:
    """Whether a node of this op becomes a one-node group although nothing fuses with it."""
    return domain in ("", "ai.onnx") and op_type in COMPILED_ALONE

# Dtypes the code generator can compile (others keep a node opaque).
COMPILABLE_DTYPES = frozenset(
    "float32 float64 float16 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool".split()
)


def uncompetitive_ops(op_types) -> list[str]:
    """The ops among `op_types` whose onnxruntime kernel beats ours today (see OpInfo.competitive)."""
    return sorted({op for op in op_types if (info := REGISTRY.get(op)) is not None and not info.competitive})


# onnxruntime's own ops that a group model holds in place of a chain onnxruntime fuses
# (fusion/onnxruntime_fused_ops.py, codegen/onnxruntime_contrib.py): never planned from a model.
ONNXRUNTIME_KERNELS: dict[tuple[str, str], OpInfo] = {
    ("com.microsoft", "SkipLayerNormalization"): OpInfo(OpKind.OUT_EWISE_FUSABLE),
}


def group_op_info(op_type: str, domain: str = "") -> OpInfo | None:
    """op_info, or the entry of an onnxruntime kernel a group model may hold (its gamma, beta and
    bias are weights like any other op's)."""
    return op_info(op_type, domain) or ONNXRUNTIME_KERNELS.get((domain, op_type))


def op_info(op_type: str, domain: str = "") -> OpInfo | None:
    """The registry entry of a default-domain op, or None (opaque) for anything else."""
    if domain not in ("", "ai.onnx"):
        return None
    return REGISTRY.get(op_type)
