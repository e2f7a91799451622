"""Whether a kernel's rows may be computed in slices: two calls, one on the first m rows of every
batch-leading tensor and one on the rest, give the bits one call gives.

Why: a GEMM group's main kernel computes whole row tiles (6 rows on AVX-512), its last tile
clamped past the batch (clamped_tail), so at batch 64 it computes 66 rows and at 62 it computes
66 too. The runtime can instead call the main kernel on the whole tiles and the small-batch
variant (one row at a time) on the few rows left (onnxfuse_runtime.c, rows_left_to_small_variant),
which is sound only when each output row depends on the same row of the inputs and on nothing
else of the batch.

A kernel qualifies when it has one symbolic dim N, every buffer with N in its shape (parameters
and intermediates) has it as its leading dim and nowhere else, and every block that touches such
a buffer reads and writes them at one spatial iteration variable over N, itself, in the leading
dim: row i of what it writes comes from row i of what it reads. N itself may not be a value the
kernel computes with (outside the indices). A reduction over the batch, a Transpose that moves
N inward, a reversed or shifted read of the rows, a Reshape that folds N into another axis: each
fails one of these, and the kernel is called whole as before.
"""

from __future__ import annotations

import tvm
from tvm import s_tir

from . import tir_walk

SPATIAL = 0  # IterVar.iter_type of a data-parallel axis


def _row_buffer(buffer, n) -> bool | None:
    """True if `buffer` is [N, ...] with N nowhere else, False if it does not depend on N, None if
    it depends on N otherwise."""
    uses = [tir_walk.uses_var(extent, n) for extent in buffer.shape]
    if not any(uses):
        return False
    return None if any(uses[1:]) or not buffer.shape[0].same_as(n) else True


def _row_var(region):
    """The block variable indexing a row buffer's leading dim in `region` (one row, the other dims
    free of it), else None."""
    first = region.region[0]
    if not isinstance(first.min, tvm.tirx.Var) or tir_walk.static_int(first.extent) != 1:
        return None
    if any(tir_walk.uses_var(r.min, first.min) or tir_walk.uses_var(r.extent, first.min) for r in region.region[1:]):
        return None
    return first.min


def _computes_with(block, n) -> bool:
    """Whether the block's values use N itself (outside buffer indices)."""
    return any(isinstance(node, tvm.tirx.Var) and node.same_as(n)
               for value in tir_walk.store_value_exprs(block) for node in tir_walk.iter_nodes_outside_indices(value))


def _block_is_row_wise(block, n) -> bool:
    if _computes_with(block, n):
        return False
    rows = []
    for region in [*block.reads, *block.writes]:
        kind = _row_buffer(region.source, n)
        if kind is None:
            return False
        if kind:
            rows.append(_row_var(region))
    if not rows:
        return True
    row = rows[0]
    if row is None or any(r is None or not r.same_as(row) for r in rows):
        return False
    if not any(_row_buffer(w.source, n) for w in block.writes):
        return False  # reads rows, writes none: it reduces over the batch
    iter_var = next((iv for iv in block.iter_vars if iv.var.same_as(row)), None)
    return iter_var is not None and int(iter_var.iter_type) == SPATIAL and iter_var.dom.extent.same_as(n)


def separable_rows(func: tvm.tirx.PrimFunc) -> bool:
    """Whether `func` (a group's unscheduled kernel) computes each row of its batch from that row
    alone (module doc)."""
    symbols = tir_walk.shape_vars(func)
    if len(symbols) != 1:
        return False
    (n,) = symbols
    if any(_row_buffer(buffer, n) is None for buffer in func.params if tir_walk.is_buffer_var(buffer)):
        return False
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    root = sch.get_sblock("root")
    if any(_row_buffer(buffer, n) is None for buffer in sch.get(root).alloc_buffers):
        return False
    blocks = [sch.get(b) for b in tir_walk.leaf_blocks(sch)]
    return bool(blocks) and all(_block_is_row_wise(b, n) for b in blocks)
