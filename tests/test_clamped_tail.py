"""The ragged last row tile of a GEMM group runs unpredicated (clamped_tail): which blocks lose
their batch predicate, and that the kernel still computes onnxruntime's bits at every batch,
including the batches whose last tile is ragged and those below one tile."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
import tvm_ffi
from conftest import MODELS, run_both
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import s_tir

from onnxfuse import optimize
from onnxfuse.codegen import relax_import
from onnxfuse.codegen.compile import build_module, compile_group
from onnxfuse.codegen.register_file import AVX512
from onnxfuse.codegen.schedule import gemm_tile_rows, schedule_group
from onnxfuse.target import resolve_target

TILE = gemm_tile_rows(AVX512)


def _gemm_bias_model(k: int = 64, cols: int = 256) -> onnx.ModelProto:
    """x[N, K] @ W[K, cols] + b: a GEMM whose result only the bias Add (the output) reads."""
    rng = np.random.default_rng(0)
    w = nh.from_array((rng.standard_normal((k, cols)) * 0.1).astype(np.float32), "W")
    b = nh.from_array(rng.standard_normal(cols).astype(np.float32), "b")
    graph = h.make_graph([h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["y"])],
                         "gemm_bias", [h.make_tensor_value_info("x", TP.FLOAT, ["N", k])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["N", cols])], [w, b])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _predicates(func) -> dict[str, str]:
    """Block name -> its predicate, as TVMScript writes it."""
    found = {}

    def collect(realize):
        found[realize.block.name_hint] = str(realize.predicate)
        return realize
    tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, collect)], order="post")
    return found


@pytest.fixture(scope="module")
def scheduled():
    group = relax_import.import_group(_gemm_bias_model(), "g")
    return schedule_group(group.prim_func, registers=AVX512)


def test_the_gemm_blocks_lose_the_batch_predicate_and_the_output_keeps_it(scheduled):
    func, stats = scheduled
    predicates = _predicates(func)
    assert stats.gemm_sized_tiles and stats.symbolic_rows
    gemm = [name for name in predicates if name.startswith("matmul")]
    assert len(gemm) == 2  # the accumulator's init and update (the bias Add stores it)
    assert stats.unpredicated_blocks == len(gemm)
    assert all("N" not in predicates[name] for name in gemm)
    assert "< N" in predicates["T_add"]  # rows past the batch are never stored
    script = func.script()
    assert "x[T.min(v_i0, N - T.int64(1)), v_k]" in script  # x's rows clamped to the last real one
    # the accumulators hold a whole tile whatever N: TVM clips a tile-local buffer to its shape
    assert script.count(f"T.max(N, T.int64({TILE}))") == 1


def test_the_kernel_alone_is_right_below_one_tile(scheduled):
    """The runtime sends the smallest batches to the small-batch variant, but the main
    kernel must be right there too (its rows past the batch read row N - 1)."""
    func, _ = scheduled
    model = _gemm_bias_model()
    w, b = (nh.to_array(t) for t in model.graph.initializer)
    kernel = build_module({"main": func.with_attr("global_symbol", "main")},
                          tvm.target.Target({"kind": "llvm"})).mod["main"]
    for batch in (1, 2, TILE - 1, TILE + 1, TILE + 5):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
        out = tvm.runtime.empty((batch, 256), "float32")
        kernel(tvm.runtime.tensor(x), tvm.runtime.tensor(w), tvm.runtime.tensor(b), out)
        np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ w + b, rtol=1e-5, atol=1e-5)


def test_every_ragged_batch_gives_onnxruntimes_bits(tmp_path):
    model = _gemm_bias_model()
    compiled = compile_group(model, "gemm_bias", resolve_target("native"), tmp_path)
    assert compiled.stats["unpredicated_blocks"] == 2
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for batch in [*range(1, 3 * TILE + 2), 60, 64, 1001]:
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
        expected = reference.run(None, {"x": x})[0]
        got = compiled.run({"x": x})[0]
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), f"batch {batch}"


# ---------------------------------------------------------------- tile-sized buffers, predicates kept

def _transformer_mlp() -> onnx.ModelProto:
    """LayerNorm, [N, 8, 64] @ [64, 256], GELU, [N, 8, 256] @ [256, 64], residual: rows of 8 under a
    symbolic N, so the row tile is not a GEMM's and its blocks keep their batch predicates."""
    return onnx.load(str(MODELS / "transformer_mlp.onnx"))


