"""Index arithmetic shared by the hand-written TE and TIR computations.

TVM types shapes and loop variables as int64; an index that mixes in an int32 constant trips its
simplifier (and LoopPartition), so every constant here is int64.
"""
from __future__ import annotations

import functools
import operator

import tvm

from ..kernel_spec import DerivedDim


def i64(value):
    """An int64 index constant for an int; an expression passes through unchanged."""
    return tvm.tirx.const(value, "int64") if isinstance(value, int) else value


def flat_index(extents, coords):
    """The row-major position of `coords` in a box of `extents`."""
    flat = i64(0)
    for extent, coord in zip(extents, coords):
        flat = flat * extent + coord
    return flat


def unflattened(flat, extents, wrap_outermost: bool = True) -> list:
    """The row-major coordinates of position `flat` (an int or an index expression) in a box of
    `extents`. Every coordinate is wrapped by default, so that a position past the end still
    reads inside the box: a Select evaluates both of its branches, the unused read included.
    Where `flat` is known to be in range, `wrap_outermost=False` saves one division."""
    extents = list(extents)
    coords = []
    for extent in reversed(extents[1:]):
        coords.append(flat % extent)
        flat = flat // extent
    coords.append(flat % extents[0] if wrap_outermost and extents else flat)
    return list(reversed(coords))


def static_length(shape) -> int | None:
    """The number of elements of `shape`, or None if a dim is symbolic."""
    dims = [int(d) if isinstance(d, (int, tvm.tirx.IntImm)) else None for d in shape]
    return None if None in dims else functools.reduce(operator.mul, dims, 1)


def derived_dim(expr) -> DerivedDim | None:
    """A shape expression as `symbol * multiplier // divisor` (a symbol alone, `s * c`, `s // c`,
    `s * a // b`), the same of a product of two symbols (`s * t * a // b`), else None."""
    tirx = tvm.tirx
    if isinstance(expr, tirx.Var):
        return DerivedDim(str(expr.name))
    if isinstance(expr, tirx.Mul):
        if isinstance(expr.a, tirx.IntImm) or isinstance(expr.b, tirx.IntImm):
            var_side, const_side = (expr.a, expr.b) if isinstance(expr.b, tirx.IntImm) else (expr.b, expr.a)
            inner = derived_dim(var_side)
            if inner is not None and inner.divisor == 1 and const_side.value >= 1:
                return DerivedDim(inner.symbol, inner.multiplier * int(const_side.value), times=inner.times)
            return None
        return _product_of_two_symbols(derived_dim(expr.a), derived_dim(expr.b))
    if isinstance(expr, tirx.FloorDiv) and isinstance(expr.b, tirx.IntImm) and expr.b.value >= 1:
        inner = derived_dim(expr.a)
        if inner is not None and inner.divisor == 1:
            return DerivedDim(inner.symbol, inner.multiplier, int(expr.b.value), inner.times)
    return None


def _product_of_two_symbols(a: DerivedDim | None, b: DerivedDim | None) -> DerivedDim | None:
    """`a * b` when each names one symbol and neither divides (a flatten of two symbolic dims)."""
    if a is None or b is None or a.times is not None or b.times is not None or a.divisor != 1 or b.divisor != 1:
        return None
    return DerivedDim(a.symbol, a.multiplier * b.multiplier, times=b.symbol)
