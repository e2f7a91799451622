"""A cheap block of the kernel's inputs read twice by its consumer (a residual Add under a Relu's
select), or read many times at one index (a Relu under a Sigmoid's and a Tanh's clamps), is inlined
(schedule._cheap_reread_of_inputs), and still computes onnxruntime's bits."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
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


def _same_bits_as_ort(compiled, model, batches, columns):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for batch in batches:
        x = (4 * np.random.default_rng(batch).standard_normal((batch, *columns))).astype(np.float32)
        x.reshape(-1)[:6] = [np.nan, -np.inf, np.inf, -0.0, 30.0, -30.0]  # past both clamps
        expected = reference.run(None, {"x": x})[0]
        got = compiled.run({"x": x})[0]
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), f"batch {batch}"


def diamond():
    """models/diamond.onnx's shape: Relu, then Sigmoid and Tanh of it, added and halved."""
    nodes = [h.make_node("Relu", ["x"], ["top"]), h.make_node("Sigmoid", ["top"], ["l"]),
             h.make_node("Tanh", ["top"], ["r"]), h.make_node("Add", ["l", "r"], ["y"])]
    return make_model(nodes, [f32("x", ["N", 32])], [f32("y", ["N", 32])])


def test_a_relu_under_two_clamps_is_inlined_with_onnxruntimes_bits(tmp_path):
    """Each use of a clamp re-expands it, so the Relu is read over a hundred times, all at one
    index: inlined, the kernel is one pass with no workspace."""
    model = diamond()
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path)
    assert compiled.stats["materialized"] == 1 and compiled.stats["max_copies"] > 100
    _same_bits_as_ort(compiled, model, (1, 3, 64, 300), (32,))


def test_a_value_read_at_two_indices_stays_materialized(tmp_path):
    """Sigmoid(r) + Tanh(r transposed): copies of r at two indices are two computations per
    element, not one common subexpression, so r is computed once and read back."""
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
             h.make_node("Sigmoid", ["r"], ["l"]), h.make_node("Tanh", ["t"], ["u"]), h.make_node("Add", ["l", "u"], ["y"])]
    model = make_model(nodes, [f32("x", ["N", 8, 8])], [f32("y", ["N", 8, 8])])
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path)
    assert compiled.stats["materialized"] == 2
    _same_bits_as_ort(compiled, model, (1, 5), (8, 8))
