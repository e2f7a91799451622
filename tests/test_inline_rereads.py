"""A cheap block of the kernel's inputs read twice by its consumer (a residual Add under a Relu's
select) is inlined (schedule._cheap_reread_of_inputs), and still computes what onnxruntime does."""

from __future__ import annotations

import numpy as np
from onnx import helper as h
from test_codegen import check_against_ort, f32, make_model

from onnxfuse.codegen.compile import compile_group
from onnxfuse.target import resolve_target


def residual_relu():
    nodes = [h.make_node("Add", ["a", "x"], ["s"]), h.make_node("Relu", ["s"], ["y"])]
    shape = ["N", 16, 16, 16]
    return make_model(nodes, [f32("a", shape), f32("x", shape)], [f32("y", shape)])


def test_the_residual_add_is_inlined_into_the_relu(tmp_path):
    model = residual_relu()
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path)
    assert compiled.stats["inlined"] == 1 and compiled.stats["materialized"] == 1
    rng = np.random.default_rng(0)
    for batch in (1, 3, 40):
        feeds = {name: rng.standard_normal((batch, 16, 16, 16)).astype(np.float32) for name in ("a", "x")}
        feeds["a"][0, 0, 0, :4] = [np.nan, -np.inf, np.inf, -0.0]  # Relu's NaN and signed zero kept
        check_against_ort(compiled, model, feeds)


def test_chains_of_rereads_stay_bounded(tmp_path):
    """Relu((a + x) * (a + x)): each block is read twice by the next; no expression is emitted more
    than twice (a block that reads another block's result is not a cheap read of inputs)."""
    nodes = [h.make_node("Add", ["a", "x"], ["s"]), h.make_node("Mul", ["s", "s"], ["m"]),
             h.make_node("Relu", ["m"], ["y"])]
    model = make_model(nodes, [f32("a", ["N", 64]), f32("x", ["N", 64])], [f32("y", ["N", 64])])
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path)
    assert compiled.stats["max_copies"] <= 2 and compiled.stats["materialized"] >= 2
    check_against_ort(compiled, model, {n: np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
                                        for n in ("a", "x")})
