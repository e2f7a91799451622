"""Kernels agree with onnxruntime on NaN, ±inf, ±0 and huge values, not only on random normals
(verification's random inputs never contain them). Found by a sweep of the ONNX node tests.
Clip, Max and Min on the same values: test_nan_propagation.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_builder import model, node
from test_codegen import check_against_ort

from onnxfuse.codegen.compile import compile_group
from onnxfuse.target import resolve_target

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 88.5, -88.5, 1e4, -1e4, 3e38, -3e38,
                    0.5, -0.5, 2.5], np.float32)

OPS = [
    ("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Exp", {}), ("Erf", {}), ("Sign", {}), ("Abs", {}),
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}), ("HardSwish", {}), ("Softplus", {}), ("Gelu", {}),
    ("Cosh", {}), ("Sinh", {}),
]


@pytest.mark.parametrize("op,attrs", OPS, ids=[op for op, _ in OPS])
def test_special_values_match_onnxruntime(tmp_path, op, attrs):
    m = model([node(op, ["x"], "a", **attrs), node("Mul", ["a", "two"], "y")], {"x": ("N", 16)}, {"y": ("N", 16)},
              {"two": np.array(2.0, np.float32)}, opset=20)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    feeds = {"x": np.stack([SPECIAL, SPECIAL[::-1]])}
    check_against_ort(cg, m, feeds)


@pytest.mark.parametrize("op,reference", [("Cosh", np.cosh), ("Sinh", np.sinh)])
def test_cosh_sinh_accurate_from_zero_to_overflow(tmp_path, op, reference):
    """TVM cannot lower cosh/sinh at all (legalize writes them with exp): small |x|, where sinh's
    difference of exponentials cancels, and |x| in (88.7, 89.4), where e^x overflows but the
    result does not, are the hard ends."""
    magnitudes = np.concatenate([np.logspace(-8, np.log10(89.4), 254), [88.8, 89.4]]).astype(np.float32)
    x = np.concatenate([magnitudes, -magnitudes]).reshape(2, -1)
    m = model([node(op, ["x"], "a"), node("Neg", ["a"], "y")], {"x": ("N", 256)}, {"y": ("N", 256)}, opset=17)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    (got,) = cg.run({"x": x})
    expected = -reference(x.astype(np.float64))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
