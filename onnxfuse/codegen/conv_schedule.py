"""A direct convolution as a register-tiled loop nest, summed in onnxruntime's order.

A stride-1 conv2d block (after its padding block) is

    out[n, k, y, x] += pad[n, c, y + dy, x + dx] * w[k, c, dy, dx]

or, lowered in onnxruntime's channel blocks (conv_blocks), block sums over (dy, dx, c) and their
sum over the blocks. Scheduled as a plain reduction, the accumulators stayed in memory: a ResNet
basic block's Conv kernel took 193 us where onnxruntime's Conv took 13.5 us at batch 1. Here one
register tile holds `channels` output channels x one vector of output columns (x), and every
step of the reduction loads one vector of the padded input and multiplies it by one broadcast
weight per output channel: `channels` FMAs per load, as onnxruntime's blocked (NCHWc) kernel
does. The reduction runs over (dy, dx, c), c innermost, onnxruntime's order within a block; a
blocked conv computes each block's sums for the tile under the final sum's loop over blocks,
in registers of their own. Bit for bit with onnxruntime on AVX-512 (tests/test_conv_schedule.py).

First measured as a prototype (one Conv + Relu, [N, 16, 16, 16], 3x3, 1 thread): 1.58x
onnxruntime's Conv at batch 1, 1.24x at 64, 1.15x at 1,000.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm

from . import tir_walk
from .conv_blocks import BLOCK_SUMS, BLOCKS_SUM
from .register_file import RegisterFile

CONV_ACCUMULATOR_REGISTERS = 8
"""Vector registers left for the input vector, broadcast weights and addresses; the rest hold
accumulators (AVX-512: 24 of 32)."""


def _is_var(expr, var) -> bool:
    return isinstance(expr, tvm.tirx.Var) and expr.same_as(var)


def _are_vars(exprs, variables) -> bool:
    return len(exprs) == len(variables) and all(_is_var(e, v) for e, v in zip(exprs, variables))


def _sum_of_vars(expr, first, second) -> bool:
    """Whether expr is `first + second` (either order), the index of a stride-1 window."""
    return isinstance(expr, tvm.tirx.Add) and (_are_vars([expr.a, expr.b], [first, second])
                                               or _are_vars([expr.a, expr.b], [second, first]))


def _channel_zero_as(indices: list, axis: int, c) -> list:
    """`indices` with a constant 0 at `axis` read as the channel variable `c` (of extent 1)."""
    if len(indices) > axis and tir_walk.static_int(indices[axis]) == 0:
        return [*indices[:axis], c, *indices[axis + 1:]]
    return indices


def direct_conv_axes(block):
    """(n, k, y, x, dy, dx, c) iteration variables of a stride-1, dilation-1 float32 conv2d block
    (conv_blocks' single-block stage) that reads a (padded) NCHW image and OIHW weights, else None."""
    ivs = block.iter_vars
    kinds = [int(iv.iter_type) for iv in ivs]
    if len(ivs) != 7 or kinds != [0, 0, 0, 0, 2, 2, 2] or len(block.reads) != 2 or len(block.writes) != 1:
        return None
    if str(block.writes[0].source.dtype) != "float32":
        return None
    n, k, y, x, dy, dx, c = (iv.var for iv in ivs)
    image, weights = ([r.min for r in region.region] for region in block.reads)
    if tir_walk.static_int(ivs[6].dom.extent) == 1:  # one input channel: read at index 0
        image, weights = _channel_zero_as(image, 1, c), _channel_zero_as(weights, 1, c)
    if not _are_vars([r.min for r in block.writes[0].region], [n, k, y, x]) or not _are_vars(weights, [k, c, dy, dx]):
        return None
    if len(image) != 4 or not _are_vars(image[:2], [n, c]):
        return None
    if not (_sum_of_vars(image[2], y, dy) and _sum_of_vars(image[3], x, dx)):
        return None
    return n, k, y, x, dy, dx, c


def is_conv_window(sch, block_rv) -> bool:
    """Whether the block is the (padded) image a direct convolution reads: kept as a buffer,
    since inlined, its bounds test runs in the convolution's innermost loop (per multiply-add)
    and the convolution's reads no longer have the window form schedule_direct_conv needs."""
    written = sch.get(block_rv).writes
    if len(written) != 1:
        return False
    for consumer in sch.get_consumers(block_rv):
        block = sch.get(consumer)
        if is_conv_stage(block) and block.reads[0].source.same_as(written[0].source):
            return True
    return False


def is_conv_stage(block) -> bool:
    """A stage of conv_blocks' lowering that reads the image: the single-block conv, the block
    sums, and aarch64's im2col-ordered ones (conv_blocks.conv2d_in_k_blocks), which no tiling here
    takes. Inlined into those, the padding's bounds test was vectorized into loads of both
    sides, outside the image: a SIGSEGV on aarch64 for a 32 x 32 image."""
    return block.name_hint.startswith((BLOCK_SUMS, BLOCKS_SUM))


def is_block_sums(block) -> bool:
    """The per-block sums of a conv lowered in channel blocks (conv_blocks): n, b, k, y, x then
    the reduction over the block's channels and the window."""
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    return block.name_hint.startswith(BLOCK_SUMS) and kinds == [0, 0, 0, 0, 0, 2, 2, 2]


def block_sums_of(sch, block_rv):
    """The block-sums block whose results this block adds up (the final sum of conv_blocks), or None."""
    block = sch.get(block_rv)
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    if not block.name_hint.startswith(BLOCKS_SUM) or kinds != [0, 0, 0, 0, 2] or len(block.reads) != 1:
        return None
    producers = [p for p in sch.get_producers(block_rv) if is_block_sums(sch.get(p))]
    return producers[0] if len(producers) == 1 else None


def output_channels_per_tile(channels: int, registers: RegisterFile, vectors: int = 1) -> int:
    """The most output channels (a divisor of `channels`) whose accumulators, `vectors` registers
    each, fit the registers."""
    budget = max(1, (registers.count - CONV_ACCUMULATOR_REGISTERS) // vectors)
    return max(d for d in range(1, min(channels, budget) + 1) if channels % d == 0)


def column_lanes(width: int, lanes: int) -> int | None:
    """Output columns per vector: the whole row when it fits one vector, else the widest divisor
    of the row that fills at least half a vector (26 columns: two vectors of 13), else None."""
    if width <= lanes:
        return width
    fitting = [d for d in range(lanes // 2, lanes + 1) if width % d == 0]
    if fitting:
        return max(fitting)
    two = [d for d in range(lanes + lanes // 2, 2 * lanes + 1) if width % d == 0]
    return max(two) if two else None


@dataclass
class ConvTile:
    """A scheduled convolution: the block that stores a register tile (None if TVM refused the
    local accumulator) and the loop it runs under, once per register tile."""
    writeback: object
    loop: object


def schedule_direct_conv(sch, block_rv, loops, registers: RegisterFile, attempt) -> ConvTile | None:
    """Register-tiles a direct_conv_axes block over its own `loops` (n, k, y, x, dy, dx, c, in
    that order), or the final sum of a blocked one (n, k, y, x, b). `attempt(what, step)` runs
    one schedule step and says whether TVM took it. Returns None with the schedule unchanged
    where the shape does not fit: a symbolic channel or width, or a width wider than a vector
    with no divisor filling half of one (column_lanes)."""
    block = sch.get(block_rv)
    sums = block_sums_of(sch, block_rv)
    if sums is not None and len(loops) == 5:
        n, k, y, x, blocks = loops
        reduction = [blocks]
    elif direct_conv_axes(block) is not None and len(loops) == 7:
        n, k, y, x, dy, dx, c = loops
        reduction = [dy, dx, c]
    else:
        return None
    channels, width = tir_walk.static_int(sch.get(k).extent), tir_walk.static_int(sch.get(x).extent)
    lanes = column_lanes(width, registers.lanes(32)) if width is not None else None
    if channels is None or lanes is None:
        return None
    name = block.name_hint
    tile = output_channels_per_tile(channels, registers, -(-lanes // registers.lanes(32)))
    holder: dict = {}
    if not attempt(f"split channels {name}", lambda: holder.update(k=sch.split(k, [None, tile]))):
        return None
    k_outer, k_inner = holder["k"]
    columns = [x]
    if width > lanes:
        if not attempt(f"split columns {name}", lambda: holder.update(x=sch.split(x, [None, lanes]))):
            return None
        columns = list(holder["x"])
    vector = columns[-1]
    order = [n, k_outer, y, *columns[:-1], *reduction, k_inner, vector]
    if not attempt(f"reorder {name}", lambda: sch.reorder(*order)):
        return None
    tile_loop = order[len(order) - 3 - len(reduction)]  # the last loop outside the reduction
    writeback = None
    if attempt(f"cache_write {name}", lambda: holder.update(wb=sch.cache_write(block_rv, 0, "local"))):
        if attempt(f"reverse_compute_at {name}", lambda: sch.reverse_compute_at(holder["wb"], tile_loop)):
            writeback = holder["wb"]
            attempt(f"vectorize writeback {name}", lambda: sch.vectorize(sch.get_loops(writeback)[-1]))
    if sums is not None:
        _block_sums_in_registers(sch, sums, reduction[0], attempt)
    attempt(f"vectorize {name}", lambda: sch.vectorize(vector))
    attempt(f"unroll {name}", lambda: sch.unroll(k_inner))
    _zero_first(sch, block_rv, reduction[0], attempt)
    return ConvTile(writeback, tile_loop)


def _zero_first(sch, block_rv, loop, attempt) -> None:
    """The accumulators' zeroing as a vectorized block of its own, before the reduction `loop`."""
    name = sch.get(block_rv).name_hint
    holder: dict = {}
    if attempt(f"decompose {name}", lambda: holder.update(init=sch.decompose_reduction(block_rv, loop))):
        init_loops = sch.get_loops(holder["init"])
        if sch.get(init_loops[-1]).kind != tvm.tirx.ForKind.VECTORIZED:
            attempt(f"vectorize init {name}", lambda: sch.vectorize(init_loops[-1]))


def _block_sums_in_registers(sch, sums_rv, blocks_loop, attempt) -> None:
    """Each channel block's sums for one register tile, computed right where the final sum adds
    them (under its loop over blocks) into registers of their own: the same FMA per weight and
    image vector as one chain, then one add per accumulator and block."""
    name = sch.get(sums_rv).name_hint
    if not attempt(f"compute_at {name}", lambda: sch.compute_at(sums_rv, blocks_loop, preserve_unit_loops=True)):
        return
    attempt(f"registers {name}", lambda: sch.set_scope(sums_rv, 0, "local"))
    loops = list(sch.get_loops(sums_rv))[-8:]  # n, b, k, y, x (the tile's extents), dy, dx, c
    n, b, k, y, x, dy, dx, c = loops
    if not attempt(f"reorder {name}", lambda: sch.reorder(n, b, y, dy, dx, c, k, x)):
        return
    attempt(f"vectorize {name}", lambda: sch.vectorize(x))
    attempt(f"unroll {name}", lambda: sch.unroll(k))
    _zero_first(sch, sums_rv, dy, attempt)
