"""The ragged last row tile computes whole: its rows past the batch read the last real row.

A kernel over a symbolic batch N runs its rows in tiles (schedule.tile_rows), and compute_at
gives every block under the tile the predicate `row < N`. In the last, ragged tile those
predicates sit inside the GEMM's reduction loop, one per unrolled row of the register tile, and
LLVM then keeps the accumulators in memory: at batch 60 (7 tiles of 8 and a tail of 4) a
[60, 64] @ [64, 256] MatMul + bias took 16.8 us against onnxruntime's 14.9 us, where batch 64
(no tail) took 15.5 us against 15.8 us.

This pass drops the batch predicate from every block that writes only the kernel's own
intermediates (the tile-local buffers, the GEMM's accumulators) and clamps that block's reads
of the kernel's inputs to the last real row: `X[min(row, N - 1), k]`. Rows past the batch then
compute row N - 1's values again into tile rows nobody reads, so the tail tile runs the same
unpredicated code as a full one. Blocks that write an output keep their predicate: those
rows are never stored. A batch of 0 runs no tile, so N - 1 is never read.

Kernels whose tail keeps its predicates (a row tile that is not a GEMM's, as over [N, 8, 64]
rows) still get tile-sized buffers: tile_sized_buffers hides the batch bound from TVM's buffer
sizing (`likely(row < N)`), which otherwise kept every intermediate batch-sized.

Only kernels with one symbolic dimension (the batch) are rewritten by unpredicated_tail. On BERT's groups over
[batch, seq, ...] a first version, which dropped every bound by a symbolic dimension (a vector
loop's `k < seq` inside the tile too), made the compiler process abort on heap corruption and
TVM reject the TIR (a weight used without declaration). Only the row tile's own bound is dropped
now, but such kernels were not tried again: they keep their predicates.

A GEMM no row tile can take (its rows in another order than the output's) stays a loop nest of
its own at the root; register_tiles_past_rows gives its symbolic rows the same treatment, block
by register-tile block (schedule._rows_at_root).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.tirx.buffer import is_buffer_var

from . import tir_walk


def _conjuncts(predicate) -> list:
    if isinstance(predicate, tirx.And):
        return _conjuncts(predicate.a) + _conjuncts(predicate.b)
    return [predicate]


def _param_buffers(func) -> list:
    return [param for param in func.params if is_buffer_var(param)]


def _is_batch_bound(condition, row_tile, shape_vars: set) -> bool:
    """`row < N`: the row tile's rows bounded by a symbolic dimension (not, say, a vector loop's
    `k < seq` inside the tile, whose reads past seq would be real reads of other rows)."""
    return _bounds_rows(condition, shape_vars) and tir_walk.uses_var(condition.a, row_tile)


def _bounds_rows(condition, shape_vars: set) -> bool:
    """`row < N`: loop variables bounded by an expression of the symbolic dims alone."""
    return isinstance(condition, tirx.LT) and bool(tir_walk.vars_in(condition.b) & shape_vars) \
        and not (tir_walk.vars_in(condition.a) & shape_vars)


def _clamped_realize(realize, clamp: set, kept: list):
    """`realize` under the predicate `kept` alone, its block's reads of `clamp` kept inside their
    symbolic dims. The read regions stay as they were: they cover the clamped reads, which touch less."""
    block = realize.block
    body = _clamped_loads(block.body, clamp)
    init = _clamped_loads(block.init, clamp) if block.init is not None else None
    new_block = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, init,
                             block.alloc_buffers, block.match_buffers, block.annotations)
    return s_tir.SBlockRealize(realize.iter_values, tirx.all(*kept) if kept else tirx.const(True, "bool"), new_block)


def _clamped_loads(body, clamp: set):
    """`body` with each read of a buffer in `clamp` kept inside its symbolic dimensions."""
    def clamped(load):
        if load.source not in clamp:
            return load
        indices = []
        for index, extent in zip(load.indices, load.source.shape):
            if isinstance(extent, tirx.IntImm):
                indices.append(index)
            else:
                indices.append(tirx.Min(index, extent - tirx.const(1, extent.ty.dtype)))
        return tirx.BufferLoad(load.source, indices)
    return tvm_ffi.structural_map(body, [(tvm.ir.TensorLoad, clamped)], order="post")


def _read_buffers(block) -> set:
    return {region.source for region in block.reads}


def _realizes(func) -> list:
    found = []
    tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, lambda r: found.append(r) or r)], order="post")
    return found


def _widened(func, buffers: set, tile_rows: int):
    """`func` with each buffer of `buffers` allocated for at least `tile_rows` along every symbolic
    dimension: TVM sizes a tile-local buffer by the tile's region clipped to the buffer, so a
    batch below the tile would otherwise get a buffer shorter than the rows the tile writes."""
    replacements = {}
    for buffer in buffers:
        shape = [extent if isinstance(extent, tirx.IntImm)
                 else tirx.Max(extent, tirx.const(tile_rows, extent.ty.dtype)) for extent in buffer.shape]
        replacements[buffer] = tirx.decl_buffer(shape, str(buffer.ty.dtype), buffer.name, scope=buffer.scope(),
                                                layout=None)
    if not replacements:
        return func
    # Only these buffers: TVM's BufferReplacer rebuilt every buffer with a symbolic shape, the
    # parameters too, and the checks whole_index_checks builds on the unscheduled function's
    # parameters then named buffers the kernel no longer declared (BERT's pooler: a Gather by a
    # run-time index, then Gemm, fell back).
    return tvm_ffi.structural_map(func, [(tirx.Var, lambda var: replacements.get(var, var))], order="post")


def _reduces_over(realize, var) -> bool:
    """Whether the block sums (or otherwise reduces) along `var`: the row tile is then its
    reduction loop (a ReduceSum over the batch), not a loop over its rows."""
    return any(int(iv.iter_type) == tir_walk.COMM_REDUCE and tir_walk.uses_var(value, var)
               for iv, value in zip(realize.block.iter_vars, realize.iter_values))


def tile_sized_buffers(func: tirx.PrimFunc, row_tile, tile_rows: int) -> tuple[tirx.PrimFunc, int]:
    """(`func` with each block's batch predicate wrapped in `likely`, and the intermediates those
    blocks write declared at least `tile_rows` long; how many blocks). Runs after
    unpredicated_tail: on its kernels only the output blocks' predicates are left (outputs are
    parameters, never widened); every other row-tiled kernel keeps all of its predicates (a tile
    that is not a GEMM's, or more than one symbolic dim).

    Why: TVM sizes a tile-local buffer by the region the tile's blocks access, narrowed by their
    predicates; with `row < N` in them it could not bound that region and kept the whole
    batch-sized buffer ([N, 8, 256] floats), so every tile wrote fresh memory and a batch of
    1,000 streamed megabytes through the caches (transformer_mlp: 5.8 ms a call where the tiles'
    own buffers gave 4.7 ms). TVM reads no bound out of `likely(row < N)`, which still guards
    the rows, so the region is the tile's, clipped to the buffer, and the buffer at least a tile
    long keeps that clip at the tile."""
    shape_vars = tir_walk.shape_vars(func)
    if not shape_vars:
        return func, 0
    params = set(_param_buffers(func))
    written, blocks = set(), []

    def hidden(realize):
        if _reduces_over(realize, row_tile):
            return realize  # its init must stay where the tile's first row is (empty_reductions)
        conditions = _conjuncts(realize.predicate)
        bounds = [_is_batch_bound(c, row_tile, shape_vars) for c in conditions]
        if not any(bounds):
            return realize
        written.update(region.source for region in realize.block.writes if region.source not in params)
        blocks.append(realize.block.name_hint)
        predicate = tirx.all(*(tirx.likely(c) if bound else c for c, bound in zip(conditions, bounds)))
        return s_tir.SBlockRealize(realize.iter_values, predicate, realize.block)

    func = func.with_body(tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, hidden)], order="post"))
    symbolic = {b for b in written if any(not isinstance(e, tirx.IntImm) for e in b.shape)}
    return _widened(func, symbolic, tile_rows), len(blocks)


def unpredicated_tail(func: tirx.PrimFunc, row_tile, tile_rows: int) -> tuple[tirx.PrimFunc, int]:
    """(`func` with the batch predicate dropped from every block that writes no parameter, and
    those blocks' reads of parameters (or of buffers written outside the tile) clamped to the
    last real row; how many blocks). `row_tile`: the variable of the row-tile loop, whose rows the
    dropped predicates bound. `tile_rows`: the row tile, which every buffer those blocks
    write must hold whatever the batch. A block that reads an output keeps its predicate: an
    output's rows past the batch are never written, and an index read from them could be
    anything."""
    params = set(_param_buffers(func))
    shape_vars = tir_walk.shape_vars(func)
    if len(shape_vars) != 1:  # see the module doc: kernels over batch and seq keep their predicates
        return func, 0
    realizes = _realizes(func)
    outputs = {region.source for realize in realizes for region in realize.block.writes} & params
    freed = {}
    for realize in realizes:
        block = realize.block
        if any(region.source in params for region in block.writes) or _read_buffers(block) & outputs:
            continue
        conditions = _conjuncts(realize.predicate)
        kept = [c for c in conditions if not _is_batch_bound(c, row_tile, shape_vars)]
        if len(kept) < len(conditions):
            freed[block.name_hint] = kept
    if not freed:
        return func, 0
    written_in_tile = set()
    for realize in realizes:
        if realize.block.name_hint in freed:
            written_in_tile |= {region.source for region in realize.block.writes}

    def rewrite(realize):
        block = realize.block
        if block.name_hint not in freed:
            return realize
        return _clamped_realize(realize, {b for b in _read_buffers(block) if b not in written_in_tile},
                                freed[block.name_hint])

    func = func.with_body(tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, rewrite)], order="post"))
    symbolic = {b for b in written_in_tile if any(not isinstance(e, tirx.IntImm) for e in b.shape)}
    return _widened(func, symbolic, tile_rows), len(freed)


ROWS_PAST_BOUND = "onnxfuse_rows_past_bound"  # a GEMM block annotation (schedule._rows_at_root)


def register_tiles_past_rows(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with the row bound dropped from the register-tile blocks of every GEMM annotated
    ROWS_PAST_BOUND (its update and its init, which write only the tile's local accumulators), and
    their reads clamped to the last real row. Such a GEMM runs at the root over symbolic rows split
    into register-tile blocks: the last block's rows past the bound compute the last row again into
    accumulators nobody stores (the write-back keeps its bound), so its reduction loop runs
    unpredicated, as a full block's. Its inputs are parameters or buffers finished before it (it
    is at the root), so every clamped read is of a real, computed row."""
    shape_vars = tir_walk.shape_vars(func)
    params = set(_param_buffers(func))
    annotated = {r.block.name_hint for r in _realizes(func) if ROWS_PAST_BOUND in r.block.annotations}
    if not annotated or not shape_vars:
        return func
    names = annotated | {f"{name}_init" for name in annotated}

    def rewrite(realize):
        block = realize.block
        if block.name_hint not in names or any(region.source in params or region.source.scope() != "local"
                                               for region in block.writes):
            return realize
        conditions = _conjuncts(realize.predicate)
        kept = [c for c in conditions if not _bounds_rows(c, shape_vars)]
        if len(kept) == len(conditions):
            return realize
        return _clamped_realize(realize, {b for b in _read_buffers(block) if b.scope() != "local"}, kept)

    return func.with_body(tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, rewrite)], order="post"))
