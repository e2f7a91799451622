"""A Reshape that infers a dim (-1) from a symbolic size divides it: the kernel checks it divides.

onnxruntime fails a Reshape whose input does not split evenly into the requested shape ("The
input tensor cannot be reshaped to the requested shape"). TVM writes the inferred dim as a floor
division, `[M] -> [-1, 4]` as `M // 4`, and a kernel computed on: at M = 6 the fused model
returned one row of four where the original fails. So the Reshape converter records each floor
division of a symbolic size it introduces, each becomes a requirement on an input dim (`M` a
multiple of 4; `s0 * 64 // 48` asks for s0 a multiple of 3; `s0 * s1 * 64 // 256`, a TorchScript
attention head split of `[seq, batch, 64]`, for the product s0 * s1 a multiple of 4), and the
kernel checks them first and fails with an error, as onnxruntime does.

That a requirement holds also makes a shape exact: a Keras encoder's feed-forward block reshapes
`[s0, 64]` to `[-1, 16, 64]` and back, whose rows TVM names `s0 // 16 * 16`, which is s0 where s0
is a multiple of 16 (`exact_dim`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend
from tvm.tirx import decl_buffer
from tvm.tirx.buffer import is_buffer_var
from tvm.tirx.transform.common import BufferReplacer

from ..errors import CompileError
from ..kernel_spec import DerivedDim, Dim, product_symbols
from .index_math import derived_dim

ERROR_KIND = "ValueError"
_DIVISIONS: contextvars.ContextVar[list | None] = contextvars.ContextVar("reshape_divisions", default=None)


@contextlib.contextmanager
def recorded_divisions():
    """Collect, while a group is imported, the floor divisions its Reshapes put in shapes."""
    divisions: list = []
    token = _DIVISIONS.set(divisions)
    try:
        yield divisions
    finally:
        _DIVISIONS.reset(token)


def _floor_divisions(expr) -> list:
    """Every `a // c` (c a constant) in a shape expression, innermost first."""
    found = []
    for child in (getattr(expr, "a", None), getattr(expr, "b", None)):
        if isinstance(child, tvm.ir.expr.Expr):
            found += _floor_divisions(child)
    if isinstance(expr, tirx.FloorDiv) and isinstance(expr.b, tirx.IntImm) and not isinstance(expr.a, tirx.IntImm):
        found.append(expr)
    return found


class ReshapeRecordingDivisions(onnx_frontend.OnnxOpConverter):
    """ONNX Reshape: TVM's converter, recording the divisions of its output shape."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        out = onnx_frontend.Reshape._impl_v13(bb, inputs, attr, params)
        divisions = _DIVISIONS.get()
        if divisions is None or not isinstance(out, relax.Expr):
            return out
        out = bb.normalize(out)
        shape = getattr(out.ty, "shape", None)
        if isinstance(out.ty, relax.TensorType) and isinstance(shape, relax.ShapeExpr):
            for dim in shape.values:
                divisions += _floor_divisions(dim)
        return out


def _scaled_symbol(expr) -> tuple[str, int] | None:
    """(key, multiplier) for `symbol * c` or `s * t * c` (key "s" or "s*t"), else None."""
    dim = derived_dim(expr)
    return ("*".join(dim.symbols), dim.multiplier) if dim is not None and dim.divisor == 1 else None


def requirements(divisions: list) -> tuple[tuple[str, int], ...]:
    """(key, n): the symbol (or the product of two, "s*t") must be a multiple of n, for each
    recorded division; refused (CompileError) where a division's numerator is not one symbol or a
    product of two times a constant."""
    needed: dict[str, int] = {}
    for division in divisions:
        scaled = _scaled_symbol(division.a)
        if scaled is None:
            raise CompileError(f"shapes: a Reshape divides {division.a} by {division.b}, which the kernel "
                               "cannot check divides evenly")
        symbol, multiplier = scaled
        divisor = int(division.b.value) // math.gcd(multiplier, int(division.b.value))
        if divisor > 1:
            needed[symbol] = math.lcm(needed.get(symbol, 1), divisor)
    return tuple(sorted(needed.items()))


