"""GEMM schedules for the shapes gate cells have: small K and N, N no multiple of the vector width
(padded), batch 1 (GEMV), tall-skinny batches. Shape decisions are checked as plain functions;
kernels are compared with numpy, in TVM's runtime and through onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import MODELS, assert_outputs_match, run_both
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnxfuse import optimize
from onnxfuse.codegen import gemm_shapes
from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.register_file import AVX2, AVX512, NEON
from onnxfuse.codegen.schedule import GEMM_TILE_ROWS, schedule_group
from onnxfuse.target import resolve_target

# ---------------------------------------------------------------- shape decisions


@pytest.mark.parametrize("cols, k, lanes, expected", [
    (30, 10, 16, 32),  # the seed gate: two whole zmm vectors
    (10, 10, 16, 16),
    (40, 64, 16, 48),
    (30, 10, 8, 32),  # AVX2
    (32, 10, 16, None),  # a multiple already
    (512, 64, 16, None),
    (100, 64, 16, None),  # 64 x 112 weights: too large a copy per call
])
def test_padded_columns(cols, k, lanes, expected):
    assert gemm_shapes.padded_columns(cols, k, lanes) == expected


def test_narrow_gemm_register_tile():
    """The seed gate's 32 padded columns: 4 rows x 2 vectors (8 x 2 was slower, see register_tile)."""
    assert gemm_shapes.register_tile(GEMM_TILE_ROWS, 2, AVX512) == (4, 2)
    assert gemm_shapes.register_tile(GEMM_TILE_ROWS, 4, AVX512) == (4, 4)
    assert gemm_shapes.register_tile(GEMM_TILE_ROWS, 32, AVX512) == (4, 4)
    assert gemm_shapes.register_tile(GEMM_TILE_ROWS, 2, AVX2) == (4, 2)
    assert gemm_shapes.register_tile(GEMM_TILE_ROWS, 2, NEON) == (4, 2)


def test_gemv_row_takes_every_accumulator_as_columns():
    assert gemm_shapes.register_tile(1, 2, AVX512) == (1, 2)
    assert gemm_shapes.register_tile(1, 32, AVX512) == (1, 16)


# ---------------------------------------------------------------- kernels against numpy


