"""Loops of the ragged last row tile end at the batch instead of testing each row against it.

A kernel over a symbolic batch N runs its rows in tiles of a fixed size (schedule.tile_rows);
every block under the tile carries the predicate `row < N`. LoopPartition peels the full tiles
off, but inside the last, ragged tile TVM leaves the loops at the whole tile's extent with the
test in their body: at batch 1 a 256-row tile of 32 floats ran 256 rows of tests per block
(the diamond model spent more time there than computing its one row).

After lowering, such a loop reads `for r in range(K): if r < d: body` (d invariant in r, the
test hoisted out of the inner loops by HoistIfThenElse). The rows r >= d do nothing, and the
test is monotone in r, so `for r in range(min(K, max(d, 0))): body` is the same program. This
pass makes that rewrite; compile.build_module runs it after TVM's default TIR pipeline (the
pipeline named PIPELINE, registered here, which also runs ieee_order.FoldZeroReinterprets).
"""

from __future__ import annotations

import tvm
import tvm.sym
import tvm_ffi
from tvm import tirx
from tvm.tirx import compilation_pipeline

from .ieee_order import FoldZeroReinterprets

PIPELINE = "onnxfuse"


def bound_below(condition, var):
    """d such that `condition` is `var < d` with d invariant in var, else None."""
    if isinstance(condition, tirx.LT):
        margin = condition.b - condition.a  # a < b  <=>  b - a > 0
    elif isinstance(condition, tirx.GT):
        margin = condition.a - condition.b
    else:
        return None
    coefficients = tvm.sym.detect_linear_equation(margin, [var])
    if len(coefficients) != 2 or not isinstance(coefficients[0], tirx.IntImm) or coefficients[0].value != -1:
        return None
    return coefficients[1]  # margin = d - var > 0  <=>  var < d


def _clamped(loop):
    body = loop.body
    if loop.kind != tirx.ForKind.SERIAL or not isinstance(body, tirx.IfThenElse) or body.else_case is not None:
        return loop
    if not isinstance(loop.min, tirx.IntImm) or loop.min.value != 0 or not isinstance(loop.extent, tirx.IntImm):
        return loop
    end = bound_below(body.condition, loop.loop_var)
    if end is None:
        return loop
    dtype = str(loop.extent.ty.dtype)
    if str(end.ty.dtype) != dtype:
        end = tirx.Cast(dtype, end)
    extent = tirx.Min(loop.extent, tirx.Max(end, tirx.const(0, dtype)))
    return tirx.For(loop.loop_var, loop.min, extent, loop.kind, body.then_case, loop.thread_binding,
                    loop.annotations, loop.step, loop.span)


def clamp_tail_loops(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with every static serial loop whose whole body is `if var < d` ending at d."""
    return tvm_ffi.structural_map(func, [(tirx.For, _clamped)], order="post")


@tirx.transform.prim_func_pass(opt_level=0, name="onnxfuse.ClampTailLoops")
def ClampTailLoops(func, _mod, _ctx):  # noqa: N802 - named as TVM names passes
    return clamp_tail_loops(func)


def _pipeline_factory():
    lower, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("s_tir")
    # FoldZeroReinterprets: after the last simplifier, which may fold a fenced integer to 0 (ieee_order)
    return tvm.transform.Sequential([lower, FoldZeroReinterprets, ClampTailLoops]), finalize_host, finalize_device


compilation_pipeline.register_tir_pipeline(PIPELINE, _pipeline_factory)
