"""Keeps TVM's arithmetic simplifier off floating-point values, so a kernel computes every float
expression in the order the model wrote it (IEEE semantics, as onnxruntime does).

Why: TVM's simplifier (the `StmtSimplify` passes, ours in simplify() below and the two in
`tvm.compile`'s default TIR pipeline) applies ring identities to expressions of every type. On
floats they are wrong: `(a + b) - b` became `a` (1 where onnxruntime gives 0 for a = 1,
b = 1e8), `x - x` and `x * 0` became 0 (NaN for NaN or ±inf), `a - (b + a)` became `-b` (-3e38
where the sum overflows to -inf). No pass option turns this off, and index arithmetic needs the
simplifier (schedule.py: reshape's `% (N*T)` must go before compute_at can bound a tile).

So every float operand of an arithmetic or comparison node is fenced: wrapped in a round trip
through an unsigned integer of the same width, `reinterpret(f, reinterpret(u, x))`. The
simplifier knows nothing of `reinterpret`, so no rule matches across a fence, while it still
simplifies the integer indices of the loads inside. Left and right operands get different
fences (the right one is fenced twice), so `x - x` is no longer two equal operands. LLVM folds
each bitcast pair away: the machine code is the same, without the rewrites.

Integer data gets the same fence on the operands of min and max, where an operand reads a
buffer: `b - min(a, b)` became `max(b - a, 0)`, and b - a overflows where the model's own
arithmetic does not (the fuzzer: int32 2147483647 where onnxruntime gives 0). Index arithmetic
(no loads) and the other integer identities, which hold for wrapping integers, are left to the
simplifier.

fence() runs before every simplification; unfence() takes our fences off again where our own
schedule needs to read the expressions (GEMM detection, expression sizes). fast_math's own
round trip goes through a signed integer and is left alone.

Inside an integer fence the simplifier still applies ring identities (they hold for wrapping
integers), and one can leave a constant: int64 `Min(Sub(x, x), y)` fences `x - x`, which
becomes 0, and TVM's LLVM code generator rejects `reinterpret(uint64, 0)` ("A zero reinterpret
shortcut requires pointer result type": it takes a reinterpret of 0 for a null pointer), so the
group fell back (fuzzer). fold_zero_reinterprets, run after TVM's lowering
(tail_loops.PIPELINE), writes such a reinterpret as the zero of its type: the same bits.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from . import tir_walk

_ARITHMETIC = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max)
_COMPARISONS = (tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE)
_REINTERPRET = tvm.ir.Op.get("tirx.reinterpret")


def _float_type(expr):
    dtype = tvm.runtime.DataType(str(expr.ty.dtype))
    return dtype if dtype.type_code == tvm.runtime.DataTypeCode.FLOAT else None


def _signed_type(expr):
    dtype = tvm.runtime.DataType(str(expr.ty.dtype))
    return dtype if dtype.type_code == tvm.runtime.DataTypeCode.INT and dtype.bits >= 8 else None


def _fenced_type(node):
    """The type to fence `node`'s operands in: floats always, signed integers in a min/max of data."""
    float_type = _float_type(node.a)
    if float_type is not None:
        return float_type
    if isinstance(node, (tirx.Min, tirx.Max)) and (tir_walk.contains_load(node.a) or tir_walk.contains_load(node.b)):
        return _signed_type(node.a)
    return None


def _through_bits(expr, dtype):
    unsigned = f"uint{dtype.bits}" + (f"x{dtype.lanes}" if dtype.lanes > 1 else "")
    return tirx.reinterpret(str(dtype), tirx.reinterpret(unsigned, expr))


def _fenced(node):
    a, b = node.a, node.b
    dtype = _fenced_type(node)
    if dtype is None:
        return node
    return type(node)(_through_bits(a, dtype), _through_bits(_through_bits(b, dtype), dtype))


def _is_fence(expr) -> bool:
    """`reinterpret(f, reinterpret(uN, x))` with x of type f: one of our fences."""
    if not (isinstance(expr, tvm.ir.Call) and expr.op.same_as(_REINTERPRET)):
        return False
    inner = expr.args[0]
    if not (isinstance(inner, tvm.ir.Call) and inner.op.same_as(_REINTERPRET)):
        return False
    bits = tvm.runtime.DataType(str(inner.ty.dtype))
    return (bits.type_code == tvm.runtime.DataTypeCode.UINT and str(inner.args[0].ty.dtype) == str(expr.ty.dtype)
            and (_float_type(expr) is not None or _signed_type(expr) is not None))


def _unfenced(call):
    return call.args[0].args[0] if _is_fence(call) else call


def fence(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every float operand of +, -, *, /, %, min, max and comparisons fenced, and the
    signed integer operands of a min or max that reads data."""
    return tvm_ffi.structural_map(func, [(_ARITHMETIC + _COMPARISONS, _fenced)], order="post")


def unfence(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` without the fences fence() put in (the expressions as they were)."""
    return tvm_ffi.structural_map(func, [(tvm.ir.Call, _unfenced)], order="post")


def _zero_of(value, dtype):
    """The zero of `dtype` if `value` is an integer zero (scalar or broadcast), else None."""
    lanes = tvm.runtime.DataType(dtype).lanes
    scalar = value.value if isinstance(value, tirx.Broadcast) else value
    if not (isinstance(scalar, tirx.IntImm) and scalar.value == 0):
        return None
    element = str(tvm.runtime.DataType(dtype).with_lanes(1))
    zero = tirx.const(0, element)
    return tirx.Broadcast(zero, lanes) if lanes > 1 else zero


def _folded(call):
    dtype = getattr(call.ty, "dtype", None)  # None: a pointer (the shortcut's own case)
    if not call.op.same_as(_REINTERPRET) or dtype is None or tvm.runtime.DataType(str(dtype)).type_code == \
            tvm.runtime.DataTypeCode.HANDLE:
        return call
    zero = _zero_of(call.args[0], str(dtype))
    return call if zero is None else zero


def fold_zero_reinterprets(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every reinterpret of an integer zero to a non-pointer type written as that
    type's zero (all bits zero either way)."""
    return tvm_ffi.structural_map(func, [(tvm.ir.Call, _folded)], order="post")


@tirx.transform.prim_func_pass(opt_level=0, name="onnxfuse.FoldZeroReinterprets")
def FoldZeroReinterprets(func, _mod, _ctx):  # noqa: N802 - named as TVM names passes
    return fold_zero_reinterprets(func)


def simplify_indices(mod: tvm.IRModule, simplify_pass) -> tvm.IRModule:
    """Runs `simplify_pass` on `mod` with every PrimFunc fenced, then takes the fences off."""
    fenced = tvm.IRModule({gv: fence(f) for gv, f in mod.functions_items()})
    simplified = simplify_pass(fenced)
    return tvm.IRModule({gv: unfence(f) for gv, f in simplified.functions_items()})


def simplify(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` through TVM's StmtSimplify on index arithmetic only: float values keep their order."""
    return simplify_indices(tvm.IRModule({"main": func}), s_tir.transform.StmtSimplify())["main"]