def _model(k: int, cols: int, gate: bool | None, seed: int = 0) -> tuple[onnx.ModelProto, np.ndarray]:
    """x[N, K] @ W[K, cols]: as the seed gate (Split in 3, Sigmoid/Tanh/Exp, Mul, Add), followed
    by a Relu, or (gate None) as the group's output itself."""
    w = (np.random.default_rng(seed).standard_normal((k, cols)) * 0.3).astype(np.float32)
    x = h.make_tensor_value_info("x", TP.FLOAT, ["N", k])
    nodes = [h.make_node("MatMul", ["x", "W"], ["y" if gate is None else "m"])]
    out_cols = cols // 3 if gate else cols
    if gate:
        nodes += [h.make_node("Split", ["m"], ["a", "b", "c"], axis=1, num_outputs=3),
                  h.make_node("Sigmoid", ["a"], ["sa"]), h.make_node("Tanh", ["b"], ["tb"]),
                  h.make_node("Exp", ["c"], ["ec"]), h.make_node("Mul", ["sa", "tb"], ["p"]),
                  h.make_node("Add", ["p", "ec"], ["y"])]
    elif gate is not None:
        nodes += [h.make_node("Relu", ["m"], ["y"])]  # a consumer, so the GEMM sits inside the group
    y = h.make_tensor_value_info("y", TP.FLOAT, ["N", out_cols])
    graph = h.make_graph(nodes, "gemm", [x], [y], [nh.from_array(w, "W")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 8
    return model, w


def _numpy(x: np.ndarray, w: np.ndarray, gate: bool | None) -> np.ndarray:
    m = x.astype(np.float64) @ w.astype(np.float64)
    if gate is None:
        return m
    if not gate:
        return np.maximum(m, 0)
    a, b, c = np.split(m, 3, axis=1)
    return 1 / (1 + np.exp(-a)) * np.tanh(b) + np.exp(c)


SHAPES = [(10, 30, True), (10, 10, False), (64, 30, False), (24, 48, True), (12, 40, False), (10, 30, None)]
KINDS = {True: "-gate", False: "-relu", None: "-alone"}


@pytest.mark.parametrize("k, cols, gate", SHAPES, ids=[f"k{k}-n{n}{KINDS[g]}" for k, n, g in SHAPES])
def test_small_gemm_kernel_matches_numpy(k, cols, gate, tmp_path):
    """Every batch path: the one-row variant (1, 5), a ragged tail (13), whole tiles (64)."""
    model, w = _model(k, cols, gate)
    compiled = compile_group(model, "gemm", resolve_target("native"), tmp_path)
    for batch in (1, 5, 13, 64):
        x = np.random.default_rng(batch).standard_normal((batch, k)).astype(np.float32)
        (actual,) = compiled.run({"x": x})
        np.testing.assert_allclose(actual, _numpy(x, w, gate), rtol=1e-4, atol=1e-5)


def test_seed_gate_pads_its_columns_and_tiles_registers():
    """N = 30 is padded to 32 and scheduled as a register-tiled GEMM (no refusals), where it
    used to run as scalar dot products."""
    from onnxfuse.codegen import relax_import

    group = relax_import.import_group(_model(10, 30, True)[0], "gate")
    _, stats = schedule_group(group.prim_func, registers=AVX512)
    assert stats.gemm_columns_padded == 1
    assert stats.reductions_scheduled == 1
    assert not stats.skipped_steps


def test_seed_gate_matches_onnxruntime(tmp_path, cache):
    """The whole path: fused, linked, run as a custom op beside the original graph."""
    model, _ = _model(10, 30, True)
    source = tmp_path / "gate.onnx"
    onnx.save(model, source)
    result = optimize(source, tmp_path / "gate.fused.onnx", cache_dir=cache, jobs=1, select="all")
    assert [n.domain for n in onnx.load(str(result.model_path)).graph.node] == ["ai.onnxfuse"]
    for batch in (1, 7, 8, 1000):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 10)).astype(np.float32)}
        expected, actual = run_both(source, result.model_path, feeds)
        assert_outputs_match(expected, actual)


def test_a_keepdims_row_reduction_is_no_gemm_to_pad_on_a_four_lane_target(tmp_path):
    """ReduceMean with keepdims looks like a GEMM (spatial N, 1 and a reduction) but multiplies
    nothing: padded to whole 4-lane vectors, the transformer MLP's LayerNorm computed garbage on
    the x86-64 baseline level (and on aarch64), which the portable target ships."""
    original = MODELS / "transformer_mlp.onnx"
    result = optimize(original, tmp_path / "t.fused.onnx", target="native", mcpu="x86-64", cache_dir=False)
    assert [o.status for o in result.outcomes] == ["compiled"] * len(result.outcomes)
    for batch in (1, 8):
        feeds = {"X": np.random.default_rng(batch).standard_normal((batch, 8, 64)).astype(np.float32)}
        assert_outputs_match(*run_both(original, result.model_path, feeds))


# ---------------------------------------------------------------- epilogues per register tile


def _projection(residual: bool) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """x[N, 16, 64] @ W + b (a transformer's projection), plus x again with `residual`."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 64)) * 0.2).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["y" if not residual else "a"])]
    if residual:
        nodes.append(h.make_node("Add", ["a", "x"], ["y"]))
    graph = h.make_graph(nodes, "projection", [h.make_tensor_value_info("x", TP.FLOAT, ["N", 16, 64])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["N", 16, 64])],
                         [nh.from_array(w, "W"), nh.from_array(b, "b")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 8
    return model, w, b


def _schedule_stats(model):
    from onnxfuse.codegen import relax_import

    return schedule_group(relax_import.import_group(model, "g").prim_func, registers=AVX512)[1]


@pytest.mark.parametrize("residual", [False, True])
def test_a_bias_add_runs_per_register_tile(residual):
    """The GEMM's one reader, reading it at one place and otherwise the kernel's inputs, moves
    under the register tile's column loop (schedule.epilogue_per_register_tile)."""
    stats = _schedule_stats(_projection(residual)[0])
    assert stats.epilogues_per_tile == 1
    assert not stats.skipped_steps


