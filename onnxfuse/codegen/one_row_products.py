"""A MatMul by a run-time weight, at one row, summed as onnxruntime sums it.

onnxruntime prepacks the weight of a MatMul when it is a constant (of the node's graph or, read
by a body, of an enclosing one), and then every row count takes MLAS's packed SGEMM: one fused
multiply-add chain over k (TVM's order up to 256 k's; gemm_blocks past it). A weight computed at
run time, a graph input, a Loop's carried value or an initializer also listed as an input (a
caller may feed it; fusion/extract.py lists it so in the group model) is not prepacked, and MLAS then takes a
kernel of its own for a single row of A (x86-64: `MlasSgemmKernelM1Avx`): K in groups of four, then a pair, then one;
each group's products rounded and added left to right (a multiply, then an add: no FMA), and
only then added to the output, which starts at +0.0. A Keras GRU converted by tf2onnx hands its
kernels through its Loop as carried values, so at batch 1 two of its four outputs differed. On
x86-64 CPUs without AVX (the portable build's baseline level, sum_orders.py) MLAS's SSE kernel
sums the products in order from +0.0 and adds a Gemm's bias last (under `qemu-x86_64 -cpu
Nehalem`, MatMul and Gemm with and without a bias, K from 3 to 64, bit for bit).

So such a product, where its rows may number one, is lowered as
`rows == 1 ? one_row_order : TVM's product`, the condition an `if_then_else`: only the branch
taken is evaluated, so more than one row costs one test per element, not a second product. Out
of scope, left as TVM computes them: a weight of one column (MLAS transposes the product then),
a weight of more than two dims (attention's batched products) and K past MAX_UNROLLED_K (the
one-row sum is written out term by term).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator

import tvm
from tvm import relax, te
from tvm.relax.frontend.onnx import onnx_frontend

from ..fusion.onnxruntime_fused_ops import MLAS_K_BLOCK
from . import sum_orders, tir_walk
from .fast_math import multiply_add
from .index_math import i64, static_length
from .rounded_products import rounded

GROUP = 4  # k's per group of the one-row kernel
MAX_UNROLLED_K = 512
ONE_ROW_PRODUCT = "one_row_product"

_WEIGHT_INPUTS: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("weight_inputs", default=frozenset())


@contextlib.contextmanager
def weights_among_inputs(names: frozenset[str]):
    """While importing a group whose inputs `names` are the original model's constants (a
    kernel compiled once for every group of its shape takes its weights as inputs): those
    count as constants, which onnxruntime prepacks, not as run-time values."""
    token = _WEIGHT_INPUTS.set(frozenset(names))
    try:
        yield
    finally:
        _WEIGHT_INPUTS.reset(token)


def one_row_order(data: te.Tensor, weight: te.Tensor, row, column, bias: te.Tensor | None = None):
    """Output (row, column) of data @ weight (+ bias), summed as MLAS's one-row kernel sums it:
    from the bias where onnxruntime's Gemm copies it into the output first."""
    k_total = tir_walk.static_int(weight.shape[0])

    def product(k: int):  # rounded alone: LLVM would fuse it into the add (docs/numerics.md)
        return rounded(data(*row, i64(k)) * weight(i64(k), column))

    bias_value = None if bias is None else bias(*([i64(0)] * (len(bias.shape) - 1)), column)
    zero = rounded(tvm.tirx.const(0.0, data.dtype))  # fenced: TVM's simplifier would fold 0.0 + x to x
    order = sum_orders.current().one_row_products
    if order == sum_orders.FUSED_CHAIN:  # aarch64: MLAS's general kernel, from the bias
        total = zero if bias_value is None else bias_value
        for k in range(k_total):
            total = multiply_add(data(*row, i64(k)), weight(i64(k), column), total)
        return total
    if order == sum_orders.IN_ORDER:  # MLAS's SSE kernel: in order, bias last
        total = zero
        for k in range(k_total):
            total = total + product(k)
        return total if bias_value is None else total + bias_value
    total = zero if bias_value is None else bias_value
    k = 0
    while k < k_total:
        size = GROUP if k_total - k >= GROUP else (2 if k_total - k >= 2 else 1)
        group = product(k)
        for j in range(1, size):
            group = group + product(k + j)
        total = total + group
        k += size
    return total