def exact_dim(expr, needed: tuple[tuple[str, int], ...]) -> Dim | None:
    """`a // d * m` as the dim it is exactly where the requirements make d divide a (a one
    symbol times a constant); None for any other expression."""
    if not isinstance(expr, tirx.Mul):
        return None
    for division, const in ((expr.a, expr.b), (expr.b, expr.a)):
        if not (isinstance(division, tirx.FloorDiv) and isinstance(division.b, tirx.IntImm)
                and isinstance(const, tirx.IntImm)):
            continue
        scaled = _scaled_symbol(division.a)
        if scaled is None:
            continue
        symbol, multiplier = scaled
        divisor = int(division.b.value)
        if dict(needed).get(symbol, 1) * multiplier % divisor:
            continue  # the requirements do not make the division exact
        numerator, denominator = multiplier * int(const.value), divisor
        common = math.gcd(numerator, denominator)
        numerator, denominator = numerator // common, denominator // common
        first, *times = product_symbols(symbol)
        if not times and (numerator, denominator) == (1, 1):
            return first
        return DerivedDim(first, numerator, denominator, times[0] if times else None)
    return None


def exact_parameter_shapes(func: tirx.PrimFunc, needed: tuple[tuple[str, int], ...]) -> tirx.PrimFunc:
    """`func` with every parameter dim exact_dim simplifies declared as that: the kernel's own
    argument checks run before its divisibility checks, and would refuse an output of N rows
    for `N // 4 * 4` with a message about the kernel's internals instead of the Reshape."""
    if not needed:
        return func
    symbols = _symbols(func)
    replacements = {}
    for param in func.params:
        if not is_buffer_var(param):
            continue
        ty = param.ty
        shape = [_as_expr(exact_dim(dim, needed), symbols, dim) for dim in ty.shape]
        if any(not new.same_as(old) for new, old in zip(shape, ty.shape)):
            replacements[param] = decl_buffer(shape, ty.dtype, param.name, None, ty.strides, ty.elem_offset,
                                              param.scope(), ty.data_alignment, ty.offset_factor)
    return BufferReplacer(replacements)(func) if replacements else func


def _symbols(func: tirx.PrimFunc) -> dict:
    return {str(dim.name): dim for param in func.params if is_buffer_var(param) for dim in param.ty.shape
            if isinstance(dim, tirx.Var)}


def _product(symbols: dict, names) -> tirx.PrimExpr:
    """The product of the function's vars named `names`."""
    product = symbols[names[0]]
    for name in names[1:]:
        product = product * symbols[name]
    return product


def _as_expr(dim, symbols: dict, original):
    """A dim of exact_dim as an expression of the function's own vars (`original` where None)."""
    if isinstance(dim, str) and dim in symbols:
        return symbols[dim]
    if isinstance(dim, DerivedDim) and all(s in symbols for s in dim.symbols):
        var = _product(symbols, dim.symbols)
        scaled = var * tirx.const(dim.multiplier, var.ty.dtype) if dim.multiplier != 1 else var
        return tirx.floordiv(scaled, tirx.const(dim.divisor, var.ty.dtype)) if dim.divisor != 1 else scaled
    return original


def with_divisibility_checks(func: tirx.PrimFunc, needed: tuple[tuple[str, int], ...]) -> tirx.PrimFunc:
    """`func` that first fails, with onnxruntime's reason, where an input dim does not divide."""
    if not needed:
        return func
    symbols = _symbols(func)
    guards = []
    for key, divisor in needed:
        if any(s not in symbols for s in product_symbols(key)):
            raise CompileError(f"shapes: a Reshape divides dim {key}, which no input of the kernel has")
        var = _product(symbols, product_symbols(key))
        text = (f"an input dim is not a multiple of {divisor}, which a Reshape in this group splits it into: "
                "the input tensor cannot be reshaped to the requested shape")
        failed = tirx.AssertStmt(tirx.const(False, "bool"), tvm.ir.StringImm(ERROR_KIND), [tvm.ir.StringImm(text)])
        ok = tirx.floormod(var, tirx.const(divisor, var.ty.dtype)) == tirx.const(0, var.ty.dtype)
        guards.append(tirx.IfThenElse(tirx.Not(ok), failed, None))
    return func.with_body(tirx.SeqStmt([*guards, func.body]))
