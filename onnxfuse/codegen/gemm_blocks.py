"""A GEMM over more than 256 k's lowered as onnxruntime sums it: in blocks of 256.

onnxruntime multiplies by a constant weight through MLAS's prepacked SGEMM, which walks K in
blocks of 256: each block's products are one chain of fused multiply-adds from 0, k in order,
and the blocks' sums are added to the output one after the other (`C = p0; C = C + p1; ...`).
Up to 256 k's that is TVM's one chain; past it the two differ in the last bits (at K = 784 in
about half the outputs of a `[64, 784] @ [784, 128]`). Where onnxruntime's graph optimizer made
a MatMul and the Add of a bias into its Gemm (a 2-D or static-shaped product, see
fusion/onnxruntime_fused_ops.py), the output starts from the bias instead: `C = b; C = C + p0;
...`. Found by comparing onnxruntime's MatMul, its MatMul + Add and its Gemm over K = 300, 512
and 784 with its own MatMuls over 256-wide slices of K, added in float32 in both orders.

So such a product is lowered in stages (like conv_blocks'): the block sums
`matmul_block_sums[..., b, j]`, each one chain over its block's k's, their sum
`matmul_blocks_sum[..., j]`, the blocks in order, the bias first where onnxruntime adds it first,
and a ragged last block (784 = 3 x 256 + 16) as a small product of its own, `matmul_tail_sum`,
added after (`matmul_with_tail`). The schedule (schedule_matmul) tiles the sum as a GEMM whose
reduction is the block index, computes every block's sums for each of its register tiles right
under the tile, and runs the ragged block's product in the same tile loops. The ragged block's
short sum is written as rounded_products.multiply_added, so that LLVM fuses each new product
into its add and nothing else.
"""

from __future__ import annotations

import tvm
from tvm import relax, te
from tvm.relax.frontend.onnx import onnx_frontend

from ..fusion.onnxruntime_fused_ops import MLAS_K_BLOCK
from . import tir_walk
from .index_math import i64
from .one_row_products import emit_product, takes_one_row_kernel
from .rounded_products import multiply_added, rounded

ONNXRUNTIME_K_BLOCK = MLAS_K_BLOCK
"""k's per block in MLAS's prepacked SGEMM (its packed stride along K); the loader asks
onnxruntime which products it fuses with their bias only past it."""

BLOCK_SUMS = "matmul_block_sums"
BLOCKS_SUM = "matmul_blocks_sum"
TAIL_SUM = "matmul_tail_sum"
WITH_TAIL = "matmul_with_tail"


def _static_dims(shape) -> list[int | None]:
    return [tir_walk.static_int(d) for d in shape]


WHOLE_VECTORS = 16
"""Columns a blocked product comes in multiples of: whole vectors on every target (16 lanes on
AVX-512, 8 on AVX2, 4 on NEON). Other column counts keep one chain over K (docs/numerics.md).
Padded to whole vectors inside the lowering, the weights of the pad columns were either selected
(LLVM then moved the select between a multiply and its add and rounded some products alone: 1-ulp
differences in the one-row kernel) or read at a clamped column (which TVM vectorizes as a gather
per weight vector: LeNet-300-100 at batch 1 took 181 us against onnxruntime's 20 us)."""


def is_blocked_matmul(data_shape, weight_shape, dtype: str) -> bool:
    """Whether a product data[..., K] @ weight[K, M] is one this lowering takes: float32, a 2-D
    weight of static shape, K over one block, M in whole vectors."""
    if str(dtype) != "float32" or len(weight_shape) != 2 or len(data_shape) < 2:
        return False
    k, m = _static_dims(weight_shape)
    return (k is not None and m is not None and k > ONNXRUNTIME_K_BLOCK and m % WHOLE_VECTORS == 0
            and _static_dims(data_shape)[-1] == k)


def is_stage(block) -> bool:
    """Whether the block is a stage of a blocked product: a GEMM by construction, never a row
    reduction to split in vector lanes (which would sum in another order)."""
    return block.name_hint.startswith((BLOCK_SUMS, BLOCKS_SUM, TAIL_SUM))