def product_as_onnxruntime(data: te.Tensor, weight: te.Tensor, product: te.Tensor | None = None,
                           bias: te.Tensor | None = None) -> te.Tensor:
    """`product` (data @ weight (+ bias, a row) as TVM computes it) where data has more than one
    row, else the one-row kernel's sums; no `product` where data has one row by its static shape."""
    rows = functools.reduce(operator.mul, list(data.shape[:-1]), i64(1))

    def element(*index):
        one_row = one_row_order(data, weight, index[:-1], index[-1], bias)
        if product is None:
            return one_row
        return tvm.tirx.if_then_else(rows == i64(1), one_row, product(*index))

    return te.compute(list(data.shape[:-1]) + [weight.shape[1]], element, name=ONE_ROW_PRODUCT)


def _depends_on_input(bb: relax.BlockBuilder, expr, seen=None) -> bool:
    """Whether `expr` is computed from an input of the group that is not one of the original's
    constants (weights_among_inputs), not from constants only."""
    seen = set() if seen is None else seen
    if isinstance(expr, (tvm.ir.expr.Constant, relax.ShapeExpr)) or expr is None:
        return False
    if isinstance(expr, relax.Var):
        if expr in seen:
            return False
        seen.add(expr)
        bound = bb.lookup_binding(expr)
        if bound is None:  # a parameter: an input of the group
            return expr.name not in _WEIGHT_INPUTS.get()
        return _depends_on_input(bb, bound, seen)
    if isinstance(expr, relax.Call):
        return any(_depends_on_input(bb, arg, seen) for arg in expr.args)
    if isinstance(expr, relax.Tuple):
        return any(_depends_on_input(bb, field, seen) for field in expr.fields)
    if isinstance(expr, relax.TupleGetItem):
        return _depends_on_input(bb, expr.tuple_value, seen)
    return True  # anything else: assume it is computed at run time


def takes_one_row_kernel(bb: relax.BlockBuilder, data, weight) -> bool:
    """Whether onnxruntime would multiply `data` by `weight` with the one-row kernel at one
    row, and this module lowers it: float32, a run-time 2-D weight of static shape and more than
    one column, data of two dims or more whose rows may be one."""
    if not all(isinstance(x.ty, relax.TensorType) and isinstance(x.ty.shape, relax.ShapeExpr) for x in (data, weight)):
        return False
    data_shape, weight_shape = list(data.ty.shape.values), list(weight.ty.shape.values)
    if str(data.ty.dtype) != "float32" or str(weight.ty.dtype) != "float32" or len(weight_shape) != 2 or len(data_shape) < 2:
        return False
    k, n = (tir_walk.static_int(d) for d in weight_shape)
    if k is None or n is None or n < 2 or k > MAX_UNROLLED_K or tir_walk.static_int(data_shape[-1]) != k:
        return False
    if sum_orders.current().one_row_products == sum_orders.FUSED_CHAIN and k > MLAS_K_BLOCK:
        return False
    if static_length(data_shape[:-1]) not in (None, 1):  # rows that are never one
        return False
    return _depends_on_input(bb, weight)


def has_one_row(data) -> bool:
    """Whether `data` has one row by its static shape (the product needs no other order)."""
    return static_length(list(data.ty.shape.values)[:-1]) == 1


def emit_product(bb: relax.BlockBuilder, data, weight, product, bias=None):
    """`product` (data @ weight (+ bias) as lowered for more than one row) in the one-row
    kernel's order at one row."""
    if has_one_row(data):
        args = [data, weight] + ([bias] if bias is not None else [])
        return bb.emit_te(lambda d, w, *b: product_as_onnxruntime(d, w, None, *b), *args,
                          primfunc_name_hint="matmul_one_row")
    product = product if isinstance(product, relax.Var) else bb.emit(product)
    args = [data, weight, product] + ([bias] if bias is not None else [])
    return bb.emit_te(product_as_onnxruntime, *args, primfunc_name_hint="matmul_one_row")


class MatMulAsOnnxruntime(onnx_frontend.OnnxOpConverter):
    """ONNX MatMul: TVM's product, with the one-row kernel's order where takes_one_row_kernel."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        data, weight = inputs[0], inputs[1]
        product = relax.op.matmul(data, weight)
        return emit_product(bb, data, weight, product) if takes_one_row_kernel(bb, data, weight) else product
