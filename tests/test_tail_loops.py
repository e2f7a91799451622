"""tail_loops.py: the last row tile's loops end at the batch; the kernel computes the same."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx_builder import model, node
from test_codegen import ort_run
from tvm.script import tirx as T

from onnxfuse.codegen import compile as compile_module
from onnxfuse.codegen import register_file, relax_import, schedule
from onnxfuse.codegen.host_kernel import serial_loops
from onnxfuse.codegen.tail_loops import PIPELINE, bound_below, clamp_tail_loops
from onnxfuse.target import resolve_target

TARGET = resolve_target("native")
REGISTERS = register_file.for_target(TARGET.tvm_target())


def _loops(func) -> list:
    found = []
    tvm_ffi.structural_map(func, [(tvm.tirx.For, lambda loop: found.append(loop) or loop)], order="post")
    return found


def _tested_loops(func) -> int:
    """Loops whose whole body is an if without else (what the pass rewrites when it can)."""
    return sum(isinstance(loop.body, tvm.tirx.IfThenElse) and loop.body.else_case is None for loop in _loops(func))


@T.prim_func(private=True)
def _rows_below(a: T.handle, n: T.int64, base: T.int64):
    A = T.match_buffer(a, (256,), "float32")
    for r in range(T.int64(256)):
        if base + r < n:
            A[r] = T.float32(1)


def test_a_loop_testing_its_variable_against_an_end_stops_there():
    func = _rows_below
    n, base = func.params[1], func.params[2]
    (loop,) = _loops(func)
    assert isinstance(loop.body, tvm.tirx.IfThenElse)
    (clamped,) = _loops(clamp_tail_loops(func))
    assert not isinstance(clamped.body, tvm.tirx.IfThenElse)
    assert tvm_ffi.structural_equal(clamped.body, loop.body.then_case)
    for n_value, base_value, rows in [(1, 0, 1), (300, 0, 256), (300, 256, 44), (5, 256, 0), (0, 0, 0)]:
        analyzer = tvm.sym.Analyzer()
        analyzer.bind(n, n_value)
        analyzer.bind(base, base_value)
        assert analyzer.simplify(clamped.extent).value == rows


@T.prim_func(private=True)
def _two_blocks_below(a: T.handle, b: T.handle, n: T.int64, base: T.int64):
    A = T.match_buffer(a, (256,), "float32")
    B = T.match_buffer(b, (256,), "float32")
    for r in range(T.int64(256)):
        row: T.let[T.int64] = base + r
        if row < n:
            A[r] = T.float32(1)
        if row < n:
            B[r] = T.float32(2)


@T.prim_func(private=True)
def _two_ends(a: T.handle, n: T.int64, m: T.int64):
    A = T.match_buffer(a, (256,), "float32")
    for r in range(T.int64(256)):
        if r < n:
            A[r] = T.float32(1)
        if r < m:
            A[r] = T.float32(2)


def test_blocks_sharing_a_row_loop_end_it_together():
    """A Concat's parts share their row loop, each with its row test, the row bound once above
    both (CSE): the loop still ends at the batch (at batch 1 it ran the tile's 128 rows)."""
    n, base = _two_blocks_below.params[2], _two_blocks_below.params[3]
    (clamped,) = _loops(clamp_tail_loops(_two_blocks_below))
    assert not any(isinstance(st, tvm.tirx.IfThenElse) for st in clamped.body.seq)
    for n_value, base_value, rows in [(1, 0, 1), (300, 256, 44), (5, 256, 0)]:
        analyzer = tvm.sym.Analyzer()
        analyzer.bind(n, n_value)
        analyzer.bind(base, base_value)
        assert analyzer.simplify(clamped.extent).value == rows
    (kept,) = _loops(clamp_tail_loops(_two_ends))  # two different ends: left as it is
    assert kept.extent.value == 256


@pytest.mark.parametrize("condition,expected", [
    (lambda r, d: r < d, "d"),
    (lambda r, d: d > r, "d"),
    (lambda r, d: r + 3 < d, "d - 3"),
    (lambda r, d: r * 2 < d, None),  # not one row per step
    (lambda r, d: d < r, None),  # true past d, not before it
    (lambda r, d: r <= d, None),  # not a form the pass reads
    (lambda r, d: tvm.tirx.likely(r < d), "d"),  # a batch bound clamped_tail.tile_sized_buffers hid
])
def test_bound_below_reads_only_var_less_than_an_invariant(condition, expected):
    r, d = tvm.tirx.Var("r", "int64"), tvm.tirx.Var("d", "int64")
    end = bound_below(condition(r, d), r)
    if expected is None:
        assert end is None
    else:
        analyzer = tvm.sym.Analyzer()
        want = {"d": d, "d - 3": d - 3}[expected]
        assert analyzer.can_prove_equal(end, want)


def _diamond(width: int = 32):
    """Relu read twice (an intermediate per tile), exact ops only: the kernel must equal onnxruntime."""
    nodes = [node("Relu", ["x"], "r"), node("Mul", ["r", "two"], "m"), node("Add", ["r", "x"], "a"),
             node("Sub", ["m", "a"], "y")]
    return model(nodes, {"x": ("N", width)}, {"y": ("N", width)}, {"two": np.array(2.0, np.float32)})


def _lowered(func):
    mod = tvm.IRModule({"k": serial_loops(func).with_attr("global_symbol", "k")})
    lower, _, _ = tvm.tirx.get_tir_pipeline(PIPELINE)
    with tvm.transform.PassContext(opt_level=3, config=compile_module.BUILD_CONFIG):
        mod = tvm.tirx.transform.BindTarget(TARGET.tvm_target().with_host(TARGET.tvm_target()))(mod)
        return lower(mod)["k"]


def test_the_last_tile_of_an_elementwise_kernel_has_no_row_tests():
    func, stats = schedule.schedule_group(relax_import.import_group(_diamond(), "k").prim_func, registers=REGISTERS)
    assert stats.symbolic_rows and stats.tile_rows > 1
    lowered = _lowered(func)
    assert _tested_loops(lowered) == 0
    lower_without, _, _ = tvm.tirx.get_tir_pipeline("s_tir")
    with tvm.transform.PassContext(opt_level=3, config=compile_module.BUILD_CONFIG):
        mod = tvm.IRModule({"k": serial_loops(func).with_attr("global_symbol", "k")})
        mod = tvm.tirx.transform.BindTarget(TARGET.tvm_target().with_host(TARGET.tvm_target()))(mod)
        assert _tested_loops(lower_without(mod)["k"]) > 0, "TVM's own pipeline leaves the tests (the pass's reason)"


@pytest.mark.parametrize("batch", [0, 1, 2, 255, 256, 257, 700])
def test_kernel_equals_onnxruntime_on_both_sides_of_a_tile(tmp_path, batch):
    m = _diamond()
    cg = compile_module.compile_group(m, "k", TARGET, tmp_path)
    assert cg.stats["tile_rows"] == 256, "the batches straddle this tile size"
    x = np.random.default_rng(batch).standard_normal((batch, 32)).astype(np.float32)
    (expected,), (got,) = ort_run(m, {"x": x}), cg.run({"x": x})
    np.testing.assert_array_equal(got, expected)
