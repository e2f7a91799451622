"""param_alignment: kernels assume element alignment of their tensors, not 64 bytes."""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx_builder import node

from onnxfuse.codegen import relax_import, schedule
from onnxfuse.codegen.compile import build_module
from onnxfuse.codegen.param_alignment import element_aligned
from onnxfuse.target import resolve_target


def _typed_group() -> onnx.ModelProto:
    """float32 and int64 inputs, a float32 weight, a float32 and a bool output."""
    nodes = [node("Cast", ["i"], "f", to=TensorProto.FLOAT), node("Add", ["x", "f"], "s"),
             node("Mul", ["s", "w"], "y"), node("Greater", ["y", "x"], "g")]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64]),
         helper.make_tensor_value_info("i", TensorProto.INT64, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64]),
         helper.make_tensor_value_info("g", TensorProto.BOOL, ["N", 64])],
        [onnx.numpy_helper.from_array(np.ones(64, np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_parameters_are_declared_at_element_alignment():
    func = relax_import.import_group(_typed_group(), "k").prim_func
    assert {p.ty.data_alignment for p in func.params} == {64}
    aligned = [(str(p.ty.dtype), p.ty.data_alignment) for p in element_aligned(func).params]
    assert aligned == [("float32", 4), ("int64", 8), ("float32", 4), ("float32", 4), ("bool", 1)]


def test_kernel_vector_loads_assume_no_64_byte_alignment():
    func = relax_import.import_group(_typed_group(), "k").prim_func
    scheduled, _ = schedule.schedule_group(func)
    ll = build_module({"k": element_aligned(scheduled).with_attr("global_symbol", "k")},
                      resolve_target("native").tvm_target()).mod.inspect_source("ll")
    vector_loads = re.findall(r"load <\d+ x \w+>, ptr [^,]+, align (\d+)", ll)
    assert vector_loads, "the kernel should be vectorized"
    assert all(int(align) < 64 for align in vector_loads), sorted(set(vector_loads))
