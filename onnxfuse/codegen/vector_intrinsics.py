"""`isnan` and `nearbyint` stay vector operations in vectorized loops.

The kernels test for NaN wherever onnxruntime's result depends on it: a fast approximation
keeps a NaN input (fast_math), Clip/Max/Min propagate NaN (nan_propagation), negated float
comparisons are true on NaN (nan_safe_comparisons), Sign keeps NaN (legalize); Round is
`nearbyint` (ties to even). TVM 0.27's VectorizeLoop vectorizes a call only if its op is marked
TVectorizable, and these two are not: a vector loop holding one became a scalar loop of 16
iterations, for the whole block (the GELU after a MatMul ran 2.4x slower than onnxruntime;
each element took a branchy scalar erf). LLVM codegen emits `isnan` as an unordered compare
and `nearbyint` as llvm.nearbyint, both defined on vectors as on scalars (one `vcmpunordps` for
16 lanes), so marking the ops vectorizable is all it takes.

The mark is set on TVM's global op registry when the compiler is imported; it only lets more
loops vectorize, in every TVM user of the process, with the same results.
"""

from __future__ import annotations

import tvm

VECTOR_SAFE_OPS = ("tirx.isnan", "tirx.nearbyint")


def mark_vectorizable() -> None:
    for name in VECTOR_SAFE_OPS:
        if not tvm.ir.Op.get(name).get_attr("TVectorizable"):
            tvm.ir.register_op_attr(name, "TVectorizable", True)


mark_vectorizable()
