"""Floating-point max and min that propagate NaN, as onnxruntime's Max, Min and Clip do.

Why: TVM's LLVM backend lowers `max(a, b)` to `a >= b ? a : b`, so the result is `b` whenever
the comparison is unordered: a NaN in `b` survives, a NaN in `a` is lost. `Clip(x, -1, 1)` is
`min(max(x, -1), 1)`, so a NaN input came out as -1, and `Max(x, 1)` as 1, where onnxruntime
(and numpy's `maximum`) return NaN.

The rewrite uses that asymmetry instead of fighting it:
- against a bound that does not vary (a constant, or a load of a rank-0 tensor: Clip's min and
  max are scalars by the spec) the data goes second, `max(c, x)`, at the same cost as before. A
  NaN bound then means "no bound", as onnxruntime's Clip treats it. A one-element tensor of
  rank 1 or more is data, not a bound: the fuzzer fed `Max(in, x)` with `in` a NaN input of
  shape [1], which the same rule had turned into x where onnxruntime's Max gives NaN;
- otherwise the smaller operand `a` is checked, `isnan(a) ? a : max(a, b)`. Only that operand is
  repeated, so a chain `max(max(max(x1, x2), x3), x4)` grows linearly.

A reduction's own update (`acc = max(acc, x)`) stays plain. The check would sit on the
accumulator's dependency chain and made a row max 2x slower (measured), and onnxruntime's
ReduceMax has no order-free NaN rule to match: it returns NaN only when the NaN comes first in
the row (measured). What a reduction reads (`ReduceMax(Clip(x))`) is rewritten. The variadic
Max and Min ops are elementwise by the time they get here (unfold_stack_reductions.py).

The ops reach TIR as max/min from several places (topi's maximum, Clip's own TE, reduction
updates), so the rewrite runs on the finished PrimFunc, after scheduling, store by store.
"""

from __future__ import annotations

import tvm
import tvm_ffi

from .tir_walk import expr_size

_MAX_MIN = (tvm.tirx.Max, tvm.tirx.Min)


def _is_float(expr) -> bool:
    return tvm.runtime.DataType(str(expr.ty.dtype)).type_code == tvm.runtime.DataTypeCode.FLOAT


def _is_invariant(expr) -> bool:
    """A value the same for every element: a constant, or a load of a rank-0 tensor (a scalar)."""
    if isinstance(expr, tvm.tirx.FloatImm):
        return True
    return isinstance(expr, tvm.ir.TensorLoad) and len(expr.source.shape) == 0


def _propagating(node):
    if not _is_float(node):
        return node
    plain = type(node)
    a, b = node.a, node.b
    if _is_invariant(a) or _is_invariant(b):
        bound, data = (a, b) if _is_invariant(a) else (b, a)
        return plain(bound, data)
    if expr_size(a) > expr_size(b):
        a, b = b, a
    return tvm.tirx.Select(tvm.tirx.isnan(a), a, plain(a, b))


def _rewrite_expr(expr):
    return tvm_ffi.structural_map(expr, [(_MAX_MIN, _propagating)], order="post")


def _is_accumulator(expr, store) -> bool:
    return (isinstance(expr, tvm.ir.TensorLoad) and expr.source.same_as(store.buffer)
            and tvm_ffi.structural_equal(list(expr.indices), list(store.indices)))


def _rewrite_store(store):
    value = store.value
    if isinstance(value, _MAX_MIN) and (_is_accumulator(value.a, store) or _is_accumulator(value.b, store)):
        new_value = type(value)(_rewrite_expr(value.a), _rewrite_expr(value.b))  # a reduction update
    else:
        new_value = _rewrite_expr(value)
    if new_value.same_as(value):
        return store
    return tvm.tirx.BufferStore(store.buffer, new_value, list(store.indices))


def propagate_nan(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every floating-point max/min replaced by its NaN-propagating form, except a
    reduction's own accumulator update."""
    return tvm_ffi.structural_map(func, [(tvm.tirx.BufferStore, _rewrite_store)], order="post")
