"""ReduceSum, ReduceMean over trailing axes and GlobalAveragePool, each row summed in onnxruntime's order.

onnxruntime 1.32 reduces the trailing axes of a float32 tensor row by row with Eigen's
vectorized sum (SSE, four lanes). From the row's first 16-byte boundary on, two four-lane
accumulators take eight elements at a time; the two are added, then one more group of four if
there is one; the four lanes are added as (l0 + l2) + (l1 + l3) (NEON's (l0 + l1) + (l2 + l3) on
aarch64: sum_orders.add_four_lanes); then the elements before the
boundary and those after the last group of four are added one by one. Row r of n elements
starts (r * n) % 4 floats past a boundary (onnxruntime's buffers are 64-byte aligned), so where n
is no multiple of 4 the rows split four ways. ReduceMean divides the sum by n. This matched
onnxruntime bit for bit on rows of 1 to 1,000 elements, one or several trailing axes, kept or
dropped; TVM's sum, in the schedule's order, differed in the last bit in about 70% of the rows.

Over axes in the middle (onnxruntime's "KRK" case: elements before and after them), each
output is MLAS's one-row product of ones by the [R, K] block: the reduced values in groups of
four, each group summed left to right, the groups added in turn from +0.0, then a pair and a
single value if R leaves them (Hummingbird's random forest sums its 100 trees so); on x86-64
CPUs without AVX (MLAS's SSE kernel; the portable build's baseline level, sum_orders.py) in
order from +0.0 (under `qemu-x86_64 -cpu Nehalem`, 408 of 408 sums of 1 to 100 values). With one
element before the axes ("RK") onnxruntime adds the values in order instead, so a symbolic batch
takes both and picks at run time.

One expression serves every split: a position a row does not use adds -0.0, IEEE addition's
identity (-0.0 + x is x for every x, -0.0 included), so the loops keep static extents.

GlobalAveragePool sums its rows (a channel's spatial values) otherwise: one four-lane
accumulator from the row's first element whatever its alignment, the lanes added as
(l0 + l2) + (l1 + l3), then the last n mod 4 elements one by one, and the sum divided by n
(matched on rows of 3 to 100 values, 3-D and 4-D inputs). Except where onnxruntime's optimizer
moves a 4-D pool to its NCHWc layout, which it does on x86-64 when the channels are a multiple
of the CPU's channel block (sum_orders.nchwc_block: 16 with AVX-512, 8 with AVX2 and on the SSE
baseline): that kernel sums each channel's values one after the other. aarch64 has no NCHWc
layout: every pool there takes the lanes (NEON's pairs), 32 channels included.
"""

from __future__ import annotations

import functools
import operator

import tvm
from tvm import relax, te

from . import sum_orders, tir_walk
from .index_math import flat_index, i64, static_length, unflattened

LANES = 4  # an SSE packet of floats
BOUNDARY = 4  # floats per 16 bytes
ROW_SUM_LANES, ROW_SUM_EDGES, ROW_SUM, ROW_MEAN = "row_sum_lanes", "row_sum_edges", "row_sum", "row_mean"
ROW_SUM_IN_ORDER, ROW_SUM_GROUPS = "row_sum_in_order", "row_sum_groups"  # over middle axes
EDGES = LANES + (BOUNDARY - 1) + (LANES - 1)  # a last group of four, at most three before, three after


def is_stage(block) -> bool:
    """Whether the block is a stage of a row sum in onnxruntime's order: its lanes are Eigen's,
    not the schedule's to choose (schedule.factor_row_reductions leaves it alone)."""
    return block.name_hint.startswith((ROW_SUM_LANES, ROW_SUM_EDGES, ROW_SUM, ROW_MEAN))


def is_edges(block) -> bool:
    """The stage of a row's elements outside its two accumulators."""
    return block.name_hint.startswith(ROW_SUM_EDGES)


