"""Vector widths at which each load of an elementwise block reads one run of memory per vector.

schedule.vectorize_elementwise fuses a block's trailing loops and splits them into vectors one
register wide. Where the output's last dim is narrower than a vector, a vector spans several
output rows, and a load whose rows are not adjacent in memory then reads one run per row, which
LLVM assembles lane by lane. A ViT's head split (out[b, h, s, 0:8] = x[s, b, 8h : 8h + 8] * c,
16 lanes spanning two s) ran at a quarter of copy bandwidth, 0.65x onnxruntime's Transpose + Mul.
In 8 lanes each vector is one load and one store.
"""

from __future__ import annotations

import math

import tvm

from . import fold_rows, tir_walk
from .index_math import flat_index

NARROWEST = 4  # lanes: below a 128-bit vector of floats, a gather is no worse than scalar code


def contiguous_lanes(block, extents: list[int], lanes: int) -> int:
    """The widest power of two from `lanes` down to NARROWEST at which every load of `block`
    reads, per vector, either consecutive addresses or one address; `extents` are the static
    extents of the trailing loops the vector loop fuses (they step the block's last iteration
    variables one by one). Loads whose address is not linear in those variables (an index read
    from data: a gather at any width) are left out. If no width does, `lanes` when a vector
    stays inside one output row (a strided load), else 0: no vector loop. A vector spanning rows
    of a true transpose (out[b, h, d, s] = x[s, b, 8h + d], rows of 17) computed each lane's
    row and column with a division and gathered: 78 us where scalar loops took 33."""
    total = math.prod(extents)
    if total % lanes or total == lanes:
        return lanes  # not split into vectors of `lanes` (one vector, or not vectorized): as it was
    variables = block.iter_vars[len(block.iter_vars) - len(extents):]
    if len(variables) != len(extents):
        return lanes
    stepping = [i for i, e in enumerate(extents) if e != 1]  # a loop of one step moves no address
    variables, extents = [variables[i] for i in stepping], [extents[i] for i in stepping]
    if any(tir_walk.static_int(iv.dom.extent) != e for iv, e in zip(variables, extents)):
        return lanes  # the loops were split or reordered: which variable steps with which loop is not known here
    coefficients = _load_coefficients(block, [iv.var for iv in variables])
    analyzer = tvm.sym.Analyzer()
    width = lanes
    while width >= NARROWEST:
        if all(_one_run(c, extents, width, analyzer) for c in coefficients):
            return width
        width //= 2
    return lanes if extents[-1] % lanes == 0 else 0


def row_reads_runs(block, extent: int) -> bool:
    """Whether every load of `block` with a linear address reads, along the block's last
    iteration variable (of static `extent`), consecutive addresses or one address: a vector
    over that row alone is then one load of each."""
    last = block.iter_vars[-1]
    if tir_walk.static_int(last.dom.extent) != extent:
        return False
    analyzer = tvm.sym.Analyzer()
    return all(_one_run(c, [extent], extent, analyzer) for c in _load_coefficients(block, [last.var]))


def _load_coefficients(block, variables) -> list[list]:
    """For each load of the block whose flat address is linear in `variables`, its coefficients."""
    index = fold_rows.block_index_simplifier(block)
    analyzer = tvm.sym.Analyzer()
    found = []
    for expr in tir_walk.store_value_exprs(block):
        for load in tir_walk.iter_loads(expr):
            address = flat_index([_int64(d) for d in load.source.shape], [_int64(index(i)) for i in load.indices])
            linear = tvm.sym.detect_linear_equation(analyzer.simplify(address), variables)
            if len(linear):
                found.append(list(linear)[:-1])
    return found


def _int64(expr):
    """`expr` as int64 (detect_linear_equation sees through no Cast)."""
    return expr if str(expr.ty.dtype) == "int64" else tvm.tirx.Cast("int64", expr)


def _one_run(coefficients: list, extents: list[int], lanes: int, analyzer) -> bool:
    """Whether a load with these address coefficients reads, per vector of `lanes` (starting at a
    multiple of `lanes` of the fused index), consecutive addresses or one address."""
    return any(_run(coefficients, extents, analyzer, step) % lanes == 0 for step in (1, 0))


def _run(coefficients: list, extents: list[int], analyzer, step: int) -> int:
    """How many consecutive points of the fused index (from a multiple of it) the address steps by
    `step` over: the product of the innermost extents whose variables have the coefficients
    step * (1, e_last, e_last * e_before, ...)."""
    run = 1
    for position in reversed(range(len(extents))):
        if not analyzer.can_prove_equal(coefficients[position], step * run):
            break
        run *= extents[position]
    return run
