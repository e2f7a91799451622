"""A Concat's output block split into one block per source, before scheduling.

TVM lowers Concat to one block that picks each element's source by position:
`y[i, j] = if_then_else(32 <= j, b[i, j - 32], a[i, j])`. Its vectorizer scalarizes a vector
loop whose if_then_else condition differs between lanes. LoopPartition can cut the column loop
where the sources meet, but in the ragged last row tile over a symbolic batch it did not, and
that tile was left to LLVM's loop vectorizer, which gave up once the sources computed a few more
ops (a Sigmoid with its exact zero tail: concat_exit 3.7x slower than onnxruntime at batch
1,000). Written as one block per source (`y[i, j] = a[i, j]` for j < 32, `y[i, 32 + j'] =
b[i, j']` for j' < 32), each block is plain elementwise and vectorizes in every tile.

Only blocks whose output no other block reads are split: a buffer written by two blocks cannot
be inlined into its consumer, nor computed at its row tile. Nor along the first axis (rows
stacked): the schedule fuses a static batch's rows with the columns into whole vectors, which
parts of 3 and 5 rows of 20 would not fill (the single block's 160 elements do). Nor where a
part's row is no whole number of vectors: 24 and 40 columns stay scalar loops, and concat_exit
reshaped that way (Relu of 24 columns, Sigmoid of 40) ran 0.93-1.00x as fast split as whole at
batch 1,000 (noisy runs; 1.00-1.04x at 64).
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
import tvm.sym
import tvm_ffi
from tvm import s_tir, tirx
from tvm.tirx.buffer import is_buffer_var

IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def position_cut(condition, var, extent: int):
    """(c, then_below) if `condition` is `var < c` (then_below) or `var >= c` with 0 < c < extent."""
    condition = tvm.sym.Analyzer().simplify(condition)
    forms = ((tirx.LT, False, True), (tirx.GE, False, False), (tirx.LE, True, False), (tirx.GT, True, True))
    for kind, constant_first, then_below in forms:
        if not isinstance(condition, kind):
            continue
        left, right = condition.a, condition.b
        bound, index = (left, right) if constant_first else (right, left)
        if isinstance(bound, tirx.IntImm) and isinstance(index, tirx.Var) and index.same_as(var):
            if 0 < bound.value < extent:
                return bound.value, then_below
    return None


def _perfect_nest(stmt):
    """(loops outermost first, the realize) if `stmt` is loops around one block realize."""
    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    return (loops, stmt) if isinstance(stmt, s_tir.SBlockRealize) and loops else None


def _cut(loops, realize):
    """(axis, c, below value, above value) for a block picking its value by one static axis."""
    block = realize.block
    store = block.body
    if block.init is not None or not isinstance(store, tirx.BufferStore) or len(block.writes) != 1:
        return None
    value = store.value
    if not (isinstance(value, tvm.ir.Call) and value.op.same_as(IF_THEN_ELSE)):
        return None
    loop_of = {lp.loop_var: lp for lp in loops}
    for axis, (iv, bound) in enumerate(zip(block.iter_vars, realize.iter_values)):
        if axis == 0:
            continue  # rows: the schedule tiles and fuses them; parts of a few rows fill no whole vectors
        loop = loop_of.get(bound) if isinstance(bound, tirx.Var) else None
        extent = iv.dom.extent
        if loop is None or not isinstance(extent, tirx.IntImm) or not isinstance(loop.extent, tirx.IntImm):
            continue
        if not (isinstance(loop.min, tirx.IntImm) and loop.min.value == 0 and loop.extent.value == extent.value):
            continue
        found = position_cut(value.args[0], iv.var, extent.value)
        if found is None:
            continue
        c, then_below = found
        below, above = (value.args[1], value.args[2]) if then_below else (value.args[2], value.args[1])
        return axis, c, below, above
    return None


def _substituted(node, mapping):
    return tvm_ffi.structural_map(node, [(tirx.Var, lambda v: mapping.get(v, v))], order="post")


def _part(loops, realize, axis: int, start: int, extent: int, value, name: str, buffers):
    """The nest of `realize` over [start, start + extent) of the block's `axis`, storing `value`,
    under `loops` (the cut axis's loop and those inside it) with fresh variables: the parts
    share the loops outside, not these definitions."""
    block = realize.block
    cut_var = block.iter_vars[axis].var
    cut_loop_var = realize.iter_values[axis]
    loop_vars = {lp.loop_var: tirx.Var(lp.loop_var.name, lp.loop_var.ty.dtype) for lp in loops}
    block_vars = {iv.var: tirx.Var(iv.var.name, iv.var.ty.dtype) for iv in block.iter_vars}
    inside = dict(block_vars)
    inside[cut_var] = block_vars[cut_var] + tirx.const(start, cut_var.ty.dtype) if start else block_vars[cut_var]
    iter_vars = []
    for k, iv in enumerate(block.iter_vars):
        dom = tvm.ir.Range.from_min_extent(tirx.const(0, iv.var.ty.dtype), tirx.const(extent, iv.var.ty.dtype)) \
            if k == axis else iv.dom
        iter_vars.append(tirx.IterVar(dom, block_vars[iv.var], iv.iter_type, iv.thread_tag))
    store = block.body
    body = tirx.BufferStore(store.buffer, _substituted(value, inside), [_substituted(i, inside) for i in store.indices])
    new_block = s_tir.SBlock(iter_vars, [], [], name, body, None, block.alloc_buffers, block.match_buffers,
                             block.annotations)
    reads, writes = s_tir.analysis.get_sblock_read_write_region(new_block, buffers)
    new_block = s_tir.SBlock(iter_vars, reads, writes, name, body, None, block.alloc_buffers, block.match_buffers,
                             block.annotations)
    values = [_substituted(v, loop_vars) for v in realize.iter_values]
    stmt = s_tir.SBlockRealize(values, _substituted(realize.predicate, loop_vars), new_block)
    for lp in reversed(loops):
        lp_extent = tirx.const(extent, lp.extent.ty.dtype) if lp.loop_var.same_as(cut_loop_var) else lp.extent
        stmt = tirx.For(loop_vars[lp.loop_var], lp.min, lp_extent, lp.kind, stmt, lp.thread_binding,
                        lp.annotations, lp.step, lp.span)
    return stmt


def _split_nest(stmt, buffers, split_ok, lanes) -> list | None:
    """`stmt`, if it is a by-position block's nest, as the statements that replace it: the loops
    outside the cut axis around one nest per source (split again for a third source), so each
    row still computes all its sources in turn. None if it is no such nest."""
    nest = _perfect_nest(stmt)
    if nest is None or not split_ok(nest[1].block):
        return None
    loops, realize = nest
    cut = _cut(loops, realize)
    if cut is None:
        return None
    axis, c, below, above = cut
    first_inner = next(k for k, lp in enumerate(loops) if lp.loop_var.same_as(realize.iter_values[axis]))
    outer, inner = loops[:first_inner], loops[first_inner:]
    extent = realize.block.iter_vars[axis].dom.extent.value
    inner_size = 1
    for lp in inner[1:]:
        if not isinstance(lp.extent, tirx.IntImm):
            return None
        inner_size *= lp.extent.value
    width = lanes(str(realize.block.writes[0].source.dtype))
    if (c * inner_size) % width or ((extent - c) * inner_size) % width:
        return None  # a part of no whole vectors would stay scalar (the single block's hint may still cut it)
    name = realize.block.name_hint
    parts = [_part(inner, realize, axis, 0, c, below, f"{name}_below{c}", buffers),
             _part(inner, realize, axis, c, extent - c, above, f"{name}_from{c}", buffers)]
    pieces = []
    for part in parts:
        pieces.extend(_split_nest(part, buffers, split_ok, lanes) or [part])
    if not outer:
        return pieces
    body = tirx.SeqStmt(pieces)
    for lp in reversed(outer):
        body = tirx.For(lp.loop_var, lp.min, lp.extent, lp.kind, body, lp.thread_binding, lp.annotations, lp.step,
                        lp.span)
    return [body]


def split_by_source(func: tirx.PrimFunc, lanes: Callable[[str], int]) -> tirx.PrimFunc:
    """`func` with every block that picks its value by a static position (a Concat) and whose
    output no other block reads written as one block per source, where each part fills whole
    vectors (`lanes(dtype)` elements; the parts of a [N, 24] + [N, 40] Concat would stay scalar);
    `func` itself if none."""
    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize):
        return func
    root = realize.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    read = set()

    def collect(block, visitor):
        for region in block.reads:
            read.add(region.source)
        visitor.default_visit(block)

    tvm_ffi.structural_visit(root.body, [(s_tir.SBlock, collect)])
    buffers = {b: b for b in [*func.params, *root.alloc_buffers] if is_buffer_var(b)}
    split_ok = lambda block: all(w.source not in read for w in block.writes)  # noqa: E731
    new_stmts, changed = [], False
    for stmt in stmts:
        pieces = _split_nest(stmt, buffers, split_ok, lanes)
        changed |= pieces is not None
        new_stmts.extend(pieces or [stmt])
    if not changed:
        return func
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt(new_stmts),
                            root.init, root.alloc_buffers, root.match_buffers, root.annotations)
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_root))
