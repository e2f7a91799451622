"""Direct convolutions get a register tile (codegen/conv_schedule) and sum in onnxruntime's order:
the kernel's answers against onnxruntime on the original model, and the schedule's own steps."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from conftest import MODELS, assert_outputs_match, host_has, run_both
from onnx_builder import model, node, weights
from tvm import s_tir

from onnxfuse import optimize
from onnxfuse.codegen import conv_blocks, conv_schedule, relax_import, schedule, tir_walk
from onnxfuse.codegen.register_file import AVX2, AVX512, NEON
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.extract import extract_group
from onnxfuse.fusion.plan import plan_fusion

# onnxruntime sums a Conv's input channels in blocks of 16 on AVX-512 CPUs (8 on AVX2), single
# channels below 16 (codegen/conv_blocks): that is the order the kernels follow.
SAME_BITS = host_has("avx512f")


def conv_relu(channels: int, out_channels: int, size: int, window: int, strides=(1, 1)) -> onnx.ModelProto:
    pad = window // 2
    out_size = (size + 2 * pad - window) // strides[0] + 1
    return model([node("Conv", ["X", "W", "B"], "c", pads=[pad] * 4, strides=list(strides)), node("Relu", ["c"], "Y")],
                 {"X": ["N", channels, size, size]}, {"Y": ["N", out_channels, out_size, out_size]},
                 {"W": weights(out_channels, channels, window, window, seed=1) * 0.2, "B": weights(out_channels, seed=2)})


def _conv_block_of(source):
    graph = load_model(source)
    (group,) = plan_fusion(graph).groups
    func = relax_import.import_group(extract_group(graph, group), "k").prim_func
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    conv = next(b for b in sch.get_child_blocks(sch.get_sblock("root")) if tir_walk.is_reduction(sch.get(b)))
    return sch, conv


def test_a_stride_one_conv_is_recognised_and_a_strided_one_is_not():
    sch, conv = _conv_block_of(conv_relu(16, 4, 16, 3))
    assert conv_schedule.direct_conv_axes(sch.get(conv)) is not None
    window = sch.get_producers(conv)
    assert any(conv_schedule.is_conv_window(sch, b) for b in window)
    sch, conv = _conv_block_of(conv_relu(16, 4, 16, 3, strides=(2, 2)))
    assert conv_schedule.direct_conv_axes(sch.get(conv)) is None


def test_a_matrix_product_is_no_convolution():
    m = model([node("MatMul", ["X", "W"], "p"), node("Relu", ["p"], "Y")], {"X": ["N", 16]}, {"Y": ["N", 16]},
              {"W": weights(16, 16)})
    sch, block = _conv_block_of(m)
    assert conv_schedule.direct_conv_axes(sch.get(block)) is None


def test_the_register_tile_holds_as_many_output_channels_as_registers_allow():
    assert conv_schedule.output_channels_per_tile(16, AVX512) == 16
    assert conv_schedule.output_channels_per_tile(48, AVX512) == 24  # 24 of 32 zmm
    assert conv_schedule.output_channels_per_tile(32, AVX512) == 16  # the largest divisor that fits
    assert conv_schedule.output_channels_per_tile(16, AVX2) == 8  # 8 of 16 ymm
    assert conv_schedule.output_channels_per_tile(7, NEON) == 7
    assert conv_schedule.output_channels_per_tile(8, AVX2, vectors=2) == 4  # columns of 13: two ymm each


def test_a_row_that_is_no_multiple_of_the_vector_takes_a_divisor_filling_half_of_one_or_more():
    assert conv_schedule.column_lanes(32, 16) == 16 and conv_schedule.column_lanes(13, 16) == 13
    assert conv_schedule.column_lanes(26, 16) == 13 and conv_schedule.column_lanes(28, 16) == 14
    assert conv_schedule.column_lanes(17, 16) is None  # prime: no vector tile
    assert conv_schedule.column_lanes(26, 4) == 2


def test_on_avx2_rows_of_13_and_26_take_two_registers_of_13_columns():
    """AVX2's 8 lanes divide neither 13 nor 26, and no divisor fills half a vector: 13 columns in
    two registers (three quarters of their lanes used), rather than no register tile at all."""
    assert conv_schedule.column_lanes(26, 8) == 13 and conv_schedule.column_lanes(13, 8) == 13
    assert conv_schedule.column_lanes(13, 4) is None  # four SSE registers per accumulator: no
    assert conv_schedule.column_lanes(17, 16) is None  # a second zmm of one lane: no


def _vectorized_blocks(script: str) -> dict[str, bool]:
    """Each block of a scheduled script → whether the loop right above it is vectorized."""
    lines, found = script.splitlines(), {}
    for i, line in enumerate(lines):
        if "T.sblock(" in line:
            loop = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].lstrip().startswith("for ")), "")
            found[line.split('"')[1]] = "T.vectorized" in loop
    return found


def test_on_avx2_the_keras_cnns_convs_and_their_epilogues_are_vectors():
    """keras_cnn's 1 -> 8 conv (rows of 26) and 8 -> 16 conv + SiLU (rows of 13) scheduled for
    AVX2: each gets its register tile, and every epilogue block runs as vectors of a row. Before,
    neither conv had a tile (rows no multiple of 8), and the SiLU's 4 channels x 13 columns,
    fused to 52, left a ragged tail and stayed scalar (the model at 0.26x onnxruntime at batch
    64 on the AVX2 level; with tiles and row vectors 0.53x)."""
    graph = load_model(MODELS / "exported" / "keras_cnn.onnx")
    convs = [g for g in plan_fusion(graph).groups if "Conv" in [graph.nodes[i].op_type for i in g.node_indices]]
    assert len(convs) == 2
    for group in convs:
        func = relax_import.import_group(extract_group(graph, group), "k").prim_func
        scheduled, stats = schedule.schedule_group(func, registers=AVX2)
        assert stats.register_tiles == 1 and not stats.skipped_steps
        blocks = _vectorized_blocks(scheduled.script())
        epilogue = {name: vectorized for name, vectorized in blocks.items() if name.startswith("T_")}
        assert epilogue and all(epilogue.values()), blocks


def test_the_schedule_tiles_the_conv_and_keeps_its_padded_image():
    graph = load_model(conv_relu(16, 16, 16, 3))
    (group,) = plan_fusion(graph).groups
    func = relax_import.import_group(extract_group(graph, group), "k").prim_func
    scheduled, stats = schedule.schedule_group(func, registers=AVX512)
    assert stats.register_tiles == 1 and not [s for s in stats.skipped_steps if "conv" in s]
    text = scheduled.script()
    assert 'T.sblock("pad_temp")' in text and "T.unroll(T.int64(16))" in text


def test_onnxruntimes_channel_blocks():
    assert [conv_blocks.channel_block(c) for c in (1, 3, 15, 16, 24, 64)] == [1, 1, 1, 16, 16, 16]


def test_more_than_one_block_is_summed_in_two_stages_and_tiled_together():
    """3 channels: three one-channel window sums, added in order; the sums are computed under the
    final sum's register tile, into registers of their own."""
    graph = load_model(conv_relu(3, 16, 16, 3))
    (group,) = plan_fusion(graph).groups
    func = relax_import.import_group(extract_group(graph, group), "k").prim_func
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert conv_blocks.BLOCK_SUMS in names and conv_blocks.BLOCKS_SUM in names
    scheduled, stats = schedule.schedule_group(func, registers=AVX512)
    assert stats.register_tiles == 1 and not [s for s in stats.skipped_steps if "conv" in s]
    assert 'scope="local"' in scheduled.script().split(conv_blocks.BLOCK_SUMS + "_local = ")[1].split("\n")[0]