def is_row_total(block) -> bool:
    """The per-row sum (or mean) after the lanes: about twenty operations per row, which
    inlining would repeat for every element its consumer reads it at (a row's Sub, Div)."""
    return block.name_hint.startswith((ROW_SUM, ROW_MEAN)) and not block.name_hint.startswith((ROW_SUM_LANES, ROW_SUM_EDGES))


def is_gathered(block) -> bool:
    """A stage whose values each row gathers from its own positions (the edges, and the total
    that adds them): vectorized across rows, every lane would load from its own offset."""
    return is_edges(block) or (is_row_total(block) and any(read.source.name.startswith(ROW_SUM_EDGES)
                                                           for read in block.reads))


def row_sum_as_onnxruntime(data: te.Tensor, first: int, n: int) -> te.Tensor:
    """The sum of each row (axes `first`.. of `data`, n elements in all) in onnxruntime's order."""
    dtype = data.dtype
    zero = tvm.tirx.const(-0.0, dtype)
    rows = list(data.shape[:first])
    extents = [int(extent) for extent in data.shape[first:]]

    def head(row):
        """Elements before the row's first 16-byte boundary."""
        offset = tvm.tirx.floormod(flat_index(rows, row) * i64(n), i64(BOUNDARY))
        return tvm.tirx.min(tvm.tirx.floormod(i64(BOUNDARY) - offset, i64(BOUNDARY)), i64(n))

    def element(row, flat, used):
        return tvm.tirx.Select(used, data(*row, *unflattened(flat, extents)), zero)

    def in_pairs(h):  # elements the two accumulators take
        return tvm.tirx.floordiv(i64(n) - h, i64(2 * LANES)) * i64(2 * LANES)

    def in_groups(h):  # elements in whole groups of four from the boundary
        return tvm.tirx.floordiv(i64(n) - h, i64(LANES)) * i64(LANES)

    accumulated = None
    if n >= 2 * LANES:
        step = te.reduce_axis((i64(0), i64(n // (2 * LANES))), name="k_pair")

        def accumulator(*index):
            *row, which, lane = index
            h = head(row)
            group = step * i64(2 * LANES) + which * i64(LANES)  # whole groups: one test for the four lanes
            return te.sum(element(row, h + group + lane, group < in_pairs(h)), axis=step)

        accumulated = te.compute(rows + [i64(2), i64(LANES)], accumulator, name=ROW_SUM_LANES)

    if n % BOUNDARY == 0:  # every row starts on a boundary: no head, no tail
        def total(*row):
            lanes = [accumulated(*row, i64(0), i64(lane)) + accumulated(*row, i64(1), i64(lane))
                     if accumulated is not None else zero for lane in range(LANES)]
            if n % (2 * LANES):  # a last group of four
                lanes = [value + element(row, i64(n - LANES + lane), True) for lane, value in enumerate(lanes)]
            return sum_orders.add_four_lanes(lanes)

        return te.compute(rows, total, name=ROW_SUM)

    # Rows split four ways: the elements outside the two accumulators (the last group of four,
    # the head, the tail) are one stage with one load of the row, EDGES per row. Read by the
    # total in place, the row was loaded eleven times, which made the schedule materialize
    # whatever computed it (and vectorize that across rows, a gather per lane).
    def edge(*index):
        *row, slot = index
        h = head(row)
        pairs, groups = in_pairs(h), in_groups(h)
        k = slot - i64(LANES)
        q = slot - i64(LANES + BOUNDARY - 1)
        position = tvm.tirx.Select(slot < i64(LANES), h + pairs + slot,
                                   tvm.tirx.Select(q < i64(0), k, h + groups + q))
        used = tvm.tirx.Select(slot < i64(LANES), groups > pairs,
                               tvm.tirx.Select(q < i64(0), k < h, position < i64(n)))
        return element(row, tvm.tirx.Select(used, position, i64(0)), used)

    edges = te.compute(rows + [i64(EDGES)], edge, name=ROW_SUM_EDGES)

    def total(*row):
        lanes = []
        for lane in range(LANES):
            value = (accumulated(*row, i64(0), i64(lane)) + accumulated(*row, i64(1), i64(lane))
                     if accumulated is not None else zero)
            lanes.append(value + edges(*row, i64(lane)))
        value = sum_orders.add_four_lanes(lanes)
        for slot in range(LANES, EDGES):  # the head, then the tail
            value = value + edges(*row, i64(slot))
        return value

    return te.compute(rows, total, name=ROW_SUM)


def global_average_as_onnxruntime(data: te.Tensor) -> te.Tensor:
    """GlobalAveragePool of float32 [N, C, spatial...] with static spatial dims, as onnxruntime's
    kernel sums (the module docstring); keeps the spatial axes as ones."""
    dtype, rank = data.dtype, len(data.shape)
    rows = list(data.shape[:2])
    extents = [int(extent) for extent in data.shape[2:]]
    n = static_length(data.shape[2:])
    zero = tvm.tirx.const(-0.0, dtype)

    def element(row, flat):
        return data(*row, *unflattened(i64(flat), extents))

    block = sum_orders.current().nchwc_block
    if rank == 4 and block and static_length(data.shape[1:2]) and int(data.shape[1]) % block == 0:
        spatial = te.reduce_axis((i64(0), i64(n)), name="k_spatial")
        sums = te.compute(rows, lambda *row: te.sum(element(row, spatial), axis=spatial), name=ROW_SUM)
        return te.compute(rows + [i64(1)] * (rank - 2), lambda *index: sums(*index[:2]) / tvm.tirx.const(n, dtype),
                          name=ROW_MEAN)

    accumulated = None
    if n >= LANES:
        step = te.reduce_axis((i64(0), i64(n // LANES)), name="k_group")
        accumulated = te.compute(rows + [i64(LANES)], lambda *index: te.sum(
            element(index[:-1], step * i64(LANES) + index[-1]), axis=step), name=ROW_SUM_LANES)

    def average(*index):
        row = index[:2]
        lanes = [accumulated(*row, i64(lane)) if accumulated is not None else zero for lane in range(LANES)]
        value = sum_orders.add_four_lanes(lanes)
        for flat in range(n // LANES * LANES, n):
            value = value + element(row, flat)
        return value / tvm.tirx.const(n, dtype)

    return te.compute(rows + [i64(1)] * (rank - 2), average, name=ROW_MEAN)


def global_average_pool(bb: relax.BlockBuilder, data: relax.Expr) -> relax.Expr | None:
    """The pool in onnxruntime's order where it is known here (float32, static spatial dims),
    else None."""
    shape = data.ty.shape.values if isinstance(data.ty.shape, relax.ShapeExpr) else None
    if data.ty.dtype != "float32" or shape is None or len(shape) < 3 or not static_length(shape[2:]):
        return None
    return bb.emit_te(global_average_as_onnxruntime, data, primfunc_name_hint="global_average_pool")


def middle_sum_as_onnxruntime(data: te.Tensor, first: int, last: int) -> te.Tensor:
    """The sum over axes first..last-1 (static, with static axes after them) of `data`, as
    onnxruntime takes it (the module docstring): in order where the axes before them hold one
    element, else as MLAS's one-row product by ones; the reduced axes dropped."""
    dtype = data.dtype
    leading, trailing = list(data.shape[:first]), list(data.shape[last:])
    extents = [int(extent) for extent in data.shape[first:last]]
    n = static_length(data.shape[first:last])

    def element(index, flat):
        return data(*index[:first], *unflattened(i64(flat), extents),
                    *index[first:])

    every = te.reduce_axis((i64(0), i64(n)), name="k_in_order")
    in_order = te.compute(leading + trailing, lambda *i: te.sum(element(i, every), axis=every), name=ROW_SUM_IN_ORDER)
    in_groups = sum_orders.current().one_row_products == sum_orders.GROUPS_OF_FOUR
    groups = n // LANES if in_groups else 0
    grouped = None
    if groups:
        group = te.reduce_axis((i64(0), i64(groups)), name="k_group")

        def group_sum(*i):
            start = group * i64(LANES)
            return te.sum(((element(i, start) + element(i, start + i64(1))) + element(i, start + i64(2)))
                          + element(i, start + i64(3)), axis=group)

        grouped = te.compute(leading + trailing, group_sum, name=ROW_SUM_GROUPS)
    rows = functools.reduce(operator.mul, leading, i64(1))

    def product_of_ones(i):
        """MLAS's one-row product by ones: in groups (AVX) or in order (SSE, aarch64), from +0.0."""
        if not in_groups:
            return in_order(*i) + tvm.tirx.const(0.0, dtype)  # +0.0 last: from -0.0 or +0.0 alike
        value = grouped(*i) if grouped is not None else tvm.tirx.const(-0.0, dtype)
        position = groups * LANES
        if n - position >= 2:
            value = (element(i, position) + element(i, position + 1)) + value
            position += 2
        if n - position == 1:
            value = element(i, position) + value
        return value + tvm.tirx.const(0.0, dtype)  # MLAS starts from +0.0: a sum of -0.0s is +0.0

    def total(*i):
        value = product_of_ones(i)
        static_rows = tir_walk.static_int(rows)
        if static_rows is not None:
            return in_order(*i) if static_rows == 1 else value
        return tvm.tirx.Select(rows == i64(1), in_order(*i), value)

    return te.compute(leading + trailing, total, name=ROW_SUM)


def _reduced_span(shape, dtype: str, axis) -> tuple[int, int, int] | None:
    """(first axis, last axis + 1, elements per sum) of the axes `axis` reduces, where
    onnxruntime's order is known here; None for another dtype, axes that are not contiguous, a
    symbolic extent, or axes after the reduced ones all of one element (or symbolic)."""
    rank = len(shape)
    axes = sorted({int(a) % rank for a in (range(rank) if axis is None else axis)}) if rank else []
    if dtype != "float32" or not axes or axes != list(range(axes[0], axes[-1] + 1)):
        return None
    first, last = axes[0], axes[-1] + 1
    n = static_length(shape[first:last])
    if not n or (last < rank and (static_length(shape[last:]) or 1) == 1):
        return None
    return first, last, n


def _reduced(data: te.Tensor, span: tuple[int, int, int], keepdims: bool, mean: bool) -> te.Tensor:
    """The sum (or mean) of `data` over the span's axes in onnxruntime's order."""
    first, last, n = span
    if last == len(data.shape):
        sums = row_sum_as_onnxruntime(data, first, n)
    else:
        sums = middle_sum_as_onnxruntime(data, first, last)
    result = te.compute(sums.shape, lambda *r: sums(*r) / tvm.tirx.const(n, data.dtype),
                        name=ROW_MEAN) if mean else sums
    if not keepdims:
        return result
    ones = [i64(1)] * (last - first)
    return te.compute(list(data.shape[:first]) + ones + list(data.shape[last:]),
                      lambda *i: result(*i[:first], *i[last:]), name="row_sum_kept")


def _legalize(mean: bool, fallback: str):
    def legalize(bb: relax.BlockBuilder, call):
        data = call.args[0]
        attrs = call.attrs
        axis = None if attrs.axis is None else [int(a) for a in attrs.axis]
        if isinstance(data.ty, relax.TensorType) and isinstance(data.ty.shape, relax.ShapeExpr):
            span = _reduced_span(data.ty.shape.values, data.ty.dtype, axis)
            if span is not None:
                return bb.call_te(lambda x: _reduced(x, span, bool(attrs.keepdims), mean), data,
                                  primfunc_name_hint="mean" if mean else "sum")
        return tvm.ir.Op.get(fallback).get_attr("FLegalize")(bb, call)
    return legalize


legalize_sum = _legalize(mean=False, fallback="relax.sum")
legalize_mean = _legalize(mean=True, fallback="relax.mean")
