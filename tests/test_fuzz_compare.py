"""fuzz/compare.py and execute.py: an approximation's error is counted in the ulps of the
narrowest float type it went through."""

from __future__ import annotations

import numpy as np
from fuzz.compare import compare_output
from fuzz.execute import approximation_precisions, sin_cos_arguments
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


def test_sin_cos_of_an_approximated_argument_count_its_magnitude():
    """The seed-41 finding: MatMul (1 ulp off) -> Pow 2 -> Cos, the argument 3e5 and the Cos 0.05 off;
    a Cos of an exact argument, or of a graph input, keeps the inputs' magnitude."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "m"], ["p"]),
             helper.make_node("Cos", ["p"], ["y"]), helper.make_node("Mul", ["x", "x"], ["q"]),
             helper.make_node("Cos", ["q"], ["z"]), helper.make_node("Sin", ["x"], ["s"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2]),
                                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["N", 2]) for o in ("y", "z", "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert sin_cos_arguments(model) == {"p": {"y"}}
    expected, got = np.array([-0.6277536], np.float32), np.array([-0.5779088], np.float32)
    assert not compare_output(expected, got, exact=False, magnitude=350.0, precision="float32").ok
    assert compare_output(expected, got, exact=False, magnitude=306301.25, precision="float32").ok