@pytest.mark.parametrize("shape", [(16, 16, 16, 3), (16, 32, 16, 3), (16, 16, 32, 3), (16, 16, 16, 5),
                                   (16, 8, 16, 3), (8, 8, 16, 3), (4, 4, 16, 3), (3, 16, 32, 3), (32, 16, 16, 3),
                                   (24, 16, 16, 3), (16, 16, 32, 1), (1, 8, 26, 3), (1, 16, 16, 3), (8, 8, 28, 3)])
def test_the_kernel_computes_onnxruntimes_conv(tmp_path, cache, shape):
    """Bit for bit on an AVX-512 CPU, whatever the channels: one 16-channel block, several (24
    channels: 16 + 8), single channels (3, 4, 8), 8 or 4 output channels (whose short unrolled
    chains once let LLVM fuse the wrong product), a 1 x 1 window (not register-tiled), one input
    channel (read at index 0), rows of 26 and 28 (vectors of 13 and 14 columns)."""
    channels, out_channels, size, window = shape
    path = tmp_path / "conv.onnx"
    onnx.save(conv_relu(channels, out_channels, size, window), str(path))
    result = optimize(path, tmp_path / "conv.fused.onnx", cache_dir=cache, jobs=1, select="all")
    (group,) = result.report["groups"]
    assert group["status"] in ("compiled", "cached")
    assert group["stats"]["register_tiles"] == (1 if window > 1 else 0)
    same_bits = SAME_BITS
    for batch in (1, 3, 64):
        x = np.random.default_rng(batch).standard_normal((batch, channels, size, size)).astype(np.float32)
        expected, actual = run_both(path, result.model_path, {"X": x})
        assert_outputs_match(expected, actual, rtol=1e-4, atol=1e-4)
        if same_bits:
            assert expected[0].tobytes() == actual[0].tobytes(), batch


