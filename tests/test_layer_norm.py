"""LayerNormalization as onnxruntime computes it (onnxfuse/codegen/layer_norm.py).

onnxruntime 1.32's CPU kernel, pinned here against numpy: rows under 8 values take Welford's
update in float, one value after the other; longer rows a mean summed in float64. The fused
kernels follow: bit for bit on short rows, and on long rows bit for bit wherever the row is
special (near the float limit, one repeated large value, NaN, ±inf), within 1e-4 of the row's
scale elsewhere (the squares are summed in another order).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_ieee_order import assert_bitwise_equal, fused_session, original_session

F32 = np.float32
EPSILON = 1e-5


def layer_norm_model(shape: tuple, axis: int, dtype=TensorProto.FLOAT, seed: int = 0) -> onnx.ModelProto:
    """y = -LayerNormalization(x) (the Neg makes it a group) with random scale and bias."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    inner = shape[axis:]
    rng = np.random.default_rng(seed)
    inits = [helper.make_tensor(name, dtype, inner, rng.standard_normal(inner).astype(np_type).ravel())
             for name in ("scale", "bias")]
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"], axis=axis, epsilon=EPSILON),
         helper.make_node("Neg", ["n"], ["y"])], "ln",
        [helper.make_tensor_value_info("x", dtype, ["N", *shape[1:]])],
        [helper.make_tensor_value_info("y", dtype, ["N", *shape[1:]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def rows(n: int, dtype=np.float32) -> tuple[np.ndarray, int]:
    """(ordinary rows of mixed scale and offset, then special rows; the index of the first special one)."""
    rng = np.random.default_rng(n)
    ordinary = rng.standard_normal((300, n)) * rng.uniform(0.1, 100, (300, 1)) + rng.uniform(-50, 50, (300, 1))
    big = float(np.finfo(dtype).max) * 0.9
    special = [np.full(n, big), np.full(n, -big), np.full(n, 1e18), np.full(n, 40000.3), np.r_[big, -big, np.zeros(n - 2)],
               np.r_[np.zeros(n - 2), big, -big], np.r_[[big] * (n - 1), 1.0], np.r_[np.nan, np.ones(n - 1)],
               np.r_[np.inf, np.ones(n - 1)], np.r_[-np.inf, np.inf, np.ones(n - 2)], np.full(n, -0.0), np.full(n, 1e-40)]
    return np.concatenate([ordinary, special]).astype(dtype), len(ordinary)


def welford_statistics(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, M2) per row, onnxruntime's update in x's type, one value after the other."""
    mean, m2 = np.zeros(len(x), x.dtype), np.zeros(len(x), x.dtype)
    with np.errstate(all="ignore"):
        for j in range(x.shape[1]):
            d = x[:, j] - mean
            mean = mean + d / x.dtype.type(j + 1)
            m2 = m2 + d * (x[:, j] - mean)
    return mean, m2


@pytest.mark.parametrize("n", [2, 5, 7])
def test_onnxruntime_takes_welfords_update_on_short_rows(n):
    """Pins onnxruntime: its mean output is Welford's, bit for bit, and a row [big, -big, 0...] has
    mean -inf there (its difference overflows), where a plain sum gives 0."""
    x, _ = rows(n)
    model = layer_norm_model((1, n), -1)
    graph = model.graph
    graph.node[0].output.append("mean")
    graph.output.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    _, mean = original_session(model).run(None, {"x": x})
    expected, _ = welford_statistics(x)
    assert_bitwise_equal(mean.ravel(), expected)
    assert not np.isfinite(mean.ravel()[-8])  # [big, -big, 0, ...]: -inf, or NaN once 0 - -inf is added


@pytest.mark.parametrize("n", [8, 16, 768])
def test_onnxruntime_sums_long_rows_in_float64(n):
    x, _ = rows(n)
    model = layer_norm_model((1, n), -1)
    model.graph.node[0].output.append("mean")
    model.graph.output.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    _, mean = original_session(model).run(None, {"x": x})
    with np.errstate(invalid="ignore"):
        expected = (x.astype(np.float64).sum(1) / n).astype(F32)
    assert_bitwise_equal(mean.ravel(), expected)


@pytest.mark.parametrize("shape,axis", [((1, 2), -1), ((1, 3), -1), ((1, 7), -1), ((1, 2, 3), 1)])
def test_short_rows_are_onnxruntimes_bit_for_bit(tmp_path, shape, axis):
    """float32 only: a float64 LayerNormalization is left to onnxruntime (TVM's FoldConstant runs
    TVM's own lowering, which rejects float64, before ours)."""
    n = int(np.prod(shape[axis:]))
    x, _ = rows(n)
    x = x.reshape(-1, *shape[1:])
    model = layer_norm_model(shape, axis)
    expected = original_session(model).run(None, {"x": x})[0]
    assert_bitwise_equal(fused_session(model, tmp_path).run(None, {"x": x})[0], expected)


# every remainder modulo 8 (onnxruntime's lanes), on both sides of its block of 4, two axes
@pytest.mark.parametrize("shape,axis", [((1, n), -1) for n in (8, 9, 11, 12, 13, 14, 15, 16, 23, 31, 64, 383, 768, 770)]
                         + [((1, 4, 4), 1), ((1, 3, 5), 1)])
def test_long_rows_are_onnxruntimes_bit_for_bit(tmp_path, shape, axis):
    """Ordinary rows too, since the squares are summed in onnxruntime's lanes and order
    (layer_norm.py); and the rows near the limits, of one repeated value, with NaN or ±inf."""
    n = int(np.prod(shape[axis:]))
    x, _ = rows(n)
    x = x.reshape(-1, *shape[1:])
    model = layer_norm_model(shape, axis)
    expected = original_session(model).run(None, {"x": x})[0]
    assert_bitwise_equal(fused_session(model, tmp_path).run(None, {"x": x})[0], expected)
