"""Row reductions (over the last axis) run in vector lanes: schedule.factor_row_reductions. Sums and
means are not split so: they add in onnxruntime's lanes (codegen/row_sums.py, tests/test_row_sums.py)."""

from __future__ import annotations

import onnx
import pytest
import tvm
from onnx_builder import const_i64, model, node
from test_codegen import check_against_ort, random_feeds
from tvm import s_tir

from onnxfuse.codegen import register_file, relax_import, schedule
from onnxfuse.codegen.compile import compile_group
from onnxfuse.target import resolve_target


def _row_reduction(op: str, width: int = 64, keepdims: int = 1) -> onnx.ModelProto:
    """x * x, reduced over the last axis of [N, 8, width], then an elementwise op on the result."""
    reduce = node(op, ["sq", "axes"] if op != "ArgMax" else ["sq"], "r", keepdims=keepdims,
                  **({"axis": -1} if op == "ArgMax" else {}))
    tail = node("Cast", ["r"], "y", to=onnx.TensorProto.FLOAT) if op == "ArgMax" else node("Neg", ["r"], "y")
    inits = {} if op == "ArgMax" else {"axes": const_i64(-1)}
    out_shape = ("N", 8, 1) if keepdims else ("N", 8)
    return model([node("Mul", ["x", "x"], "sq"), reduce, tail], {"x": ("N", 8, width)}, {"y": out_shape}, inits, opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ArgMax"])
def test_row_reductions_match_onnxruntime(tmp_path, op):
    m = _row_reduction(op)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    if op in ("ReduceMax", "ReduceMin"):
        assert cg.stats["reductions_factored"] == 1
    elif op != "ArgMax":
        assert cg.stats["reductions_factored"] == 0  # summed in onnxruntime's lanes instead
    for batch in (1, 7, 33):  # 7 and 33 leave a ragged last row tile
        check_against_ort(cg, m, random_feeds(m, batch, seed=batch))


def test_without_keepdims(tmp_path):
    m = _row_reduction("ReduceMax", keepdims=0)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    assert cg.stats["reductions_factored"] == 1
    check_against_ort(cg, m, random_feeds(m, 5))


def test_rows_too_short_to_split_stay_serial(tmp_path):
    """Fewer than two vectors per row, or no vector of half a register or more that divides
    the row (12 floats: 4 lanes of AVX-512's 16): nothing to gain from partial sums."""
    m = _row_reduction("ReduceMax", width=12)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    assert cg.stats["reductions_factored"] == 0
    check_against_ort(cg, m, random_feeds(m, 5))


def test_reduction_over_a_middle_axis_vectorizes_its_columns_instead(tmp_path):
    m = model([node("ReduceSum", ["x", "axes"], "y", keepdims=1)], {"x": ("N", 64, 32)}, {"y": ("N", 1, 32)},
              {"axes": const_i64(1)}, opset=18)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    assert cg.stats["reductions_factored"] == 0
    assert cg.stats["vectorized"] >= 1
    check_against_ort(cg, m, random_feeds(m, 3))


def test_partial_sums_take_a_row_not_the_batch():
    """The partial results' buffer (a max here) must shrink to a row once lowered. Left at the row tile, TVM kept
    it batch-sized with a symbolic batch, so each tile allocated the whole batch's: 40x slower
    at batch 1000."""
    imported = relax_import.import_group(_row_reduction("ReduceMax", width=128), "k")
    scheduled, stats = schedule.schedule_group(imported.prim_func)
    assert stats.reductions_factored == 1
    lower = tvm.transform.Sequential([
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(),
    ])
    lowered = lower(tvm.IRModule({"main": scheduled}))["main"].script()
    partial_sums = [line.strip() for line in lowered.splitlines() if "_rf = " in line and "alloc_buffer" in line]
    assert len(partial_sums) == 1, lowered
    shape = partial_sums[0].split("alloc_buffer(", 1)[1].split(")")[0]
    assert "N" not in shape, partial_sums[0]


def test_rows_the_register_does_not_divide_take_narrower_lanes(tmp_path):
    """1,000 floats: 16 lanes leave a ragged tail, 8 divide it (on AVX2 8 lanes is the whole
    register). Left serial, each row was a chain of 1,000 dependent adds."""
    m = _row_reduction("ReduceMax", width=1000)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    assert cg.stats["reductions_factored"] == 1
    for batch in (1, 7):
        check_against_ort(cg, m, random_feeds(m, batch, seed=batch))


@pytest.mark.parametrize("lanes,extent,expected", [
    (16, 256, 16), (16, 1000, 8), (16, 12, 0), (16, 24, 8), (8, 1004, 4), (8, 1002, 0), (4, 6, 0), (4, 1000, 4),
])
def test_lanes_dividing(lanes, extent, expected):
    assert schedule._lanes_dividing(extent, lanes) == expected


def _vector_loop_reads_per_lane(func) -> list[bool]:
    """For each vectorized loop: whether a block in it reads a per-row value (a buffer whose
    last dimension is 1) at an index bound to the loop (one value per lane, a gather) rather
    than one value for all lanes."""
    import tvm_ffi

    from onnxfuse.codegen import tir_walk

    found = []

    def visit_for(loop, visitor):
        if loop.kind == tvm.tirx.ForKind.VECTORIZED:
            realizes = []
            tvm_ffi.structural_visit(loop.body, [(s_tir.SBlockRealize, lambda r, _: realizes.append(r))])
            per_lane = False
            for realize in realizes:
                bound = [var.var for var, value in zip(realize.block.iter_vars, realize.iter_values)
                         if tir_walk.uses_var(value, loop.loop_var)]
                for read in realize.block.reads:
                    if str(read.source.shape[-1]) == "1":
                        per_lane |= any(tir_walk.uses_var(r.min, v) for r in read.region for v in bound)
            found.append(per_lane)
        visitor.default_visit(loop)

    tvm_ffi.structural_visit(func.body, [(tvm.tirx.For, visit_for)])
    return found


def test_a_row_value_is_broadcast_to_its_row_not_gathered(tmp_path, width=1000):
    """x - max(x): the elementwise loop reads one max per row. Vectorized over fused rows of
    1,000 (not a multiple of 16 lanes), each vector spanned two rows and gathered the max per
    lane: a 1,000-wide softmax ran 8x slower than onnxruntime."""
    m = model([node("ReduceMax", ["x", "axes"], "m", keepdims=1), node("Sub", ["x", "m"], "y")],
              {"x": ("N", width)}, {"y": ("N", width)}, {"axes": const_i64(-1)}, opset=18)
    func = relax_import.import_group(m, "k").prim_func
    registers = register_file.for_target(resolve_target("native").tvm_target())
    scheduled, _ = schedule.schedule_group(func, True, schedule.DEFAULT_MAX_DUPLICATION, False, registers)
    reads = _vector_loop_reads_per_lane(scheduled)
    assert reads and not any(reads), scheduled
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    check_against_ort(cg, m, random_feeds(m, 9))