def _allocated_shapes(func) -> list:
    """The shapes of the buffers `func` allocates, once TVM has sized them (CompactBufferAllocation)."""
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    passes = [s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation()]
    lowered = tvm.transform.Sequential(passes)(mod)["main"]
    found = []

    def collect(block):
        found.extend(tuple(buffer.shape) for buffer in block.alloc_buffers)
        return block
    tvm_ffi.structural_map(lowered.body, [(s_tir.SBlock, collect)], order="post")
    return found


def test_predicated_tiles_get_buffers_of_the_tile_not_the_batch():
    func, stats = schedule_group(relax_import.import_group(_transformer_mlp(), "g").prim_func, registers=AVX512)
    assert stats.unpredicated_blocks == 0 and stats.tile_sized_blocks > 0
    assert all("likely" in p for p in _predicates(func).values() if "< s" in p or "< N" in p)
    shapes = _allocated_shapes(func)
    assert shapes and all(isinstance(extent, tvm.tirx.IntImm) for shape in shapes for extent in shape), shapes


def test_tile_sized_buffers_give_onnxruntimes_bits_at_every_batch(tmp_path):
    source = MODELS / "transformer_mlp.onnx"
    result = optimize(source, tmp_path / "mlp.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups_compiled"] == 1
    for batch in [1, 2, 3, 4, 5, 7, 9, 64, 1001]:
        x = np.random.default_rng(batch).standard_normal((batch, 8, 64)).astype(np.float32)
        expected, actual = run_both(source, result.model_path, {"X": x})
        assert np.array_equal(actual[0].view(np.uint32), expected[0].view(np.uint32)), f"batch {batch}"


def test_a_pooler_over_batch_and_seq_compiles_with_tile_sized_buffers(tmp_path):
    """BERT's pooler as TorchScript writes it: Gather(x[N, S, 64], 0, axis=1), Gemm, Tanh. Sizing
    its buffers once rebuilt the kernel's parameters, and the index checks made for the original
    ones named buffers it no longer declared: the group fell back."""
    rng = np.random.default_rng(8)
    inits = [nh.from_array(np.array(0, np.int64), "first"),
             nh.from_array((rng.standard_normal((64, 64)) * 0.2).astype(np.float32), "W"),
             nh.from_array(rng.standard_normal(64).astype(np.float32), "b")]
    nodes = [h.make_node("Gather", ["x", "first"], ["t"], axis=1), h.make_node("Gemm", ["t", "W", "b"], ["z"]),
             h.make_node("Tanh", ["z"], ["y"])]
    graph = h.make_graph(nodes, "pooler", [h.make_tensor_value_info("x", TP.FLOAT, ["N", "S", 64])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["N", 64])], inits)
    source = tmp_path / "pooler.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(source))
    result = optimize(source, tmp_path / "pooler.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups_compiled"] == 1, result.report
    for batch, seq in [(1, 3), (5, 16), (64, 7)]:
        x = rng.standard_normal((batch, seq, 64)).astype(np.float32)
        expected, actual = run_both(source, result.model_path, {"x": x})
        assert np.array_equal(actual[0].view(np.uint32), expected[0].view(np.uint32)), (batch, seq)


def test_a_sum_over_the_batch_keeps_its_bound():
    """A ReduceSum over the batch tiles its reduction loop: its init must stay at the first row
    (empty_reductions), so its `row < N` is left as it is (fuzz case reduce-empty-batch: a batch
    of 0 returned the previous call's sum)."""
    graph = h.make_graph([h.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)], "sum",
                         [h.make_tensor_value_info("x", TP.FLOAT, ["N", 3])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 1])],
                         [nh.from_array(np.array([0, 1], np.int64), "axes")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    func, stats = schedule_group(relax_import.import_group(model, "g").prim_func, registers=AVX512)
    assert stats.symbolic_rows and stats.tile_sized_blocks == 0
