"""The result of an ONNX Mul is rounded to its type before anything adds to it, as onnxruntime's is.

Why: TVM's LLVM backend builds with `AllowFPOpFusion = Fast` and no target attribute turns that
off, so on a CPU with FMA (AVX2, AVX-512, NEON) LLVM contracted an elementwise `x * y + z`
into one fused multiply-add: one rounding where onnxruntime's Mul and Add round twice (68 of
256 random float32 elements of `Mul -> Add` differed in the last bit). onnxruntime computes
Mul and Add in separate kernels (its generic elementwise code is built for the x86-64 baseline,
without FMA); only its MLAS kernels (GEMM, and exp/tanh/erf/logistic polynomials) use FMA.

So the product of a float `multiply` is wrapped in `llvm.arithmetic.fence`, which LLVM does not
contract across and which costs no instruction. Only the ONNX op's product is fenced: the
GEMM's inner products (`acc + a * b` in a reduction) and our own polynomials (fast_math) keep
their FMAs, as onnxruntime's MLAS kernels do. Tensors with their own rounding (integers) are
left alone.
"""

from __future__ import annotations

import tvm
from tvm import te, topi
from tvm.relax.transform.legalize_ops.binary import _binary


def rounded(value):
    """`value` (a float PrimExpr) as a value LLVM will not fuse into a following add."""
    return tvm.tirx.call_llvm_pure_intrin(str(value.ty.dtype), "llvm.arithmetic.fence", value)


def rounded_multiply(a, b):
    """topi.multiply (broadcasting, scalar operands) with every float product fenced."""
    product = topi.multiply(a, b)
    if not isinstance(product, te.Tensor) or "float" not in str(product.dtype):
        return product
    return te.compute(product.shape, lambda *i: rounded(product(*i)), name="T_multiply_rounded")


legalize_multiply = _binary(rounded_multiply)


# A sum whose every step adds the new product to the running sum, which is fenced: LLVM may only
# fuse the new product into the add, so each step is fma(x, y, sum) as in onnxruntime's kernels.
# With a plain sum, once LLVM had unrolled a short chain and dropped its `0 +`, it fused the first
# product into the second step instead (x0 y0 + round(x1 y1) where onnxruntime computes
# round(x0 y0) + x1 y1): 4-9% of the outputs of 8-output-channel convolutions, LayerNorm rows of
# 16 to 383 values, and the 16-k last block of a [1, 784] @ [784, 64] product differed in the last bit.
multiply_added = te.comm_reducer(lambda total, product: product + rounded(total),
                                 lambda dtype: tvm.tirx.const(0.0, dtype), name="multiply_added")
