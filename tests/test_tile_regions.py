"""A row tile computes the rows it writes from the rows it reads, and no more: a producer whose
rows a tile needs are spread over the whole batch stays at the root (computed once), and a GEMM's
epilogue moves under its register tile only when it covers that one tile.

The pattern is PyTorch's dynamo export of nn.MultiheadAttention (batch_first): the context
`probs @ V` over [N, heads, seq, d] is transposed to [seq, N, heads, d] and reshaped to
[seq * N, heads * d], so the output's rows are seq-major and a tile of them reads one row of many
batches. Before, each tile recomputed the product over 2N - 1 batches (quadratic), the SSE level
failed to build, and the per-tile epilogue read rows no tile had computed yet (wrong from batch
8 on). Compared bit for bit with onnxruntime, on every ISA level this CPU runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import run_both
from onnx_builder import const_i64, model, node, weights

from onnxfuse import optimize
from onnxfuse.codegen import relax_import
from onnxfuse.codegen.register_file import AVX512
from onnxfuse.codegen.schedule import schedule_group

HEADS, SEQ, DEPTH = 4, 16, 16


def context(perm):
    """probs @ V -> Transpose(perm) -> Reshape [-1, heads * depth]."""
    return model([node("MatMul", ["probs", "v"], "context"),
                  node("Transpose", ["context"], "moved", perm=perm),
                  node("Reshape", ["moved", "shape"], "y")],
                 {"probs": ["N", HEADS, SEQ, SEQ], "v": ["N", HEADS, SEQ, DEPTH]}, {"y": ["rows", HEADS * DEPTH]},
                 {"shape": const_i64(-1, HEADS * DEPTH)})


def seq_major_context():
    """As the exporter writes it: [seq, N, heads, depth] -> [seq * N, heads * depth]."""
    return context([2, 0, 1, 3])


def batch_major_context():
    """The same product with the batch kept first: [N, seq, heads, depth] -> [N * seq, ...]."""
    return context([0, 2, 1, 3])


def _stats(proto):
    return schedule_group(relax_import.import_group(proto, "g").prim_func, registers=AVX512)[1]


def test_a_product_read_across_the_batch_stays_at_the_root():
    stats = _stats(seq_major_context())
    assert any("over the whole batch" in step for step in stats.skipped_steps)
    assert stats.register_tiles == 1


def test_a_product_read_tile_by_tile_still_moves_under_the_tile():
    stats = _stats(batch_major_context())
    assert not any("over the whole batch" in step or "not one tile's region" in step for step in stats.skipped_steps)
    assert stats.computed_at >= 1


@pytest.mark.parametrize("build", [seq_major_context, batch_major_context])
def test_the_context_is_onnxruntimes_bits_past_several_tiles(build, tmp_path):
    source = tmp_path / "context.onnx"
    onnx.save(build(), str(source))
    result = optimize(source, tmp_path / "context.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups_compiled"] == 1  # every ISA level built
    for batch in (1, 2, 7, 8, 9, 17, 64):
        rng = np.random.default_rng(batch)
        probs = rng.random((batch, HEADS, SEQ, SEQ)).astype(np.float32)
        feeds = {"probs": probs / probs.sum(-1, keepdims=True),
                 "v": rng.standard_normal((batch, HEADS, SEQ, DEPTH)).astype(np.float32)}
        (expected,), (actual,) = run_both(source, result.model_path, feeds)
        assert actual.shape == expected.shape == (batch * SEQ, HEADS * DEPTH)
        assert actual.tobytes() == expected.tobytes(), batch


def split_columns(columns: int, target: tuple[int, ...], compare: bool = False):
    """x [N, 28] @ W [28, columns] (-> LessOrEqual -> Cast) -> Reshape(target): a GEMM whose
    columns a Reshape splits, as Hummingbird-shaped tree products do."""
    nodes = [node("MatMul", ["x", "w"], "product")]
    last = "product"
    if compare:
        nodes += [node("LessOrEqual", ["product", "b"], "decided"), node("Cast", ["decided"], "decisions", to=1)]
        last = "decisions"
    nodes.append(node("Reshape", [last, "shape"], "y"))
    return model(nodes, {"x": ["N", 28]}, {"y": ["N", *target[1:]]},
                 {"w": weights(28, columns), "b": weights(1, columns, seed=1), "shape": const_i64(*target)})


def test_a_reshape_whose_rows_straddle_a_column_block_stays_out_of_the_register_tile():
    """A column block of 64 meets rows of 96: a tile's columns are the end of one reshaped row
    and the start of the next, a region no box describes (TVM gave it a wrong one)."""
    stats = _stats(split_columns(192, (-1, 2, 96)))
    assert any("not one tile's region" in step for step in stats.skipped_steps)
    assert stats.register_tiles == 1


def test_a_reshape_into_whole_column_blocks_still_follows_the_register_tile():
    stats = _stats(split_columns(960, (-1, 60, 16)))
    assert not any("not one tile's region" in step for step in stats.skipped_steps)
    assert stats.epilogues_per_tile >= 1


@pytest.mark.parametrize("columns, target, compare", [
    (192, (-1, 2, 96), False), (960, (-1, 8, 120), False), (960, (-1, 4, 1, 15, 16), True), (960, (-1, 60, 16), True)])
def test_a_product_split_by_a_reshape_is_onnxruntimes_bits(columns, target, compare, tmp_path):
    source = tmp_path / "split.onnx"
    onnx.save(split_columns(columns, target, compare), str(source))
    result = optimize(source, tmp_path / "split.fused.onnx", cache_dir=False, jobs=1, select="all", verify=False)
    assert result.report["groups_compiled"] == 1
    for batch in (1, 7, 64):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 28)).astype(np.float32)}
        (expected,), (actual,) = run_both(source, result.model_path, feeds)
        assert actual.shape == expected.shape
        assert actual.tobytes() == expected.tobytes(), batch


def test_heads_that_straddle_a_column_block_are_onnxruntimes_bits(tmp_path):
    """A projection to 3 heads of 40 ([N, 16, 32] @ [32, 120] + b -> [N, 16, 3, 40] -> heads
    first): each 64-column block ends inside a head; 19 of 53 such GEMM + view shapes tried
    (columns 96 to 384, rows of 32 to 160) gave garbage per tile before, caught by verify."""
    source = tmp_path / "heads.onnx"
    onnx.save(model([node("MatMul", ["x", "w"], "p"), node("Add", ["p", "b"], "q"),
                     node("Reshape", ["q", "shape"], "split"), node("Transpose", ["split"], "y", perm=[0, 2, 1, 3])],
                    {"x": ["N", SEQ, 32]}, {"y": ["N", 3, SEQ, 40]},
                    {"w": weights(32, 120), "b": weights(120, seed=1), "shape": const_i64(-1, SEQ, 3, 40)}), str(source))
    result = optimize(source, tmp_path / "heads.fused.onnx", cache_dir=False, jobs=1, select="all", verify=False)
    assert result.report["groups_compiled"] == 1
    for batch in (1, 3, 9):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, SEQ, 32)).astype(np.float32)}
        (expected,), (actual,) = run_both(source, result.model_path, feeds)
        assert actual.tobytes() == expected.tobytes(), batch
