"""The CPU schedule for one fused group PrimFunc.

Why this shape (measured; docs/codegen.md keeps the numbers):
- StmtSimplify first, so reshape indices (`% (N*T)`) do not stop compute_at from bounding regions.
- Inline only producers that are re-emitted at most max_duplication times (default: read once),
  and pure index copies (reshape/split/slice): inlining a value read k times re-expands it k
  times per level, which blows up deep tree chains.
- Everything else is computed under a row-tile loop of the first output (compute_at), so
  intermediates become small tile-local buffers and each value is computed once per tile.
- The tile loop runs in parallel only for symbolic or large batches (a launch costs microseconds).
- Outputs that other blocks also read get a cache_write, and all sink outputs' row-tile loops
  are merged into one, so multi-output groups (LSTM cell: H_out reads C_out) tile completely.
- GEMM blocks (one innermost reduction): a register-blocked micro-kernel (schedule_matmul): a
  rows x vectors accumulator tile in a "local" buffer that LLVM keeps in registers (6 x 64 floats
  in 24 zmm registers on AVX-512; sized per target by register_file), k outside the unrolled
  rows x vectors, vector FMAs over output columns; near the single-core FMA peak (OpenBLAS speed
  on 1000x64 @ 64x192). Such groups use 8- or 6-row tiles (gemm_tile_rows), so a ragged tail is cheap. A small GEMM
  whose N is no multiple of the vector width is computed over N padded to one (pad_gemm_columns,
  widen_padded_gemms; the shape decisions are gemm_shapes'): the seed gate's N = 30 ran as
  scalar dot products before.
- The tile loop (and, in GEMM groups, every loop inside the tile) carries LoopPartition's hint:
  full tiles run without the `row < N` predicates compute_at adds; only the tail keeps them.
- Other reductions (Conv/Reduce*): the last spatial loop is split by the vector width and moved
  inside the reduction loops, so the update is a vector FMA over output columns.
- The duplication guard (max_duplication, inline_cheap_producers) bounds how often one producer
  is re-emitted; the default 1 keeps the behaviour measured in the notes.
- Elementwise blocks: trailing static loops fused, split by the vector width (several registers
  wide for a long value: interleaved_vectors), vectorized.
- Gather chains (tree walks): one loop per level and a one-row small-batch variant (tree_schedule).
Every step is attempted on its own and skipped if TVM refuses it: an unusual group gets a
simpler (still valid) schedule rather than a failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..errors import short_reason
from . import (
    clamped_tail,
    concat_blocks,
    conv_schedule,
    fold_rows,
    gemm_blocks,
    gemm_shapes,
    ieee_order,
    interleaved_vectors,
    row_sums,
    tir_walk,
    tree_schedule,
    vector_runs,
)
from .register_file import AVX512, RegisterFile

TILE_ELEMENTS = 8192  # elements of the widest intermediate row block kept per tile
MAX_TILE_ROWS = 256
PARALLEL_MIN_ELEMENTS = 1 << 16  # static batches smaller than this stay single-threaded
GEMM_TILE_ROWS = 8  # row tile of a group with a GEMM: 4 was slower at batch 64, 32 costs 2 us at batch 1
SMALL_BATCH_ROWS = GEMM_TILE_ROWS  # batches below this run a gather chain's small-batch variant
RAGGED_TILE_SLACK = 2  # a GEMM group's main kernel takes batches from its tile's rows minus this (small_batch_below)

DEFAULT_MAX_DUPLICATION = 1  # see inline_cheap_producers; measured on the tree chains below

DATA_PAR, COMM_REDUCE = 0, tir_walk.COMM_REDUCE


@dataclass
class ScheduleStats:
    blocks: int = 0
    inlined: int = 0
    computed_at: int = 0
    vectorized: int = 0
    reductions_scheduled: int = 0
    reductions_factored: int = 0  # row reductions split in vector lanes (factor_row_reductions)
    gemm_columns_padded: int = 0  # GEMMs computed over N padded to whole vectors (pad_gemm_columns)
    register_tiles: int = 0  # GEMMs given a register-blocked micro-kernel (schedule_matmul)
    epilogues_per_tile: int = 0  # GEMM readers run per register tile (epilogue_per_register_tile)
    column_blocks_first: int = 0  # GEMMs whose column blocks run outside the row blocks (_tile_loop_order)
    unpredicated_blocks: int = 0  # blocks the ragged last tile runs whole (clamped_tail)
    clamped_row_blocks: int = 0  # GEMMs at the root blocked over symbolic rows (clamped_tail.register_tiles_past_rows)
    tile_sized_blocks: int = 0  # blocks whose batch predicate TVM's buffer sizing ignores (tile_sized_buffers)
    vector_tails: int = 0  # rows run as whole vectors and a narrower tail (vectorize_with_tail)
    interleaved: int = 0  # long values vectorized several registers wide (interleaved_vectors)
    narrowed_to_runs: int = 0  # vector loops narrowed so that each load reads one run (vector_runs)
    parallel: bool = False
    tile_rows: int = 0
    gemm_sized_tiles: bool = False  # row tiles of a GEMM group's size (gemm_tile_rows): a small batch is all tail
    symbolic_rows: bool = False  # the row-tile loop runs over a symbolic (batch) extent
    folded_rows: bool = False  # [batch, seq, ...] tiled as batch x seq rows (fold_rows)
    gather_chain: bool = False  # a tree walk: each level one loop (tree_schedule.fuse_level_loops)
    row_work: int = 0  # innermost iterations per unit of the symbolic dims (see row_work)
    materialized: int = 0  # blocks left after inlining: each computes its value once per tile
    max_copies: int = 0  # most copies of one inlined expression (<= max_duplication, index copies aside)
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
        stats.skipped_steps.append(f"{what}: {short_reason(exc, 120)}")
        return False


def _blocks(sch):
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def _lanes(dtype: str, registers: RegisterFile) -> int:
    """Elements of `dtype` in one vector register: vectorized loops are one register wide (wider
    vectors, split by LLVM, spilled in NEON's gate math and were no faster on AVX2), but for rows
    no power of two divides (_row_lanes)."""
    return registers.lanes(tvm.runtime.DataType(dtype).bits)


def _lanes_dividing(extent: int, lanes: int) -> int:
    """The widest vector, at most `lanes` and a power of two, that divides `extent` (a row of
    1,000 floats takes 8 of AVX-512's 16 lanes: 16 leave a ragged tail); 0 if that is under
    half a register or under 4 lanes."""
    narrowest = max(lanes // 2, 4)
    while lanes >= narrowest and extent % lanes:
        lanes //= 2
    return lanes if lanes >= narrowest else 0


def _row_lanes(extent: int, lanes: int) -> int:
    """Lanes for a row vectorized alone: the widest power of two dividing it (_lanes_dividing),
    else the divisor of the row, at most two registers wide, that takes the fewest register
    operations (a gate row of 10 floats: one vector of 10, which LLVM splits into 8 + 2); 0 if
    none. Left scalar, such a row was LLVM's to vectorize, and LLVM's loop vectorizer gives up
    on the fenced products of rounded_products: the seed gate's epilogue ran scalar, 4x slower."""
    power = _lanes_dividing(extent, lanes)
    if power:
        return power
    divisors = [d for d in range(max(lanes // 2, 2), 2 * lanes + 1) if extent % d == 0]
    if not divisors:
        return 0
    return min(divisors, key=lambda d: ((extent // d) * -(-d // lanes), -d))


# ---------------------------------------------------------------- inlining


def _copies_if_inlined(sch, block_rv, outputs) -> int | None:
    """How many copies of the block's expression inlining would leave in the program (the loads
    of its buffer in its current consumers), or None if it must stay a block."""
    block = sch.get(block_rv)
    if block.name_hint in outputs or tir_walk.is_reduction(block) or len(block.writes) != 1 or _kept_at_root(block):
        return None
    buffer = block.writes[0].source
    consumers = [sch.get(c) for c in sch.get_consumers(block_rv)]
    if any(tir_walk.gathers_along_unit_axis(c, buffer) for c in consumers):
        return None  # the gather's index must stay, to be checked (tir_walk.gathers_along_unit_axis)
    if any(_multiplies(c, buffer) for c in consumers) and not tir_walk.is_index_copy(block):
        return None
    return sum(tir_walk.count_loads_of(c, buffer) for c in consumers)


def _multiplies(block, buffer) -> bool:
    """Whether `block` is a matrix product with `buffer` as an operand (read as a value, not as
    an index). Such an operand, computed in the kernel (a LayerNorm before its GEMM, a GEMM
    chain's hidden layer), stays a block: the GEMM reads each operand value once per column
    block, so inlined it would be recomputed that often. Inlined, transformer_mlp's LayerNorm
    ran its division by sqrt(var + eps) in the GEMM's inner loop: 0.93x onnxruntime at batch 64,
    against 1.17x materialised. A tree ensemble's leaf sum reads its index computation inside a
    gather's indices: that stays inlined."""
    value = getattr(block.body, "value", None)
    return (value is not None and _is_matrix_product(block)
            and any(load.source.same_as(buffer) for load in tir_walk.outer_loads(value)))


CHEAP_EPILOGUE_NODES = 12  # a clamp of one GEMM result load (tanh's input), its two indices counted, is 9


def _small_store_value(block):
    """The value a block stores, when it is a plain store (no reduction) of at most
    CHEAP_EPILOGUE_NODES nodes; else None."""
    value = getattr(block.body, "value", None)
    if value is None or block.init is not None or tir_walk.expr_size(value) > CHEAP_EPILOGUE_NODES:
        return None
    return value


def _cheap_gemm_epilogue(sch, block_rv) -> bool:
    """A few operations on one load of a GEMM's result (the clamp before a tanh): inlined however
    often it is read, since LLVM computes the copies once (common subexpressions) and one load
    cannot multiply along a chain. Materialised in a gate cell with narrow rows, LLVM vectorized
    it across the tile's rows with a gather and a scatter per column (30% of the seed gate's
    time at N = 10)."""
    value = _small_store_value(sch.get(block_rv))
    if value is None:
        return False
    loads = list(tir_walk.iter_loads(value))
    if len(loads) != 1:
        return False
    return any(_is_gemm(sch.get(p)) and sch.get(p).writes[0].source.same_as(loads[0].source)
               for p in sch.get_producers(block_rv))


REREAD_COPIES = 2  # a Relu's select(x < 0, 0, x) reads x twice
# Copies of a cheap value of the inputs where each consumer reads it at one index: diamond's
# Relu is read 114 times by the clamps of its Sigmoid and Tanh (each use of a clamp re-expands
# it). Its consumer already holds that many loads; inlining grows it at most CHEAP_EPILOGUE_NODES
# times, once (nothing it reads is inlined further).
SHARED_COPIES = 256


def _kernel_params(sch) -> set[str]:
    """Names of the kernel's parameters (its inputs and outputs): buffers no block computes."""
    return {param.name for param in sch.mod["main"].params}


def _cheap_reread_of_inputs(sch, block_rv, copies: int) -> bool:
    """A few operations on the kernel's own inputs (a residual Add), read at most twice (by a
    Relu's select), or up to SHARED_COPIES times where each consumer reads it at one index (a
    Relu feeding a Sigmoid and a Tanh, whose clamps read it a dozen times): inlined, since LLVM
    computes the copies in one consumer once, and a block that reads only inputs starts no chain
    along which copies could multiply. Materialised, the residual Add + Relu after a Conv
    (conv_block, [1000, 16, 16, 16]) wrote and re-read a whole tile: its kernel took 4.6 ms
    where onnxruntime's Add and Relu took 3.6 ms together; diamond's Relu cost a pass and a
    workspace (paired rounds at batch 64 / 1,000: 1.44x / 1.56x onnxruntime, inlined 1.57x /
    1.92x)."""
    value = _small_store_value(sch.get(block_rv))
    if copies > SHARED_COPIES or value is None:
        return False
    inputs = _kernel_params(sch)
    if not all(load.source.name in inputs for load in tir_walk.iter_loads(value)):
        return False
    if copies <= REREAD_COPIES:
        return True
    if any(isinstance(node, tirx.Let) for node in tir_walk.iter_nodes(value)):
        return False  # each copy would define its variable again
    buffer = sch.get(block_rv).writes[0].source
    return all(tir_walk.reads_at_one_index(sch.get(c), buffer) for c in sch.get_consumers(block_rv))


def inline_cheap_producers(sch, stats: ScheduleStats, max_duplication: int = 1) -> None:
    """Inlines producers whose expression would be re-emitted at most `max_duplication` times,
    and pure index copies (reshape/split/slice: duplicating them duplicates index math only).

    The duplication guard, in the spirit of XLA's: blocks are visited consumers first, so a
    consumer that was itself inlined k times already shows its producer's loads k times over.
    The count therefore multiplies along chains, and no expression is ever emitted more than
    `max_duplication` times: the program grows by at most that factor, which keeps compile time
    linear in the depth of a tree chain (whose per-level index is read by 3-4 lookups: inlining
    it everywhere re-expands every earlier level 4x per level). A value that is not inlined is
    materialised once (per row tile) and read from there."""
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(sch.get_sblock("root"))}
    changed = True
    while changed:
        changed = False
        for block_rv in reversed(_blocks(sch)):
            copies = _copies_if_inlined(sch, block_rv, outputs)
            if copies is None:
                continue
            if conv_schedule.is_conv_window(sch, block_rv) or gemm_blocks.is_with_tail(sch.get(block_rv)):
                continue  # the add of a ragged last block follows the register tiles as a block of its own
            if row_sums.is_row_total(sch.get(block_rv)):
                continue  # once per row, not once per element of the row that reads it
            if (copies > max_duplication and not tir_walk.is_index_copy(sch.get(block_rv))
                    and not _cheap_gemm_epilogue(sch, block_rv) and not _cheap_reread_of_inputs(sch, block_rv, copies)):
                continue
            name = sch.get(block_rv).name_hint
            index_copy = tir_walk.is_index_copy(sch.get(block_rv))
            if _try(stats, f"inline {name}", lambda: sch.compute_inline(block_rv)):
                stats.inlined += 1
                if not index_copy:
                    stats.max_copies = max(stats.max_copies, copies)
                changed = True
    stats.materialized = len(_blocks(sch))


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


def row_work(sch) -> int:
    """About how much one row costs: the blocks' innermost iterations with every symbolic extent
    (the batch) taken as 1 (a GEMM row counts its multiply-adds, an elementwise row its elements).
    The runtime weighs batch x row_work against the cost of waking onnxruntime's pool. A block
    kept at the root (a padded weight copy) runs once per call, not per row: not counted."""
    total = 0
    for block_rv in _blocks(sch):
        if _kept_at_root(sch.get(block_rv)):
            continue
        iterations = 1
        for iv in sch.get(block_rv).iter_vars:
            iterations *= _static(iv.dom.extent) or 1
        total += iterations
    return total


def _fills_register_tile(block, registers: RegisterFile) -> bool:
    cols = _static(block.iter_vars[-2].dom.extent) if len(block.iter_vars) >= 2 else None
    lanes = _lanes(_block_dtype(block), registers)
    return cols is not None and cols % lanes == 0 and gemm_shapes.fills_register_tile(cols // lanes, registers)


def gemm_tile_rows(registers: RegisterFile) -> int:
    """Rows per tile of a group whose GEMMs fill their register tiles: whole register tiles, as
    many as fit GEMM_TILE_ROWS (8 = 2 x 4 rows; AVX-512's 6-row register tile: one). Other GEMM
    groups keep GEMM_TILE_ROWS (their narrow tiles have 4 rows). With clamped_tail the ragged last tile
    costs a whole one, so a tile of one 6-row register tile wastes less than two."""
    rows = registers.gemm_rows
    return rows * max(1, GEMM_TILE_ROWS // rows)


def choose_tile_rows(batch: int | None, row_elements: int, gemm: bool = False, small_batch: bool = False,
                     gemm_rows: int = GEMM_TILE_ROWS) -> int:
    """Rows per tile: enough to amortise per-tile loop overhead, few enough that the tile's
    intermediates stay in L1. A GEMM group uses one register tile of rows: its micro-kernel
    streams the weights once per register tile anyway, and a short ragged tile keeps batch 1
    cheap (a 32-row tail tile runs all 32 rows' loops under per-row predicates). Measured on
    the LSTM gate (64x192 weights): 8 rows gives 1.4 us at batch 1 (32 rows: 3.3 us) and the
    same 17 us at batch 64. The small-batch variant of a GEMM group uses one row per tile (see
    needs_small_batch_variant)."""
    if small_batch:
        return 1
    rows = max(1, min(MAX_TILE_ROWS, TILE_ELEMENTS // max(1, row_elements)))
    rows = 1 << (rows.bit_length() - 1)  # a power of two
    if gemm:
        rows = min(rows, gemm_rows)
    if batch is not None:
        rows = min(rows, batch)
    return rows


def separate_read_outputs(sch, stats: ScheduleStats) -> None:
    """An output that other blocks of the group also read (an LSTM cell's C_out feeds H_out)
    gets a cache_write: computed into an intermediate, then copied out. TVM refuses compute_at
    on an output block, so without this none of its producers could move under the row tile."""
    for block_rv in list(sch.get_output_blocks(sch.get_sblock("root"))):
        consumers = _readers(sch, block_rv)
        if consumers:
            name = sch.get(block_rv).name_hint
            _try(stats, f"separate output {name}", lambda: sch.cache_write(block_rv, 0, "global", consumer_blocks=consumers))


def _readers(sch, block_rv) -> list:
    """The consumers that read what the block writes. TVM also counts a later block writing
    other elements of the same buffer (the parts of a Concat, concat_blocks) as a consumer."""
    written = [region.source for region in sch.get(block_rv).writes]
    return [c for c in sch.get_consumers(block_rv)
            if any(r.source.same_as(w) for r in sch.get(c).reads for w in written)]


def _sink_outputs(sch):
    outputs = list(sch.get_output_blocks(sch.get_sblock("root")))
    return [b for b in outputs if not _readers(sch, b)] or outputs


def tile_rows(sch, stats: ScheduleStats, row_elements: int, small_batch: bool = False,
              registers: RegisterFile = AVX512):
    """Splits the outermost loop of every sink output into row tiles and merges those tile loops
    into one; returns (anchor names, tile loop, batch) or None."""
    outputs = _sink_outputs(sch)
    if not outputs or not sch.get_loops(outputs[0]):
        return None
    for block_rv in outputs:
        _batch_loop_first(sch, stats, block_rv)
    extent = sch.get(sch.get_loops(outputs[0])[0]).extent
    batch = _static(extent)
    gemms = [sch.get(b) for b in _blocks(sch) if _is_gemm(sch.get(b))]
    gemm = bool(gemms)
    gemm_rows = gemm_tile_rows(registers) if all(_fills_register_tile(g, registers) for g in gemms) \
        else GEMM_TILE_ROWS
    rows = choose_tile_rows(batch, row_elements, gemm, small_batch, gemm_rows)
    stats.tile_rows = rows
    stats.gemm_sized_tiles = rows == (gemm_rows if gemm else GEMM_TILE_ROWS)
    stats.symbolic_rows = batch is None
    anchors, tile_loops = [], []
    for group in _by_first_loop(sch, outputs):
        loops = sch.get_loops(group[0])
        if not loops or not _same_extent(sch.get(loops[0]).extent, extent):
            continue
        parts = _split(sch, stats, loops[0], [None, rows], "split row tile")
        if parts is not None:
            anchors.extend(sch.get(b).name_hint for b in group)
            tile_loops.append(parts[0])
    if not tile_loops:
        return None
    if len(tile_loops) > 1:
        holder = {}
        if _try(stats, "merge output tiles", lambda: holder.update(loop=sch.merge(*tile_loops))):
            tile_loops = [holder["loop"]]
        else:
            anchors = anchors[:1]
    return anchors, tile_loops[0], batch


def _by_first_loop(sch, blocks) -> list[list]:
    """`blocks` grouped by their outermost loop: the parts of a Concat (concat_blocks) share it."""
    groups: list[list] = []
    for block_rv in blocks:
        loops = sch.get_loops(block_rv)
        first = sch.get(loops[0]) if loops else None
        group = next((g for g in groups if first is not None and sch.get(sch.get_loops(g[0])[0]).same_as(first)), None)
        if group is None:
            groups.append([block_rv])
        else:
            group.append(block_rv)
    return groups


def _batch_loop_first(sch, stats: ScheduleStats, block_rv) -> None:
    """An output whose first axis is static and a later one symbolic (a cell's state stacked as
    [2, N, H]) gets its batch loop outermost, so the row tiles run over the batch: tiled over
    the two stacked halves instead, the cell's GEMMs ran 0.66x onnxruntime at batch 64."""
    loops = list(sch.get_loops(block_rv))
    if not loops or _static(sch.get(loops[0]).extent) is None:
        return
    batch = next((lp for lp in loops if _static(sch.get(lp).extent) is None), None)
    if batch is not None:
        _try(stats, "batch loop first", lambda: sch.reorder(batch, *[lp for lp in loops if lp != batch]))


def _same_extent(a, b) -> bool:
    return str(a) == str(b)


def compute_under_tile(sch, stats: ScheduleStats, anchors, tile_loop) -> None:
    """compute_at every other block under the tile loop (consumers first), then move the outputs
    that are not producers of the anchor under it too (reverse_compute_at).

    An output that also feeds the anchor (an LSTM cell's C_out feeds H_out through tanh) is
    computed at the tile like any producer: its own producers can only follow it there.

    A producer stays at the root when a tile would need a batch-sized region of it
    (_region_grows_with_batch): then every tile recomputed the producer over the whole batch."""
    moved = set(anchors)
    batch_symbols = tir_walk.vars_in(sch.get(tile_loop).extent)
    for block_rv in reversed(_blocks(sch)):
        name = sch.get(block_rv).name_hint
        if name in moved or _kept_at_root(sch.get(block_rv)):
            continue
        # A blocked product's ragged block goes first, so that its register tiles can add it (gemm_blocks).
        index = -2 if gemm_blocks.is_tail_sum(sch.get(block_rv)) else -1
        if batch_symbols and _region_grows_with_batch(sch, block_rv, tile_loop, index, batch_symbols):
            stats.skipped_steps.append(f"compute_at {name}: a tile would need it over the whole batch")
            continue
        if _try(stats, f"compute_at {name}",
                lambda: sch.compute_at(block_rv, tile_loop, preserve_unit_loops=True, index=index)):
            stats.computed_at += 1
            moved.add(name)
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(sch.get_sblock("root"))}
    for block_rv in _blocks(sch):
        name = sch.get(block_rv).name_hint
        if name in outputs and name not in moved:
            if _try(stats, f"reverse_compute_at {name}",
                    lambda: sch.reverse_compute_at(block_rv, tile_loop, preserve_unit_loops=True)):
                stats.computed_at += 1


def _region_grows_with_batch(sch, block_rv, tile_loop, index: int, batch_symbols: set) -> bool:
    """Whether the block, computed under the row tile, would loop over an extent that depends on
    the batch: the rows a tile reads of it are spread over the whole batch. PyTorch's dynamo
    export of MultiheadAttention writes its context as `probs @ V` over [N, heads, seq, d], then
    Transpose to [seq, N, heads, d] and Reshape to [seq * N, heads * d]: a tile of 8 output rows
    (seq-major) needs the product's rows of nearly every batch, and compute_at made each tile
    loop over `2 N - 1` of them, quadratic in the batch (the SSE level also failed to build)."""
    below = _loops_below_after(sch, block_rv, tile_loop,
                               lambda trial: trial.compute_at(block_rv, tile_loop, preserve_unit_loops=True, index=index))
    return any(tir_walk.uses_var(loop.extent, symbol) for loop in below or () for symbol in batch_symbols)


def _loops_below_after(sch, block_rv, loop_rv, move) -> list | None:
    """The block's loops under `loop_rv` once `move(schedule)` has moved it there, tried on a
    copy of the schedule so that `sch` is untouched (None: the move was refused)."""
    trial = sch.copy()
    try:
        move(trial)
    except Exception:  # noqa: BLE001 - refused: the caller's own attempt reports why
        return None
    loops = [trial.get(loop) for loop in trial.get_loops(block_rv)]
    anchor = trial.get(loop_rv)
    return loops[next(i for i, loop in enumerate(loops) if loop.same_as(anchor)) + 1:]


# ---------------------------------------------------------------- loop nests


def _own_loops(sch, block_rv):
    """The loops that belong to this block's iteration variables (the innermost ones)."""
    block = sch.get(block_rv)
    loops = list(sch.get_loops(block_rv))
    count = len(block.iter_vars)
    return loops[-count:] if count and len(loops) >= count else []


def _block_dtype(block) -> str:
    return str(block.writes[0].source.dtype) if block.writes else "float32"


def vectorize_elementwise(sch, stats: ScheduleStats, block_rv, registers: RegisterFile, gemm_results=(),
                          ragged_rows: int = 0) -> None:
    """Fuses the trailing static loops and vectorizes them (split by the vector width).

    Not across rows when a vector would span two of them and the block reads a value per row
    (softmax's max): each lane then loads its own row's value, a gather. A 1,000-wide softmax
    ran 8x slower than onnxruntime that way. Such a block vectorizes its rows alone, in lanes
    dividing them (_row_lanes). Nor across the rows of a tile over a symbolic batch
    (`ragged_rows`, see _keep_row_loop)."""
    block = sch.get(block_rv)
    if row_sums.is_gathered(block):  # as vectors, each lane gathered its own row's values
        if row_sums.is_edges(block):  # unrolled, its slots share the row's index arithmetic
            _try(stats, f"unroll {block.name_hint}", lambda: sch.unroll(_own_loops(sch, block_rv)[-1]))
        return
    lanes = _lanes(_block_dtype(block), registers)
    loops = _own_loops(sch, block_rv)
    trailing = []
    for loop in reversed(loops):
        node = sch.get(loop)
        if _static(node.extent) is None or isinstance(node.body, tvm.tirx.SeqStmt):
            break  # a loop shared with other blocks (a Concat's row loop, concat_blocks) cannot be fused
        trailing.insert(0, loop)
    if not trailing:
        return
    if _keep_row_loop(sch, trailing, loops, ragged_rows, lanes):
        trailing = trailing[1:]
    innermost = _static(sch.get(trailing[-1]).extent)
    if innermost % lanes and (_reads_per_row(block) or _reads_rows_of_another_width(block, gemm_results)):
        if innermost > lanes and not _binds_values(block) and (innermost > 2 * lanes or _whole_tail(innermost, lanes)):
            vectorize_with_tail(sch, stats, trailing[-1], innermost, lanes)
            return
        trailing, lanes = trailing[-1:], _row_lanes(innermost, lanes)
        if not lanes:
            return
    extents = [_static(sch.get(loop).extent) for loop in trailing]
    extent = math.prod(extents)
    if extent < 2:
        return
    contiguous = vector_runs.contiguous_lanes(block, extents, lanes)
    ragged = extent > lanes and extent % lanes  # fused, the vectors would leave a tail: not vectorized
    row_lanes = _row_lanes(innermost, lanes) if (not contiguous or ragged) and len(trailing) > 1 else 0
    if row_lanes and vector_runs.row_reads_runs(block, innermost):
        # vectors across rows would gather: each row alone (conv rows of 13, one vector each)
        trailing, extents, extent = trailing[-1:], [innermost], innermost
        lanes = contiguous = row_lanes
    if not contiguous:
        return
    name = block.name_hint
    holder = {}
    if not _try(stats, f"fuse {name}", lambda: holder.update(loop=sch.fuse(*trailing) if len(trailing) > 1 else trailing[0])):
        return
    fused = holder["loop"]
    if contiguous < lanes:  # narrower vectors, each a run of every load (vector_runs); never interleaved
        stats.narrowed_to_runs += 1
        register_lanes = lanes = contiguous
    else:
        register_lanes, lanes = lanes, _interleaved_lanes(block, extent, lanes, registers)
        if lanes > register_lanes and vector_runs.contiguous_lanes(block, extents, lanes) != lanes:
            lanes = register_lanes  # several registers wide, a vector would read more than one run
    if extent > lanes and extent % lanes == 0:
        if not _try(stats, f"split {name}", lambda: holder.update(parts=sch.split(fused, [None, lanes]))):
            return
        fused = holder["parts"][1]
        if _selects_by_position(block, lanes):
            outer = holder["parts"][0]
            _try(stats, "partition hint", lambda: sch.annotate(outer, "pragma_loop_partition_hint", 1))
    elif extent > lanes:
        return  # a ragged tail would put a predicate inside the vector loop
    if _try(stats, f"vectorize {name}", lambda: sch.vectorize(fused)):
        stats.vectorized += 1
        stats.interleaved += lanes > register_lanes


def _interleaved_lanes(block, extent: int, lanes: int, registers: RegisterFile) -> int:
    """Lanes for a block's fused vector loop: several registers wide for a long value
    (interleaved_vectors), unless that would move a Concat's cut off a vector boundary."""
    wide = interleaved_vectors.vector_lanes(interleaved_vectors.value_ops(block), extent, lanes, registers)
    if wide > lanes and _selects_by_position(block, lanes) and not _selects_by_position(block, wide):
        return lanes
    return wide


def vectorize_with_tail(sch, stats: ScheduleStats, loop, extent: int, lanes: int) -> None:
    """A row of `extent` elements, no multiple of `lanes`, as whole vectors and a narrower tail
    (loop_partition: one loop of full vectors, one of the rest), rather than in vectors of a width
    that divides the row: 40 floats are 2 x 16 + 8 lanes, not 5 x 8."""
    holder = {}
    whole = extent - extent % lanes
    if not _try(stats, "partition tail", lambda: holder.update(parts=sch.loop_partition(loop, [whole, None]))):
        return
    head, tail = holder["parts"]
    if _try(stats, "split whole vectors", lambda: holder.update(split=sch.split(head, [None, lanes]))):
        if _try(stats, "vectorize whole vectors", lambda: sch.vectorize(holder["split"][1])):
            stats.vectorized += 1
    tail_lanes = _row_lanes(extent - whole, lanes)
    if not tail_lanes:
        return
    if extent - whole > tail_lanes:
        if not _try(stats, "split tail", lambda: holder.update(tail=sch.split(tail, [None, tail_lanes])[1])):
            return
        tail = holder["tail"]
    if _try(stats, "vectorize tail", lambda: sch.vectorize(tail)):
        stats.vectorized += 1
        stats.vector_tails += 1


def _whole_tail(extent: int, lanes: int) -> bool:
    """Whether a row's tail past its whole vectors is itself a vector of half of them or more, a
    power of two (24 = 16 + 8). A row within two registers with a ragged tail (13 on AVX2's 8
    lanes, 26 on AVX-512's 16) runs as one vector of the row instead, which LLVM splits into as
    many register operations, and needs no loop partition: partitioned inside a conv's column
    tile (keras_cnn's rows of 26 as two tiles of 13, on AVX2), TVM 0.27 gave both parts the same
    block variables, an ill-formed function, and the group fell back to onnxruntime."""
    tail = extent % lanes
    return tail >= lanes // 2 and tail & (tail - 1) == 0


def _binds_values(block) -> bool:
    """Whether the block's value binds a variable (a Let: sigmoid_clamp's ratio). loop_partition
    copies the block, and two copies defining one variable make the function ill-formed."""
    return any(isinstance(node, tvm.tirx.Let) for expr in tir_walk.store_value_exprs(block)
               for node in tir_walk.iter_nodes(expr))


def _selects_by_position(block, lanes: int) -> bool:
    """Whether the block picks its value by its last index at whole vectors (a Concat that stays
    one block, concat_blocks: `if_then_else(32 <= j, b[j - 32], a[j])`). TVM's vectorizer
    scalarizes a vector loop whose if_then_else condition differs between lanes; with
    LoopPartition's hint on the loop of whole vectors, each part's condition is the same for
    every lane and the loop stays a vector loop. Only if every cut falls between vectors: at
    24 of 48 columns, TVM 0.27 failed to build the partitioned loop (int32 vs int64 in its
    simplifier), and the group fell back to onnxruntime."""
    if not block.iter_vars or _static(block.iter_vars[-1].dom.extent) is None:
        return False
    last, extent = block.iter_vars[-1].var, _static(block.iter_vars[-1].dom.extent)
    selects = [node for expr in tir_walk.store_value_exprs(block) for node in tir_walk.iter_nodes(expr)
               if isinstance(node, tvm.ir.expr.Call) and node.op.same_as(concat_blocks.IF_THEN_ELSE)]
    cuts = [concat_blocks.position_cut(call.args[0], last, extent) for call in selects]
    return bool(cuts) and all(cut is not None and cut[0] % lanes == 0 for cut in cuts)


def _keep_row_loop(sch, trailing, own_loops, ragged_rows: int, lanes: int) -> bool:
    """Whether a block's row loop stays out of its vector loop: it is the row loop of a tile over
    a symbolic batch, whose rows past the batch carry a `row < N` predicate, and the rest of the
    row fills whole vectors. Fused with the columns, that predicate sits on every vector and the
    loop runs the whole tile whatever the batch (a 256-row tile of 32 floats: 512 predicated
    vectors per block at batch 1). Kept apart, the row loop of the last tile ends at the batch
    (tail_loops)."""
    if not ragged_rows or len(trailing) < 2 or trailing[0] != own_loops[0]:
        return False
    if _static(sch.get(trailing[0]).extent) != ragged_rows:
        return False
    rest = 1
    for loop in trailing[1:]:
        rest *= _static(sch.get(loop).extent)
    return rest >= lanes and rest % lanes == 0


def _reads_per_row(block) -> bool:
    """Whether the block reads a buffer indexed by its outer axes but not its innermost one."""
    if len(block.iter_vars) < 2:
        return False
    inner, outer = block.iter_vars[-1].var, [iv.var for iv in block.iter_vars[:-1]]

    def uses(region, var) -> bool:
        return any(tir_walk.uses_var(r.min, var) for r in region.region)

    return any(not uses(read, inner) and any(uses(read, v) for v in outer) for read in block.reads)


def _reads_rows_of_another_width(block, gemm_results) -> bool:
    """Whether a vector spanning two output rows would gather from a GEMM result it reads: that
    result's rows are wider than the output's (one gate's columns, a padded result) or read
    from an offset. Narrow gate rows (N = 10) read that way ran as gathers. Only GEMM results:
    other groups (tree chains) keep the schedule they were measured with."""
    if len(block.iter_vars) < 2 or not block.writes:
        return False
    inner = block.iter_vars[-1].var
    width = block.writes[0].source.shape[-1]
    for read in block.reads:
        if not any(read.source.same_as(b) for b in gemm_results):
            continue
        if not read.region or not tir_walk.uses_var(read.region[-1].min, inner):
            continue
        if not read.region[-1].min.same_as(inner) or str(read.source.shape[-1]) != str(width):
            return True
    return False


def _is_matmul_like(block) -> bool:
    """Two or more spatial axes and a reduction: worth a register tile over rows and columns."""
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    return kinds.count(DATA_PAR) >= 2 and COMM_REDUCE in kinds


def _is_gemm(block) -> bool:
    """Matmul-like with exactly one reduction axis, innermost: what schedule_matmul handles."""
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    return (_is_matmul_like(block) and kinds[-1] == COMM_REDUCE and kinds.count(COMM_REDUCE) == 1
            and not gemm_blocks.is_block_sums(block))  # tiled with their sum


def _is_matrix_product(block) -> bool:
    """A GEMM whose reduction multiplies two operands (A[.., k] * B[k, ..]), not a row reduction
    shaped like one (ReduceMean with keepdims: spatial axes N, 1 and a reduction)."""
    if not _is_gemm(block):
        return False
    if gemm_blocks.is_blocks_sum(block):
        return True  # the product of a blocked GEMM, its multiply-adds in its block sums
    k = block.iter_vars[-1].var
    return sum(any(tir_walk.uses_var(r.min, k) for r in read.region) for read in block.reads) >= 2


def _split(sch, stats, loop, factors, what):
    holder = {}
    if _try(stats, what, lambda: holder.update(parts=sch.split(loop, factors))):
        return list(holder["parts"])
    return None


KEEP_AT_ROOT = "onnxfuse_keep_at_root"  # a block annotation: computed once per call, never inlined or tiled
PADDED_COLUMNS = "onnxfuse_padded_columns"  # a GEMM block annotation: the N it is computed over


def _kept_at_root(block) -> bool:
    return KEEP_AT_ROOT in block.annotations


def pad_gemm_columns(sch, stats: ScheduleStats, registers: RegisterFile) -> None:
    """A small GEMM whose N is no multiple of the vector width (the seed gate's N = 30) is
    computed over N padded to the next multiple (gemm_shapes.padded_columns): its weight is
    copied once per call into a zero-padded [K, N'] buffer (kept at the root, outside the row
    tiles), the GEMM runs whole column vectors into a padded result, and its consumers read the
    first N columns of that result. Unpadded, schedule_matmul refused it and the GEMM ran as
    scalar dot products. Done first, while the block's bindings are still trivial (pad_einsum
    needs them)."""
    for block_rv in _blocks(sch):
        block = sch.get(block_rv)
        padded = _padded_columns(block, registers)
        if padded is None:
            continue
        before = {sch.get(b).name_hint for b in _blocks(sch)}
        factors = [1] * (len(block.iter_vars) - 2) + [padded, 1]
        if not _try(stats, f"pad columns {block.name_hint}", lambda: sch.pad_einsum(block_rv, factors)):
            continue
        for producer in sch.get_producers(block_rv):
            if sch.get(producer).name_hint not in before:
                _try(stats, "keep the padded weight at the root", lambda: sch.annotate(producer, KEEP_AT_ROOT, 1))
        _try(stats, f"mark padded {block.name_hint}", lambda: sch.annotate(block_rv, PADDED_COLUMNS, padded))
        stats.gemm_columns_padded += 1


def _for_polynomial_epilogue(blocks, registers: RegisterFile) -> RegisterFile:
    """`registers` with 4-row GEMM register tiles where a GEMM of exactly one register tile of
    columns (N = 64 floats on AVX-512) feeds a polynomial (Exp, Tanh, Sigmoid, Erf: multiply-adds
    of broadcast constants); `blocks`: the unscheduled function's. Its 6 x 4 tile holds 24
    accumulators and leaves too few registers for the polynomial's constants, which LLVM hoists out
    of the row-tile loop: 7 accumulators then went through the stack on every step.
    [N, 64] @ [64, 64] -> Tanh ran 0.78-0.84x onnxruntime (6 rows) and 1.21-1.31x (4 rows);
    -> Sigmoid from K = 128 0.65-0.69x and 1.10-1.15x (batch 1,024 and 16,000, one run each).
    Wider GEMMs (the recurrent cells' N = 192 to 384, column blocks first) and narrower ones ran
    alike with either tile, and the cells lost 2-8% with 4 rows."""
    if registers.gemm_rows <= 4:
        return registers
    one_tile = any(_is_matrix_product(b) and _static(b.iter_vars[-2].dom.extent) == 4 * _lanes(_block_dtype(b), registers)
                   for b in blocks)
    polynomial = one_tile and any(_computes_polynomial(b) for b in blocks if not tir_walk.is_reduction(b))
    return replace(registers, gemm_rows=4) if polynomial else registers


def _pads_columns(blocks, registers: RegisterFile) -> bool:
    """Whether pad_gemm_columns will pad a GEMM among `blocks` (the unscheduled function's)."""
    return any(_padded_columns(block, registers) is not None for block in blocks)


def _padded_then_folded(func, stats: ScheduleStats, registers: RegisterFile):
    """`func` with its GEMMs' columns padded (pad_gemm_columns), then its rows folded (fold_rows).
    In this order because pad_einsum needs a block's reads indexed by its own iteration variables,
    and a folded block reads its [batch, seq] input at [r // seq, r % seq]: folded first, the
    padding was refused and `[N, 16, 40] @ [40, 40]` ran as scalar dot products, which LLVM summed
    in an order of its own (202 of 5,120 elements an ulp off onnxruntime's); not folded, its
    register tile ran along the symbolic seq loop one row at a time (0.48x onnxruntime at batch
    64 x seq 16, with Tanh after it)."""
    sch = s_tir.Schedule(tvm.IRModule({"main": _concats_split(func, registers)}))
    pad_gemm_columns(sch, stats, registers)
    padded = sch.mod["main"]
    folded = fold_rows.fold_leading_dims(padded)
    stats.folded_rows = folded is not padded
    return folded


def _concats_split(func, registers: RegisterFile):
    """`func` with each Concat block split where its sources meet (concat_blocks), simplified."""
    return ieee_order.simplify(concat_blocks.split_by_source(func, lambda dtype: _lanes(dtype, registers)))


def _padded_columns(block, registers: RegisterFile) -> int | None:
    """The padded column count of a GEMM block pad_gemm_columns pads, else None (not a matrix
    product: a padded row reduction computed wrong on 4-lane targets)."""
    if not _is_matrix_product(block):
        return None
    extents = [_static(iv.dom.extent) for iv in block.iter_vars]
    cols, k = extents[-2], extents[-1]
    if cols is None or k is None:
        return None
    return gemm_shapes.padded_columns(cols, k, _lanes(_block_dtype(block), registers))


def widen_padded_gemms(sch):
    """compute_at bounds a GEMM under the row tile by what its consumers read, which shrinks a
    padded GEMM's column loop back to N. Every padded column is still valid to compute (zero
    weights, a result buffer N' wide), so that loop is given back its padded extent here, where
    TVM's primitives cannot extend a loop. Returns the schedule (a new one if anything changed)."""
    widen = {}
    for block_rv in tir_walk.leaf_blocks(sch):
        block = sch.get(block_rv)
        padded = block.annotations.get(PADDED_COLUMNS)
        loops = _own_loops(sch, block_rv)
        if padded is None or len(loops) != len(block.iter_vars):
            continue
        column = sch.get(loops[-2])
        binding = _sblock_realize(sch, block_rv).iter_values[-2]
        if binding.same_as(column.loop_var) and _static(column.min) == 0 and _static(column.extent) != int(padded):
            widen[column.loop_var] = int(padded)
    if not widen:
        return sch

    def widened(loop):
        extent = next((e for var, e in widen.items() if var.same_as(loop.loop_var)), None)
        if extent is None:
            return loop
        return tvm.tirx.For(loop.loop_var, loop.min, tvm.tirx.IntImm(loop.extent.ty.dtype, extent), loop.kind,
                            loop.body, loop.thread_binding, loop.annotations)

    func = tvm_ffi.structural_map(sch.mod["main"], [(tvm.tirx.For, widened)], order="post")
    return s_tir.Schedule(tvm.IRModule({"main": func}))


def schedule_matmul(sch, stats: ScheduleStats, block_rv, registers: RegisterFile) -> bool:
    """A register-blocked micro-kernel for C[i, j] += A[i, k] * B[k, j]:

        for j_o, i_o:                      # one tile of rows x (vectors x lanes) outputs (_tile_loop_order)
            acc[rows, vectors*lanes] = 0   # a "local" cache: LLVM keeps it in registers
            for k:                         # reduction outside the vector lanes
                for r in unroll(rows), v in unroll(vectors): acc[r, v] += A[i, k] * B[k, v] (vector FMA)
            C[tile] = acc

    The accumulator must be a small static local buffer: accumulating straight into the
    (workspace) output makes LLVM load and store it around every FMA, since it cannot prove
    that the output does not alias A or B. K may be symbolic (attention's probabilities @ V sum
    over the sequence): the k loop is a plain loop either way, and each output's multiply-adds
    still run in k order. Returns False (schedule unchanged) if not applicable."""
    block = sch.get(block_rv)
    name = block.name_hint
    loops = _own_loops(sch, block_rv)
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    if len(loops) != len(kinds) or kinds[-1] != COMM_REDUCE or kinds.count(COMM_REDUCE) != 1:
        return False
    spatial, k_loop = loops[:-1], loops[-1]
    lanes = _lanes(_block_dtype(block), registers)
    cols = _static(sch.get(spatial[-1]).extent)
    if cols is None or cols % lanes != 0:
        return False
    row_extent = _static(sch.get(spatial[-2]).extent)
    clamped = row_extent is None and _rows_at_root(sch, block_rv, spatial)
    rows, vectors = gemm_shapes.register_tile(gemm_shapes.CLAMPED_ROWS if clamped else row_extent, cols // lanes,
                                              registers)
    col_parts = _split(sch, stats, spatial[-1], [None, vectors, lanes], f"split cols {name}")
    if col_parts is None:
        return False
    row_parts = _split(sch, stats, spatial[-2], [None, rows], f"split rows {name}")
    if row_parts is None:
        return False
    if clamped and rows > 1 and _try(stats, f"annotate {name}",
                                     lambda: sch.annotate(block_rv, clamped_tail.ROWS_PAST_BOUND, 1)):
        stats.clamped_row_blocks += 1
    outer = _tile_loop_order(list(spatial[:-2]), row_parts[0], col_parts[0])
    tile = outer[-1]
    if not _try(stats, f"reorder {name}", lambda: sch.reorder(*outer, k_loop, row_parts[1], col_parts[1], col_parts[2])):
        return False
    stats.column_blocks_first += int(tile is row_parts[0])
    holder = {}
    writeback = _register_tile_write_back(sch, stats, block_rv, tile)
    if writeback is not None:
        vectorize_elementwise(sch, stats, writeback, registers)
        last_result = writeback
        if gemm_blocks.is_blocks_sum(block):
            last_result, tile = _tail_per_register_tile(sch, stats, block_rv, writeback, tile) or (writeback, tile)
        else:
            last_result, tile = _sum_per_register_tile(sch, stats, block_rv, writeback, tile) or (writeback, tile)
        chain = PADDED_COLUMNS not in block.annotations and cols > lanes and not _other_products(sch, block)
        column_blocks = cols // (vectors * lanes)
        epilogue_per_register_tile(sch, stats, last_result, tile, chain=chain,
                                   polynomials=column_blocks <= POLYNOMIAL_CHAIN_COLUMN_BLOCKS,
                                   inline_write_back=PADDED_COLUMNS not in block.annotations)
    sums = gemm_blocks.block_sums_of(sch, block_rv)
    if sums is not None:
        _block_sums_per_register_tile(sch, stats, sums, tile, lanes)
    stats.reductions_scheduled += 1
    stats.register_tiles += 1
    if _try(stats, f"vectorize {name}", lambda: sch.vectorize(col_parts[2])):
        stats.vectorized += 1
    _try(stats, f"unroll {name}", lambda: sch.unroll(col_parts[1]))
    _try(stats, f"unroll {name}", lambda: sch.unroll(row_parts[1]))
    if _try(stats, f"decompose {name}", lambda: holder.update(init=sch.decompose_reduction(block_rv, k_loop))):
        init_loops = sch.get_loops(holder["init"])
        if init_loops and sch.get(init_loops[-1]).kind != tvm.tirx.ForKind.VECTORIZED:
            _try(stats, f"vectorize init {name}", lambda: sch.vectorize(init_loops[-1]))
    return True


def _rows_at_root(sch, block_rv, spatial) -> bool:
    """Whether a GEMM's row loop is the outermost loop of its nest (materialized at the root, not
    under a row tile): `[10*batch, 32] @ [32, 32]` feeding a transpose no row tile can follow.
    Its symbolic rows then split into register-tile blocks whose last one computes past the rows
    (clamped_tail.register_tiles_past_rows) instead of one row at a time."""
    loops = sch.get_loops(block_rv)
    return len(spatial) == 2 and bool(loops) and sch.get(loops[0]).same_as(sch.get(spatial[0]))


def _register_tile_write_back(sch, stats: ScheduleStats, block_rv, tile_loop):
    """The block that stores each register tile from its local cache, under the tile loop (None
    if TVM refused)."""
    name = sch.get(block_rv).name_hint
    holder = {}
    if not _try(stats, f"cache_write {name}", lambda: holder.update(wb=sch.cache_write(block_rv, 0, "local"))):
        return None
    if not _try(stats, f"reverse_compute_at {name}",
                lambda: sch.reverse_compute_at(holder["wb"], tile_loop, preserve_unit_loops=True)):
        return None
    return holder["wb"]


def _block_sums_per_register_tile(sch, stats: ScheduleStats, sums_rv, tile_loop, lanes: int) -> None:
    """Every k block's sums of a blocked product (gemm_blocks) for one register tile, computed
    under the tile loop before their sum: per block, the register tile's FMAs (k outside the
    unrolled rows and column vectors) from zero, then a store of the tile. Computed under the
    sum's own loop over blocks instead, LLVM kept the sum's accumulators in registers across
    the k loop too (48 vectors of 32) and spilled the block sums' there: the serial kernel of
    `[N, 768] @ [768, 64]` ran at half onnxruntime's speed at batch 64."""
    name = sch.get(sums_rv).name_hint
    if not _try(stats, f"compute_at {name}", lambda: sch.compute_at(sums_rv, tile_loop, preserve_unit_loops=True)):
        return
    *rows, block, column, k = _own_loops(sch, sums_rv)
    parts = _split(sch, stats, column, [None, lanes], f"split cols {name}")
    if parts is None or not _try(stats, f"reorder {name}", lambda: sch.reorder(block, k, *rows, *parts)):
        return
    _try(stats, f"vectorize {name}", lambda: sch.vectorize(parts[1]))
    for row_or_vector in [*rows, parts[0]]:
        _try(stats, f"unroll {name}", lambda: sch.unroll(row_or_vector))
    holder = {}
    if _try(stats, f"decompose {name}", lambda: holder.update(init=sch.decompose_reduction(sums_rv, k))):
        init_loops = sch.get_loops(holder["init"])
        if sch.get(init_loops[-1]).kind != tvm.tirx.ForKind.VECTORIZED:
            _try(stats, f"vectorize init {name}", lambda: sch.vectorize(init_loops[-1]))


def _tail_per_register_tile(sch, stats: ScheduleStats, block_rv, writeback, tile_loop):
    """A blocked product with a ragged last block (gemm_blocks): that block's sums, a small GEMM
    of their own over the same register tiles, run in the same tile loops, so the add of them
    follows each register tile like the product's other readers (_add_per_merged_tile).
    Returns the add and the merged tile loop where the add follows the register tiles, else None."""
    add = next((c for c in sch.get_consumers(writeback) if gemm_blocks.is_with_tail(sch.get(c))), None)
    if add is None:
        return None
    tails = [p for p in sch.get_producers(add) if gemm_blocks.is_tail_sum(sch.get(p)) or
             any(gemm_blocks.is_tail_sum(sch.get(q)) for q in sch.get_producers(p))]
    if len(tails) != 1:
        return None
    return _add_per_merged_tile(sch, stats, add, writeback, block_rv, tails[0], tile_loop)


def _is_tile_write_back(block) -> bool:
    """Whether the block stores a register tile from its local cache (_register_tile_write_back)."""
    return (len(block.reads) == 1 and block.reads[0].source.scope() == "local"
            and block.writes[0].source.scope() != "local")


def _sum_per_register_tile(sch, stats: ScheduleStats, block_rv, writeback, tile_loop):
    """Two products summed elementwise (a recurrent cell's `X W + H R`, then its bias): the
    product scheduled first is computed for the same register tile just before this one, so the
    sum runs on the two tiles just computed instead of as a pass over the row tile
    (_add_per_merged_tile). Returns the sum and the merged tile loop, else None."""
    def other_tile(block):
        return _is_tile_write_back(sch.get(block)) and not sch.get(block).same_as(sch.get(writeback))
    add = next((c for c in sch.get_consumers(writeback) if any(other_tile(p) for p in sch.get_producers(c))), None)
    if add is None:
        return None
    other = next(p for p in sch.get_producers(add) if other_tile(p))
    results = [sch.get(writeback).writes[0].source, sch.get(other).writes[0].source]
    if not _reads_tile_results_only(sch, add, results):
        return None
    return _add_per_merged_tile(sch, stats, add, writeback, writeback, other, tile_loop)


def _add_per_merged_tile(sch, stats: ScheduleStats, add, writeback, block_rv, other_rv, tile_loop):
    """`add`, which reads the register tiles of two loop nests (block_rv's, under tile_loop, and
    other_rv's), moved right after them, with the write-back it reads inlined into it (it adds
    the accumulators still in registers). TVM moves a block under a loop only with all its
    producers there (and a producer only with its consumers), so the two nests are merged level
    by level first, from where they part down to the register tile; where their extents differ
    nothing is merged and the add stays per row tile. Returns the add and the merged tile loop,
    else None."""
    name = sch.get(add).name_hint
    own, theirs = list(sch.get_loops(block_rv)), list(sch.get_loops(other_rv))
    depth = next((d for d, (a, b) in enumerate(zip(own, theirs)) if not sch.get(a).same_as(sch.get(b))), None)
    last = next((d for d, loop in enumerate(own) if sch.get(loop).same_as(sch.get(tile_loop))), None)
    if depth is None or last is None or len(theirs) <= last or depth > last:
        return None
    if any(_static(sch.get(own[d]).extent) != _static(sch.get(theirs[d]).extent) for d in range(depth, last + 1)):
        return None
    for d in range(depth, last + 1):
        if not _try(stats, f"merge tile loops {name}", lambda: sch.merge(theirs[d], own[d])):
            return None
        own, theirs = list(sch.get_loops(block_rv)), list(sch.get_loops(other_rv))
    if not _try(stats, f"epilogue per register tile {name}",
                lambda: sch.reverse_compute_at(add, own[last], preserve_unit_loops=True)):
        return None
    stats.epilogues_per_tile += 1
    _try(stats, f"inline {sch.get(writeback).name_hint}", lambda: sch.compute_inline(writeback))
    return add, own[last]


def _tile_loop_order(leading: list, row_blocks, column_blocks) -> list:
    """The loops over a row tile's register tiles, outermost first; the last one holds a register
    tile (its accumulators are written back under it). A GEMM whose rows come from one loop (an
    [N, K] @ [K, M] cell) runs column blocks outermost: each K x (vectors x lanes) block of
    weights is then read for every row block of the tile while it is in L1, instead of the whole
    weight matrix once per row block. Measured, paired rounds against the rows-first build:
    lstm_gate 1.28x -> 1.36x onnxruntime at batch 64, 1.34x -> 1.43x at 1,000; the transformer
    MLP ([N, 8, 64], rows from two loops) lost 3-9% at batch 1,000 that way (5 runs), so it
    keeps rows first."""
    return [*leading, row_blocks, column_blocks] if leading else [column_blocks, row_blocks]


POLYNOMIAL_CHAIN_COLUMN_BLOCKS = 2  # see epilogue_per_register_tile


def _computes_polynomial(block) -> bool:
    """Whether the block evaluates a polynomial (Exp, Tanh, Sigmoid, Erf: multiply-adds of
    broadcast constants, which hold vector registers wherever the block runs)."""
    return "llvm.fmuladd" in str(block.body)


def epilogue_per_register_tile(sch, stats: ScheduleStats, writeback, tile_loop, chain: bool = True,
                               polynomials: bool = True, inline_write_back: bool = True) -> None:
    """The elementwise ops after a GEMM (its bias Add, an activation, a head Transpose) run right
    after each register tile is written back, on the rows x columns just stored, instead of over
    the whole row tile once all its column blocks are done: the few KB just stored are re-read
    at once, from L1. An op follows when it reads the tile's results (the write-back's and those
    of the ops moved before it) at one place each and otherwise the kernel's inputs: a bias Add,
    then a GELU's Div, then the Mul that reads both. A reader of several column blocks (a gate
    cell's Split parts) needs more than one tile: TVM refuses the move.

    Measured, paired rounds against onnxruntime: MatMul + Add by [64, 64] weights on [N, 16, 64]
    1.18x -> 1.30x at batch 64, 1.26x -> 1.84x at 1,000 (the bias per tile); the GRU cell 1.33x
    -> 1.40x at 64; conv_block's bias, residual Add and Relu 1.32x -> 1.47x at 64, 1.20x -> 1.44x
    at 1,000. With the bias alone per tile and the activation once per row tile, LLVM kept 8 of
    the second column block's 24 accumulators on the stack: `[N, 784] @ [784, 128] + b -> Tanh`
    ran 0.75x onnxruntime at batch 64, 1.02x with the chain (GELU 0.48x -> 0.94x).

    chain=False moves the first reader only. schedule_matmul asks for that where the GEMM's
    columns are padded (pad_gemm_columns: its readers are predicated on the real columns, and
    with a second one per tile the x86-64-v3 build of `[N, 16, 128] @ [128, 20] -> Relu` failed
    in TVM, "mismatched types. int32 vs. int64"), where they fill one vector (4 x 1-vector tiles:
    `[N, 16] @ [16, 16] -> Relu` at 1,000 rows 1.24x -> 1.07x with the chain) and where the
    kernel has another matrix product (BERT's FFN, its GELU per tile of the first GEMM: the
    exported bert_tiny_2l_ts 1.62-1.69x -> 1.44-1.54x at batch 1; not understood). polynomials=
    False keeps a polynomial (Tanh, Sigmoid, a GELU's Erf) out of the chain after the first
    reader: past POLYNOMIAL_CHAIN_COLUMN_BLOCKS column blocks the polynomial per tile shares the
    column-block loop with the next block's k loop, and `[N, 256] @ [256, 384]` + GELU (6 blocks)
    lost 2-4%.

    The write-back, when the first reader is its only one, is inlined into it: that reader adds
    the bias to the accumulators still in registers and stores once. Paired rounds, old/new, at
    batch 64 / 1,000: gru_cell 1.040 / 1.047, transformer_mlp 1.015 / 1.027, conv_block 1.008 /
    1.019. inline_write_back=False keeps it where the GEMM's columns are padded: an epilogue
    reading the padded accumulators lost its narrower tail vector (vectorize_with_tail)."""
    moved = [writeback]
    while True:
        tile_blocks = [sch.get(b) for b in moved]
        results = [block.writes[0].source for block in tile_blocks]
        consumers = ({sch.get(c).name_hint for b in moved for c in sch.get_consumers(b)}
                     - {block.name_hint for block in tile_blocks})
        any_op = polynomials or len(moved) == 1  # the first reader may be a polynomial either way
        reader = next((c for c in _blocks(sch)  # in program order: a reader after what it reads
                       if sch.get(c).name_hint in consumers and _reads_tile_results_only(sch, c, results)
                       and (any_op or not _computes_polynomial(sch.get(c)))), None)
        if reader is None or not _covers_one_tile(sch, stats, reader, tile_loop):
            break
        if not _try(stats, f"epilogue per register tile {sch.get(reader).name_hint}",
                    lambda: sch.reverse_compute_at(reader, tile_loop, preserve_unit_loops=True)):
            break
        stats.epilogues_per_tile += 1
        moved.append(reader)
        if not chain:
            break
    if inline_write_back and len(moved) > 1 and len(sch.get_consumers(writeback)) == 1 \
            and _is_tile_write_back(sch.get(writeback)):
        _try(stats, f"inline {sch.get(writeback).name_hint}", lambda: sch.compute_inline(writeback))


def _covers_one_tile(sch, stats: ScheduleStats, reader_rv, tile_loop) -> bool:
    """Whether the reader, moved under the register tile, loops over extents free of the
    kernel's symbolic dims: about the tile's rows and columns. A reader whose index divides the
    row by the batch (the Reshape of a [seq, N, ...] Transpose to [seq * N, ...]) was given the
    bounding range of rows it reads, spread over N, under a predicate that let it read rows no
    tile had computed yet: wrong values from batch 8 on (verify caught it). A Reshape of the
    rows by a static seq (tf2onnx's [N * 16, 64] -> [N, 16, 64]) gets extents in the loop
    variables only, and stays per tile. A Reshape that splits the columns into rows no column
    block divides (`[N, 192] -> [N, 2, 96]` under blocks of 64) takes the end of one row and the
    start of the next per tile, a region TVM boxed wrongly (its extents a floor-modulo of the
    block's first column): elements no tile wrote (tests/test_tile_regions.py). Such a reader
    stays per row tile."""
    below = _loops_below_after(sch, reader_rv, tile_loop,
                               lambda trial: trial.reverse_compute_at(reader_rv, tile_loop, preserve_unit_loops=True))
    symbols = tir_walk.shape_vars(sch.mod["main"])
    wraps = below is not None and any(isinstance(node, tvm.tirx.FloorMod) for loop in below
                                      for node in tir_walk.iter_nodes(loop.extent))
    if below is None or not (wraps or any(tir_walk.uses_var(loop.extent, v) for loop in below for v in symbols)):
        return True
    stats.skipped_steps.append(f"epilogue per register tile {sch.get(reader_rv).name_hint}: not one tile's region")
    return False


def _other_products(sch, block) -> bool:
    """Whether the kernel has a matrix product besides `block`'s."""
    return any(_is_matrix_product(sch.get(b)) and sch.get(b).name_hint != block.name_hint
               and not gemm_blocks.is_tail_sum(sch.get(b)) for b in _blocks(sch))  # part of a blocked product


def _reads_tile_results_only(sch, reader_rv, results) -> bool:
    """The reader stores one value that loads the tile's results (`results`, buffers) at one
    place (however often) and otherwise reads the kernel's inputs only."""
    reader = sch.get(reader_rv)
    value = getattr(reader.body, "value", None)
    if reader.init is not None or value is None:
        return False
    inputs = _kernel_params(sch)
    places = []
    for load in tir_walk.iter_loads(value):
        if any(load.source.same_as(buffer) for buffer in results):
            places.append(load.indices)
        elif load.source.name not in inputs:
            return False
    return bool(places) and all(tvm_ffi.structural_equal(list(p), list(places[0])) for p in places)


_sblock_realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")


def _loop_kinds(sch, block_rv, loops) -> list[int]:
    """COMM_REDUCE for each loop that a reduction iter var of the block is bound to, else
    DATA_PAR. Read from the bindings, since rfactor and compute_at leave loops in another order
    than the iter vars."""
    block = sch.get(block_rv)
    bindings = _sblock_realize(sch, block_rv).iter_values
    reduce_bindings = [b for iv, b in zip(block.iter_vars, bindings) if int(iv.iter_type) == COMM_REDUCE]
    return [COMM_REDUCE if any(tir_walk.uses_var(b, sch.get(lp).loop_var) for b in reduce_bindings) else DATA_PAR
            for lp in loops]


def _contiguous_loop(sch, block_rv, loops):
    """Among `loops`, the innermost one bound to the iter var that indexes the last dimension
    of the block's output (its contiguous one), or None: what a reduction vectorizes over."""
    block = sch.get(block_rv)
    if not block.writes:
        return None
    last = block.writes[0].region[-1].min
    bindings = _sblock_realize(sch, block_rv).iter_values
    binding = next((b for iv, b in zip(block.iter_vars, bindings) if last.same_as(iv.var)), None)
    if binding is None:
        return None
    bound = [lp for lp in loops if tir_walk.uses_var(binding, sch.get(lp).loop_var)]
    return bound[-1] if bound else None


def schedule_reduction(sch, stats: ScheduleStats, block_rv, registers: RegisterFile) -> None:
    """Moves the reduction loops outside the (vectorized) contiguous output loop:
    C[i, j:j+V] += A[i,k] * B[k, j:j+V]."""
    block = sch.get(block_rv)
    name = block.name_hint
    loops = _own_loops(sch, block_rv)
    if len(loops) != len(block.iter_vars):
        return
    if conv_schedule.is_block_sums(block) or gemm_blocks.is_block_sums(block):
        return  # scheduled with the sum of its blocks, under that block's register tile
    tile = conv_schedule.schedule_direct_conv(sch, block_rv, loops, registers, lambda what, step: _try(stats, what, step))
    if tile is not None:
        stats.reductions_scheduled += 1
        stats.register_tiles += 1
        if tile.writeback is not None:
            epilogue_per_register_tile(sch, stats, tile.writeback, tile.loop)
        return
    if _is_matmul_like(block) and schedule_matmul(sch, stats, block_rv, registers):
        return
    kinds = _loop_kinds(sch, block_rv, loops)
    reduce = [lp for lp, kind in zip(loops, kinds) if kind == COMM_REDUCE]
    contiguous = _contiguous_loop(sch, block_rv, loops)
    if contiguous is not None and kinds[loops.index(contiguous)] != DATA_PAR:
        contiguous = None
    spatial = [lp for lp, kind in zip(loops, kinds) if kind == DATA_PAR and lp != contiguous]
    if not reduce:
        return
    lanes = _lanes(_block_dtype(block), registers)
    extent = _static(sch.get(contiguous).extent) if contiguous is not None else None
    holder = {}
    vector_loop = None
    if extent is not None and extent >= lanes and extent % lanes == 0:
        if _try(stats, f"split {name}", lambda: holder.update(cols=sch.split(contiguous, [None, lanes]))):
            col_outer, vector_loop = holder["cols"]
            spatial.append(col_outer)
    elif extent is not None and 1 < extent <= lanes:
        vector_loop = contiguous
    elif contiguous is not None:
        spatial.append(contiguous)
    order = spatial + reduce + ([vector_loop] if vector_loop is not None else [])
    in_order = [sch.get(lp) for lp in order] == [sch.get(lp) for lp in _own_loops(sch, block_rv)]
    if not in_order and not _try(stats, f"reorder {name}", lambda: sch.reorder(*order)):
        return
    stats.reductions_scheduled += 1
    if vector_loop is None:
        return
    # Vectorize before decomposing: without its init the update block is neither "complete" nor
    # a "reduction block", and TVM then refuses to vectorize any loop around it.
    if _try(stats, f"vectorize {name}", lambda: sch.vectorize(vector_loop)):
        stats.vectorized += 1
    if not _try(stats, f"decompose {name}", lambda: holder.update(init=sch.decompose_reduction(block_rv, reduce[0]))):
        return
    init_loops = sch.get_loops(holder["init"])
    if init_loops and sch.get(init_loops[-1]).kind != tvm.tirx.ForKind.VECTORIZED:
        _try(stats, f"vectorize init {name}", lambda: sch.vectorize(init_loops[-1]))


def _reads_rows(block, reduce_var) -> bool:
    """Whether the block reduces along rows: its innermost reduction var indexes the last (the
    contiguous) dimension of a buffer it reads, and the last dimension of its output indexes no
    read's last dimension, so there are no contiguous output columns to vectorize over."""
    def last_index(region):
        return region.region[-1].min if len(region.region) else None

    out_last = last_index(block.writes[0]) if block.writes else None
    read_lasts = [last_index(r) for r in block.reads]
    along_rows = any(i is not None and i.same_as(reduce_var) for i in read_lasts)
    columns = out_last is not None and any(i is not None and i.same_as(out_last) for i in read_lasts)
    return along_rows and not columns


def factor_row_reductions(sch, stats: ScheduleStats, registers: RegisterFile) -> list[tuple[str, str]]:
    """A reduction whose output has no contiguous columns to vectorize over (a row sum, mean or
    max over the last axis) is split in vector lanes instead: `rfactor` makes `lanes` partial
    results, each accumulated over every lanes-th element of the row (a vector op per step),
    then a short sum of the lanes. Returns (partial sums, final sum) block names.

    Done before row tiling: the final sum then keeps the tile's `row < N` predicate (rfactor
    drops a predicate that is already there, which let a ragged tail write past the output)."""
    factored = []
    for block_rv in tir_walk.leaf_blocks(sch):
        block = sch.get(block_rv)
        if not tir_walk.is_reduction(block) or len(block.writes) > 1:
            continue  # a reduction of several values (Welford's update, layer_norm.py) depends on its order
        loops = _own_loops(sch, block_rv)
        if len(loops) != len(block.iter_vars) or _loop_kinds(sch, block_rv, loops)[-1] != COMM_REDUCE:
            continue
        if not _reads_rows(block, block.iter_vars[-1].var) or gemm_blocks.is_stage(block) or row_sums.is_stage(block):
            continue  # schedule_reduction vectorizes over the output's columns instead
        extent = _static(sch.get(loops[-1]).extent)
        lanes = _lanes_dividing(extent, _lanes(_block_dtype(block), registers)) if extent else 0
        if not lanes or extent < 2 * lanes:
            continue
        name = block.name_hint
        parts = _split(sch, stats, loops[-1], [None, lanes], f"split reduction {name}")
        holder = {}
        factor = lambda: holder.update(rf=sch.rfactor(parts[1], len(block.writes[0].region)))
        if parts is not None and _try(stats, f"rfactor {name}", factor):
            stats.reductions_factored += 1
            factored.append((sch.get(holder["rf"]).name_hint, name))
    return factored


def nest_partial_sums(sch, stats: ScheduleStats, factored: list[tuple[str, str]]) -> None:
    """Computes each row's partial sums right before the final sum that reads them (under its
    last spatial loop): one vector accumulator per row. Left beside the final sum at the row
    tile, TVM does not shrink their buffer to the tile when the batch is symbolic: every tile
    then allocated the whole batch's partial sums."""
    for partial, final in factored:
        rf, final_rv = sch.get_sblock(partial), sch.get_sblock(final)
        loops = _own_loops(sch, final_rv)
        kinds = _loop_kinds(sch, final_rv, loops)
        spatial = [lp for lp, kind in zip(loops, kinds) if kind == DATA_PAR]
        lanes = [lp for lp, kind in zip(loops, kinds) if kind == COMM_REDUCE]
        if not spatial or not lanes:
            continue
        # compute_at may have put the lane loop outside the row loops: lanes innermost first.
        if kinds != sorted(kinds) and not _try(stats, f"reorder {final}", lambda: sch.reorder(*spatial, *lanes)):
            continue
        _try(stats, f"compute_at {partial}", lambda: sch.compute_at(rf, spatial[-1], preserve_unit_loops=True))


def schedule_loop_nests(sch, stats: ScheduleStats, registers: RegisterFile, done: frozenset[str] = frozenset()) -> None:
    """Schedules each leaf block's own loops, except the blocks named in `done`."""
    gemm_results = [sch.get(b).writes[0].source for b in tir_walk.leaf_blocks(sch)
                    if _is_matrix_product(sch.get(b))]
    ragged_rows = stats.tile_rows if stats.symbolic_rows and stats.tile_rows > 1 else 0
    for block_rv in tir_walk.leaf_blocks(sch):
        block = sch.get(block_rv)
        if block.name_hint in done or _kept_at_root(block):
            continue  # a padded weight copy stays scalar: vectorized across its rows it gathers
        if conv_schedule.is_conv_window(sch, block_rv):
            continue  # its own loops (fused and split by the vector, its bounds test ran per element)
        if tir_walk.is_reduction(block):
            schedule_reduction(sch, stats, block_rv, registers)
        elif block.body is not None and hasattr(block.body, "value"):
            vectorize_elementwise(sch, stats, block_rv, registers, gemm_results, ragged_rows)


# ---------------------------------------------------------------- entry point


def schedule_group(func, allow_parallel: bool = True, max_duplication: int = DEFAULT_MAX_DUPLICATION,
                   small_batch: bool = False, registers: RegisterFile = AVX512) -> tuple[tvm.tirx.PrimFunc, ScheduleStats]:
    """Schedules the fused PrimFunc for CPU; never fails on a refused step (see module doc).

    allow_parallel=False gives the same schedule with a serial tile loop. The compiler does not
    ask for it: host_kernel.serial_loops derives it from the parallel schedule without scheduling
    again (test_host_kernel.py checks the two are equal). small_batch=True gives the variant for
    small batches (one row per tile, serial; see needs_small_batch_variant, small_batch_below).
    registers: the target's vector registers, which size the GEMM register tile and every vector
    loop (register_file)."""
    stats = ScheduleStats()
    func = fold_rows.exact_row_indices(func)  # folded or not: a Reshape's reads at [b, s], not via // seq
    unscheduled = s_tir.Schedule(tvm.IRModule({"main": func}))
    blocks = [unscheduled.get(block_rv) for block_rv in _blocks(unscheduled)]
    registers = _for_polynomial_epilogue(blocks, registers)
    if _pads_columns(blocks, registers):
        func = _padded_then_folded(func, stats, registers)
    else:
        folded = fold_rows.fold_leading_dims(func)
        stats.folded_rows = folded is not func
        func = _concats_split(folded, registers)
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    stats.blocks = len(_blocks(sch))
    stats.row_work = row_work(sch)
    widest_row = row_elements(sch)
    inline_cheap_producers(sch, stats, max_duplication)
    stats.gather_chain = tree_schedule.is_gather_chain(sch)
    separate_read_outputs(sch, stats)
    factored = factor_row_reductions(sch, stats, registers)
    tiled = tile_rows(sch, stats, widest_row, small_batch, registers)
    if tiled is not None:
        anchors, outer, batch = tiled
        row_tile = sch.get(outer).loop_var  # the schedule's loop handles do not outlive widen_padded_gemms
        compute_under_tile(sch, stats, anchors, outer)
        # Let LoopPartition peel the ragged last tile: full tiles then run without the per-row
        # `row < N` predicates that compute_at adds (they force every accumulator through memory).
        _try(stats, "partition hint", lambda: sch.annotate(outer, "pragma_loop_partition_hint", 1))
        total = (batch or 0) * widest_row
        # Parallel before decompose_reduction: TVM refuses to parallelize over a bare update block.
        if allow_parallel and not small_batch and (batch is None or total >= PARALLEL_MIN_ELEMENTS):
            if _try(stats, "parallel tiles", lambda: sch.parallel(outer)):
                stats.parallel = True
    level_loops = tree_schedule.fuse_level_loops(sch) if tiled is not None and stats.gather_chain else frozenset()
    sch = widen_padded_gemms(sch)
    nest_partial_sums(sch, stats, factored)
    # A row's final sum of the lanes is short and already in place around its partial sums.
    schedule_loop_nests(sch, stats, registers, done=frozenset(final for _, final in factored) | level_loops)
    gemm_tiled = tiled is not None and stats.gemm_sized_tiles
    if gemm_tiled:
        hint_tail_partition(sch, stats)
    func = sch.mod["main"]
    if gemm_tiled and stats.symbolic_rows and not stats.gather_chain:
        func, stats.unpredicated_blocks = clamped_tail.unpredicated_tail(func, row_tile, stats.tile_rows)
    if tiled is not None and stats.symbolic_rows and not stats.gather_chain:
        func, stats.tile_sized_blocks = clamped_tail.tile_sized_buffers(func, row_tile, stats.tile_rows)
    if stats.clamped_row_blocks:
        func = clamped_tail.register_tiles_past_rows(func)
    return fold_rows.exact_load_indices(func), stats  # inlining joined Reshapes' reads into new ones


def needs_small_batch_variant(stats: ScheduleStats) -> bool:
    """A GEMM group over a symbolic batch gets a second kernel for small batches (small_batch_below).

    Its row tiles hold gemm_tile_rows rows, so a smaller batch runs one whole tile (clamped_tail;
    before it, a tail tile whose per-row predicates kept the accumulators in memory). One row per
    tile takes 16 accumulators in registers and costs a row at a time (LSTM cell at batch 1: 3.1 us
    -> 1.3 us), but streams the weights once per row, which halves large-batch speed; so the
    runtime picks the variant by batch. A gather chain (a tree walk) gets one whatever its tile:
    one row per tile walks the trees without a ragged tile's predicates (tree_schedule)."""
    return stats.symbolic_rows and (stats.gemm_sized_tiles or stats.gather_chain)


def small_batch_below(stats: ScheduleStats, tile_rows: int | None = None) -> int:
    """The batch below which the runtime calls the small-batch variant (0: the kernel has none);
    `tile_rows`: another level's row tile for the same kernel (small_batch_below_for_level).

    The main kernel computes whole row tiles (clamped_tail), so below one tile it costs about one
    tile whatever the batch, while the variant's cost grows by a row at a time. Measured on the
    bundled cells (paired rounds, the main kernel forced at every batch against the variant):
    with 6-row tiles (AVX-512) the two cross between batch 3 and 4 (`lstm_cell` 5.9 / 7.0 us for
    the variant at 3 / 4 rows, the main kernel 6.5 us at both; at 6 rows 8.8 against 6.6 us), with
    8-row tiles (the AVX2 level on the same CPU) between 5 and 6. A register-tiled GEMM group
    thus switches at its tile's rows minus RAGGED_TILE_SLACK. Other groups keep SMALL_BATCH_ROWS:
    a gather chain's variant also saves its predicates (tree_schedule), and a tile without a
    GEMM reuses no weights across its rows, so computing past the batch buys nothing there."""
    if not needs_small_batch_variant(stats):
        return 0
    if stats.gather_chain or not stats.register_tiles:
        return SMALL_BATCH_ROWS
    return max(1, (tile_rows or stats.tile_rows) - RAGGED_TILE_SLACK)


def small_batch_below_for_level(best: ScheduleStats, best_registers: RegisterFile, registers: RegisterFile) -> int:
    """small_batch_below of another ISA level's schedule of the same kernel, from the best level's
    stats, without scheduling again (a lower level may be scheduled in a forked child, which
    reports nothing back; scheduling it twice cost 12% more compile time on the corpus). Its row
    tile differs only where the best level's was the GEMM-filled one (gemm_tile_rows): columns
    that fill the widest register tile fill every narrower one, so that level takes its own
    gemm_tile_rows there; any other tile (a narrow GEMM's GEMM_TILE_ROWS) is the same at every
    level. tests/test_gemm_schedule.py checks this against each level's real schedule."""
    return small_batch_below(best, tile_rows_for_level(best, best_registers, registers))


def tile_rows_for_level(best: ScheduleStats, best_registers: RegisterFile, registers: RegisterFile) -> int:
    """The row tile another ISA level's schedule of the same kernel takes (see
    small_batch_below_for_level)."""
    filled = best.tile_rows == gemm_tile_rows(best_registers)
    return gemm_tile_rows(registers) if filled else best.tile_rows


def needs_serial_variant(stats: ScheduleStats) -> bool:
    """A kernel whose row-tile loop runs in parallel over a symbolic batch gets a second function
    with that loop serial, for the calls the runtime makes without onnxruntime's pool (a batch
    whose work is not worth waking it, see the runtime's worth_the_pool).

    Without it those calls run the parallel kernel's tasks one after another on the calling
    thread, in code TVM outlined into a closure: there the buffers are loaded from a struct,
    without the noalias and alignment the function's parameters carry. Measured in TVM's runtime
    on one thread, serial vs parallel-compiled: LSTM cell 44.6 vs 47.6 us at batch 64, GRU cell
    535.8 vs 564.4 us at batch 1000, the diamond model 23.8 vs 27.6 us at batch 1000."""
    return stats.parallel and stats.symbolic_rows


def hint_tail_partition(sch, stats: ScheduleStats) -> None:
    """Asks LoopPartition to split every serial loop inside the row tile too. In the ragged last
    tile every block carries a `row < N` predicate; without this its loops would still run the
    whole tile (32 rows of a matmul for one real row: 13 us instead of 2 us at batch 1).
    Partitioning gives a predicate-free part, a short mixed part, and drops the dead part.
    Only for GEMM groups: on a depth-8 tree chain it tripled LLVM time (1.3 s -> 4.5 s). Not
    around an ArgMax/ArgMin (a reduction into two buffers): partitioned, TVM 0.27 made its
    tile write out of bounds (a segfault at every batch of 8 or more)."""
    for block_rv in tir_walk.leaf_blocks(sch):
        if len(sch.get(block_rv).writes) > 1:
            continue
        for loop in list(sch.get_loops(block_rv))[1:]:
            node = sch.get(loop)
            hinted = "pragma_loop_partition_hint" in node.annotations
            if node.kind != tvm.tirx.ForKind.SERIAL or _static(node.extent) in (None, 1) or hinted:
                continue
            _try(stats, "partition hint", lambda: sch.annotate(loop, "pragma_loop_partition_hint", 1))
