"""The fast exp/tanh/erf/sigmoid (codegen/fast_math.py) against onnxruntime's own ops, in ulps, over
a dense sweep of float32 inputs in [-100, 100], and bit for bit on NaN, ±inf and ±0. The bounds
asserted here are the ones docs/numerics.md states."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host_has
from onnx_builder import model, node
from test_ieee_order import assert_bitwise_equal, fused_session, original_session

F32 = np.float32
WIDTH = 1000
SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], F32)


def ordered(values: np.ndarray) -> np.ndarray:
    """float32 → integers in the same order, adjacent floats one apart (ulp distance = difference)."""
    bits = values.view(np.int32).astype(np.int64)
    return np.where(bits >= 0, bits, -(2**31) - bits)


def sweep() -> np.ndarray:
    """1.6 million inputs in [-100, 100]: 600,000 evenly spaced float32 bit patterns from 0 to 100
    (as dense near 1e-38 as near 50) with their negatives, and 400,000 evenly spaced values."""
    top = ordered(np.array([100.0], F32))[0]
    positive = np.linspace(0, top, 600_000).astype(np.int64).astype(np.int32).view(F32)
    values = np.concatenate([positive, -positive, np.linspace(-100, 100, 400_000, dtype=F32)])
    return values.reshape(-1, WIDTH)


def _fused_and_onnxruntime(op: str, x: np.ndarray, tmp_path):
    """(shipped kernel, onnxruntime) results of op(x); a Neg after the op (exact) makes it a group."""
    m = model([node(op, ["x"], "a"), node("Neg", ["a"], "y")], {"x": ("N", x.shape[1])}, {"y": ("N", x.shape[1])},
              opset=17)
    (got,) = fused_session(m, tmp_path).run(None, {"x": x})
    (expected,) = original_session(m).run(None, {"x": x})
    return -got, -expected


# op: [(inputs the bound covers, max ulps), ...], and the max absolute difference over the sweep
BOUNDS = {
    # onnxruntime's own (MLAS's) exp, subnormal results (below -87.3) and overflow included
    "Exp": ([(lambda x: np.ones_like(x, bool), 0)], 0.0, None),
    "Tanh": ([(lambda x: np.ones_like(x, bool), 0)], 0.0, None),  # onnxruntime's own rational function
    "Erf": ([(lambda x: np.ones_like(x, bool), 0)], 0.0, None),  # onnxruntime's own (MLAS's) erf
    # onnxruntime's own rational function (test_sigmoid_levels.py: bit for bit at every level).
    "Sigmoid": ([(lambda x: np.ones_like(x, bool), 0)], 0.0, None),
}


@pytest.mark.parametrize("op", list(BOUNDS))
def test_fast_math_within_documented_ulps_of_onnxruntime(tmp_path, op):
    x = sweep()
    got, expected = _fused_and_onnxruntime(op, x, tmp_path)
    x, got, expected = x.ravel(), got.ravel(), expected.ravel()
    ulps = np.abs(ordered(got) - ordered(expected))
    ulp_bounds, abs_bound, abs_only_where = BOUNDS[op]
    for covers, bound in ulp_bounds:
        inside = covers(x)
        worst = np.argmax(np.where(inside, ulps, -1))
        assert ulps[inside].max() <= bound, f"{op}({x[worst]}) = {got[worst]}, onnxruntime {expected[worst]}"
    finite = np.isfinite(expected)
    where = finite & (abs_only_where(x) if abs_only_where else True)
    assert np.abs(got[where].astype(np.float64) - expected[where]).max() <= abs_bound
    np.testing.assert_array_equal(np.isfinite(got), finite)


@pytest.mark.parametrize("op", list(BOUNDS))
def test_fast_math_special_values_exact(tmp_path, op):
    got, expected = _fused_and_onnxruntime(op, SPECIALS[None], tmp_path)
    assert_bitwise_equal(got, expected)


TAIL = np.linspace(-110, -80, 40_000, dtype=F32)  # exp subnormal from -87.3, 0 from -103.97
TAILS = {  # op: (input, attributes): each output element is exp of one tail value (or about it)
    "Exp": (TAIL.reshape(-1, WIDTH), {}),
    "Softplus": (TAIL.reshape(-1, WIDTH), {}),  # log1p(exp(x)) is exp(x) there
    "Softmax": (np.stack([np.zeros_like(TAIL), TAIL, TAIL, TAIL], 1), {"axis": -1}),  # the row's max is 0
}


@pytest.mark.parametrize("op", list(TAILS))
def test_subnormal_results_are_onnxruntimes(tmp_path, op):
    """Results under 2^-126 are subnormal, within 1 ulp of onnxruntime's, and 0 exactly where its
    are: `Log(Softmax)` of a logit 100 below the row's max is -100, not -inf (fast_math.py)."""
    x, attrs = TAILS[op]
    m = model([node(op, ["x"], "a", **attrs), node("Neg", ["a"], "y")], {"x": ("N", x.shape[1])},
              {"y": ("N", x.shape[1])}, opset=17)
    got = -fused_session(m, tmp_path).run(None, {"x": x})[0]
    expected = -original_session(m).run(None, {"x": x})[0]
    assert ((expected > 0) & (expected < 2.0**-126)).sum() > 10_000  # subnormals are what this tests
    np.testing.assert_array_equal(got == 0, expected == 0)
    assert np.abs(ordered(got.ravel()) - ordered(expected.ravel())).max() <= 1


