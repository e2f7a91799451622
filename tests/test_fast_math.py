"""fast_math: vectorizable exp/tanh/erf/sigmoid/softmax agree with onnxruntime and leave no libm calls."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx_builder import model, node
from test_codegen import check_against_ort, random_feeds
from tvm import relax

from onnxfuse.codegen import relax_import
from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.fast_math import FastMath
from onnxfuse.target import resolve_target

TRANSCENDENTAL_CALLS = ("T.exp(", "T.tanh(", "T.erf(", "T.sigmoid(")


def _op_then_scale(op: str, shape=("N", 8, 64), **attrs):
    scale = np.linspace(0.5, 1.5, shape[-1]).astype(np.float32)
    return model([node(op, ["x"], "a", **attrs), node("Mul", ["a", "scale"], "y")], {"x": shape}, {"y": shape},
                 {"scale": scale}, opset=18)


@pytest.mark.parametrize("op,attrs", [
    ("Exp", {}), ("Tanh", {}), ("Erf", {}), ("Sigmoid", {}),
    ("Softmax", {"axis": -1}), ("Softmax", {"axis": 1}), ("LogSoftmax", {"axis": -1}),
])
def test_fast_ops_match_onnxruntime_without_libm_calls(tmp_path, op, attrs):
    m = _op_then_scale(op, **attrs)
    fused = relax_import.import_group(m, "k").prim_func.script()
    assert not [call for call in TRANSCENDENTAL_CALLS if call in fused], fused
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    for batch in (1, 9):
        feeds = random_feeds(m, batch, seed=batch)
        feeds["x"] *= 4  # softmax rows with a wide range, sigmoid and tanh into saturation
        check_against_ort(cg, m, feeds)


def test_softmax_of_large_logits_stays_finite(tmp_path):
    """exp(x - max): logits far above exp's range must not overflow."""
    m = _op_then_scale("Softmax", axis=-1)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    feeds = random_feeds(m, 3)
    feeds["x"] = feeds["x"] * 50 + 1000
    check_against_ort(cg, m, feeds)
    assert np.isfinite(cg.run(feeds)[0]).all()


def test_non_float32_is_left_alone():
    m = model([node("Exp", ["x"], "y")], {"x": ("N", 4)}, {"y": ("N", 4)}, dtype=11)  # float64
    mod = relax_import._import(m)
    names = []
    relax.analysis.post_order_visit(FastMath()(mod)["main"].body,
                                    lambda e: names.append(e.op.name)
                                    if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    assert names == ["relax.exp"]


def test_fast_exp_is_accurate_over_the_whole_float_range(tmp_path):
    """Within 2 ulp of exp from -86.98 (below it the result is under 2.4e-38, subnormal: the
    subnormal tail is test_ieee_fast_math's) to 88.72, the largest finite result; inf above, NaN
    kept. topi's fast exp gave inf from 88.38."""
    x = np.linspace(-86.98, 88.72, 200_000).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 88.7228, 88.723, -104.0, 0.0, -0.0], np.float32)
    m = model([node("Exp", ["x"], "a"), node("Neg", ["a"], "y")], {"x": ("N", x.size)}, {"y": ("N", x.size)}, opset=17)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    (got,) = cg.run({"x": x[None]})
    np.testing.assert_allclose(-got[0], np.exp(x.astype(np.float64)), rtol=2.4e-7, atol=0)
    m = model([node("Exp", ["x"], "a"), node("Neg", ["a"], "y")], {"x": ("N", 8)}, {"y": ("N", 8)}, opset=17)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    (got,) = cg.run({"x": specials[None]})
    with np.errstate(over="ignore"):
        expected = np.exp(specials)  # float32: overflows and underflows where a float32 result must
    expected[5] = 0.0  # exp(-104) = 6.8e-46: below the smallest float32 anyway
    np.testing.assert_array_equal(-got[0], expected)
    assert np.isfinite(-got[0][3]) and np.isinf(-got[0][4])


@pytest.mark.parametrize("width", [1000, 24])
def test_softmax_of_rows_the_vector_does_not_divide(tmp_path, width):
    """The row's maximum of rows of 1,000 takes 8-lane vectors, of 24 too
    (schedule._lanes_dividing); the sum is written in onnxruntime's 16 lanes by the lowering
    itself (fast_math._lane_sums), its ragged last vector read through if_then_else."""
    m = _op_then_scale("Softmax", shape=("N", width), axis=-1)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    assert cg.stats["reductions_factored"] == 1
    for batch in (1, 9):
        feeds = random_feeds(m, batch, seed=batch)
        feeds["x"] *= 4
        check_against_ort(cg, m, feeds)