def test_the_bias_add_stores_the_accumulators():
    """The register tile's write-back is inlined into its one per-tile reader: no block copies
    the local accumulators out; the bias Add reads them."""
    from onnxfuse.codegen import relax_import

    func, _ = schedule_group(relax_import.import_group(_projection(False)[0], "g").prim_func, registers=AVX512)
    script = func.script()
    assert "_local = T.sblock_alloc_buffer" in script or 'scope="local"' in script
    assert not [line for line in script.splitlines() if 'T.sblock("' in line and '_local")' in line]


def test_gate_epilogues_stay_at_the_row_tile():
    """A gate cell's reader needs other column blocks (the Split's parts): not tried, so no
    refusal is recorded either."""
    stats = _schedule_stats(onnx.load(str(MODELS / "lstm_gate.onnx")))
    assert stats.epilogues_per_tile == 0
    assert not stats.skipped_steps


def test_two_products_are_summed_per_register_tile():
    """lstm_cell's `X W + H R + b`: both products' tile loops merged, their sum under the
    register tile (schedule._sum_per_register_tile), the second product's write-back inlined
    into it; the gate math stays at the row tile."""
    from onnxfuse.codegen import relax_import

    func, stats = schedule_group(relax_import.import_group(onnx.load(str(MODELS / "lstm_cell.onnx")), "g").prim_func,
                                 registers=AVX512)
    assert stats.epilogues_per_tile == 1
    assert not stats.skipped_steps
    script = func.script()
    assert script.count("_m in T.serial(T.int64(4)") == 1  # one loop over the column blocks of both products
    assert 'sblock("matmul_intermediate_local")' not in script  # stored by the sum instead


@pytest.mark.parametrize("residual", [False, True])
def test_a_per_tile_epilogue_matches_numpy(residual, tmp_path):
    """Every batch path: the one-row variant (1, 5), a ragged tail (13), whole tiles (64)."""
    model, w, b = _projection(residual)
    compiled = compile_group(model, "projection", resolve_target("native"), tmp_path)
    for batch in (1, 5, 13, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 16, 64)).astype(np.float32)
        expected = x.astype(np.float64) @ w + b + (x if residual else 0)
        (actual,) = compiled.run({"x": x})
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("name", "gemms", "first"), [("lstm_gate", 1, 1), ("gru_cell", 2, 2), ("transformer_mlp", 2, 0)])
def test_column_blocks_run_first_where_rows_come_from_one_loop(name, gemms, first):
    """The cells' [N, K] @ [K, M] GEMMs run each block of weight columns over all row blocks of the
    tile (schedule._tile_loop_order); the transformer MLP's [N, 8, 64] rows keep rows first."""
    stats = _schedule_stats(onnx.load(str(MODELS / f"{name}.onnx")))
    assert stats.register_tiles == gemms
    assert stats.column_blocks_first == first
    assert not stats.skipped_steps


@pytest.mark.parametrize("name", ["lstm_gate", "gru_cell"])
def test_column_blocks_first_cells_match_onnxruntime(name, tmp_path):
    """Every batch path of a cell whose GEMMs run column blocks first: the one-row variant (1, 5),
    a ragged tail tile with a ragged register tile (13), whole tiles (64, 1,000)."""
    original = MODELS / f"{name}.onnx"
    result = optimize(original, tmp_path / "c.fused.onnx", target="native", cache_dir=False)
    assert [o.status for o in result.outcomes] == ["compiled"]
    inputs = [i.name for i in onnx.load(str(original)).graph.input]
    for batch in (1, 5, 13, 64, 1000):
        rng = np.random.default_rng(batch)
        feeds = {n: rng.standard_normal((batch, 64)).astype(np.float32) for n in inputs}
        assert_outputs_match(*run_both(original, result.model_path, feeds))


