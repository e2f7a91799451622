"""[batch, seq, hidden] groups are tiled over batch x seq rows (codegen/fold_rows.py): the groups
PyTorch's TorchScript exporter writes around a transformer's linear layers, checked against
onnxruntime on the group, at sizes where batch x seq is 1, ragged (not a multiple of the 8-row
tile) and large, and with batch and seq different (a kernel that mixed them up would fail)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import host_has
from onnx import helper as h
from test_codegen import check_against_ort, f32, make_model, random_feeds

from onnxfuse.codegen import fold_rows, relax_import
from onnxfuse.codegen.compile import compile_group
from onnxfuse.target import resolve_target

SIZES = [(1, 1), (3, 5), (2, 16), (64, 16)]  # (batch, seq): 1 row, 15 (ragged), 32, 1,024


def _weights(k, n, seed=0):
    rng = np.random.default_rng(seed)
    return {"w": (rng.standard_normal((k, n)) * 0.1).astype(np.float32),
            "b": rng.standard_normal(n).astype(np.float32)}


def linear_residual(k=128, n=64):
    """MatMul + bias + residual: the attention output and second FFN layer of a TorchScript BERT."""
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["b", "m"], ["a"]),
             h.make_node("Add", ["a", "r"], ["y"])]
    return make_model(nodes, [f32("x", ["batch", "seq", k]), f32("r", ["batch", "seq", n])],
                      [f32("y", ["batch", "seq", n])], _weights(k, n))


def linear_heads(k=64, heads=4):
    """MatMul + bias + Reshape into heads: a TorchScript BERT's query, key and value projections."""
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["b", "m"], ["a"]),
             h.make_node("Reshape", ["a", "heads"], ["y"])]
    inits = {**_weights(k, k), "heads": np.array([0, 0, heads, k // heads], np.int64)}
    return make_model(nodes, [f32("x", ["batch", "seq", k])], [f32("y", ["batch", "seq", heads, k // heads])], inits)


def linear_gelu(k=64, n=128):
    """MatMul + bias + erf GELU, as TorchScript exports the first FFN layer."""
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["b", "m"], ["a"]),
             h.make_node("Div", ["a", "sqrt2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
             h.make_node("Add", ["e", "one"], ["p"]), h.make_node("Mul", ["a", "p"], ["q"]),
             h.make_node("Mul", ["q", "half"], ["y"])]
    inits = {**_weights(k, n), "sqrt2": np.array(1.4142135, np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    return make_model(nodes, [f32("x", ["batch", "seq", k])], [f32("y", ["batch", "seq", n])], inits)


def ffn_without_epilogue(k=64, n=256):
    """MatMul + bias -> MatMul, nothing after the second: a BERT FFN whose residual Add and
    LayerNorm onnxruntime keeps for its SkipLayerNormalization."""
    second = (np.random.default_rng(2).standard_normal((n, k)) * 0.1).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["b", "m"], ["a"]),
             h.make_node("MatMul", ["a", "w2"], ["y"])]
    return make_model(nodes, [f32("x", ["batch", "seq", k])], [f32("y", ["batch", "seq", k])],
                      {**_weights(k, n), "w2": second})


def transposed_heads():
    """A Transpose that swaps seq and heads: rows of the output are no rows of the input."""
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Transpose", ["a"], ["y"], perm=[0, 2, 1, 3])]
    return make_model(nodes, [f32("x", ["batch", "seq", 4, 16])], [f32("y", ["batch", 4, "seq", 16])])


def sum_over_seq():
    """A reduction over seq: one output row reads every seq row."""
    nodes = [h.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)]
    model = make_model(nodes, [f32("x", ["batch", "seq", 32])], [f32("y", ["batch", 1, 32])],
                       {"axes": np.array([1], np.int64)})
    return model


def _prim_func(model):
    """The group's PrimFunc as schedule_group hands it to the fold: with exact row indices."""
    return fold_rows.exact_row_indices(relax_import.import_group(model, "k").prim_func)


def _feeds(model, batch, seq):
    return random_feeds(model, seed=1, dims={"batch": batch, "seq": seq})


@pytest.mark.parametrize("build", [linear_residual, linear_heads, linear_gelu, ffn_without_epilogue])
def test_transformer_groups_fold(build):
    func = _prim_func(build())
    folded = fold_rows.fold_leading_dims(func)
    assert folded is not func
    assert "batch * seq" in folded.script()


@pytest.mark.parametrize("build", [transposed_heads, sum_over_seq])
def test_groups_whose_rows_move_do_not_fold(build):
    func = _prim_func(build())
    assert fold_rows.fold_leading_dims(func) is func


def test_a_fold_tvm_refuses_leaves_the_group_as_it_was():
    """A row sum kept as [batch, seq, 1] (and shifted, so the output block is no reduction): its
    blocks bind the unit axis to a constant, which transform_block_layout refuses; the group
    keeps its unfolded schedule (row reductions and all)."""
    nodes = [h.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1), h.make_node("Add", ["s", "one"], ["y"])]
    model = make_model(nodes, [f32("x", ["batch", "seq", 64])], [f32("y", ["batch", "seq", 1])],
                       {"axes": np.array([-1], np.int64), "one": np.array(1.0, np.float32)})
    func = _prim_func(model)
    assert fold_rows.leading_dims(func) is not None
    assert fold_rows.fold_leading_dims(func) is func


def test_a_static_seq_is_not_folded():
    """[N, 8, 64]: the runtime's small-batch variant is chosen by N, the product of the symbolic
    dims; folded, N = 1 would mean 8 rows run in 1-row tiles."""
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["b", "m"], ["y"])]
    func = _prim_func(make_model(nodes, [f32("x", ["n", 8, 64])], [f32("y", ["n", 8, 64])], _weights(64, 64)))
    assert fold_rows.leading_dims(func) is None
    assert fold_rows.fold_leading_dims(func) is func


def test_two_dimensional_groups_are_left_alone():
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["b", "m"], ["y"])]
    func = _prim_func(make_model(nodes, [f32("x", ["n", 64])], [f32("y", ["n", 64])], _weights(64, 64)))
    assert fold_rows.leading_dims(func) is None
    assert fold_rows.fold_leading_dims(func) is func


def test_the_reshape_reads_its_source_row_by_row_after_exact_row_indices():
    script = _prim_func(linear_heads()).script()
    assert "// seq" not in script and "% seq" not in script


@pytest.mark.parametrize("build", [linear_residual, linear_heads, linear_gelu, transposed_heads,
                                   ffn_without_epilogue])
def test_folded_kernels_compute_what_onnxruntime_does(build, tmp_path):
    """ffn_without_epilogue, folded, wrote garbage into other tiles' rows (its GEMM's register
    cache kept the output's 3D shape) until its GEMM wrote a folded intermediate instead."""
    model = build()
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path)
    assert compiled.stats["folded_rows"] == (build is not transposed_heads)
    for batch, seq in SIZES:
        check_against_ort(compiled, model, _feeds(model, batch, seq))


