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
- `max(stack([a, b, ...]), axis=0)`: the ONNX frontend imports the variadic Max and Min ops
  (whenever shapes are static) as a reduction over their stacked inputs. We import them as
  `maximum(maximum(a, b), ...)`: elementwise ops, so their max can propagate NaN
  (nan_propagation keeps a reduction's own max plain) and the schedule sees no stack.
- `logical_not(less(a, b))` and the other float comparisons: TVM's simplifier turns `!(a < b)`
  into `a >= b` and its LLVM backend emits `a != b` as an ordered compare; both are false where
  a or b is NaN, and the negation is true there (onnxruntime, IEEE). We write the negation as
  the opposite comparison or'ed with `isnan(a) || isnan(b)`, which no rewrite breaks.
- `take(shape_to_tensor(shape), k)`: the ONNX frontend reads a dimension this way for the
  negative-index fix-up of GatherElements; when that dimension is static we fold it to a scalar
  (otherwise it becomes a tiny run-time computation on a lifted constant).
"""

from __future__ import annotations

import tvm
from tvm import relax, te

from .relax_rewrite import rewrite_functions


def _flat_index(shape, coords):
    flat = tvm.tirx.const(0, "int64")
    for extent, coord in zip(shape, coords):
        flat = flat * extent + coord
    return flat


def _unflatten(flat, shape):
    """Coordinates of `flat` in `shape`; the outermost one is not wrapped (flat < prod(shape))."""
    coords = []
    for extent in reversed(list(shape)[1:]):
        coords.append(tvm.tirx.floormod(flat, extent))
        flat = tvm.tirx.floordiv(flat, extent)
    coords.append(flat)
    return list(reversed(coords))


def reshape_without_wrap(data: te.Tensor, new_shape) -> te.Tensor:
    in_shape = list(data.shape)
    if not in_shape:
        return te.compute(tuple(new_shape), lambda *_: data(), name="T_reshape")

    def element(*coords):
        flat = _flat_index(new_shape, [tvm.tirx.Cast("int64", c) for c in coords]) if coords else tvm.tirx.const(0, "int64")
        src = _unflatten(flat, [tvm.tirx.Cast("int64", d) for d in in_shape])
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
    "relax.cosh": _legalize_cosh,
    "relax.sinh": _legalize_sinh,
}


@relax.expr_functor.mutator
class _ShapeTakeFolder(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.take":
            return call
        source, index = call.args[0], call.args[1]
        if not isinstance(source, relax.Var) or not isinstance(index, tvm.ir.GenericConst):
            return call
        binding = self.lookup_binding(source)
        if getattr(getattr(binding, "op", None), "name", None) != "relax.shape_to_tensor":
            return call
        values = getattr(binding.args[0].ty, "values", None)
        k = index.value.numpy() if hasattr(index.value, "numpy") else None
        if values is None or k is None or k.ndim != 0 or not -len(values) <= int(k) < len(values):
            return call
        dim = values[int(k)]
        if not isinstance(getattr(dim, "value", None), int):
            return call
        return relax.const(int(dim.value), str(call.ty.dtype))


_PAIRWISE = {"relax.max": relax.op.maximum, "relax.min": relax.op.minimum}


@relax.expr_functor.mutator
class _StackReductionUnfolder(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        pairwise = _PAIRWISE.get(getattr(call.op, "name", None))
        stacked = call.args[0] if pairwise is not None else None
        if not isinstance(stacked, relax.Var) or call.attrs.keepdims or [int(a) for a in (call.attrs.axis or [])] != [0]:
            return call
        binding = self.lookup_binding(stacked)
        if getattr(getattr(binding, "op", None), "name", None) != "relax.stack" or int(binding.attrs.axis) != 0:
            return call
        parts = binding.args[0]
        if isinstance(parts, relax.Var):
            parts = self.lookup_binding(parts)
        if not isinstance(parts, relax.Tuple) or len(parts.fields) < 2:
            return call
        result = parts.fields[0]
        for part in parts.fields[1:]:
            result = self.builder_.normalize(pairwise(result, part))
        return result


@tvm.transform.module_pass(opt_level=0, name="OnnxfuseUnfoldStackReductions")
class UnfoldStackReductions:
    """Rewrites `max(stack(xs), axis=0)` (and min) as a chain of elementwise maximum (minimum)."""

    def transform_module(self, mod, ctx):
        return rewrite_functions(mod, _StackReductionUnfolder)


_OPPOSITE = {
    "relax.less": relax.op.greater_equal, "relax.less_equal": relax.op.greater,
    "relax.greater": relax.op.less_equal, "relax.greater_equal": relax.op.less,
    "relax.equal": relax.op.not_equal, "relax.not_equal": relax.op.equal,
}


@relax.expr_functor.mutator
class _NegatedComparisonRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.logical_not" or not isinstance(call.args[0], relax.Var):
            return call
        comparison = self.lookup_binding(call.args[0])
        opposite = _OPPOSITE.get(getattr(getattr(comparison, "op", None), "name", None))
        if opposite is None or "float" not in str(comparison.args[0].ty.dtype):
            return call
        a, b = comparison.args
        if comparison.op.name == "relax.not_equal":  # not(a != b) is a == b, false on NaN either way
            return self.builder_.normalize(opposite(a, b))
        either_nan = relax.op.logical_or(relax.op.isnan(a), relax.op.isnan(b))
        return self.builder_.normalize(relax.op.logical_or(opposite(a, b), either_nan))


@tvm.transform.module_pass(opt_level=0, name="OnnxfuseNanSafeNegatedComparisons")
class NanSafeNegatedComparisons:
    """Rewrites `not(cmp(a, b))` on floats as `opposite(a, b) or isnan(a) or isnan(b)`."""

    def transform_module(self, mod, ctx):
        return rewrite_functions(mod, _NegatedComparisonRewriter)


@tvm.transform.module_pass(opt_level=0, name="OnnxfuseFoldShapeTake")
class FoldShapeTake:
    """Folds `take(shape_to_tensor(shape), k)` to the static dimension k."""

    def transform_module(self, mod, ctx):
        return rewrite_functions(mod, _ShapeTakeFolder)
