"""The CPU schedule for one fused group PrimFunc.

Why this shape (see /work/shared/notes/tvm-0.27.md, "Scheduling without the expression blowup"):
- StmtSimplify first, so reshape indices (`% (N*T)`) do not stop compute_at from bounding regions.
- Inline only producers that are read exactly once, and pure index copies (reshape/split/slice):
  inlining a value read k times re-expands it k times per level, which blows up deep tree chains.
- Everything else is computed under a row-tile loop of the first output (compute_at), so
  intermediates become small tile-local buffers and each value is computed once per tile.
- The tile loop runs in parallel only for symbolic or large batches (a launch costs microseconds).
- Reductions (MatMul/Gemm/Conv/Reduce*): the last spatial loop is split by the vector width and
  moved inside the reduction loops, so the update is a vector FMA over output columns; for
  matmul-like blocks a few output rows are unrolled around it (a small register tile).
- Elementwise blocks: trailing static loops fused, split by the vector width, vectorized.
Every step is attempted on its own and skipped if TVM refuses it: an unusual group gets a
simpler (still valid) schedule rather than a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import s_tir

from . import tir_walk

VECTOR_BYTES = 64  # one AVX-512 register; LLVM splits it for AVX2 / NEON
TILE_ELEMENTS = 8192  # elements of the widest intermediate row block kept per tile
MAX_TILE_ROWS = 256
PARALLEL_MIN_ELEMENTS = 1 << 16  # static batches smaller than this stay single-threaded
MATMUL_ROW_UNROLL = 4

DATA_PAR, COMM_REDUCE = 0, 2


@dataclass
class ScheduleStats:
    blocks: int = 0
    inlined: int = 0
    computed_at: int = 0
    vectorized: int = 0
    reductions_scheduled: int = 0
    parallel: bool = False
    tile_rows: int = 0
    skipped_steps: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _static(expr) -> int | None:
    return int(expr.value) if hasattr(expr, "value") and isinstance(expr.value, int) else None


def _try(stats: ScheduleStats, what: str, step) -> bool:
    """Runs one schedule step; a refused step is recorded and skipped (the schedule stays valid)."""
    try:
        step()
        return True
    except Exception as exc:  # noqa: BLE001 - TVM reports refusals with several error types
        stats.skipped_steps.append(f"{what}: {str(exc).strip().splitlines()[-1][:120] if str(exc).strip() else type(exc).__name__}")
        return False


def _blocks(sch):
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def _is_reduction(block) -> bool:
    return any(int(iv.iter_type) == COMM_REDUCE for iv in block.iter_vars)


def _lanes(dtype: str) -> int:
    bits = tvm.runtime.DataType(dtype).bits
    return max(1, VECTOR_BYTES * 8 // max(8, bits))


# ---------------------------------------------------------------- inlining


def _should_inline(sch, block_rv, outputs) -> bool:
    block = sch.get(block_rv)
    if block.name_hint in outputs or _is_reduction(block) or len(block.writes) != 1:
        return False
    if tir_walk.is_index_copy(block):
        return True
    buffer = block.writes[0].source
    consumers = sch.get_consumers(block_rv)
    reads = sum(tir_walk.count_loads_of(sch.get(c), buffer) for c in consumers)
    return reads <= 1


def inline_cheap_producers(sch, stats: ScheduleStats) -> None:
    """Inlines index copies and read-once producers, repeating until nothing changes."""
    changed = True
    while changed:
        changed = False
        outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(sch.get_sblock("root"))}
        for block_rv in _blocks(sch):
            if _should_inline(sch, block_rv, outputs):
                name = sch.get(block_rv).name_hint
                if _try(stats, f"inline {name}", lambda: sch.compute_inline(block_rv)):
                    stats.inlined += 1
                    changed = True


# ---------------------------------------------------------------- tiling


def row_elements(sch) -> int:
    """The largest static per-row size (product of dims after the first) of any block's output."""
    widest = 1
    for block_rv in _blocks(sch):
        for region in sch.get(block_rv).writes:
            size = 1
            for dim in list(region.source.shape)[1:]:
                value = _static(dim)
                size *= value if value is not None else 1
            widest = max(widest, size)
    return widest


