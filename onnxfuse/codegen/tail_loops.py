"""Loops of the ragged last row tile end at the batch instead of testing each row against it.

A kernel over a symbolic batch N runs its rows in tiles of a fixed size (schedule.tile_rows);
every block under the tile carries the predicate `row < N`. LoopPartition peels the full tiles
off, but inside the last, ragged tile TVM leaves the loops at the whole tile's extent with the
test in their body: at batch 1 a 256-row tile of 32 floats ran 256 rows of tests per block
(the diamond model spent more time there than computing its one row).

After lowering, such a loop reads `for r in range(K): if r < d: body` (d invariant in r, the
test hoisted out of the inner loops by HoistIfThenElse), or, for several blocks under one row
loop (a Concat's parts), lets and then one such `if` per block, all with the same d. The rows
r >= d do nothing, and the test is monotone in r, so `for r in range(min(K, max(d, 0))): body`
is the same program. This pass makes that rewrite; compile.build_module runs it after TVM's
default TIR pipeline (the pipeline named PIPELINE, registered here, which also runs
ieee_order.FoldZeroReinterprets and stack_buffers.StackBuffers).
"""

from __future__ import annotations

import tvm
import tvm.sym
import tvm_ffi
from tvm import tirx
from tvm.tirx import compilation_pipeline

from .ieee_order import FoldZeroReinterprets
from .stack_buffers import StackBuffers

PIPELINE = "onnxfuse"
_LIKELY = tvm.ir.Op.get("prim.likely")  # how clamped_tail.tile_sized_buffers writes a batch bound


def bound_below(condition, var):
    """d such that `condition` is `var < d` (or `likely(var < d)`, clamped_tail.tile_sized_buffers)
    with d invariant in var, else None."""
    if isinstance(condition, tvm.ir.expr.Call) and condition.op.same_as(_LIKELY):
        condition = condition.args[0]
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


def _substituted(expr, values: dict):
    return tvm_ffi.structural_map(expr, [(tirx.Var, lambda v: values.get(v, v))], order="post")


def _tested_body(body, var):
    """(d, the body without its test) if `body` runs only where `var < d`: one `if` without else,
    or lets followed by such ifs that all test the same end (the parts of a Concat share their row
    loop, each keeps its own row test, and CSE binds the row once above both)."""
    if isinstance(body, tirx.IfThenElse):
        if body.else_case is not None:
            return None
        end = bound_below(body.condition, var)
        return None if end is None else (end, body.then_case)
    if not isinstance(body, tirx.SeqStmt):
        return None
    stmts = list(body.seq)
    binds = []
    while stmts and isinstance(stmts[0], tirx.Bind):
        binds.append(stmts.pop(0))
    if not stmts or not all(isinstance(st, tirx.IfThenElse) and st.else_case is None for st in stmts):
        return None
    values = {}
    for bind in binds:  # each value may read the lets before it
        values[bind.var] = _substituted(bind.value, values)
    ends = [bound_below(_substituted(st.condition, values), var) for st in stmts]
    if any(end is None for end in ends) or not all(tvm_ffi.structural_equal(end, ends[0]) for end in ends[1:]):
        return None
    return ends[0], tirx.SeqStmt([*binds, *(st.then_case for st in stmts)])


def _clamped(loop):
    if loop.kind != tirx.ForKind.SERIAL:
        return loop
    if not isinstance(loop.min, tirx.IntImm) or loop.min.value != 0 or not isinstance(loop.extent, tirx.IntImm):
        return loop
    tested = _tested_body(loop.body, loop.loop_var)
    if tested is None:
        return loop
    end, body = tested
    dtype = str(loop.extent.ty.dtype)
    if str(end.ty.dtype) != dtype:
        end = tirx.Cast(dtype, end)
    extent = tirx.Min(loop.extent, tirx.Max(end, tirx.const(0, dtype)))
    return tirx.For(loop.loop_var, loop.min, extent, loop.kind, body, loop.thread_binding,
                    loop.annotations, loop.step, loop.span)


def clamp_tail_loops(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with every static serial loop whose whole body is `if var < d` (or lets, then such
    ifs with one d) ending at d."""
    return tvm_ffi.structural_map(func, [(tirx.For, _clamped)], order="post")


@tirx.transform.prim_func_pass(opt_level=0, name="onnxfuse.ClampTailLoops")
def ClampTailLoops(func, _mod, _ctx):  # noqa: N802 - named as TVM names passes
    return clamp_tail_loops(func)


def _pipeline_factory():
    lower, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("s_tir")
    # FoldZeroReinterprets: after the last simplifier, which may fold a fenced integer to 0 (ieee_order)
    passes = [lower, FoldZeroReinterprets, ClampTailLoops, StackBuffers]
    return tvm.transform.Sequential(passes), finalize_host, finalize_device


compilation_pipeline.register_tir_pipeline(PIPELINE, _pipeline_factory)
