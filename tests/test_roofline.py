"""roofline: the bytes and multiply-adds a kernel asks for, and the machine bounds they meet."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_builder import model, node, weights

from onnxfuse.measure.roofline import (
    bytes_moved,
    call_floor_us,
    gemm_free_model,
    gemm_only_model,
    gemm_peak_gflops,
    multiply_add_flops,
    ratio_bound,
)
from onnxfuse.select.measured import Measurement


def test_bytes_moved_counts_inputs_weights_and_outputs_like_numpy():
    w, idx = weights(16, 8), np.arange(3, dtype=np.int64)
    m = model([node("MatMul", ["x", "w"], "y")], {"x": ("N", 16)}, {"y": ("N", 8)}, {"w": w, "idx": idx})
    x = np.zeros((5, 16), np.float32)
    y = x @ w
    moved = bytes_moved(m, {"x": x}, [y])
    assert moved == x.nbytes + w.nbytes + idx.nbytes + y.nbytes == 5 * 16 * 4 + 16 * 8 * 4 + 3 * 8 + 5 * 8 * 4


def test_flops_of_a_matmul_chain_follow_the_batch():
    """x[N,16] @ w1[16,32] → relu → @ w2[32,8]: 2·N·16·32 + 2·N·32·8, at whatever batch the feeds have."""
    m = model([node("MatMul", ["x", "w1"], "h"), node("Relu", ["h"], "r"), node("MatMul", ["r", "w2"], "y")],
              {"x": ("N", 16)}, {"y": ("N", 8)}, {"w1": weights(16, 32), "w2": weights(32, 8)})
    for batch in (1, 7):
        assert multiply_add_flops(m, {"x": np.zeros((batch, 16), np.float32)}) == 2 * batch * (16 * 32 + 32 * 8)


def test_flops_of_a_batched_matmul_transposed_gemm_and_grouped_conv():
    batched = model([node("MatMul", ["a", "b"], "y")], {"a": (3, 5, 4), "b": (3, 4, 6)}, {"y": (3, 5, 6)})
    feeds = {"a": np.zeros((3, 5, 4), np.float32), "b": np.zeros((3, 4, 6), np.float32)}
    assert multiply_add_flops(batched, feeds) == 2 * 3 * 5 * 4 * 6

    gemm = model([node("Gemm", ["a", "w", "c"], "y", transA=1)], {"a": (10, "N")}, {"y": ("N", 3)},
                 {"w": weights(10, 3), "c": weights(3)})
    assert multiply_add_flops(gemm, {"a": np.zeros((10, 4), np.float32)}) == 2 * 4 * 10 * 3

    # 8 → 6 channels in 2 groups, 3x3 filters, 10x10 → 8x8: each output reads 4 channels x 9 taps
    conv = model([node("Conv", ["x", "w"], "y", group=2)], {"x": ("N", 8, 10, 10)}, ["y"], {"w": weights(6, 4, 3, 3)})
    assert multiply_add_flops(conv, {"x": np.zeros((2, 8, 10, 10), np.float32)}) == 2 * (2 * 6 * 8 * 8) * (4 * 3 * 3)


def test_groups_without_multiply_adds_count_none():
    m = model([node("Sigmoid", ["x"], "y")], {"x": ("N", 4)}, {"y": ("N", 4)})
    assert multiply_add_flops(m, {"x": np.zeros((3, 4), np.float32)}) == 0


def test_achieved_bandwidth_and_its_share_of_the_copy_bandwidth():
    m = Measurement(64, 1, kernel_us=10.0, onnxruntime_us=25.0, bytes_moved=200_000)
    assert m.kernel_gbs == pytest.approx(20.0) and m.gain_us == 15.0
    assert m.to_json(copy_gbs=40.0)["copy_bandwidth_pct"] == 50.0
    assert "copy_bandwidth_pct" not in m.to_json()


def test_achieved_compute_its_share_of_the_peak_and_the_ratio_bound():
    """2 MFLOP in 40 µs is 50 GFLOP/s: half of a 100 GFLOP/s peak, where the work would take 20 µs,
    so against onnxruntime's 60 µs no kernel could be more than 3x faster."""
    m = Measurement(64, 1, kernel_us=40.0, onnxruntime_us=60.0, flops=2_000_000)
    assert m.kernel_gflops == pytest.approx(50.0)
    out = m.to_json(peak_gflops=100.0)
    assert out["gemm_peak_pct"] == 50.0 and out["ratio_bound"] == pytest.approx(3.0)
    assert "gemm_peak_pct" not in m.to_json()  # no peak measured: no share of it
    assert "flops" not in Measurement(64, 1, 40.0, 60.0).to_json(peak_gflops=100.0)
    assert ratio_bound(0, 60.0, 100.0) is None


