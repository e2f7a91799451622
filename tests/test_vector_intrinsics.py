"""vector_intrinsics.py: loops that test for NaN or round stay vector loops, and still match onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx_builder import model, node
from test_codegen import ort_run
from test_tail_loops import _lowered

from onnxfuse.codegen import compile as compile_module
from onnxfuse.codegen import register_file, relax_import
from onnxfuse.codegen.vector_intrinsics import VECTOR_SAFE_OPS
from onnxfuse.target import resolve_target

TARGET = resolve_target("native")
REGISTERS = register_file.for_target(TARGET.tvm_target())
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-40, 3e38, -3e38, 0.5, -2.5, 1.0,
                    -1.0, 7.0, 1e-5], np.float32)
# Each op reaches isnan another way: IsNaN itself; Max propagates NaN; a negated comparison is
# true on NaN. Round is nearbyint.
CASES = {
    "isnan": ([node("IsNaN", ["x"], "b"), node("Where", ["b", "zero", "x"], "y")], {"zero": np.array(0.0, np.float32)}),
    "max": ([node("Neg", ["x"], "n"), node("Max", ["x", "n"], "y")], {}),
    "not_less": ([node("Less", ["x", "half"], "l"), node("Not", ["l"], "n"), node("Where", ["n", "x", "half"], "y")],
                 {"half": np.array(0.5, np.float32)}),
    "round": ([node("Round", ["x"], "y")], {}),
}


def _model(case):
    nodes, inits = CASES[case]
    return model(nodes, {"x": ("N", 64)}, {"y": ("N", 64)}, inits)


def _lanes_of_marked_calls(func) -> list[int]:
    ops = [tvm.ir.Op.get(name) for name in VECTOR_SAFE_OPS]
    lanes = []

    def visit(call):
        if any(call.op.same_as(op) for op in ops):
            lanes.append(tvm.runtime.DataType(str(call.ty.dtype)).lanes)
        return call

    tvm_ffi.structural_map(func, [(tvm.ir.expr.Call, visit)], order="post")
    return lanes


@pytest.mark.parametrize("case", list(CASES))
def test_nan_tests_and_rounding_are_computed_on_whole_vectors(case):
    func, stats = compile_module._schedule_or_plain(relax_import.import_group(_model(case), "k").prim_func, REGISTERS)
    assert stats.vectorized > 0
    lanes = _lanes_of_marked_calls(_lowered(func))
    assert lanes, "the kernel calls isnan or nearbyint"
    assert min(lanes) > 1, f"a call left scalar (lanes {sorted(set(lanes))}): its loop was scalarized"


@pytest.mark.parametrize("case", list(CASES))
def test_vector_kernels_match_onnxruntime(tmp_path, case):
    m = _model(case)
    cg = compile_module.compile_group(m, "k", TARGET, tmp_path)
    x = np.stack([SPECIAL, SPECIAL[::-1], np.roll(SPECIAL, 3), np.roll(SPECIAL, 7)]).repeat(4, axis=1)
    (expected,), (got,) = ort_run(m, {"x": x}), cg.run({"x": x})
    if case == "erf":  # the fast erf is within a few ulp (docs/numerics.md); NaN and infinities exact
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=0)
    else:
        np.testing.assert_array_equal(got, expected)
