"""ONNX Reciprocal as the arm64 onnxruntime computes it: an estimate refined twice, not a division.

onnxruntime's Reciprocal is Eigen's `cwiseInverse` over the whole tensor. On NEON, Eigen takes it
four floats at a time with the CPU's reciprocal estimate (FRECPE: 8 bits, from a table of the
input's top 8 fraction bits) and two Newton steps, each FRECPS (`2 - a r`, one fused rounding)
times the last value; the n mod 4 floats past the last whole packet it divides (`1 / x`). Both
differ from the correctly rounded quotient in the last bits: RMSNorm as PyTorch's dynamo exports
it (a Reciprocal of a Sqrt) came out 2.4e-7 off in the fused model with a division.

FRECPE is written out here from the Arm pseudocode (FPRecipEstimate, RecipEstimate) in float and
int32 operations every vector unit has, so the kernel needs no Arm intrinsic (LLVM could not
split `llvm.aarch64.neon.frecpe` over 8 or 16 lanes): for a normal x whose reciprocal is normal,
the 9-bit estimate r of the fraction's leading 9 bits `s` (256 <= s < 512) is
`((2^19 div (2 s + 1)) + 1) div 2`, where the float quotient's floor is the integer one (2 s + 1
is odd, so the quotient is never within 1/1023 of an integer), and the result is r / 256 times
2 to the negated exponent, minus one. Inputs past that range are scaled by 2^25 (exact both ways): the
estimate of a subnormal x overflows to inf below 2^-128 as FRECPE's does, and that of |x| >=
2^126 is the subnormal FRECPE gives. Zero and infinity give inf and zero, which the Newton steps
keep (FRECPS of inf and 0 is 2). Checked against the arm64 onnxruntime under `qemu-aarch64 -cpu
neoverse-n1`, with subnormals, +-0, +-inf, 2^-128, 2^-129 and 2^127 among the inputs
(tests/test_aarch64.py).

Only float32 takes this path, and only where the level's orders say so (sum_orders.NEON); every
other Reciprocal is TVM's division, which x86-64's onnxruntime also computes (Eigen divides
there).
"""

from __future__ import annotations

import tvm
from tvm import te
from tvm.relax.frontend.onnx import onnx_frontend

from . import sum_orders
from .fast_math import multiply_add
from .index_math import flat_index, i64
from .rounded_products import rounded

PACKET = 4  # floats per Eigen packet on NEON
_SCALE = 25  # a power of two that moves any subnormal or |x| >= 2^126 into the estimate's normal range


def _f32(value):
    return tvm.tirx.const(value, "float32")


def _i32(value):
    return tvm.tirx.const(value, "int32")


def _normal_estimate(y):
    """FRECPE of a float whose exponent field e lies in [1, 252], so that the result is normal:
    sign, exponent field 253 - e, fraction the estimate's low 8 bits followed by 15 zeros."""
    bits = tvm.tirx.reinterpret("int32", y)
    exponent = (bits >> _i32(23)) & _i32(0xFF)
    leading = (bits >> _i32(15)) & _i32(0xFF)  # the fraction's top 8 bits; s = 256 + leading
    divisor = tvm.tirx.Cast("float32", leading * _i32(2) + _i32(513))  # 2 s + 1
    quotient = tvm.tirx.floor(_f32(2.0**19) / divisor)
    estimate = tvm.tirx.Cast("int32", tvm.tirx.floor((quotient + _f32(1.0)) * _f32(0.5)))  # 256 <= r < 512
    sign = bits & _i32(-(2**31))
    result = sign | ((_i32(253) - exponent) << _i32(23)) | ((estimate - _i32(256)) << _i32(15))
    return tvm.tirx.reinterpret("float32", result)


def reciprocal_estimate(x):
    """FRECPE of a float32 expression, bit for bit (a NaN stays a NaN)."""
    exponent = (tvm.tirx.reinterpret("int32", x) >> _i32(23)) & _i32(0xFF)
    up, down = _f32(2.0**_SCALE), _f32(2.0**-_SCALE)
    subnormal, huge = exponent == _i32(0), exponent >= _i32(253)
    scaled = tvm.tirx.Select(subnormal, x * up, tvm.tirx.Select(huge, x * down, x))
    estimate = _normal_estimate(scaled)
    estimate = tvm.tirx.Select(subnormal, estimate * up, tvm.tirx.Select(huge, estimate * down, estimate))
    infinite = tvm.tirx.Cast("float32", tvm.tirx.const(float("inf"), "float64"))
    estimate = tvm.tirx.Select(x == _f32(0.0), _copysign(infinite, x), estimate)
    return tvm.tirx.Select(exponent == _i32(0xFF), _zero_or_nan(x), estimate)


def _copysign(magnitude, sign_of):
    sign = tvm.tirx.reinterpret("int32", sign_of) & _i32(-(2**31))
    return tvm.tirx.reinterpret("float32", tvm.tirx.reinterpret("int32", magnitude) | sign)


def _zero_or_nan(x):
    """FRECPE of an infinity is a zero of its sign; of a NaN, the NaN."""
    return tvm.tirx.Select(x != x, x, _copysign(_f32(0.0), x))


def _newton_step(x, r):
    """r times FRECPS(x, r) = 2 - x r, rounded once (a fused multiply-add), then rounded again."""
    return rounded(multiply_add(-x, r, _f32(2.0)) * r)


def reciprocal_as_eigen(data: te.Tensor) -> te.Tensor:
    """1 / data as Eigen's NEON packets compute it: elements of whole packets of 4 (in row-major
    order over the tensor) by the estimate and two Newton steps, the rest by division."""
    shape = list(data.shape)
    total = i64(1)
    for extent in shape:
        total = total * extent
    in_packets = total - tvm.tirx.floormod(total, i64(PACKET))

    def element(*index):
        x = data(*index)
        estimate = reciprocal_estimate(x)
        refined = _newton_step(x, _newton_step(x, estimate))
        # zero and infinity: FRECPS(0, inf) and FRECPS(inf, 0) are 2, so the estimate stands
        refined = tvm.tirx.Select((x == _f32(0.0)) | (tvm.tirx.reinterpret("int32", x) & _i32(0x7FFFFFFF)
                                                       == _i32(0x7F800000)), estimate, refined)
        return tvm.tirx.Select(flat_index(shape, index) < in_packets, refined, _f32(1.0) / x)

    return te.compute(shape, element, name="T_reciprocal")


class ReciprocalAsOnnxruntime(onnx_frontend.OnnxOpConverter):
    """Reciprocal of a float32 tensor where onnxruntime estimates it (sum_orders), else TVM's."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        data = inputs[0]
        estimated = sum_orders.current().reciprocal_estimated
        if not estimated or str(data.ty.dtype) != "float32" or isinstance(data, tvm.ir.expr.Constant):
            return onnx_frontend.Reciprocal._impl_v13(bb, inputs, attr, params)
        return bb.emit_te(reciprocal_as_eigen, data, primfunc_name_hint="reciprocal")