def test_the_ratio_bound_counts_the_call_both_sides_pay():
    """With a 10 µs call around it, the same 20 µs of work leaves onnxruntime's 60 µs only 2x above
    any kernel's best (60 / (20 + 10)), not 3x."""
    assert ratio_bound(2_000_000, 60.0, 100.0, call_us=10.0) == pytest.approx(2.0)
    out = Measurement(64, 1, kernel_us=40.0, onnxruntime_us=60.0, flops=2_000_000).to_json(peak_gflops=100.0, call_us=10.0)
    assert out["ratio_bound"] == pytest.approx(2.0)


def test_an_empty_call_is_timed_in_microseconds():
    """A sanity range, not a speed assertion: a call from Python takes more than 0 and far less
    than 10 ms (a unit slip to seconds or nanoseconds fails here)."""
    assert 0.0 < call_floor_us(1, calls=50) < 10_000.0


def test_the_gemm_peak_is_a_measured_rate_below_any_x86_cores_limit():
    """A sanity range, not a speed assertion: above 1 GFLOP/s, below 64 FLOP per cycle at 6 GHz."""
    assert 1.0 < gemm_peak_gflops(1, size=128, calls=2) < 64 * 6.0


def small_cell():
    """An LSTM-like cell: two MatMuls, their sum, a Sigmoid gate times the state c. (model, w, r)"""
    w, r = weights(8, 16, seed=1), weights(8, 16, seed=2)
    m = model(
        [node("MatMul", ["x", "w"], "xw"), node("MatMul", ["h", "r"], "hr"), node("Add", ["xw", "hr"], "g"),
         node("Sigmoid", ["g"], "s"), node("Mul", ["s", "c"], "y")],
        {"x": ("N", 8), "h": ("N", 8), "c": ("N", 16)}, {"y": ("N", 16)}, {"w": w, "r": r},
    )
    return m, w, r


def test_gemm_only_model_keeps_the_matmuls_and_what_feeds_them():
    """An LSTM-like cell cut at its MatMuls: two outputs, equal to numpy's products; the state
    input that only the cut-off gate math reads is gone."""
    import onnxruntime as ort

    m, w, r = small_cell()
    cut = gemm_only_model(m)
    assert [o.name for o in cut.graph.output] == ["xw", "hr"]
    assert sorted(i.name for i in cut.graph.input) == ["h", "x"]
    rng = np.random.default_rng(0)
    x, h = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
    xw, hr = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x, "h": h})
    np.testing.assert_allclose(xw, x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(hr, h @ r, rtol=1e-5, atol=1e-5)
    assert gemm_only_model(model([node("Relu", ["x"], "y")], {"x": (2, 3)}, {"y": (2, 3)})) is None


def test_gemm_free_model_keeps_everything_but_the_matmuls_whose_outputs_become_inputs():
    """The same cell without its MatMuls: fed the products, it computes the gate math as numpy
    does; the inputs only the MatMuls read are gone."""
    import onnxruntime as ort

    m, _, _ = small_cell()
    cut = gemm_free_model(m)
    assert [n.op_type for n in cut.graph.node] == ["Add", "Sigmoid", "Mul"]
    assert sorted(i.name for i in cut.graph.input) == ["c", "hr", "xw"]
    rng = np.random.default_rng(0)
    xw, hr, c = (rng.standard_normal((3, 16)).astype(np.float32) for _ in range(3))
    (y,) = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"xw": xw, "hr": hr, "c": c})
    np.testing.assert_allclose(y, c / (1 + np.exp(-(xw + hr))), rtol=1e-5, atol=1e-6)
    assert gemm_free_model(model([node("Relu", ["x"], "y")], {"x": (2, 3)}, {"y": (2, 3)})) is None
