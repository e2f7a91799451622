"""GEMMs over more than 256 k's give onnxruntime's bits (codegen/gemm_blocks.py): MLAS sums K in
blocks of 256 and adds the blocks in order, its Gemm from the bias. Every model here is compared
with onnxruntime running it, element for element, through `optimize`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_both
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnxfuse import optimize
from onnxfuse.codegen import relax_import
from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.schedule import schedule_group
from onnxfuse.fusion.onnxruntime_fused_ops import onnxruntime_fused_ops
from onnxfuse.target import resolve_target

ROWS = (1, 5, 37, 64)  # one row (the small-batch kernel), a ragged row tile, whole tiles and a tail


def _model(k: int, cols: int, form: str, activation: str = "Relu", rank: int = 2) -> onnx.ModelProto:
    """x @ W [+ b] -> activation, the product written as `form`: "matmul" (no bias), "matmul_add"
    (a bias Add after it), "gemm" (Gemm with W transposed, as PyTorch's Linear exports)."""
    rng = np.random.default_rng(k + cols)
    weight = (rng.standard_normal((k, cols)) / np.sqrt(k)).astype(np.float32)
    bias = (rng.standard_normal(cols) * 0.1).astype(np.float32)
    if form == "gemm":
        inits = [nh.from_array(np.ascontiguousarray(weight.T), "W"), nh.from_array(bias, "b")]
        nodes = [h.make_node("Gemm", ["x", "W", "b"], ["z"], transB=1)]
    else:
        inits = [nh.from_array(weight, "W")] + ([nh.from_array(bias, "b")] if form == "matmul_add" else [])
        nodes = [h.make_node("MatMul", ["x", "W"], ["m" if form == "matmul_add" else "z"])]
        if form == "matmul_add":
            nodes.append(h.make_node("Add", ["m", "b"], ["z"]))
    nodes.append(h.make_node(activation, ["z"], ["y"]))
    lead = ["B", "S"] if rank == 3 else ["N"]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [*lead, k])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [*lead, cols])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _assert_onnxruntimes_bits(model: onnx.ModelProto, tmp_path, target: str = "native") -> None:
    source = tmp_path / "model.onnx"
    onnx.save(model, str(source))
    result = optimize(source, tmp_path / "model.fused.onnx", cache_dir=False, jobs=1, select="all", target=target)
    assert result.report["groups_compiled"] == 1
    rank = len(model.graph.input[0].type.tensor_type.shape.dim)
    k = model.graph.input[0].type.tensor_type.shape.dim[-1].dim_value
    rng = np.random.default_rng(k)
    for rows in ROWS:
        shape = (rows, 3, k) if rank == 3 else (rows, k)
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        expected, actual = run_both(source, result.model_path, feeds)
        np.testing.assert_array_equal(actual[0], expected[0], err_msg=f"{rows} rows")


@pytest.mark.parametrize("k, cols", [(257, 64), (300, 128), (512, 64), (784, 128), (1000, 32)])
def test_a_product_over_k_blocks_is_onnxruntimes(k, cols, tmp_path):
    """One block and a ragged one (257, 300), whole blocks only (512), several and a ragged one
    (784, 1000). One chain over all of K differed in 1,199 of 4,096 outputs at K = 257."""
    _assert_onnxruntimes_bits(_model(k, cols, "matmul"), tmp_path)


@pytest.mark.parametrize("k, form", [(784, "matmul_add"), (300, "matmul_add"), (784, "gemm"), (512, "gemm")])
def test_a_2d_product_and_bias_sum_from_the_bias_as_onnxruntimes_gemm(k, form, tmp_path):
    """onnxruntime makes a 2-D MatMul + Add its Gemm (FusedGemm with the Relu), which starts from
    the bias: ((b + p0) + p1) + ..., where the MatMul alone gets it last."""
    _assert_onnxruntimes_bits(_model(k, 128, form), tmp_path)


@pytest.mark.parametrize("k, activation", [(784, "Tanh"), (300, "Sigmoid")])
def test_a_3d_product_and_bias_add_the_bias_last(k, activation, tmp_path):
    """Over [B, S, K] with symbolic dims onnxruntime keeps the MatMul and the Add apart."""
    _assert_onnxruntimes_bits(_model(k, 64, "matmul_add", activation, rank=3), tmp_path)


def test_onnxruntime_is_asked_which_products_start_from_the_bias():
    """The loader asks onnxruntime's optimized graph (onnxruntime_fused_ops): a 2-D product and
    its bias become its Gemm (here FusedGemm, with the Relu); over [B, S, K] with symbolic dims
    they do not; up to 256 k's the two give the same bits, so nothing is asked."""
    fused = onnxruntime_fused_ops(_model(784, 128, "matmul_add"))
    assert [op.op for op in fused] == ["FusedGemm"]
    assert onnxruntime_fused_ops(_model(784, 128, "matmul_add", rank=3)) == ()
    assert onnxruntime_fused_ops(_model(256, 128, "matmul_add")) == ()


def test_the_block_sums_and_the_ragged_block_run_in_the_register_tiles():
    """Each register tile computes its blocks' sums (then stores them), adds them up, adds the
    ragged block's sums (a small GEMM in the same tile loops) and runs the Relu, all per tile."""
    group = relax_import.import_group(_model(784, 128, "matmul"), "k")
    scheduled, stats = schedule_group(group.prim_func)
    assert not stats.skipped_steps
    assert stats.register_tiles == 2  # the sum of the blocks and the ragged block
    assert stats.epilogues_per_tile == 2  # the add of the ragged block, then the Relu
    text = scheduled.script()
    assert "matmul_block_sums_update" in text and "matmul_tail_sum_update" in text


def test_a_blocked_product_builds_on_every_isa_level(tmp_path):
    """The portable library's levels (x86-64 baseline, v3, v4) each build; the one this CPU
    runs gives onnxruntime's bits."""
    model = _model(784, 64, "matmul", "Tanh")
    compiled = compile_group(model, "blocked", resolve_target("portable"), tmp_path)
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": np.random.default_rng(7).standard_normal((9, 784)).astype(np.float32)}
    np.testing.assert_array_equal(compiled.run(feeds)[0], session.run(None, feeds)[0])


CORPUS = Path(__file__).resolve().parent.parent / "models" / "exported"


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_pytorchs_exported_mnist_mlp_is_onnxruntimes_bit_for_bit(exporter, tmp_path):
    """PyTorch's MNIST MLP (Linear 784 -> 320 -> 64 -> 10, both exporters write Gemm with B
    transposed): every layer in one kernel (--select all), the first two summed in blocks from
    the bias, on its recorded batch and at 1, 5 and 64 rows."""
    source = CORPUS / f"mlp_mnist_{exporter}.onnx"
    result = optimize(source, tmp_path / "mlp.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups_compiled"] == 1
    recorded = dict(np.load(CORPUS / f"mlp_mnist_{exporter}.inputs.npz"))
    rng = np.random.default_rng(28)
    for feeds in [recorded] + [{"x": rng.standard_normal((rows, 1, 28, 28)).astype(np.float32)} for rows in (1, 5, 64)]:
        expected, actual = run_both(source, result.model_path, feeds)
        np.testing.assert_array_equal(actual[0], expected[0])