def matmul_in_blocks(data: te.Tensor, weight: te.Tensor, bias: te.Tensor | None = None) -> te.Tensor:
    """data @ weight (+ bias, added first), summed as onnxruntime sums it (module doc)."""
    *rows, depth = data.shape
    depth, columns = int(depth), int(weight.shape[1])
    zero = tvm.tirx.const(0.0, data.dtype)
    blocks, tail = divmod(depth, ONNXRUNTIME_K_BLOCK)
    k_in_block = te.reduce_axis((i64(0), i64(ONNXRUNTIME_K_BLOCK)), name="k")

    def block_sum(*index):
        *row, block, column = index
        k = block * i64(ONNXRUNTIME_K_BLOCK) + k_in_block
        # A plain sum: a loop of 256 steps is not unrolled whole (the tail's is, below), and the
        # fence of multiply_added here made LLVM spill the register tile in the k loop
        # (`[N, 768] @ [768, 64]` at half onnxruntime's speed).
        return te.sum(data[(*row, k)] * weight[k, column], axis=k_in_block)

    block = te.reduce_axis((i64(0), i64(blocks)), name="b")
    if blocks == 1:  # one whole block and a ragged one: the first is a product like any other
        total = te.compute((*rows, i64(columns)), lambda *index: block_sum(*index[:-1], i64(0), index[-1]),
                           name=BLOCKS_SUM)
        biased = (lambda *index: total(*index) + bias[index[-1]]) if bias is not None else total
    else:
        sums = te.compute((*rows, i64(blocks), i64(columns)), block_sum, name=BLOCK_SUMS)

        def blocks_sum(*index):
            term = sums[(*index[:-1], block, index[-1])]
            if bias is not None:  # the first block's sum with the bias, so that 0 + (p0 + b) = b + p0
                term = term + tvm.tirx.Select(block == 0, bias[index[-1]], zero)
            return te.sum(term, axis=block)

        total = biased = te.compute((*rows, i64(columns)), blocks_sum, name=BLOCKS_SUM)
    result = total
    if tail:
        # The last, ragged block is a product of its own: a block of 256 k's with the missing ones
        # selected away put selects between the multiplies and the adds, and LLVM then rounded
        # some products alone (the unrolled rows of a register tile lost their FMAs).
        k_in_tail = te.reduce_axis((i64(0), i64(tail)), name="k")
        first = i64(blocks * ONNXRUNTIME_K_BLOCK)
        tail_sum = te.compute((*rows, i64(columns)), lambda *index: multiply_added(
            data[(*index[:-1], first + k_in_tail)] * weight[first + k_in_tail, index[-1]], axis=k_in_tail),
            name=TAIL_SUM)
        # tail + sum, not sum + tail (the same bits): the tail's block comes first, before the
        # product's register tiles, which then add it in. Rounded: a tail of one k is a bare
        # product, which LLVM would fuse into the add.
        result = te.compute((*rows, i64(columns)), lambda *index: rounded(tail_sum(*index)) + biased(*index),
                            name=WITH_TAIL)
    return result


def _shape(expr) -> list | None:
    ty = expr.ty
    return list(ty.shape.values) if isinstance(ty, relax.TensorType) and ty.shape is not None else None


def legalize_matmul(bb: relax.BlockBuilder, call):
    """The blocked lowering where is_blocked_matmul holds, else TVM's own."""
    data, weight = call.args
    data_shape, weight_shape = _shape(data), _shape(weight)
    if (data_shape is not None and weight_shape is not None and str(weight.ty.dtype) == "float32"
            and is_blocked_matmul(data_shape, weight_shape, data.ty.dtype)):
        return bb.call_te(matmul_in_blocks, data, weight, primfunc_name_hint="matmul")
    return tvm.ir.Op.get("relax.matmul").get_attr("FLegalize")(bb, call)


class GemmInBlocks(onnx_frontend.OnnxOpConverter):
    """ONNX Gemm, `A @ B + C` with alpha and beta 1 (onnx_semantics writes other alphas as a
    product and a Mul), a row of biases C and a K over one block: the blocked lowering, C first
    (onnxruntime's Gemm starts its output from C); by a run-time weight, the one-row kernel's
    order at one row (one_row_products). Any other Gemm: TVM's converter."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, weight = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        plain = (bias is None or attr.get("transA", 0) or float(attr.get("alpha", 1.0)) != 1.0
                 or float(attr.get("beta", 1.0)) != 1.0)
        if not plain and attr.get("transB", 0):
            weight = bb.normalize(relax.op.permute_dims(weight, [1, 0]))
        shapes = [_shape(x) if x is not None else None for x in (data, weight, bias)]
        if plain or None in shapes or str(bias.ty.dtype) != "float32" or not _is_row(shapes[2], shapes[1][1]):
            return onnx_frontend.Gemm._impl_v13(bb, inputs, attr, params)
        if is_blocked_matmul(shapes[0], shapes[1], data.ty.dtype):
            row = bb.normalize(relax.op.reshape(bias, [shapes[1][1]])) if len(shapes[2]) == 2 else bias
            product = bb.emit_te(matmul_in_blocks, data, weight, row, primfunc_name_hint="matmul")
        else:
            product = onnx_frontend.Gemm._impl_v13(bb, inputs, attr, params)
        if not attr.get("transB", 0) and takes_one_row_kernel(bb, data, weight):
            return emit_product(bb, data, weight, product, bias)  # onnxruntime's one-row kernel, from C
        return product


def _is_row(bias_shape, columns) -> bool:
    """Whether a Gemm's C is one row of biases: [M] or [1, M]."""
    dims, m = _static_dims(bias_shape), tir_walk.static_int(columns)
    return dims in ([m], [1, m])


def _stage_reducing_innermost(block, name: str) -> bool:
    """A stage named `name` whose one reduction axis is its innermost."""
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    return block.name_hint.startswith(name) and kinds[-1] == tir_walk.COMM_REDUCE and kinds.count(tir_walk.COMM_REDUCE) == 1


def is_block_sums(block) -> bool:
    """The per-block sums of a blocked product: spatial rows, block, column, then k."""
    return _stage_reducing_innermost(block, BLOCK_SUMS)


def is_tail_sum(block) -> bool:
    """The sums of a blocked product's last, ragged block: spatial rows and column, then k."""
    return _stage_reducing_innermost(block, TAIL_SUM)


def is_with_tail(block) -> bool:
    """The add of a blocked product's ragged last block to the sum of its whole ones."""
    return block.name_hint.startswith(WITH_TAIL)


def is_blocks_sum(block) -> bool:
    """The sum of a blocked product's block sums: spatial rows and column, then the block."""
    return _stage_reducing_innermost(block, BLOCKS_SUM)


def block_sums_of(sch, block_rv):
    """The block-sums block whose results this block adds up (the sum of a blocked product), or None."""
    if not is_blocks_sum(sch.get(block_rv)):
        return None
    producers = [p for p in sch.get_producers(block_rv) if is_block_sums(sch.get(p))]
    return producers[0] if len(producers) == 1 else None