def choose_tile_rows(batch: int | None, row_elements: int) -> int:
    rows = max(1, min(MAX_TILE_ROWS, TILE_ELEMENTS // max(1, row_elements)))
    rows = 1 << (rows.bit_length() - 1)  # a power of two
    if batch is not None:
        rows = min(rows, batch)
    return rows


def tile_rows(sch, stats: ScheduleStats, row_elements: int):
    """Splits the first output's outermost loop into row tiles; returns (outer, inner) or None."""
    outputs = list(sch.get_output_blocks(sch.get_sblock("root")))
    if not outputs:
        return None
    anchor = outputs[0]
    loops = sch.get_loops(anchor)
    if not loops:
        return None
    batch = _static(sch.get(loops[0]).extent)
    rows = choose_tile_rows(batch, row_elements)
    stats.tile_rows = rows
    holder = {}
    if not _try(stats, "split row tile", lambda: holder.update(split=sch.split(loops[0], [None, rows]))):
        return None
    outer, inner = holder["split"]
    return anchor, outer, inner, batch


def compute_under_tile(sch, stats: ScheduleStats, anchor, tile_loop) -> None:
    """compute_at every remaining producer under the tile loop (consumers first), and move the
    other outputs under it too when they allow (reverse_compute_at)."""
    anchor_name = sch.get(anchor).name_hint
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(sch.get_sblock("root"))}
    for block_rv in reversed(_blocks(sch)):
        name = sch.get(block_rv).name_hint
        if name == anchor_name or name in outputs:
            continue
        if _try(stats, f"compute_at {name}", lambda: sch.compute_at(block_rv, tile_loop, preserve_unit_loops=True)):
            stats.computed_at += 1
    for block_rv in _blocks(sch):
        name = sch.get(block_rv).name_hint
        if name in outputs and name != anchor_name:
            if _try(stats, f"reverse_compute_at {name}", lambda: sch.reverse_compute_at(block_rv, tile_loop, preserve_unit_loops=True)):
                stats.computed_at += 1


# ---------------------------------------------------------------- loop nests


def _own_loops(sch, block_rv):
    """The loops that belong to this block's iteration variables (the innermost ones)."""
    block = sch.get(block_rv)
    loops = list(sch.get_loops(block_rv))
    count = len(block.iter_vars)
    return loops[-count:] if count and len(loops) >= count else []


def _block_dtype(block) -> str:
    return str(block.writes[0].source.dtype) if block.writes else "float32"


def vectorize_elementwise(sch, stats: ScheduleStats, block_rv) -> None:
    """Fuses the trailing static loops and vectorizes them (split by the vector width)."""
    block = sch.get(block_rv)
    lanes = _lanes(_block_dtype(block))
    loops = _own_loops(sch, block_rv)
    trailing = []
    for loop in reversed(loops):
        if _static(sch.get(loop).extent) is None:
            break
        trailing.insert(0, loop)
    if not trailing:
        return
    extent = 1
    for loop in trailing:
        extent *= _static(sch.get(loop).extent)
    if extent < 2:
        return
    name = block.name_hint
    holder = {}
    if not _try(stats, f"fuse {name}", lambda: holder.update(loop=sch.fuse(*trailing) if len(trailing) > 1 else trailing[0])):
        return
    fused = holder["loop"]
    if extent > lanes and extent % lanes == 0:
        if not _try(stats, f"split {name}", lambda: holder.update(parts=sch.split(fused, [None, lanes]))):
            return
        fused = holder["parts"][1]
    elif extent > lanes:
        return  # a ragged tail would put a predicate inside the vector loop
    if _try(stats, f"vectorize {name}", lambda: sch.vectorize(fused)):
        stats.vectorized += 1


def _is_matmul_like(block) -> bool:
    """Two or more spatial axes and a reduction: worth a small register tile over rows."""
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    return kinds.count(DATA_PAR) >= 2 and COMM_REDUCE in kinds


def schedule_reduction(sch, stats: ScheduleStats, block_rv) -> None:
    """Moves the reduction loops outside the (vectorized) last spatial loop: C[i, j:j+V] += A[i,k] * B[k, j:j+V]."""
    block = sch.get(block_rv)
    name = block.name_hint
    loops = _own_loops(sch, block_rv)
    if len(loops) != len(block.iter_vars):
        return
    spatial = [lp for lp, iv in zip(loops, block.iter_vars) if int(iv.iter_type) == DATA_PAR]
    reduce = [lp for lp, iv in zip(loops, block.iter_vars) if int(iv.iter_type) == COMM_REDUCE]
    if not spatial or not reduce or len(spatial) + len(reduce) != len(loops):
        return
    lanes = _lanes(_block_dtype(block))
    last_extent = _static(sch.get(spatial[-1]).extent)
    holder = {}
    vector_loop = None
    if last_extent is not None and last_extent >= lanes and last_extent % lanes == 0:
        if _try(stats, f"split {name}", lambda: holder.update(cols=sch.split(spatial[-1], [None, lanes]))):
            col_outer, vector_loop = holder["cols"]
            spatial = spatial[:-1] + [col_outer]
    elif last_extent is not None and 1 < last_extent <= lanes:
        vector_loop, spatial = spatial[-1], spatial[:-1]
    row_inner = None
    if vector_loop is not None and _is_matmul_like(block) and len(spatial) >= 2:
        row_extent = _static(sch.get(spatial[-2]).extent)
        if row_extent is not None and row_extent % MATMUL_ROW_UNROLL == 0 and row_extent > MATMUL_ROW_UNROLL:
            if _try(stats, f"split rows {name}", lambda: holder.update(rows=sch.split(spatial[-2], [None, MATMUL_ROW_UNROLL]))):
                row_outer, row_inner = holder["rows"]
                spatial = spatial[:-2] + [row_outer, spatial[-1]]
    order = spatial + reduce + ([row_inner] if row_inner is not None else []) + ([vector_loop] if vector_loop is not None else [])
    if not _try(stats, f"reorder {name}", lambda: sch.reorder(*order)):
        return
    stats.reductions_scheduled += 1
    if vector_loop is None:
        return
    # Vectorize before decomposing: without its init the update block is neither "complete" nor
    # a "reduction block", and TVM then refuses to vectorize any loop around it.
    if _try(stats, f"vectorize {name}", lambda: sch.vectorize(vector_loop)):
        stats.vectorized += 1
    if row_inner is not None:
        _try(stats, f"unroll {name}", lambda: sch.unroll(row_inner))
    if not _try(stats, f"decompose {name}", lambda: holder.update(init=sch.decompose_reduction(block_rv, reduce[0]))):
        return
    init_loops = sch.get_loops(holder["init"])
    if init_loops and sch.get(init_loops[-1]).kind != tvm.tirx.ForKind.VECTORIZED:
        _try(stats, f"vectorize init {name}", lambda: sch.vectorize(init_loops[-1]))


def schedule_loop_nests(sch, stats: ScheduleStats) -> None:
    for block_rv in _blocks_recursive(sch):
        block = sch.get(block_rv)
        if _is_reduction(block):
            schedule_reduction(sch, stats, block_rv)
        elif block.body is not None and hasattr(block.body, "value"):
            vectorize_elementwise(sch, stats, block_rv)


def _blocks_recursive(sch):
    """All leaf blocks, including those moved under loops by compute_at."""
    found = []

    def walk(block_rv):
        children = list(sch.get_child_blocks(block_rv))
        if not children:
            found.append(block_rv)
        for child in children:
            walk(child)

    for top in sch.get_child_blocks(sch.get_sblock("root")):
        walk(top)
    return found


# ---------------------------------------------------------------- entry point


def simplify(func):
    mod = tvm.IRModule({"main": func})
    mod = s_tir.transform.StmtSimplify()(mod)
    return mod["main"]


def schedule_group(func, allow_parallel: bool = True) -> tuple[tvm.tirx.PrimFunc, ScheduleStats]:
    """Schedules the fused PrimFunc for CPU; never fails on a refused step (see module doc).

    allow_parallel=False gives the same schedule with a serial tile loop: in-process verification
    uses it, because TVM's own single-thread launcher ignores a failing task, so an index assert
    inside a parallel loop would go unnoticed there."""
    stats = ScheduleStats()
    func = simplify(func)
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    stats.blocks = len(_blocks(sch))
    widest_row = row_elements(sch)
    inline_cheap_producers(sch, stats)
    tiled = tile_rows(sch, stats, widest_row)
    if tiled is not None:
        anchor, outer, inner, batch = tiled
        compute_under_tile(sch, stats, anchor, outer)
        total = (batch or 0) * widest_row
        # Parallel before decompose_reduction: TVM refuses to parallelize over a bare update block.
        if allow_parallel and (batch is None or total >= PARALLEL_MIN_ELEMENTS):
            if _try(stats, "parallel tiles", lambda: sch.parallel(outer)):
                stats.parallel = True
    schedule_loop_nests(sch, stats)
    return sch.mod["main"], stats
