"""Groups that differ only in weights and value names compile to one kernel (kernel_identity.py),
and every node calling it passes its own weights: checked against onnxruntime on the original."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import MODELS, assert_outputs_match, run_both
from onnx import TensorProto, numpy_helper
from onnx_builder import const_i64, model, node, weights

from onnxfuse import optimize, pipeline
from onnxfuse.cache import group_key
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.extract import extract_group
from onnxfuse.fusion.partition import FusionOptions
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.kernel_identity import canonical_group
from onnxfuse.progress import Progress

BIN = Path(sys.executable).parent
EXPORTED_BERT = MODELS / "exported" / "bert_tiny_12l_dynamo.onnx"


def block(prefix: str, x: str, seed: int, scale: float = 0.5, dim: int = 16) -> tuple[list, dict, str]:
    """MatMul → bias → Mul by a scalar → Tanh, every name under `prefix`: (nodes, initializers, output)."""
    p = prefix
    nodes = [node("MatMul", [x, f"{p}W"], f"{p}mm"), node("Add", [f"{p}mm", f"{p}b"], f"{p}biased"),
             node("Mul", [f"{p}biased", f"{p}scale"], f"{p}scaled"), node("Tanh", [f"{p}scaled"], f"{p}out")]
    inits = {f"{p}W": weights(dim, dim, seed=seed), f"{p}b": weights(dim, seed=seed + 100),
             f"{p}scale": np.array(scale, np.float32)}
    return nodes, inits, f"{p}out"


BLOCK_OPS = 4
"""The fusion bound that keeps each block a group of its own: blocks in a row are a GEMM chain."""


def blocks_model(*specs: tuple[str, int, float], dim: int = 16, dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """Blocks in a row, one per (prefix, seed, scale); plan them with max_depth=BLOCK_OPS."""
    nodes, inits, x = [], {}, "X"
    for prefix, seed, scale in specs:
        n, i, x = block(prefix, x, seed, scale, dim)
        nodes += n
        inits.update(i)
    if dtype != TensorProto.FLOAT:
        inits = {k: v.astype(np.float64) for k, v in inits.items()}
    return model(nodes, {"X": ("N", dim)}, {x: ("N", dim)}, inits, dtype=dtype)


def canonical_groups(m: onnx.ModelProto, tmp_path: Path, max_depth: int = 256) -> list:
    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.onnx"
    onnx.save(m, str(path))
    graph = load_model(path)
    return [canonical_group(extract_group(graph, g)) for g in plan_fusion(graph, FusionOptions(max_depth=max_depth)).groups]


def keys(m: onnx.ModelProto, tmp_path: Path) -> list[str]:
    return [group_key(c.model, "x86_64|dup1") for c in canonical_groups(m, tmp_path, BLOCK_OPS)]


# ---- The identity -------------------------------------------------------------------------------

def test_groups_differing_in_weights_and_names_share_an_identity(tmp_path):
    first, second = canonical_groups(blocks_model(("a.", 1, 0.5), ("layer_two/", 2, 0.5)), tmp_path, BLOCK_OPS)[:2]
    assert first.model.SerializeToString(deterministic=True) == second.model.SerializeToString(deterministic=True)
    assert first.weights.keys() == second.weights.keys() == {"w0", "w1"}
    assert not np.array_equal(first.weights["w0"], second.weights["w0"])
    assert first.sources["w0"] == "a.W" and second.sources["w0"] == "layer_two/W"
    assert first.sources["x0"] == "X" and second.sources["x0"] == "a.out"


def test_the_key_does_not_change_when_values_and_dims_are_renamed(tmp_path):
    original = blocks_model(("a.", 1, 0.5))
    renamed = onnx.ModelProto()
    renamed.CopyFrom(original)
    mapping = {"X": "input_ids", "a.W": "encoder.weight", "a.b": "encoder.bias", "a.scale": "c17", "a.mm": "t9",
               "a.out": "a.out"}
    for n in renamed.graph.node:
        n.input[:] = [mapping.get(i, i + "_renamed") for i in n.input]
        n.output[:] = [mapping.get(o, o + "_renamed") for o in n.output]
        n.name = n.name + "_renamed"
    for t in renamed.graph.initializer:
        t.name = mapping[t.name]
    renamed.graph.input[0].name = "input_ids"
    renamed.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch_size"
    renamed.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch_size"
    assert keys(renamed, tmp_path) == keys(original, tmp_path)


@pytest.mark.parametrize("change", ["baked scalar", "shape", "dtype"])
def test_groups_differing_in_what_the_kernel_bakes_in_get_two_identities(tmp_path, change):
    base = keys(blocks_model(("a.", 1, 0.5)), tmp_path)
    other = {"baked scalar": lambda: blocks_model(("a.", 1, 0.25)),
             "shape": lambda: blocks_model(("a.", 1, 0.5), dim=8),
             "dtype": lambda: blocks_model(("a.", 1, 0.5), dtype=TensorProto.DOUBLE)}[change]()
    assert keys(other, tmp_path)[0] != base[0]


def test_weights_are_arguments_and_constants_the_kernel_needs_are_baked_in(tmp_path):
    """A float matrix and bias are weights; the scalar, the Reshape shape and a bool mask stay."""
    nodes = [node("MatMul", ["X", "W"], "mm"), node("Add", ["mm", "b"], "biased"),
             node("Mul", ["biased", "half"], "scaled"), node("Where", ["mask", "scaled", "biased"], "picked"),
             node("Reshape", ["picked", "shape"], "Y")]
    inits = {"W": weights(4, 4), "b": weights(4, seed=1), "half": np.array([0.5], np.float32),
             "mask": np.array([True, False, False, True]), "shape": const_i64(-1, 2)}
    (group,) = canonical_groups(model(nodes, {"X": ("N", 4)}, {"Y": ("M", 2)}, inits), tmp_path)
    baked = {t.name: numpy_helper.to_array(t).tolist() for t in group.model.graph.initializer}
    assert baked == {"c0": [0.5], "c1": [True, False, False, True], "c2": [-1, 2]}
    assert [i.name for i in group.model.graph.input] == ["x0", "w0", "w1"]
    assert {group.sources[w] for w in group.weights} == {"W", "b"}


# ---- One kernel per identity, end to end ------------------------------------------------------

def count_compiles(monkeypatch) -> list[str]:
    """The kernel names compile_one is called with."""
    names, real = [], pipeline.compile_one

    def compile_one(model_bytes, name, *args):
        names.append(name)
        return real(model_bytes, name, *args)

    monkeypatch.setattr(pipeline, "compile_one", compile_one)
    return names


def fused_op_types(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node if n.domain == "ai.onnxfuse"]


def test_two_identities_three_groups_two_kernels_each_node_its_own_weights(tmp_path, monkeypatch):
    m = blocks_model(("a.", 1, 0.5), ("b.", 2, 0.5), ("c.", 3, 0.25))
    src = tmp_path / "m.onnx"
    onnx.save(m, str(src))
    compiles = count_compiles(monkeypatch)
    log = io.StringIO()
    result = optimize(src, tmp_path / "m.fused.onnx", cache_dir=tmp_path / "cache", jobs=1, max_depth=BLOCK_OPS,
                      progress=Progress(stream=log))
    assert result.report["groups_compiled"] == 3
    assert len(compiles) == 2
    assert log.getvalue().splitlines()[0] == "onnxfuse: 3 groups → 2 kernels to compile, 0 groups from cache"
    ops = fused_op_types(result.model_path)
    assert ops[0] == ops[1] != ops[2]
    feeds = {"X": np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)}
    assert_outputs_match(*run_both(src, result.model_path, feeds))

    # The same blocks under other names and with other weights: every kernel comes from the cache.
    renamed = blocks_model(("enc.0.", 7, 0.5), ("enc.1.", 8, 0.5), ("enc.2.", 9, 0.25))
    src2 = tmp_path / "renamed.onnx"
    onnx.save(renamed, str(src2))
    again = optimize(src2, tmp_path / "renamed.fused.onnx", cache_dir=tmp_path / "cache", jobs=1,
                     max_depth=BLOCK_OPS)
    assert again.report["groups_cached"] == 3 and len(compiles) == 2
    assert fused_op_types(again.model_path) == ops
    assert_outputs_match(*run_both(src2, again.model_path, feeds))


def make_models():
    spec = importlib.util.spec_from_file_location("make_models", MODELS / "make_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_twelve_repeated_layers_compile_as_one(tmp_path):
    """MatMul-bias-GELU-MatMul-bias-residual-LayerNorm, once and 12 times with weights of its own:
    the same distinct kernels are compiled (so cold optimize takes about as long: docs/benchmarks.md)."""
    mm = make_models()
    runs = {}
    for layers in (1, 12):
        src, cache = tmp_path / f"block{layers}.onnx", tmp_path / f"cache{layers}"
        onnx.save(mm.repeated_block_model(layers), str(src))
        result = optimize(src, tmp_path / f"block{layers}.fused.onnx", cache_dir=cache)
        compiled = len(list(cache.glob("??/*")))  # an entry per compiled kernel
        runs[layers] = (compiled, result)
        feeds = {"X": np.random.default_rng(layers).standard_normal((3, 8, 64)).astype(np.float32)}
        assert_outputs_match(*run_both(src, result.model_path, feeds))
    (one_compiles, one), (twelve_compiles, twelve) = runs[1], runs[12]
    # Per layer: the FFN (a GEMM chain) and the bias + residual + LayerNorm (onnxruntime fuses them
    # into its SkipLayerNormalization, a group of its own here).
    assert one.report["groups_compiled"] == 2 and twelve.report["groups_compiled"] == 24
    assert one_compiles == twelve_compiles == 2
    assert len(set(fused_op_types(twelve.model_path))) == 2


@pytest.mark.slow
def test_exported_twelve_layer_bert_shares_kernels_and_verifies(tmp_path, cache):
    if not EXPORTED_BERT.is_file():
        pytest.skip(f"{EXPORTED_BERT.name} is not in models/exported")
    fused = tmp_path / "bert.fused.onnx"
    result = optimize(EXPORTED_BERT, fused, cache_dir=cache)
    groups = [g for g in result.report["groups"] if "kernel" in g]
    kernels = {g["kernel"] for g in groups}
    # At least 5 kept groups per layer (auto leaves the attention scores, Q @ K^T, to onnxruntime;
    # the FFN is one GEMM chain), and the 12 layers share their kernels.
    assert len(groups) >= 5 * 12 and len(kernels) <= len(groups) // 8, (len(groups), len(kernels))
    verdict = subprocess.run([str(BIN / "onnxfuse"), "verify", str(EXPORTED_BERT), str(fused), "--inputs",
                              str(EXPORTED_BERT.with_suffix(".inputs.npz"))], capture_output=True, text=True)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