def test_the_bundled_resnet_block_compiles_by_default_and_is_onnxruntimes_bit_for_bit(tmp_path, cache):
    """Both convolutions of conv_block are kernels under `--select auto` (select/auto.py), their
    batch norms folded as onnxruntime folds them (frontend/fold_batch_norms)."""
    result = optimize(MODELS / "conv_block.onnx", tmp_path / "conv_block.fused.onnx", cache_dir=cache, jobs=1)
    assert [(g["op_types"], g["status"] != "fallback") for g in result.report["groups"]] == [
        (["Conv", "Relu"], True), (["Conv", "Add", "Relu"], True)]
    assert not [n for n in onnx.load(str(result.model_path)).graph.node if n.op_type == "Conv"]
    for batch in (1, 3, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 16, 16, 16)).astype(np.float32)
        expected, actual = run_both(MODELS / "conv_block.onnx", result.model_path, {"X": x})
        assert_outputs_match(expected, actual)
        if SAME_BITS:
            assert expected[0].tobytes() == actual[0].tobytes(), batch


def test_both_exported_denoisers_compile_by_default_bit_for_bit(tmp_path, cache):
    """PyTorch's DnCNN-style denoiser (models/exported, both exporters, which fold its batch norms
    themselves): a 3-channel input conv, three 16 -> 16 and a 16 -> 3 conv, all kernels under
    `--select auto`, onnxruntime's bits on the recorded inputs and at batches 1 and 5."""
    for exporter in ("ts", "dynamo"):
        source = MODELS / "exported" / f"denoiser_tiny_{exporter}.onnx"
        result = optimize(source, tmp_path / f"{exporter}.fused.onnx", cache_dir=cache, jobs=1)
        assert [g["status"] != "fallback" for g in result.report["groups"]] == [True] * 5
        assert not [n for n in onnx.load(str(result.model_path)).graph.node if n.op_type == "Conv"]
        recorded = dict(np.load(MODELS / "exported" / f"denoiser_tiny_{exporter}.inputs.npz"))
        feeds = [recorded] + [{"x": np.random.default_rng(b).standard_normal((b, 3, 32, 32)).astype(np.float32)}
                              for b in (1, 5)]
        for inputs in feeds:
            expected, actual = run_both(source, result.model_path, inputs)
            assert_outputs_match(expected, actual)
            if SAME_BITS:
                assert expected[0].tobytes() == actual[0].tobytes(), exporter


