"""Single-element constant operands become scalars, and small integer powers become multiplies.

Why: exporters often write a scalar operand as a one-element tensor (`Pow(x, [2.0])`,
`Mul(x, [0.5])`). Such a constant has rank 1, so import lifts it into a kernel argument that
every element reloads, and its value is unknown to the code generator: `Pow(x, [2.0])` then
compiles to a libm `powf` call per element (a LayerNorm's variance ran 10x slower than
onnxruntime). As a rank-0 constant, legalization embeds it as an immediate instead.

This is exact: the constant has one element, and the other operand has at least its rank, so
broadcasting gives the same shape. Powers 1, 2 and 3 of floats then become multiplies, as
onnxruntime's own Pow kernel computes them.

Except a float zero added, multiplied or divided: TVM folds `x * 0.0` to 0, `0.0 / x` to 0 and
`x + 0.0` to x as it builds the expression, which is wrong for NaN, ±inf and -0. Such a zero
stays (or becomes) a one-element tensor, which import lifts into an argument: a load, which
nothing folds.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .relax_rewrite import function_pass

BROADCAST_BINARY_OPS = frozenset(
    f"relax.{name}"
    for name in (
        "add subtract multiply divide floor_divide power maximum minimum mod floor_mod "
        "equal not_equal less less_equal greater greater_equal "
        "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor"
    ).split()
)
POWERS_AS_MULTIPLIES = (1.0, 2.0, 3.0)
ZERO_FOLDING_OPS = frozenset({"relax.add", "relax.multiply", "relax.divide"})  # folded as TVM builds them


def _constant_array(expr) -> np.ndarray | None:
    if not isinstance(expr, tvm.ir.GenericConst) or not hasattr(expr.value, "numpy"):
        return None
    return expr.value.numpy()


def _ndim(expr) -> int | None:
    ndim = getattr(getattr(expr, "ty", None), "ndim", -1)
    return ndim if ndim is not None and ndim >= 0 else None


def as_scalar(operand, other):
    """`operand` as a rank-0 constant if it is a one-element constant no higher in rank than `other`."""
    array = _constant_array(operand)
    other_ndim = _ndim(other)
    if array is None or array.ndim == 0 or array.size != 1 or other_ndim is None or array.ndim > other_ndim:
        return operand
    return relax.const(array.reshape(()), str(array.dtype))


def _is_float_zero(array) -> bool:
    return array is not None and array.size == 1 and array.dtype.kind == "f" and float(array.reshape(())) == 0.0


def as_tensor(operand, other):
    """A rank-0 constant as a one-element tensor if `other` has a rank to broadcast it against."""
    array = _constant_array(operand)
    if array is None or array.ndim or not _ndim(other):
        return operand
    return relax.const(array.reshape((1,)), str(array.dtype))


def _operand(op: str, operand, other):
    if op in ZERO_FOLDING_OPS and _is_float_zero(_constant_array(operand)):
        return as_tensor(operand, other)
    return as_scalar(operand, other)


@relax.expr_functor.mutator
class _ScalarOperandRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        if op not in BROADCAST_BINARY_OPS or len(call.args) != 2:
            return call
        lhs, rhs = call.args
        new_lhs, new_rhs = _operand(op, lhs, rhs), _operand(op, rhs, lhs)
        if op == "relax.power":
            product = self._power_as_product(new_lhs, new_rhs)
            if product is not None:
                return product
        if new_lhs.same_as(lhs) and new_rhs.same_as(rhs):
            return call
        return relax.Call(call.op, [new_lhs, new_rhs], call.attrs)

    def _power_as_product(self, base, exponent):
        array = _constant_array(exponent)
        dtype = str(getattr(getattr(base, "ty", None), "dtype", ""))
        if array is None or array.ndim != 0 or not dtype.startswith("float") or float(array) not in POWERS_AS_MULTIPLIES:
            return None
        product = base
        for _ in range(int(float(array)) - 1):
            product = self.builder_.emit(relax.op.multiply(product, base))
        return product


ScalarOperands = function_pass(
    "OnnxfuseScalarOperands", _ScalarOperandRewriter,
    "Rewrites one-element constant operands of broadcasting binary ops to scalars, and float powers by 1, 2 "
    "and 3 to multiplies, in every Relax function.")
