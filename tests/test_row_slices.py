"""A call's last few rows in the small-batch variant (codegen/row_slices.py, the runtime's
rows_left_to_small_variant): which kernels qualify, the rule, and onnxruntime's bits at every
batch around the row tiles, through the library and in-process."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from conftest import MODELS, run_both
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import te

from onnxfuse import optimize
from onnxfuse.codegen import relax_import
from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.row_slices import separable_rows
from onnxfuse.kernel_spec import rows_left_to_small_variant
from onnxfuse.target import resolve_target


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _x(shape=("N", 64)):
    return h.make_tensor_value_info("x", TP.FLOAT, list(shape))


def _y(shape):
    return h.make_tensor_value_info("y", TP.FLOAT, list(shape))


def _weights(k=64, n=64):
    rng = np.random.default_rng(0)
    return [nh.from_array((rng.standard_normal((k, n)) * 0.1).astype(np.float32), "W")]


def _separable(model) -> bool:
    return separable_rows(relax_import.import_group(model, "g").prim_func)


def test_a_gemm_with_its_epilogue_and_the_cells_are_row_wise():
    model = _model([h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Tanh", ["m"], ["y"])],
                   [_x()], [_y(["N", 64])], _weights())
    assert _separable(model)
    for name in ("lstm_cell", "gru_cell", "lstm_gate"):
        assert _separable(onnx.load(str(MODELS / f"{name}.onnx"))), name


def test_a_sum_over_the_batch_is_not():
    """Each row reads the sum of all rows: sliced calls would sum only their own."""
    nodes = [h.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1), h.make_node("Sub", ["x", "s"], ["y"])]
    model = _model(nodes, [_x()], [_y(["N", 64])], [nh.from_array(np.array([0], np.int64), "axes")])
    assert not _separable(model)


def test_a_transpose_moving_the_batch_inward_is_not():
    model = _model([h.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), h.make_node("Relu", ["t"], ["y"])],
                   [_x()], [_y([64, "N"])])
    assert not _separable(model)


def _rows_read_at(row_of) -> tvm.tirx.PrimFunc:
    """y[i] = 2 x[row_of(i, N)] over [N, 64]."""
    n = tvm.tirx.Var("N", "int64")
    x = te.placeholder((n, 64), "float32", name="x")
    y = te.compute((n, 64), lambda i, j: x[row_of(i, n), j] * tvm.tirx.const(2.0, "float32"), name="y")
    return te.create_prim_func([x, y])


def test_rows_read_in_reverse_are_not():
    """y[i] = x[N - 1 - i]: the row a slice reads depends on N (no exporter's op imports so here,
    so the function is built by hand; its row-wise twin qualifies)."""
    assert not separable_rows(_rows_read_at(lambda i, n: n - 1 - i))
    assert separable_rows(_rows_read_at(lambda i, n: i))


def test_two_symbols_are_not():
    model = _model([h.make_node("MatMul", ["x", "W"], ["y"])], [_x(("N", "S", 64))], [_y(["N", "S", 64])], _weights())
    assert not _separable(model)


@pytest.mark.parametrize(("batch", "left"), [(64, 0), (62, 2), (61, 1), (63, 3), (60, 0), (6, 0), (7, 1),
                                             (3, 0), (4, 0), (5, 0), (1000, 0), (1003, 1)])
def test_the_rows_left_to_the_small_variant(batch, left):
    """6-row tiles, the variant below 4 rows (AVX-512's): a last tile of 1-3 rows goes to the
    variant, one of 4-5 stays in the main kernel; a batch below 4 is the variant's whole."""
    assert rows_left_to_small_variant(batch, 6, 4) == left


def test_no_row_tile_means_one_call():
    assert rows_left_to_small_variant(61, 0, 4) == 0


def _tile_batches(tile: int) -> list[int]:
    return sorted({*range(1, 2 * tile + 3), 10 * tile - 1, 10 * tile + 1, 10 * tile + 2, 10 * tile + 3, 64, 1001})


def test_the_cell_gives_onnxruntimes_bits_around_every_tile(tmp_path, cache):
    """lstm_cell through its library: whole tiles, every remainder, below one tile."""
    source = MODELS / "lstm_cell.onnx"
    result = optimize(source, tmp_path / "lstm.fused.onnx", cache_dir=cache, jobs=1)
    (group,) = [g for g in result.report["groups"] if g.get("status") == "compiled"]
    tile = group["stats"]["tile_rows"]
    assert group["stats"]["row_tile"] == tile > 1
    for batch in _tile_batches(tile):
        rng = np.random.default_rng(batch)
        feeds = {name: rng.standard_normal((batch, 64)).astype(np.float32) for name in ("X", "H", "C")}
        expected, actual = run_both(source, result.model_path, feeds)
        for e, a in zip(expected, actual):
            assert np.array_equal(a.view(np.uint32), e.view(np.uint32)), f"batch {batch}"


def test_in_process_runs_slice_the_rows_too(tmp_path):
    """CompiledGroup.run (verification's path) splits a call as the library does."""
    rng = np.random.default_rng(1)
    inits = [*_weights(64, 256), nh.from_array(rng.standard_normal(256).astype(np.float32), "b")]
    model = _model([h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["y"])],
                   [_x()], [_y(["N", 256])], inits)
    compiled = compile_group(model, "gemm_bias", resolve_target("native"), tmp_path)
    tile = compiled.spec.row_tile
    assert tile == compiled.stats["tile_rows"] and compiled.spec.small_batch_below
    w, b = (nh.to_array(t) for t in inits)
    for batch in _tile_batches(tile):
        x = rng.standard_normal((batch, 64)).astype(np.float32)
        (got,) = compiled.run({"x": x})
        np.testing.assert_allclose(got, x.astype(np.float64) @ w + b, rtol=1e-4, atol=1e-5)