@pytest.mark.parametrize("build", [linear_residual, linear_heads, ffn_without_epilogue])
def test_folded_linear_layers_are_bit_exact(build, tmp_path):
    """No sum is reordered: the same products in the same order as the unfolded kernel and
    onnxruntime's GEMM."""
    model = build()
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, seq in SIZES:
        feeds = _feeds(model, batch, seq)
        for got, expected in zip(compiled.run(feeds), session.run(None, feeds)):
            np.testing.assert_array_equal(got, expected)


def test_model_is_valid():
    for build in (linear_residual, linear_heads, linear_gelu, transposed_heads, sum_over_seq):
        onnx.checker.check_model(build())


@pytest.mark.skipif(not host_has("avx512f"), reason="40 columns are whole 8-lane vectors: nothing to pad")
def test_a_gemm_with_padded_columns_is_padded_then_folded_and_keeps_onnxruntimes_bits(tmp_path):
    """`[batch, seq, 40] @ [40, 40]`: N = 40 is padded to whole vectors (schedule.pad_gemm_columns),
    which needs the GEMM's unfolded reads, so the padding comes first and the fold after it.
    Folded first, the padding was refused and the GEMM ran as scalar dot products that LLVM summed
    in its own order (202 of 5,120 elements one ulp off); not folded, its register tile held one
    row (0.52x onnxruntime at batch 64 x seq 16)."""
    rng = np.random.default_rng(4)
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Tanh", ["m"], ["y"])]
    model = make_model(nodes, [f32("x", ["batch", "seq", 40])], [f32("y", ["batch", "seq", 40])],
                       {"w": (rng.standard_normal((40, 40)) * 0.2).astype(np.float32)})
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path)
    assert compiled.stats["folded_rows"]
    assert compiled.stats["gemm_columns_padded"] == 1 and compiled.stats["register_tiles"] == 1
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, seq in SIZES:
        feeds = _feeds(model, batch, seq)
        np.testing.assert_array_equal(compiled.run(feeds)[0], session.run(None, feeds)[0])