def test_symbolic_image_sizes_and_padding_forms(tmp_path, cache):
    """A symbolic height and width (no register tile: the width is unknown), SAME_UPPER padding,
    asymmetric pads and none: each compiles and sums in onnxruntime's order all the same."""
    weights_and_bias = {"W": weights(16, 16, 3, 3, seed=1) * 0.2, "B": weights(16, seed=2)}
    square = ["N", 16, 16, 16]
    cases = {
        "symbolic": (["N", 16, "H", "Wd"], ["N", 16, "H", "Wd"], dict(pads=[1, 1, 1, 1])),
        "same_upper": (square, square, dict(auto_pad="SAME_UPPER")),
        "asymmetric": (square, square, dict(pads=[0, 1, 2, 1])),
        "unpadded": (square, ["N", 16, 14, 14], {}),
    }
    for name, (dims, out_dims, attrs) in cases.items():
        path = tmp_path / f"{name}.onnx"
        onnx.save(model([node("Conv", ["X", "W", "B"], "c", **attrs), node("Relu", ["c"], "Y")], {"X": dims},
                        {"Y": out_dims}, weights_and_bias), str(path))
        result = optimize(path, tmp_path / f"{name}.fused.onnx", cache_dir=cache, jobs=1, select="all")
        assert [g["status"] != "fallback" for g in result.report["groups"]] == [True], name
        x = np.random.default_rng(3).standard_normal((2, 16, 16, 16)).astype(np.float32)
        expected, actual = run_both(path, result.model_path, {"X": x})
        assert_outputs_match(expected, actual)
        if SAME_BITS:
            assert expected[0].tobytes() == actual[0].tobytes(), name


def test_the_keras_cnns_one_channel_conv_is_register_tiled_with_onnxruntimes_bits(tmp_path, cache):
    """tf2onnx's MNIST CNN (models/exported/keras_cnn): a 1 -> 8 channel 3 x 3 conv on 28 x 28
    with no padding reads the image itself at channel index 0, in rows of 26. It ran as scalar
    loops, 0.58x onnxruntime at batch 64; tiled, 2.8x (docs/codegen.md)."""
    source = MODELS / "exported" / "keras_cnn.onnx"
    result = optimize(source, tmp_path / "keras_cnn.fused.onnx", cache_dir=cache, jobs=1, select="all")
    first = result.report["groups"][0]
    assert first["op_types"][0] == "Conv" and first["stats"]["register_tiles"] == 1
    recorded = dict(np.load(MODELS / "exported" / "keras_cnn.inputs.npz"))
    (name,) = recorded
    feeds = [recorded] + [{name: np.random.default_rng(b).random((b, 28, 28, 1)).astype(np.float32)} for b in (1, 3, 64)]
    for inputs in feeds:
        expected, actual = run_both(source, result.model_path, inputs)
        assert_outputs_match(expected, actual)
        if SAME_BITS:
            assert all(e.tobytes() == a.tobytes() for e, a in zip(expected, actual))


def conv_silu(channels: int, out_channels: int, size: int) -> onnx.ModelProto:
    """Conv 3 x 3 (padded) then x * Sigmoid(x): keras_cnn's second conv has 8 -> 16 channels on 13 x 13."""
    return model([node("Conv", ["X", "W", "B"], "c", pads=[1] * 4), node("Sigmoid", ["c"], "s"), node("Mul", ["c", "s"], "Y")],
                 {"X": ["N", channels, size, size]}, {"Y": ["N", out_channels, size, size]},
                 {"W": weights(out_channels, channels, 3, 3, seed=1) * 0.2, "B": weights(out_channels, seed=2)})


def test_an_epilogue_on_rows_of_13_runs_one_vector_per_row_with_onnxruntimes_bits(tmp_path, cache):
    """The SiLU after a register tile of 16 channels x 13 columns: fused into vectors of 16, each
    spanned two channels' rows and LLVM gathered and scattered it lane by lane (keras_cnn's
    second conv at 0.80x onnxruntime, batch 64); one 13-lane vector per row, 1.05x."""
    graph = load_model(conv_silu(8, 16, 13))
    (group,) = plan_fusion(graph).groups
    func = relax_import.import_group(extract_group(graph, group), "k").prim_func
    scheduled, stats = schedule.schedule_group(func, registers=AVX512)
    assert stats.register_tiles == 1
    assert "T.vectorized(T.int64(16))" not in scheduled.script()
    path = tmp_path / "conv_silu.onnx"
    onnx.save(conv_silu(8, 16, 13), str(path))
    result = optimize(path, tmp_path / "conv_silu.fused.onnx", cache_dir=cache, jobs=1, select="all")
    for batch in (1, 3, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 13, 13)).astype(np.float32)
        expected, actual = run_both(path, result.model_path, {"X": x})
        assert_outputs_match(expected, actual)
        if SAME_BITS:
            assert expected[0].tobytes() == actual[0].tobytes(), batch
