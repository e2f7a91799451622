"""A long elementwise value (onnxruntime's Erf, a GELU) vectorized several registers wide so its
chains interleave (codegen/interleaved_vectors.py): the decision as a plain function, the schedule
taking it only for long values, and the kernels still onnxruntime's bits."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from conftest import run_both
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnxfuse import optimize
from onnxfuse.codegen import interleaved_vectors, relax_import
from onnxfuse.codegen.interleaved_vectors import LONG_VALUE_OPS, vector_lanes
from onnxfuse.codegen.register_file import AVX2, AVX512, NEON
from onnxfuse.codegen.schedule import schedule_group


@pytest.mark.parametrize("ops, extent, lanes, registers, expected", [
    (LONG_VALUE_OPS - 1, 2048, 16, AVX512, 16),  # short: one register, memory-bound anyway
    (LONG_VALUE_OPS, 2048, 16, AVX512, 64),  # 4 chains side by side on 32 registers
    (400, 96, 16, AVX512, 32),  # 96 floats: 3 vectors of 32, no tail
    (400, 48, 16, AVX512, 16),
    (400, 2048, 8, AVX2, 16),  # 16 registers: 2 chains
    (400, 24, 8, AVX2, 8),
    (400, 64, 4, NEON, 16),
])
def test_vector_lanes(ops, extent, lanes, registers, expected):
    assert vector_lanes(ops, extent, lanes, registers) == expected


def _gelu_after_gemm(activation: str = "gelu") -> onnx.ModelProto:
    """[N, 64] @ [64, 256] + b, then PyTorch's erf GELU (or a Relu): as exporters write it."""
    rng = np.random.default_rng(3)
    inits = [nh.from_array((rng.standard_normal((64, 256)) * 0.3).astype(np.float32), "W"),
             nh.from_array(rng.standard_normal(256).astype(np.float32), "b")]
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["z"])]
    if activation == "gelu":
        inits += [nh.from_array(np.array(math.sqrt(2), np.float32), "sqrt2"),
                  nh.from_array(np.array(1, np.float32), "one"), nh.from_array(np.array(0.5, np.float32), "half")]
        nodes += [h.make_node("Div", ["z", "sqrt2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
                  h.make_node("Add", ["e", "one"], ["e1"]), h.make_node("Mul", ["z", "e1"], ["g"]),
                  h.make_node("Mul", ["g", "half"], ["y"])]
    else:
        nodes.append(h.make_node("Relu", ["z"], ["y"]))
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, ["N", 64])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["N", 256])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _stats(model):
    return schedule_group(relax_import.import_group(model, "g").prim_func, registers=AVX512)[1]


def test_a_gelu_after_a_gemm_runs_four_registers_wide_and_a_relu_one():
    assert _stats(_gelu_after_gemm("gelu")).interleaved >= 1
    assert _stats(_gelu_after_gemm("relu")).interleaved == 0


def test_erf_counts_as_a_long_value_and_an_add_does_not():
    from tvm import s_tir, te, tirx

    from onnxfuse.codegen.fast_math import erf_value

    x = te.placeholder((64,), name="x")
    ops = {}
    for name, fn in (("erf", lambda i: erf_value(x[i])), ("add", lambda i: x[i] + tirx.const(1.0, "float32"))):
        sch = s_tir.Schedule(te.create_prim_func([x, te.compute((64,), fn, name=name)]))
        ops[name] = interleaved_vectors.value_ops(sch.get(sch.get_sblock(name)))
    assert ops["erf"] >= LONG_VALUE_OPS > ops["add"] >= 1


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_an_interleaved_gelu_is_onnxruntimes_bit_for_bit(batch, tmp_path):
    source = tmp_path / "gelu.onnx"
    onnx.save(_gelu_after_gemm("gelu"), str(source))
    result = optimize(source, tmp_path / "gelu.fused.onnx", cache_dir=False, jobs=1, select="all")
    x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32) * 2
    x[0, :4] = [np.nan, np.inf, -np.inf, 1e-40]
    expected, actual = run_both(source, result.model_path, {"x": x})
    np.testing.assert_array_equal(expected[0].view(np.uint32), actual[0].view(np.uint32))
