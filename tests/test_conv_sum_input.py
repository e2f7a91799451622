"""conv_sum_input: on aarch64 a Conv + bias read only by a residual Add is summed from the residual,
as onnxruntime's Conv with a sum input sums it there. The arm64 onnxruntime is the reference of
tests/test_aarch64.py (conv_block, the orders model); here the rewrite's reach, and the kernel
against numpy computing that order, built for this machine with NEON's orders."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_builder import model, node
from test_arm_reciprocal import needs_fma

from onnxfuse.codegen import compile as compile_module
from onnxfuse.codegen import relax_import, sum_orders
from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.conv_blocks import CONV_WITH_SUM
from onnxfuse.target import resolve_target

F32, F64 = np.float32, np.float64


def _residual_conv(channels: int, bias: bool = True, conv_read_twice: bool = False, image=(12, 13)):
    rng = np.random.default_rng(channels)
    inits = {"w": rng.standard_normal((8, channels, 3, 3)).astype(F32)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(8).astype(F32)
        conv_inputs.append("b")
    nodes = [node("Conv", conv_inputs, "c", pads=[1, 1, 1, 1]), node("Add", ["z", "c"], "s"), node("Relu", ["s"], "y")]
    outputs = {"y": ("N", 8, *image)}
    if conv_read_twice:
        nodes.append(node("Neg", ["c"], "c_neg"))
        outputs["c_neg"] = ("N", 8, *image)
    return model(nodes, {"x": ("N", channels, *image), "z": ("N", 8, *image)}, outputs, inits, opset=13), inits


def _script(m, orders) -> str:
    with sum_orders.summing_as(orders):
        return relax_import.import_group(m, "k").prim_func.script()


def test_neon_sums_from_the_residual():
    assert CONV_WITH_SUM in _script(_residual_conv(8)[0], sum_orders.NEON)


@pytest.mark.parametrize("orders", [sum_orders.AVX512, sum_orders.AVX2, sum_orders.SSE])
def test_x86_levels_add_the_residual_after_the_bias(orders):
    assert CONV_WITH_SUM not in _script(_residual_conv(8)[0], orders)


@pytest.mark.parametrize("case", [dict(bias=False), dict(conv_read_twice=True)])
def test_onnxruntime_fuses_only_a_biased_conv_read_by_the_add_alone(case):
    assert CONV_WITH_SUM not in _script(_residual_conv(8, **case)[0], sum_orders.NEON)


def _fma_chain(terms, start):
    acc = start
    for x, w in terms:
        acc = (x.astype(F64) * w.astype(F64) + acc.astype(F64)).astype(F32)
    return acc


def _onnxruntime_arm_order(x, z, w, b, k_block: int):
    """((z + s0) + s1 ...) + b, each s a fused chain over one K block of im2col products (c, dy, dx)."""
    n, channels, height, width = x.shape
    padded = np.zeros((n, channels, height + 2, width + 2), F32)
    padded[:, :, 1:-1, 1:-1] = x
    products = [(padded[:, c, dy:dy + height, dx:dx + width][:, None], w[:, c, dy, dx][None, :, None, None])
                for c in range(channels) for dy in range(3) for dx in range(3)]
    value = z.copy()
    for first in range(0, len(products), k_block):
        block = _fma_chain(products[first:first + k_block], np.zeros_like(z))
        value = (value + block).astype(F32)
    return np.maximum((value + b[None, :, None, None]).astype(F32), 0)


@needs_fma
@pytest.mark.parametrize("channels", [8, 16, 15])  # 72 products: one block; 144, 135: a whole one and a ragged one
# (156 pixels: MLAS keeps its K stride of 128)
def test_kernel_sums_in_that_order(tmp_path, monkeypatch, channels):
    monkeypatch.setattr(compile_module.sum_orders, "for_target", lambda _: sum_orders.NEON)
    m, inits = _residual_conv(channels)
    kernel = compile_group(m, "k", resolve_target("native"), tmp_path)
    rng = np.random.default_rng(1)
    for batch in (1, 3):
        x = np.maximum(rng.standard_normal((batch, channels, 12, 13)), 0).astype(F32)
        z = rng.standard_normal((batch, 8, 12, 13)).astype(F32)
        got = kernel.run({"x": x, "z": z})[0]
        expected = _onnxruntime_arm_order(x, z, inits["w"], inits["b"], sum_orders.NEON.conv_k_block)
        assert np.array_equal(expected.view(np.uint32), got.view(np.uint32)), (channels, batch)