def test_the_small_batch_variant_takes_the_batches_below_the_row_tile_less_two():
    """One whole row tile costs the main kernel about the same at any batch below it, the variant
    a row at a time: a GEMM group switches at its tile's rows less two (4 with AVX-512's 6-row
    tiles, 6 with 8-row ones); a tree walk keeps SMALL_BATCH_ROWS; a static batch needs none."""
    from onnxfuse.codegen import relax_import
    from onnxfuse.codegen.schedule import SMALL_BATCH_ROWS, small_batch_below

    wide = relax_import.import_group(_model(64, 256, False)[0], "wide").prim_func
    assert small_batch_below(schedule_group(wide, registers=AVX512)[1]) == 4
    assert small_batch_below(schedule_group(wide, registers=AVX2)[1]) == 6
    narrow = relax_import.import_group(_model(10, 30, True)[0], "gate").prim_func
    assert small_batch_below(schedule_group(narrow, registers=AVX512)[1]) == GEMM_TILE_ROWS - 2
    tree = relax_import.import_group(onnx.load(str(MODELS / "tree_trav_d3.onnx")), "tree").prim_func
    assert small_batch_below(schedule_group(tree, registers=AVX512)[1]) == SMALL_BATCH_ROWS


@pytest.mark.parametrize("case", ["lstm_cell", "gru_cell", "lstm_gate", "wide", "seed_gate", "narrow"])
def test_each_levels_threshold_derived_from_the_best_levels_schedule_is_its_own_schedules(case):
    """The compiler derives a lower level's threshold from the AVX-512 schedule's stats
    (small_batch_below_for_level) instead of scheduling that level again: the same number as the
    level's own schedule gives, for wide, narrow and padded GEMMs and the bundled cells."""
    from onnxfuse.codegen import relax_import
    from onnxfuse.codegen.register_file import SSE
    from onnxfuse.codegen.schedule import small_batch_below, small_batch_below_for_level, tile_rows_for_level

    models = {"wide": lambda: _model(64, 256, False)[0], "seed_gate": lambda: _model(10, 30, True)[0],
              "narrow": lambda: _model(16, 32, False)[0]}
    model = models[case]() if case in models else onnx.load(str(MODELS / f"{case}.onnx"))
    func = relax_import.import_group(model, case).prim_func
    best = schedule_group(func, registers=AVX512)[1]
    assert small_batch_below(best) > 0
    for registers in (AVX2, SSE, NEON):
        own = schedule_group(func, registers=registers)[1]
        assert small_batch_below_for_level(best, AVX512, registers) == small_batch_below(own), registers
        assert tile_rows_for_level(best, AVX512, registers) == own.tile_rows, registers


def test_a_portable_library_switches_each_level_at_its_own_threshold(tmp_path):
    """The AVX-512 level tiles 6 rows, the AVX2 and baseline levels 8: each level's table row
    carries its own threshold, and the kernel is right on both sides of each (every batch 1-9
    against numpy, run at the best level here; CompiledGroup.run picks as the runtime does)."""
    from onnxfuse.runtime.library import kernel_table_source, table_levels

    model, weight = _model(64, 256, False)
    target = resolve_target("portable")
    compiled = compile_group(model, "wide_levels", target, tmp_path, host_kernel=True)
    spec = compiled.spec
    assert spec.level_small_batch_below == (4, 6, 6) and spec.small_batch_below == 4
    assert spec.level_row_tiles == (6, 8, 8) and spec.row_tile == 6  # its rows are separable (row_slices)
    source = kernel_table_source([spec], table_levels([spec], target), target.arch)
    for suffix, below, tile in zip(spec.levels, spec.level_small_batch_below, spec.level_row_tiles):
        assert f"__tvm_ffi_wide_levels__{suffix}_small, {below}, {tile}," in source
    for batch in [*range(1, 10), 13, 19]:
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
        (y,) = compiled.run({"x": x})
        np.testing.assert_allclose(y, _numpy(x, weight, False), rtol=1e-4, atol=1e-4)


