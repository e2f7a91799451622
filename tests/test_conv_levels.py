"""Convolutions per ISA level: each level of a portable build sums a Conv's input channels in the
blocks onnxruntime uses on the CPUs that level serves (codegen/conv_blocks.py): 16 on AVX-512, 8
on AVX2 and on the SSE baseline (MLAS's NchwcBlockSize). Checked on emulated CPUs (qemu-user,
as in test_portable_levels.py) against onnxruntime on the same emulated CPU, bit for bit: with
AVX-512's blocks everywhere, the AVX2 and baseline levels were ~1e-6 off (conv_block's default
output at batch 1, 1.1e-6 under `-cpu Haswell`)."""

from __future__ import annotations

import onnx
import pytest
import tvm
from conftest import MODELS
from test_conv_schedule import conv_relu, conv_silu
from test_portable_levels import needs_qemu, probe
from tvm import s_tir

from onnxfuse import optimize
from onnxfuse.codegen import conv_blocks, relax_import, tir_walk
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.extract import extract_group
from onnxfuse.fusion.plan import plan_fusion

LEVELS = {"Haswell": "x86-64-v3", "Nehalem": "x86-64"}  # emulated CPU → the level it runs


def test_each_level_takes_onnxruntimes_channel_block():
    assert conv_blocks.channel_block_for("x86_64", 64) == 16  # AVX-512
    assert conv_blocks.channel_block_for("x86_64", 32) == 8  # AVX2
    assert conv_blocks.channel_block_for("x86_64", 16) == 8  # the SSE baseline
    assert conv_blocks.channel_block_for("aarch64", 16) == 16  # unmeasured on Arm: AVX-512's order


def _block_sums_extent(conv: onnx.ModelProto) -> int | None:
    """The number of channel blocks the imported conv sums (None: one block, a single stage)."""
    graph = load_model(conv)
    (group,) = plan_fusion(graph).groups
    func = relax_import.import_group(extract_group(graph, group), "k").prim_func
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    for block in (sch.get(rv) for rv in tir_walk.leaf_blocks(sch)):
        if block.name_hint == conv_blocks.BLOCK_SUMS:
            return tir_walk.static_int(block.iter_vars[1].dom.extent)
    return None


def test_the_block_in_force_decides_the_lowering():
    """16 channels: one block of 16 (AVX-512's order), two of 8 under `summed_in_blocks_of(8)`;
    12 channels: single channels, or a block of 8 and a ragged one of 4."""
    assert _block_sums_extent(conv_relu(16, 8, 8, 3)) is None
    assert _block_sums_extent(conv_relu(12, 8, 8, 3)) == 12
    with conv_blocks.summed_in_blocks_of(8):
        assert _block_sums_extent(conv_relu(16, 8, 8, 3)) == 2
        assert _block_sums_extent(conv_relu(12, 8, 8, 3)) == 2
    assert conv_blocks.channel_block(16) == 16  # restored after the `with`


@pytest.fixture(scope="module")
def built(tmp_path_factory, cache):
    """Convs of 3, 8, 12, 16 and 20 input channels (single channels, one block, ragged blocks at 8
    and at 16), a SiLU after 8 -> 16 on rows of 13, the bundled conv_block by default and
    tf2onnx's MNIST CNN with every group a kernel: name → (original, fused, library), each for
    the portable target."""
    out = tmp_path_factory.mktemp("conv_levels")
    models = {"c3": conv_relu(3, 16, 16, 3), "c8_rows_of_28": conv_relu(8, 8, 28, 3), "c12": conv_relu(12, 8, 16, 3),
              "c16_5x5": conv_relu(16, 16, 16, 5), "c20": conv_relu(20, 8, 12, 3), "silu": conv_silu(8, 16, 13)}
    result = {}
    for name, conv in models.items():
        path = out / f"{name}.onnx"
        onnx.save(conv, str(path))
        done = optimize(path, out / f"{name}.fused.onnx", target="portable", cache_dir=cache, jobs=1, select="all")
        assert [g["status"] != "fallback" for g in done.report["groups"]] == [True], name
        result[name] = (path, done.model_path, done.library_path)
    done = optimize(MODELS / "conv_block.onnx", out / "conv_block.fused.onnx", target="portable", cache_dir=cache, jobs=1)
    assert not [n for n in onnx.load(str(done.model_path)).graph.node if n.op_type == "Conv"]
    result["conv_block"] = (MODELS / "conv_block.onnx", done.model_path, done.library_path)
    keras_cnn = MODELS / "exported" / "keras_cnn.onnx"  # rows of 26 and 13: two-register columns on AVX2
    done = optimize(keras_cnn, out / "keras_cnn.fused.onnx", target="portable", cache_dir=cache, jobs=1, select="all")
    assert [g["status"] != "fallback" for g in done.report["groups"]] == [True] * 4
    result["keras_cnn"] = (keras_cnn, done.model_path, done.library_path)
    return result


@needs_qemu
@pytest.mark.parametrize("cpu", sorted(LEVELS))
def test_every_level_gives_onnxruntimes_bits_on_its_cpu(built, cpu):
    for name, (original, fused, library) in built.items():
        report = probe(cpu, original, fused, library, (1, 3))
        assert report["level"] == LEVELS[cpu], name
        assert report["outputs"], name
        for output in report["outputs"]:
            assert output["same_shape"] and output["max_abs"] == 0.0, (name, output)
