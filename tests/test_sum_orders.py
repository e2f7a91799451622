"""onnxruntime's summation orders per ISA level (codegen/sum_orders.py): each level of a portable
build sums a Conv's input channels in the blocks onnxruntime uses on the CPUs that level serves
(16 on AVX-512, 8 on AVX2 and on the SSE baseline: MLAS's NchwcBlockSize), and a Softmax row's
exps in its kernel's lanes (16, 8, and 4 with the rest added one by one), a LayerNorm row by
Welford's update where onnxruntime's vectorized path needs AVX2, and MLAS's one-row products
(a batch-1 product by a run-time weight, a sum over middle axes) in groups of four with AVX, in
order without. Checked on emulated
CPUs (qemu-user, as in test_portable_levels.py) against onnxruntime on the same emulated CPU, bit
for bit. With AVX-512's orders everywhere, the AVX2 and baseline levels were off: conv_block's
default output by 1.1e-6 under `-cpu Haswell`, Softmax rows of 333 by 4-7e-9 on both, and
vit_block_ts's default output by 2.4e-7 and tree_trav_d3's by 6e-8 under `-cpu Nehalem`."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from conftest import MODELS
from onnx_builder import model, node
from test_conv_schedule import conv_relu, conv_silu
from test_portable_levels import needs_qemu, probe
from tvm import s_tir

from onnxfuse import optimize
from onnxfuse.codegen import conv_blocks, relax_import, sum_orders, tir_walk
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.extract import extract_group
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.target import resolve_target

LEVELS = {"Haswell": "x86-64-v3", "Nehalem": "x86-64"}  # emulated CPU → the level it runs


def test_each_level_takes_onnxruntimes_orders():
    """MLAS picks its kernels by CPU features: the portable x86 levels' targets, and --mcpu ones."""
    v4, v3, baseline = (resolve_target("x86_64").tvm_target(level) for level in resolve_target("x86_64").levels)
    assert sum_orders.for_target(v4) == sum_orders.AVX512
    assert sum_orders.for_target(v3) == sum_orders.AVX2
    assert sum_orders.for_target(baseline) == sum_orders.SSE
    haswell = resolve_target("x86_64", mcpu="haswell")
    assert sum_orders.for_target(haswell.tvm_target(haswell.levels[0])) == sum_orders.AVX2
    arm = resolve_target("aarch64")
    assert sum_orders.for_target(arm.tvm_target(arm.levels[0])) == sum_orders.NEON
    assert (sum_orders.AVX512.conv_channel_block, sum_orders.AVX2.conv_channel_block, sum_orders.SSE.conv_channel_block) \
        == (16, 8, 8)
    assert (sum_orders.AVX2.softmax_lanes, sum_orders.SSE.softmax_lanes) == (8, 4)
    assert sum_orders.SSE.layer_norm_welford_below is None and sum_orders.AVX2.layer_norm_welford_below == 8
    assert (sum_orders.SSE.one_row_products, sum_orders.AVX2.one_row_products, sum_orders.NEON.one_row_products) \
        == (sum_orders.IN_ORDER, sum_orders.GROUPS_OF_FOUR, sum_orders.FUSED_CHAIN)
    assert sum_orders.NEON.four_lanes_added == sum_orders.ADJACENT != sum_orders.SSE.four_lanes_added
    assert (sum_orders.AVX512.nchwc_block, sum_orders.AVX2.nchwc_block, sum_orders.SSE.nchwc_block,
            sum_orders.NEON.nchwc_block) == (16, 8, 8, None)


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
    """16 channels: one block of 16 (AVX-512's order), two of 8 summing as on AVX2;
    12 channels: single channels, or a block of 8 and a ragged one of 4."""
    assert _block_sums_extent(conv_relu(16, 8, 8, 3)) is None
    assert _block_sums_extent(conv_relu(12, 8, 8, 3)) == 12
    with sum_orders.summing_as(sum_orders.AVX2):
        assert _block_sums_extent(conv_relu(16, 8, 8, 3)) == 2
        assert _block_sums_extent(conv_relu(12, 8, 8, 3)) == 2
    assert conv_blocks.channel_block(16) == 16  # restored after the `with`


@pytest.fixture(scope="module")
def convolutions(tmp_path_factory, cache):
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