@pytest.mark.parametrize("op", list(BOUNDS))
def test_a_symbolic_rows_scalar_tail_is_onnxruntimes_too(tmp_path, op):
    """With the row length symbolic, a row's last elements (333 = 20 x 16 + 13) run in a scalar
    loop, where LLVM's SLP vectorizer took two products into one vector multiply and left the
    Horner step after one of them unfused (Exp 1 ulp off at 3 of 21,312 elements of exp(x - row
    max)): every multiply-add of these functions is llvm.fmuladd now (fast_math.multiply_add)."""
    rng = np.random.default_rng(333)
    x = (rng.standard_normal((64, 333)) * 4).astype(F32)
    x = np.concatenate([x - x.max(axis=1, keepdims=True), sweep().ravel()[: 64 * 333].reshape(64, 333)])
    m = model([node(op, ["x"], "a"), node("Neg", ["a"], "y")], {"x": ("N", "D")}, {"y": ("N", "D")}, opset=17)
    (got,) = fused_session(m, tmp_path).run(None, {"x": x})
    (expected,) = original_session(m).run(None, {"x": x})
    assert_bitwise_equal(got, expected)


# onnxruntime's Softmax (MLAS's AVX-512 kernels): exp(x - max) summed in 16 lanes, then reduced in
# its own order (fast_math._fast_softmax). Rows shorter than, equal to and longer than a vector,
# with a ragged last one, static and symbolic; the last axis and an inner one; opset 11's
# flattened rows.
SOFTMAX_CASES = {
    "static": (17, ["N", 333], -1), "static_one": (17, ["N", 1], -1), "static_short": (17, ["N", 5], -1),
    "symbolic": (17, ["N", "D"], -1), "inner_axis": (17, ["N", 37, 4], 1), "opset11_flattened": (11, ["N", 3, 40], 1),
}


@pytest.mark.skipif(not host_has("avx512f"), reason="onnxruntime sums in 16 lanes on AVX-512 CPUs only")
@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax_is_onnxruntimes_bit_for_bit(tmp_path, case):
    opset, dims, axis = SOFTMAX_CASES[case]
    m = model([node("Softmax", ["x"], "a", axis=axis), node("Neg", ["a"], "y")], {"x": tuple(dims)}, {"y": tuple(dims)},
              opset=opset)
    session = fused_session(m, tmp_path)
    lengths = (1, 15, 16, 17, 100, 333) if case == "symbolic" else (None,)
    for seed, length in enumerate(lengths):
        shape = [9 if d == "N" else (length if d == "D" else d) for d in dims]
        x = (np.random.default_rng(seed).standard_normal(shape) * 4).astype(F32)
        (got,) = session.run(None, {"x": x})
        (expected,) = original_session(m).run(None, {"x": x})
        assert_bitwise_equal(got, expected)
