"""Our own lowerings where TVM's default ones defeat the schedule.

- `reshape`: topi wraps the flat index with `% total` and every output coordinate with
  `% extent`. With a symbolic batch (total = N*T) TVM's simplifier cannot remove those, and then
  compute_at cannot bound what a row tile needs: every tile recomputed the whole batch. Our
  reshape decomposes the flat index without wrapping the outermost coordinate, which is in range
  by construction.
- `relu`: TVM lowers it to `max(x, 0)`, which turns NaN into 0; onnxruntime (and numpy) keep
  NaN. `x < 0 ? 0 : x` keeps it at the same cost, so a kernel agrees with onnxruntime even on
  the NaNs a model with degenerate weights produces. `clip` (HardSigmoid's) and `sign` likewise.
- `cosh`, `sinh`: TVM 0.27 has no LLVM lowering for them ("unknown intrinsic tirx.cosh"), so
  every group with one fell back. We write them with exp, accurate near 0 and up to overflow.

- `abs`: on signed integers TVM's `x >= 0 ? x : -x` became a branch (its select reads memory),
  and under `x < 0` LLVM took `-x` (a no-signed-wrap sub) as positive: int64 `Abs(x) < -3` was
  false for INT64_MIN, whose Abs wraps to itself in onnxruntime. `max(x, -x)` is the same value
  (INT_MIN included) with no branch. Since wrapping_integers.py computes `-x` so that it wraps,
  the select would be right too; the max stays, branch-free.
- `multiply`: its float product is fenced from FMA contraction (rounded_products).
- `layer_norm`: onnxruntime's algorithms, Welford for short rows, a float64 mean otherwise
  (layer_norm.py).
- `conv2d`: summed in blocks of input channels, as onnxruntime sums it (conv_blocks.py).
- `sum`, `mean` over trailing axes: each row summed in onnxruntime's (Eigen's) order (row_sums.py).

The Relax rewrites that run before lowering are passes of their own: unfold_stack_reductions,
nan_safe_comparisons, fold_shape_take.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, topi

from .conv_blocks import legalize_conv2d
from .gemm_blocks import legalize_matmul
from .index_math import flat_index, unflattened
from .layer_norm import legalize_layer_norm
from .rounded_products import legalize_multiply
from .row_sums import legalize_mean, legalize_sum


def reshape_without_wrap(data: te.Tensor, new_shape) -> te.Tensor:
    in_shape = list(data.shape)
    if not in_shape:
        return te.compute(tuple(new_shape), lambda *_: data(), name="T_reshape")

    def element(*coords):
        flat = flat_index(new_shape, [tvm.tirx.Cast("int64", c) for c in coords])
        src = unflattened(flat, [tvm.tirx.Cast("int64", d) for d in in_shape], wrap_outermost=False)
        return data(*src)

    return te.compute(tuple(new_shape), element, name="T_reshape")


def _legalize_reshape(bb: relax.BlockBuilder, call):
    target = call.args[1]
    if isinstance(target, relax.Var):
        target = bb.lookup_binding(target)
    shape = target.values if isinstance(target, relax.ShapeExpr) else call.ty.shape.values
    return bb.call_te(reshape_without_wrap, call.args[0], list(shape), primfunc_name_hint="reshape")


def relu_keeping_nan(data: te.Tensor) -> te.Tensor:
    zero = tvm.tirx.const(0, data.dtype)
    return te.compute(data.shape, lambda *i: tvm.tirx.Select(data(*i) < zero, zero, data(*i)), name="T_relu")


def _legalize_relu(bb: relax.BlockBuilder, call):
    return bb.call_te(relu_keeping_nan, call.args[0], primfunc_name_hint="relu")


def clip_keeping_nan(data: te.Tensor, low, high) -> te.Tensor:
    """Comparisons instead of TVM's max/min, which turn NaN into a bound (HardSigmoid's clip)."""
    low, high = tvm.tirx.Cast(data.dtype, low), tvm.tirx.Cast(data.dtype, high)

    def element(*i):
        x = data(*i)
        return tvm.tirx.Select(x < low, low, tvm.tirx.Select(x > high, high, x))

    return te.compute(data.shape, element, name="T_clip")


def _legalize_clip(bb: relax.BlockBuilder, call):
    return bb.call_te(clip_keeping_nan, *call.args, primfunc_name_hint="clip")


def sign_keeping_nan(data: te.Tensor) -> te.Tensor:
    """-1, 0 or 1, and NaN for NaN (TVM's sign gives 0)."""
    zero, one = tvm.tirx.const(0, data.dtype), tvm.tirx.const(1, data.dtype)

    def element(*i):
        x = data(*i)
        sign = tvm.tirx.Select(x > zero, one, tvm.tirx.Select(x < zero, zero - one, zero))
        return tvm.tirx.Select(tvm.tirx.isnan(x), x, sign) if "float" in str(data.dtype) else sign

    return te.compute(data.shape, element, name="T_sign")


def _legalize_sign(bb: relax.BlockBuilder, call):
    return bb.call_te(sign_keeping_nan, call.args[0], primfunc_name_hint="sign")


def abs_wrapping(data: te.Tensor) -> te.Tensor:
    """|x|, with |INT_MIN| = INT_MIN on signed integers as onnxruntime's; topi's on other types."""
    if not str(data.dtype).startswith("int"):
        return topi.abs(data)
    zero = tvm.tirx.const(0, data.dtype)
    return te.compute(data.shape, lambda *i: tvm.tirx.max(data(*i), zero - data(*i)), name="T_abs")


def _legalize_abs(bb: relax.BlockBuilder, call):
    return bb.call_te(abs_wrapping, call.args[0], primfunc_name_hint="tir_abs")  # TVM's own name for it


def _exp_halves(x, dtype):
    """(e^|x| / 2, e^-|x| / 2) from one exp of |x|/2, so e^|x| / 2 overflows only where it
    exceeds the largest float (cosh and sinh stay finite up to |x| ~ 89.4, e^|x| to 88.7)."""
    half = tvm.tirx.const(0.5, dtype)
    h = tvm.tirx.exp(tvm.tirx.abs(x) * half)
    return (h * half) * h, half / (h * h)


def cosh_from_exp(data: te.Tensor) -> te.Tensor:
    def element(*i):
        grow, decay = _exp_halves(data(*i), data.dtype)
        return grow + decay

    return te.compute(data.shape, element, name="T_cosh")


def sinh_from_exp(data: te.Tensor) -> te.Tensor:
    """Odd Taylor terms to x^9 below |x| = 0.5 (relative error < 1e-10), where the difference
    of exponentials would cancel; e^x/2 - e^-x/2 above, with x's sign."""
    zero, small = tvm.tirx.const(0, data.dtype), tvm.tirx.const(0.5, data.dtype)

    def element(*i):
        x = data(*i)
        x2 = x * x
        series = tvm.tirx.const(1, data.dtype)
        for denominator in (72, 42, 20, 6):  # 1 + x²/6 (1 + x²/20 (1 + x²/42 (1 + x²/72)))
            series = tvm.tirx.const(1, data.dtype) + x2 * tvm.tirx.const(1 / denominator, data.dtype) * series
        grow, decay = _exp_halves(x, data.dtype)
        magnitude = grow - decay
        large = tvm.tirx.Select(x < zero, zero - magnitude, magnitude)
        return tvm.tirx.Select(tvm.tirx.abs(x) < small, x * series, large)

    return te.compute(data.shape, element, name="T_sinh")


def _legalize_cosh(bb: relax.BlockBuilder, call):
    return bb.call_te(cosh_from_exp, call.args[0], primfunc_name_hint="cosh")


def _legalize_sinh(bb: relax.BlockBuilder, call):
    return bb.call_te(sinh_from_exp, call.args[0], primfunc_name_hint="sinh")


CUSTOM_LEGALIZE = {
    "relax.reshape": _legalize_reshape,
    "relax.nn.relu": _legalize_relu,
    "relax.clip": _legalize_clip,
    "relax.sign": _legalize_sign,
    "relax.abs": _legalize_abs,
    "relax.cosh": _legalize_cosh,
    "relax.sinh": _legalize_sinh,
    "relax.multiply": legalize_multiply,
    "relax.nn.layer_norm": legalize_layer_norm,
    "relax.nn.conv2d": legalize_conv2d,
    "relax.matmul": legalize_matmul,
    "relax.sum": legalize_sum,
    "relax.mean": legalize_mean,
}