# name → (opset, dims, axis): rows shorter than, equal to and longer than each level's vector,
# with a ragged last one, static and symbolic (N = D in the probe: rows of 1, 3, 17 and 40); the
# last axis and an inner one; opset 11's flattened rows.
SOFTMAXES = {"rows_333": (17, ["N", 333], -1), "rows_5": (17, ["N", 5], -1), "rows_16": (17, ["N", 16], -1),
             "symbolic": (17, ["N", "D"], -1), "inner_axis": (17, ["N", 37, 4], 1),
             "opset11_flattened": (11, ["N", 3, 40], 1)}


@pytest.fixture(scope="module")
def softmaxes(tmp_path_factory, cache):
    """Each Softmax of SOFTMAXES (then a Neg) as one kernel for the portable target: name →
    (original, fused, library)."""
    out = tmp_path_factory.mktemp("softmax_levels")
    result = {}
    for name, (opset, dims, axis) in SOFTMAXES.items():
        path = out / f"{name}.onnx"
        onnx.save(model([node("Softmax", ["x"], "a", axis=axis), node("Neg", ["a"], "y")], {"x": tuple(dims)},
                        {"y": tuple(dims)}, opset=opset), str(path))
        done = optimize(path, out / f"{name}.fused.onnx", target="portable", cache_dir=cache, jobs=1, select="all")
        assert [g["status"] != "fallback" for g in done.report["groups"]] == [True], name
        result[name] = (path, done.model_path, done.library_path)
    return result


@pytest.fixture(scope="module")
def pools(tmp_path_factory, cache):
    """GlobalAveragePool over 8, 16 and 24 channels: onnxruntime moves a pool to its NCHWc layout
    (each channel summed in order) where the channels are a multiple of the CPU's channel block, 8
    on AVX2 and on the baseline, 16 on AVX-512; else its four lanes. With AVX-512's block at every
    level, 8 and 24 channels were off under both emulated CPUs (3e-8 to 9e-8)."""
    out = tmp_path_factory.mktemp("pools")
    path = out / "pools.onnx"
    shapes = {"c8": (8, 5, 5), "c16": (16, 5, 5), "c24": (24, 3, 7)}
    nodes = [n for name in shapes for n in (node("GlobalAveragePool", [name], f"{name}_p"),
                                           node("Neg", [f"{name}_p"], f"{name}_y"))]
    onnx.save(model(nodes, {name: ("N", *shape) for name, shape in shapes.items()},
                    {f"{name}_y": ("N", shape[0], 1, 1) for name, shape in shapes.items()}, opset=13), str(path))
    done = optimize(path, out / "pools.fused.onnx", target="portable", cache_dir=cache, jobs=1, select="all")
    assert done.report["groups_fallback"] == 0, done.report["groups"]
    return {"pools": (path, done.model_path, done.library_path)}


def _assert_same_bits_under(cpu: str, models: dict, batches) -> None:
    for name, (original, fused, library) in models.items():
        report = probe(cpu, original, fused, library, batches)
        assert report["level"] == LEVELS[cpu], name
        assert report["outputs"], name
        for output in report["outputs"]:
            assert output["same_shape"] and output["max_abs"] == 0.0, (name, output)


def _layer_norm(n: int) -> onnx.ModelProto:
    rng = np.random.default_rng(n)
    return model([node("LayerNormalization", ["x", "g", "b"], "a", axis=-1, epsilon=1e-5), node("Neg", ["a"], "y")],
                 {"x": ("N", n)}, {"y": ("N", n)},
                 {"g": rng.standard_normal(n).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32)},
                 opset=17)