def test_wide_gemms_take_six_row_tiles_on_avx512_and_narrow_ones_eight():
    """A GEMM whose columns fill 4 zmm vectors gets 6 x 4 register tiles in 6-row tiles; the seed
    gate's 32 padded columns (2 vectors) keep 4 x 2 tiles in 8-row tiles (6 x 2 was slower)."""
    from onnxfuse.codegen import relax_import

    wide = relax_import.import_group(_model(64, 256, False)[0], "wide")
    _, wide_stats = schedule_group(wide.prim_func, registers=AVX512)
    assert (wide_stats.tile_rows, wide_stats.gemm_sized_tiles, wide_stats.register_tiles) == (6, True, 1)
    narrow = relax_import.import_group(_model(10, 30, True)[0], "gate")
    _, narrow_stats = schedule_group(narrow.prim_func, registers=AVX512)
    assert (narrow_stats.tile_rows, narrow_stats.gemm_sized_tiles) == (GEMM_TILE_ROWS, True)
    _, avx2_stats = schedule_group(wide.prim_func, registers=AVX2)
    assert avx2_stats.tile_rows == GEMM_TILE_ROWS
    assert gemm_shapes.register_tile(6, 4, AVX512) == (6, 4)
    assert gemm_shapes.register_tile(GEMM_TILE_ROWS, 2, AVX512) == (4, 2)


