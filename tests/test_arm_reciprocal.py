"""arm_reciprocal: NEON's reciprocal estimate and Eigen's refinement, written in float and int32
operations, give the bits of the Arm pseudocode (FPRecipEstimate, FRECPS), computed here in
integers, on this x86-64 machine. The arm64 onnxruntime itself is the reference of
tests/test_aarch64.py (its orders model and exported RMSNorm)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx_builder import model, node
from tvm import te
from tvm.target import codegen

from onnxfuse.codegen import relax_import, sum_orders
from onnxfuse.codegen.arm_reciprocal import reciprocal_as_eigen, reciprocal_estimate

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
needs_fma = pytest.mark.skipif(not codegen.target_has_features("fma", TARGET),
                               reason="FRECPS is a fused multiply-add; this CPU has none")


def frecpe_reference(x: np.ndarray) -> np.ndarray:
    """FPRecipEstimate for float32 (round to nearest, no flush to zero), in integers as the Arm
    pseudocode writes it: the fraction widened to 52 bits, RecipEstimate's integer divisions."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.int64)
    sign, exponent, fraction = bits & 0x80000000, (bits >> 23) & 0xFF, (bits & 0x7FFFFF) << 29
    subnormal = exponent == 0
    top_clear = (fraction >> 51) & 1 == 0
    exponent = np.where(subnormal & top_clear, -1, exponent)
    fraction = np.where(subnormal, np.where(top_clear, fraction << 2, fraction << 1) & ((1 << 52) - 1), fraction)
    scaled = 256 | (fraction >> 44)
    estimate = ((1 << 19) // (scaled * 2 + 1) + 1) // 2
    result_exponent = 253 - exponent
    fraction = (estimate & 0xFF) << 44
    fraction = np.where(result_exponent == 0, (1 << 51) | (fraction >> 1), fraction)
    fraction = np.where(result_exponent == -1, (1 << 50) | (fraction >> 2), fraction)
    result_exponent = np.maximum(result_exponent, 0)
    out = (sign | (result_exponent << 23) | (fraction >> 29)).astype(np.uint32).view(np.float32)
    magnitude = np.abs(x)
    with np.errstate(invalid="ignore"):
        out = np.where(magnitude < np.float32(2.0**-128), np.copysign(np.float32(np.inf), x), out)
        out = np.where(np.isinf(x), np.copysign(np.float32(0.0), x), out)
    return np.where(np.isnan(x), x, out).astype(np.float32)


def frecps_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """2 - a b rounded once (the product is exact in float64, and so is its difference from 2
    wherever a b is near 1, as in every Newton step here); inf times 0 gives 2."""
    with np.errstate(invalid="ignore", over="ignore"):
        step = (2.0 - a.astype(np.float64) * b.astype(np.float64)).astype(np.float32)
        special = (np.isinf(a) & (b == 0)) | ((a == 0) & np.isinf(b))
    return np.where(special, np.float32(2.0), step)


def eigen_reference(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1)
    whole = flat.size - flat.size % 4
    out = np.empty_like(flat)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        r = frecpe_reference(flat[:whole])
        for _ in range(2):
            r = (frecps_reference(flat[:whole], r) * r).astype(np.float32)
        out[:whole] = r
        out[whole:] = np.float32(1.0) / flat[whole:]
    return out.reshape(x.shape)


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, 1.5, 2.0**-126, 2.0**-127, 1.5 * 2.0**-127,
                     2.0**-128, 1.9 * 2.0**-128, 2.0**-129, 2.0**-149, -1e-39, 3e-40, 2.0**125, 1.99 * 2.0**125,
                     2.0**126, -1.5 * 2.0**126, 2.0**127, 3.4e38, -3.4028235e38], np.float32)


def _run(compute, values: np.ndarray) -> np.ndarray:
    data = te.placeholder(values.shape, "float32", name="x")
    func = te.create_prim_func([data, compute(data)])
    built = tvm.compile(tvm.IRModule({"main": func}), target=TARGET)
    out = tvm.runtime.tensor(np.zeros(values.shape, np.float32))
    built["main"](tvm.runtime.tensor(values), out)
    return out.numpy()


def _same_bits(expected: np.ndarray, actual: np.ndarray) -> None:
    differ = np.nonzero(expected.view(np.uint32) != actual.view(np.uint32))[0]
    assert differ.size == 0, [(float(v), float(e), float(a)) for v, e, a in
                              zip(VALUES[differ[:5]], expected[differ[:5]], actual[differ[:5]])]


def _values() -> np.ndarray:
    """Every fraction at two exponents, the boundary exponents of the estimate's normal range
    with random fractions, random bits across all exponents, and the special values."""
    rng = np.random.default_rng(0)
    every_fraction = np.arange(1 << 23, dtype=np.uint32)
    parts = [every_fraction | np.uint32(127 << 23), every_fraction | np.uint32((1 << 31) | (3 << 23))]
    for exponent in (0, 1, 2, 252, 253, 254):
        parts.append(rng.integers(0, 1 << 23, 20_000, dtype=np.uint32) | np.uint32(exponent << 23))
    parts.append(rng.integers(0, 0x7F800000, 200_000, dtype=np.uint32) | (rng.integers(0, 2, 200_000, dtype=np.uint32) << 31))
    return np.concatenate([*(p.view(np.float32) for p in parts), SPECIALS])


VALUES = _values()


def test_estimate_is_frecpe_bit_for_bit():
    _same_bits(frecpe_reference(VALUES), _run(lambda x: te.compute(x.shape, lambda i: reciprocal_estimate(x[i])), VALUES))


@needs_fma
def test_whole_packets_refined_and_the_rest_divided():
    """Packets of 4 over the tensor in row-major order: 3 of 7 x 5 = 35 floats and 2 of 2 x 3 x 5 =
    30 are divided (the quotient differs from the refined estimate in about a quarter of the values)."""
    rng = np.random.default_rng(1)
    for shape in ((7, 5), (2, 3, 5), (3,)):
        size = int(np.prod(shape))
        values = (rng.standard_normal(size) * np.exp(rng.uniform(-60, 60, size))).astype(np.float32)
        values[: min(size, SPECIALS.size)] = SPECIALS[: min(size, SPECIALS.size)]
        values = values.reshape(shape)
        got = _run(reciprocal_as_eigen, values)
        expected = eigen_reference(values)
        assert np.array_equal(expected.view(np.uint32), got.view(np.uint32)), (shape, expected, got)
    many = rng.uniform(0.5, 2.0, 4096 * 4).astype(np.float32)
    with np.errstate(divide="ignore"):
        assert not np.array_equal(eigen_reference(many), np.float32(1.0) / many)  # the check can fail


def _reciprocal_group(dtype: int = 1):
    return model([node("Reciprocal", ["x"], "r"), node("Neg", ["r"], "y")], {"x": ("N", 13)}, {"y": ("N", 13)},
                 dtype=dtype, opset=17)


@pytest.mark.parametrize("orders,estimated", [(sum_orders.NEON, True), (sum_orders.AVX512, False),
                                              (sum_orders.SSE, False)])
def test_only_neon_levels_estimate(orders, estimated):
    with sum_orders.summing_as(orders):
        script = relax_import.import_group(_reciprocal_group(), "k").prim_func.script()
    assert ("T.reinterpret" in script) == estimated, script


def test_float64_is_divided_on_neon_too():
    with sum_orders.summing_as(sum_orders.NEON):
        script = relax_import.import_group(_reciprocal_group(dtype=11), "k").prim_func.script()
    assert "T.reinterpret" not in script and "/" in script, script