@pytest.fixture(scope="module")
def layer_norms(tmp_path_factory, cache):
    """LayerNormalization over rows of 5 (Welford's update everywhere), 8, 17, 40 and 333 (the
    vectorized path with AVX2, Welford's without), and PyTorch's exported ViT encoder block by
    default (LayerNorms, attention's Softmax, GELU): name → (original, fused, library)."""
    out = tmp_path_factory.mktemp("layer_norm_levels")
    result = {}
    for n in (5, 8, 17, 40, 333):
        path = out / f"rows_{n}.onnx"
        onnx.save(_layer_norm(n), str(path))
        done = optimize(path, out / f"rows_{n}.fused.onnx", target="portable", cache_dir=cache, jobs=1, select="all")
        assert [g["status"] != "fallback" for g in done.report["groups"]] == [True], n
        result[f"rows_{n}"] = (path, done.model_path, done.library_path)
    vit = MODELS / "exported" / "vit_block_ts.onnx"
    done = optimize(vit, out / "vit_block_ts.fused.onnx", target="portable", cache_dir=cache, jobs=1)
    assert done.report["groups_fallback"] == 0
    result["vit_block_ts"] = (vit, done.model_path, done.library_path)
    return result


@pytest.fixture(scope="module")
def one_row_products(tmp_path_factory, cache):
    """MLAS's one-row kernel (groups of four with AVX, in order on the SSE baseline): a Gemm by a
    weight and bias fed at run time, at batch 1 (K of 13 and 64); ReduceSum over the middle axis
    of [N, T, K], a product by ones (in order at N = 1 everywhere); and the bundled tree_trav_d3,
    whose ReduceMean averages its trees so: name → (original, fused, library)."""
    out = tmp_path_factory.mktemp("one_row_products")
    result = {}
    for k in (13, 64):
        path = out / f"gemm_k{k}.onnx"
        onnx.save(model([node("Gemm", ["a", "w", "c"], "p"), node("Neg", ["p"], "y")],
                        {"a": ("N", k), "w": (k, 6), "c": (6,)}, {"y": ("N", 6)}, opset=13), str(path))
        done = optimize(path, out / f"{path.stem}.fused.onnx", target="portable", cache_dir=cache, jobs=1, select="all")
        assert [g["status"] != "fallback" for g in done.report["groups"]] == [True], path.stem
        result[path.stem] = (path, done.model_path, done.library_path)
    for trees, classes in ((13, 5), (100, 2)):
        path = out / f"sum_{trees}_{classes}.onnx"
        onnx.save(model([node("ReduceSum", ["x", "axes"], "a", keepdims=0), node("Neg", ["a"], "y")],
                        {"x": ("N", trees, classes)}, {"y": ("N", classes)}, {"axes": np.array([1], np.int64)},
                        opset=13), str(path))
        done = optimize(path, out / f"{path.stem}.fused.onnx", target="portable", cache_dir=cache, jobs=1, select="all")
        assert [g["status"] != "fallback" for g in done.report["groups"]] == [True], path.stem
        result[path.stem] = (path, done.model_path, done.library_path)
    trees = MODELS / "tree_trav_d3.onnx"
    done = optimize(trees, out / "tree_trav_d3.fused.onnx", target="portable", cache_dir=cache, jobs=1)
    assert done.report["groups_fallback"] == 0
    result["tree_trav_d3"] = (trees, done.model_path, done.library_path)
    return result


@needs_qemu
@pytest.mark.parametrize("cpu", sorted(LEVELS))
def test_every_levels_one_row_products_give_onnxruntimes_bits_on_its_cpu(one_row_products, cpu):
    _assert_same_bits_under(cpu, one_row_products, (1, 3, 17))


@needs_qemu
@pytest.mark.parametrize("cpu", sorted(LEVELS))
def test_every_levels_layer_norm_gives_onnxruntimes_bits_on_its_cpu(layer_norms, cpu):
    _assert_same_bits_under(cpu, layer_norms, (1, 3, 17))


@needs_qemu
@pytest.mark.parametrize("cpu", sorted(LEVELS))
def test_every_levels_convolutions_give_onnxruntimes_bits_on_its_cpu(convolutions, cpu):
    _assert_same_bits_under(cpu, convolutions, (1, 3))


@needs_qemu
@pytest.mark.parametrize("cpu", sorted(LEVELS))
def test_every_levels_pools_give_onnxruntimes_bits_on_its_cpu(pools, cpu):
    _assert_same_bits_under(cpu, pools, (1, 3))


@needs_qemu
@pytest.mark.parametrize("cpu", sorted(LEVELS))
def test_every_levels_softmax_gives_onnxruntimes_bits_on_its_cpu(softmaxes, cpu):
    _assert_same_bits_under(cpu, softmaxes, (1, 3, 17, 40))