def _gemm_then(op: str, cols: int) -> onnx.ModelProto:
    w = np.random.default_rng(6).standard_normal((64, cols)).astype(np.float32) * 0.2
    graph = h.make_graph([h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node(op, ["m"], ["y"])], "g",
                         [h.make_tensor_value_info("x", TP.FLOAT, ["N", 64])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["N", cols])], [nh.from_array(w, "W")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("op, cols, rows", [("Tanh", 64, 4), ("Sigmoid", 64, 4), ("Relu", 64, 6), ("Tanh", 128, 6)])
def test_a_polynomial_after_one_register_tile_of_columns_takes_four_row_tiles(op, cols, rows):
    """[N, 64] @ [64, 64] -> Tanh: 6 x 4 accumulators left too few registers for the Tanh's
    constants and 7 went through the stack each step (0.78x onnxruntime; 4 rows: 1.21x).
    A Relu needs no constants; 128 columns ran alike with either tile: both keep 6 rows."""
    assert _schedule_stats(_gemm_then(op, cols)).tile_rows == (8 if rows == 4 else 6)


def test_a_gemm_then_tanh_with_four_row_tiles_is_onnxruntimes(tmp_path):
    model = _gemm_then("Tanh", 64)
    source = tmp_path / "m.onnx"
    onnx.save(model, str(source))
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    x = {"x": np.random.default_rng(7).standard_normal((37, 64)).astype(np.float32)}
    assert_outputs_match(*run_both(source, result.model_path, x))


@pytest.mark.parametrize("cols, tails", [(40, 1), (24, 1), (33, 0), (48, 0)])
def test_a_row_past_whole_vectors_ends_in_a_narrower_vector(cols, tails):
    """An epilogue row of 40 floats after a padded GEMM runs as 2 x 16 lanes and a tail of 8
    (schedule.vectorize_with_tail), not as 5 x 8: [N, 16, 40] @ [40, 40] -> Tanh went from 1.03x
    to 1.28x onnxruntime at batch 64. A tail of one float stays scalar; 48 is whole vectors."""
    assert _schedule_stats(_gemm_then("Tanh", cols)).vector_tails == tails


@pytest.mark.parametrize("cols", [40, 24, 33])
def test_a_row_with_a_vector_tail_is_onnxruntimes(cols, tmp_path):
    model = _gemm_then("Tanh", cols)
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(cols)
    for rows in (1, 5, 37, 256):
        x = {"x": (rng.standard_normal((rows, 64)) * 4).astype(np.float32)}
        np.testing.assert_array_equal(compiled.run(x)[0], session.run(None, x)[0])


def _dense_layer(k: int, cols: int, activation: str, rank: int = 2) -> onnx.ModelProto:
    """x @ W + b -> activation; "Gelu" as PyTorch exports it: x * (1 + erf(x / sqrt 2)) * 0.5."""
    rng = np.random.default_rng(k + cols)
    inits = [nh.from_array((rng.standard_normal((k, cols)) / np.sqrt(k)).astype(np.float32), "W"),
             nh.from_array((rng.standard_normal(cols) * 0.1).astype(np.float32), "b")]
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["z"])]
    if activation == "Gelu":
        inits += [nh.from_array(np.array(v, np.float32), name) for name, v in (("sq2", 1.4142135), ("one", 1.0), ("half", 0.5))]
        nodes += [h.make_node("Div", ["z", "sq2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
                  h.make_node("Add", ["e", "one"], ["e1"]), h.make_node("Mul", ["z", "e1"], ["g"]),
                  h.make_node("Mul", ["g", "half"], ["y"])]
    else:
        nodes.append(h.make_node(activation, ["z"], ["y"]))
    lead = ["N", 16] if rank == 3 else ["N"]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [*lead, k])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [*lead, cols])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("k, cols, activation, tiles, per_tile", [
    (784, 128, "Tanh", 2, 3),  # blocked (gemm_blocks): the ragged block's add, the bias Add, the Tanh
    (256, 128, "Tanh", 1, 2),  # the bias Add, then the Tanh
    (128, 128, "Gelu", 1, 3),  # the bias Add, the Div, and the Mul that reads both (Erf and the rest inlined)
    (16, 16, "Relu", 1, 1),  # one vector of columns: the bias Add only
])
def test_the_ops_after_a_gemm_follow_it_per_register_tile(k, cols, activation, tiles, per_tile):
    """Each op that reads only what the tile computed runs right after the tile's write-back
    (schedule.epilogue_per_register_tile). With the Tanh once per row tile instead, LLVM kept 8 of
    the second column block's 24 accumulators on the stack: [N, 784] @ [784, 128] + b -> Tanh ran
    0.75x onnxruntime, 1.02x per tile (GELU 0.48x -> 0.94x) at batch 64."""
    stats = _schedule_stats(_dense_layer(k, cols, activation))
    assert stats.register_tiles == tiles
    assert stats.epilogues_per_tile == per_tile
    assert not stats.skipped_steps


def test_a_padded_gemm_moves_its_first_reader_only_and_builds_on_every_level(tmp_path):
    """Padded columns (20 -> 24 on AVX2, 32 on AVX-512): with the Relu per tile too, the x86-64-v3
    build failed in TVM ("mismatched types. int32 vs. int64") and the group fell back."""
    model = _dense_layer(128, 20, "Relu", rank=3)
    assert _schedule_stats(model).epilogues_per_tile == 1
    compiled = compile_group(model, "padded", resolve_target("portable"), tmp_path)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = {"x": np.random.default_rng(20).standard_normal((3, 16, 128)).astype(np.float32)}
    np.testing.assert_array_equal(compiled.run(x)[0], session.run(None, x)[0])


@pytest.mark.parametrize("activation, rank", [("Gelu", 2), ("Sigmoid", 2), ("Tanh", 3), ("Gelu", 3)])
def test_a_dense_layer_with_its_activation_per_tile_is_onnxruntimes(activation, rank, tmp_path):
    """Bit for bit at every batch path: one row, a ragged row tile, whole tiles (K <= 256, where
    onnxruntime's GEMM sums in one block too). Through optimize: onnxruntime runs this GELU as
    its Gelu or BiasGelu kernel, which the loader finds and the group computes (docs/numerics.md)."""
    source = tmp_path / "dense.onnx"
    onnx.save(_dense_layer(128, 128, activation, rank), str(source))
    result = optimize(source, tmp_path / "dense.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups_compiled"] == 1
    rng = np.random.default_rng(rank)
    for rows in (1, 5, 37, 256):
        shape = (rows, 16, 128) if rank == 3 else (rows, 128)
        feeds = {"x": (rng.standard_normal(shape) * 2).astype(np.float32)}
        expected, actual = run_both(source, result.model_path, feeds)
        np.testing.assert_array_equal(actual[0], expected[0])


