"""concat_blocks.py: a Concat's output block becomes one block per source, and still matches onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx_builder import model, node
from test_codegen import ort_run
from test_tail_loops import _loops, _lowered
from tvm import s_tir

from onnxfuse.codegen import compile as compile_module
from onnxfuse.codegen import concat_blocks, register_file, relax_import
from onnxfuse.target import resolve_target

TARGET = resolve_target("native")
REGISTERS = register_file.for_target(TARGET.tvm_target())
_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")
LANES = lambda dtype: 8  # noqa: E731 - whole vectors of 8 (AVX2's float32), so 3 x 8 and 5 x 8 columns split


def _position_selects(func) -> int:
    found = []

    def visit(call):
        if call.op.same_as(_IF_THEN_ELSE):
            found.append(call)
        return call

    tvm_ffi.structural_map(func, [(tvm.ir.Call, visit)], order="post")
    return len(found)


def _block_names(func) -> list[str]:
    names = []

    def visit(block, visitor):
        names.append(block.name_hint)
        visitor.default_visit(block)

    tvm_ffi.structural_visit(func, [(s_tir.SBlock, visit)])
    return names


def _concat_exit(width: int = 32, batch="N"):
    """models/concat_exit.onnx: Concat(Relu(x) * 2, -Sigmoid(x)) along the columns."""
    nodes = [node("Relu", ["x"], "r"), node("Mul", ["r", "two"], "a"), node("Sigmoid", ["x"], "s"),
             node("Neg", ["s"], "b"), node("Concat", ["a", "b"], "y", axis=1)]
    return model(nodes, {"x": (batch, width)}, {"y": (batch, 2 * width)}, {"two": np.array(2.0, np.float32)})


def _three_sources():
    """Three sources of unequal widths along a middle axis."""
    nodes = [node("Neg", ["a"], "na"), node("Exp", ["b"], "eb"), node("Abs", ["c"], "ac"),
             node("Concat", ["na", "eb", "ac"], "y", axis=1)]
    return model(nodes, {"a": ("N", 3, 8), "b": ("N", 5, 8), "c": ("N", 1, 8)}, {"y": ("N", 9, 8)})


def _concat_read_again():
    """The Concat is read by another op of the group: its block must stay one."""
    nodes = [node("Neg", ["a"], "na"), node("Concat", ["na", "b"], "c", axis=1), node("Exp", ["c"], "y")]
    return model(nodes, {"a": ("N", 16), "b": ("N", 16)}, {"y": ("N", 32)})


def _rows_stacked():
    """Concat along a static first axis: left whole (its 8 x 20 elements fill whole vectors)."""
    nodes = [node("Neg", ["a"], "na"), node("Sigmoid", ["b"], "sb"), node("Concat", ["na", "sb"], "y", axis=0)]
    return model(nodes, {"a": (3, 20), "b": (5, 20)}, {"y": (8, 20)})


def test_each_source_gets_a_block_that_picks_nothing():
    func = relax_import.import_group(_concat_exit(), "k").prim_func
    assert _position_selects(func) == 1
    split = concat_blocks.split_by_source(func, LANES)
    assert _position_selects(split) == 0
    assert sum(name.startswith("T_concat") for name in _block_names(split)) == 2


def test_the_parts_share_the_loops_outside_the_cut():
    """Each row computes its sources in turn, as the single block did (two passes over each row
    tile, one per source, ran concat_exit about 5% slower at batch 1,000)."""
    split = concat_blocks.split_by_source(relax_import.import_group(_concat_exit(), "k").prim_func, LANES)
    shared = [lp for lp in _loops(split) if isinstance(lp.body, tvm.tirx.SeqStmt)]
    assert len(shared) == 1
    assert sorted(_block_names(shared[0])) == ["T_concat_below32", "T_concat_from32"]


def test_three_sources_give_three_blocks():
    split = concat_blocks.split_by_source(relax_import.import_group(_three_sources(), "k").prim_func, LANES)
    assert _position_selects(split) == 0
    assert sum(name.startswith("T_concat") for name in _block_names(split)) == 3


def _unaligned():
    nodes = [node("Neg", ["a"], "na"), node("Sigmoid", ["b"], "sb"), node("Concat", ["na", "sb"], "y", axis=1)]
    return model(nodes, {"a": ("N", 24), "b": ("N", 40)}, {"y": ("N", 64)})


def test_parts_of_no_whole_vectors_are_not_split():
    func = relax_import.import_group(_unaligned(), "k").prim_func
    assert concat_blocks.split_by_source(func, lambda dtype: 16).same_as(func)
    assert _position_selects(concat_blocks.split_by_source(func, LANES)) == 0


@pytest.mark.parametrize("build", [_concat_read_again, _rows_stacked])
def test_a_concat_read_by_another_block_or_along_rows_is_left_whole(build):
    func = relax_import.import_group(build(), "k").prim_func
    assert concat_blocks.split_by_source(func, LANES).same_as(func)


def test_every_tile_of_a_concat_is_a_vector_loop():
    """In the ragged last row tile too (the tile a small batch runs): no loop is scalarized (TVM's
    vectorizer names a loop it turned back into a scalar loop `<name>.s`). One block with an
    if_then_else on the column left that tile scalar."""
    func, stats = compile_module._schedule_or_plain(relax_import.import_group(_concat_exit(), "k").prim_func, REGISTERS)
    assert stats.symbolic_rows and stats.tile_rows > 1
    loops = _loops(_lowered(func))
    assert not [lp for lp in loops if lp.loop_var.name.endswith(("_s", ".s"))]
    # and the ragged tile's shared row loop ends at the batch (tail_loops), no row test left in it
    assert not [lp for lp in loops if isinstance(lp.body, tvm.tirx.SeqStmt)
                and any(isinstance(st, tvm.tirx.IfThenElse) for st in lp.body.seq)]


@pytest.mark.parametrize("batch", ["N", 8, 300])
def test_a_concat_is_vectorized_whatever_the_batch(batch):
    """Static batches fuse rows and columns into one vector loop elsewhere; the parts' shared row
    loop is left out of it (schedule.vectorize_elementwise)."""
    func, stats = compile_module._schedule_or_plain(
        relax_import.import_group(_concat_exit(batch=batch), "k").prim_func, REGISTERS)
    assert stats.vectorized == 2 and not stats.skipped_steps
    assert not [lp for lp in _loops(_lowered(func)) if lp.loop_var.name.endswith(("_s", ".s"))]


@pytest.mark.parametrize("build, shapes", [
    (lambda: _concat_exit(batch=300), {"x": (300, 32)}),
    (_concat_exit, {"x": (37, 32)}),
    (lambda: _concat_exit(24), {"x": (5, 24)}),
    (_three_sources, {"a": (7, 3, 8), "b": (7, 5, 8), "c": (7, 1, 8)}),
    (_concat_read_again, {"a": (3, 16), "b": (3, 16)}),
    (_rows_stacked, {"a": (3, 20), "b": (5, 20)}),
    (_unaligned, {"a": (9, 24), "b": (9, 40)}),
])
def test_split_concats_match_onnxruntime(tmp_path, build, shapes):
    m = build()
    rng = np.random.default_rng(0)
    feeds = {name: (rng.standard_normal(shape) * 4).astype(np.float32) for name, shape in shapes.items()}
    cg = compile_module.compile_group(m, "k", TARGET, tmp_path)
    for expected, got in zip(ort_run(m, feeds), cg.run(feeds)):
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)
