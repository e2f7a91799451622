"""fuzz/compare.py and execute.py: an approximation's error is counted in the ulps of the
narrowest float type it went through."""

from __future__ import annotations

import numpy as np
from fuzz.compare import compare_output
from fuzz.execute import approximation_precisions
from onnx import TensorProto, helper


def _softplus_cast_model(to=TensorProto.DOUBLE):
    nodes = [helper.make_node("Softplus", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["y"], to=to),
             helper.make_node("Abs", ["x"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 7])],
                              [helper.make_tensor_value_info("y", to, ["N", 7]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 7])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_float32_approximation_cast_to_float64_keeps_float32_ulps():
    assert approximation_precisions(_softplus_cast_model()) == {"y": "float32", "z": None}
    expected = np.array([np.float32(3.7476814)], dtype=np.float64)
    one_float32_ulp = expected + np.spacing(np.float32(3.7476814))
    assert not compare_output(expected, one_float32_ulp, exact=False).ok  # float64 ulps: 2^29 of them
    assert compare_output(expected, one_float32_ulp, exact=False, precision="float32").ok
    far = expected * (1 + 1e-3)  # a wrong value is still one
    assert not compare_output(expected, far, exact=False, precision="float32").ok


def test_a_wider_precision_never_loosens_a_narrow_output():
    expected = np.array([1.0], dtype=np.float16)
    assert not compare_output(expected, expected + np.float16(0.05), exact=False, precision="float64").ok