def test_a_kernel_with_two_products_moves_each_ones_first_reader_only():
    """transformer_mlp ([N, 8, 64] @ [64, 256] + b -> GELU -> @ [256, 64] + b): the bias Adds per
    tile, the GELU once per row tile. With the GELU per tile of the first GEMM, BERT's FFN (the
    same shape of kernel) ran 7-10% slower at batch 1 (schedule.epilogue_per_register_tile)."""
    stats = _schedule_stats(onnx.load(str(MODELS / "transformer_mlp.onnx")))
    assert stats.register_tiles == 2
    assert stats.epilogues_per_tile == 2


def test_one_vector_of_columns_takes_eight_rows():
    """N = 10 (padded to 16) or 16 on AVX-512, 8 on AVX2: 8 x 1 accumulators, one weight vector
    per 8 FMAs (4 x 1 ran [N, 128] @ [128, 10] + Relu at 0.69x onnxruntime at 1,000 rows, 8 x 1 at
    0.99x). Two vectors keep 4 rows (the seed gate: 8 x 2 was slower)."""
    assert gemm_shapes.register_tile(GEMM_TILE_ROWS, 1, AVX512) == (8, 1)
    assert gemm_shapes.register_tile(GEMM_TILE_ROWS, 1, AVX2) == (8, 1)
    assert gemm_shapes.register_tile(GEMM_TILE_ROWS, 2, AVX512) == (4, 2)
    assert gemm_shapes.register_tile(1, 1, AVX512) == (1, 1)


def _attention_context(heads: int = 2, depth: int = 16) -> onnx.ModelProto:
    """Attention's probabilities @ V, heads merged back (BERT's TorchScript export): a product
    over K = seq, which is symbolic."""
    graph = h.make_graph(
        [h.make_node("MatMul", ["probs", "v"], ["context"]),
         h.make_node("Transpose", ["context"], ["y"], perm=[0, 2, 1, 3])], "attention",
        [h.make_tensor_value_info("probs", TP.FLOAT, ["batch", heads, "seq", "seq"]),
         h.make_tensor_value_info("v", TP.FLOAT, ["batch", heads, "seq", depth])],
        [h.make_tensor_value_info("y", TP.FLOAT, ["batch", "seq", heads, depth])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_a_product_over_a_symbolic_k_gets_a_register_tile():
    """K = seq unknown until run time: the register tile's k loop runs to it (BERT's context
    product had none and ran as one accumulator per output)."""
    stats = _schedule_stats(_attention_context())
    assert stats.register_tiles == 1
    assert not stats.skipped_steps


def test_a_product_over_a_symbolic_k_is_onnxruntimes_bits(tmp_path):
    source = tmp_path / "attention.onnx"
    onnx.save(_attention_context(), str(source))
    result = optimize(source, tmp_path / "attention.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups_compiled"] == 1
    for batch, seq in [(1, 1), (2, 7), (3, 16), (1, 33), (4, 128)]:
        rng = np.random.default_rng(batch * 1000 + seq)
        probs = rng.random((batch, 2, seq, seq)).astype(np.float32)
        feeds = {"probs": probs / probs.sum(-1, keepdims=True),
                 "v": rng.standard_normal((batch, 2, seq, 16)).astype(np.float32)}
        (expected,), (actual,) = run_both(source, result.model_path, feeds)
        assert actual.shape == expected.shape == (batch, seq, 2, 16)
        assert actual.tobytes() == expected.tobytes(), (batch, seq)
