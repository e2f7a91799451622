"""contracted_gelu: FastGelu's `(C x) x + B` becomes one MultiplyAdd where onnxruntime's C++ is
contracted (aarch64), and only there; the arm64 onnxruntime is the reference of test_aarch64.py
(tf2onnx's Keras encoder), here the rewrite's reach and the lowering's one rounding (numpy)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx_builder import model, node

from onnxfuse.codegen import contracted_gelu, onnx_semantics, sum_orders
from onnxfuse.codegen.relax_import import import_group
from onnxfuse.fusion.onnxruntime_fused_ops import fast_gelu_nodes


def _fast_gelu_group(extra_reader: bool = False) -> onnx.ModelProto:
    nodes, scalars = fast_gelu_nodes("x", "g")
    outputs = {"y": ("N", 8)}
    if extra_reader:  # the product (C x) x also read elsewhere: no single node may take it
        outputs["cxx"] = ("N", 8)
        nodes.append(node("Identity", ["g__fast_gelu_cxx"], "cxx"))
    m = model([*nodes, node("Neg", ["g"], "y")], {"x": ("N", 8)}, outputs, {}, opset=17)
    m.graph.initializer.extend(scalars)
    return m


def _op_types(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


def test_neon_contracts_the_inner_sum_only():
    with sum_orders.summing_as(sum_orders.NEON):
        rewritten = contracted_gelu.contracted(_fast_gelu_group())
    assert _op_types(rewritten).count(contracted_gelu.MULTIPLY_ADD) == 1
    # of the chain's five Muls and two Adds, the product by x and the add of B are gone
    assert _op_types(rewritten).count("Mul") == 4 and _op_types(rewritten).count("Add") == 1


@pytest.mark.parametrize("orders", [sum_orders.AVX512, sum_orders.AVX2, sum_orders.SSE])
def test_x86_levels_keep_the_roundings(orders):
    group = _fast_gelu_group()
    with sum_orders.summing_as(orders):
        assert contracted_gelu.contracted(group) is group


def test_a_product_read_elsewhere_is_left_alone():
    group = _fast_gelu_group(extra_reader=True)
    with sum_orders.summing_as(sum_orders.NEON):
        assert contracted_gelu.contracted(group) is group


def test_other_constants_are_not_gelu():
    group = _fast_gelu_group()
    for init in group.graph.initializer:
        if init.name.endswith("__fast_gelu_b"):
            init.CopyFrom(numpy_helper.from_array(np.array(0.8, np.float32), init.name))
    with sum_orders.summing_as(sum_orders.NEON):
        assert contracted_gelu.contracted(group) is group


def test_onnx_gelu_tanh_is_contracted_too():
    """opset 20's Gelu(approximate="tanh"), as onnx_semantics writes it out, meets the same rewrite."""
    gelu = model([node("Gelu", ["x"], "y", approximate="tanh")], {"x": ("N", 8)}, {"y": ("N", 8)}, opset=20)
    with sum_orders.summing_as(sum_orders.NEON):
        rewritten = contracted_gelu.contracted(onnx_semantics.as_onnxruntime_computes(gelu))
    assert contracted_gelu.MULTIPLY_ADD in _op_types(rewritten)


def test_import_lowers_it_to_one_fused_multiply_add():
    with sum_orders.summing_as(sum_orders.NEON):
        script = import_group(_fast_gelu_group(), "k").prim_func.script()
    assert "llvm.fmuladd" in script and "multiply_add" in script, script
    with sum_orders.summing_as(sum_orders.AVX512):
        assert "multiply_add" not in import_group(_fast_gelu_group(), "k").prim_func.script()
