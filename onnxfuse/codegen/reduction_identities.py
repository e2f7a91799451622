"""Float min/max reductions start from ±inf, as onnxruntime's ReduceMin and ReduceMax do.

Why: TOPI starts a min reduction from the largest finite float and a max reduction from the
smallest, so a row of +inf reduced to 3.4e38 and a row of -inf (a fully masked attention row)
to -3.4e38, where onnxruntime gives ±inf. The identity cannot change before scheduling: TVM's
rfactor (schedule.factor_row_reductions) recognises a min or max reduction only by that finite
identity. So this runs on the scheduled function: every store of the finite bound into a
buffer that a min (max) update accumulates into becomes a store of +inf (-inf). Nothing else
changes: a row with any value below +inf reduces to the same result from either start.

Float sums start from -0.0, IEEE addition's identity (-0.0 + x is x for every x, +0.0 + -0.0
is +0.0): from TOPI's +0.0 a row of -0.0 summed to +0.0 where onnxruntime gives -0.0, and
1 / ReduceMean of it was +inf instead of -inf (the fuzzer). The same rewrite, on add updates
over axes of a static size; over the batch axis the sum keeps +0.0, which onnxruntime gives
for an empty batch.

Dot products (a sum whose update adds a product it computes itself: MatMul, Gemm) keep +0.0:
MLAS zeroes its accumulators and fuses the first product into that zero, so a row of products
that are all -0.0 comes out +0.0. From -0.0 the sum was -0.0 there, and LLVM, which may drop an
add of -0.0 (but not of +0.0), left the first product a plain multiply: where it unrolled the
k loop (a one-row kernel over K = 32) it then fused that product into the second step instead
of the second product (x0 y0 + round(x1 y1) where MLAS computes round(x0 y0) + x1 y1), and 1 to
4 of the outputs of `[N, 32] @ [32, 10]` differed in the last bit at 2 to 8 rows.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx

from . import tir_walk

_START = {tirx.Min: np.inf, tirx.Max: -np.inf}


def _is_float(expr) -> bool:
    return tvm.runtime.DataType(str(expr.ty.dtype)).type_code == tvm.runtime.DataTypeCode.FLOAT


def _reads_itself(store, operand) -> bool:
    return (isinstance(operand, tvm.ir.TensorLoad) and operand.source.same_as(store.buffer)
            and tvm_ffi.structural_equal(list(operand.indices), list(store.indices)))


def _accumulators(func) -> dict:
    """Buffer → the infinity its float min/max reduction starts from."""
    found = {}

    def visit(store, visitor):
        value = store.value
        if type(value) in _START and _is_float(value) and (_reads_itself(store, value.a) or _reads_itself(store, value.b)):
            found[store.buffer] = _START[type(value)]
        visitor.default_visit(store)

    tvm_ffi.structural_visit(func, [(tirx.BufferStore, visit)])
    return found


def _never_empty(block) -> bool:
    """Whether every reduction axis of `block` has a static, non-zero extent."""
    reduce_axes = [iv for iv in block.iter_vars if int(iv.iter_type) == tir_walk.COMM_REDUCE]
    return bool(reduce_axes) and all(isinstance(iv.dom.extent, tirx.IntImm) and iv.dom.extent.value > 0
                                     for iv in reduce_axes)


def _added_term(store, value):
    """The term an add update `store = value` adds to the running sum, or None if it is no such
    update."""
    if _reads_itself(store, value.a):
        return value.b
    return value.a if _reads_itself(store, value.b) else None


def _sum_accumulators(func) -> set:
    """Buffers a float add reduction over static, non-empty axes accumulates into, dot products
    excepted (they start from +0.0 as MLAS's do). A sum over the batch axis keeps +0.0: over an
    empty batch onnxruntime's sum is +0.0."""
    found = set()

    def visit(block, visitor):
        store = block.body
        value = getattr(store, "value", None)
        term = (_added_term(store, value) if isinstance(store, tirx.BufferStore) and isinstance(value, tirx.Add)
                and _is_float(value) else None)
        if term is not None and not isinstance(term, tirx.Mul) and _never_empty(block):
            found.add(store.buffer)
        visitor.default_visit(block)

    tvm_ffi.structural_visit(func, [(s_tir.SBlock, visit)])
    return found


def _finite_bound(dtype: str, infinity: float) -> float | None:
    if dtype not in ("float16", "float32", "float64"):
        return None
    info = np.finfo(dtype)
    return float(info.max) if infinity > 0 else float(info.min)


def start_from_infinity(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every float min/max reduction's finite start replaced by ±inf, and every
    float sum's +0.0 start by -0.0."""
    accumulators, sums = _accumulators(func), _sum_accumulators(func)
    if not accumulators and not sums:
        return func

    def restart(store):
        infinity = accumulators.get(store.buffer)
        value = store.value
        if store.buffer in sums and isinstance(value, tirx.FloatImm) and value.value == 0.0:
            return tirx.BufferStore(store.buffer, tirx.FloatImm(str(value.ty.dtype), -0.0), list(store.indices))
        if infinity is None or not isinstance(value, tirx.FloatImm):
            return store
        dtype = str(value.ty.dtype)
        if float(value.value) != _finite_bound(dtype, infinity):
            return store
        return tirx.BufferStore(store.buffer, tirx.FloatImm(dtype, infinity), list(store.indices))

    return tvm_ffi.structural_map(func, [(tirx.BufferStore, restart)], order="post")
