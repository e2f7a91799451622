"""Schedule steps for gather chains: tree traversals (Hummingbird's tree_trav, perf_tree_trav).

Such a group walks every tree one level per step: each level looks its node index up in a few
node tables (feature, threshold, children), gathers the feature from the input row, compares,
and computes the next index. The generic schedule (schedule.py) materializes, per row tile, every
value that is read more than once: a level becomes three or four loops over the tile's trees,
each storing its values for the next loop to load. On a 100-tree depth-8 forest that made a
batch-1 kernel spend its time on stores and reloads between those loops.

fuse_level_loops moves those values into the loop of the block that consumes them (compute_at
at that loop), so each level is one loop over the tile's trees and its intermediates are
scalars in registers. The level's own result (the next node index) stays materialized: it is
what makes one level's lookups independent of each other, so the CPU overlaps them. Walking
each tree to its leaf in one go (every level moved into the final reduction's tree loop) was
measured too and was 2x slower at batch 1: every step then waits for the previous one's loads.

Each level's loop runs over the tile's rows x trees flattened (Hummingbird reshapes the index
to [N*T]); it is split into a row loop and a tree loop so the index's // T and % T simplify away.

Measured, kernel alone, alternating rounds (docs/benchmarks.md, "Trees"): on a 100-tree depth-8
forest, tree_trav 1.4x faster at batch 1 and 1.5x at 1,000 and 10,000, perf_tree_trav 1.3x at
batch 1 and 1.15x at large batches from the level loops; the split adds 1.2-1.6x at batch 1,000.
"""

from __future__ import annotations

import tvm

from . import tir_walk


def is_gather_chain(sch) -> bool:
    """Whether some block loads at an index that loads a value the group computed and keeps (a
    lookup whose index another lookup produced, as in every level of a tree walk). Asked after
    inlining: a gather at indices the group was given (an embedding lookup) is not a chain,
    though before inlining its index normalization (negative indices wrap) is a block of its own."""
    computed = list(sch.get(sch.get_sblock("root")).alloc_buffers)
    for block_rv in tir_walk.leaf_blocks(sch):
        for expr in tir_walk.store_value_exprs(sch.get(block_rv)):
            for load in tir_walk.iter_loads(expr):
                for index in load.indices:
                    if any(_is_one_of(inner.source, computed) for inner in tir_walk.iter_loads(index)):
                        return True
    return False


def _is_one_of(buffer, buffers) -> bool:
    return any(buffer.same_as(b) for b in buffers)


def _innermost_common_loop(sch, blocks):
    """The innermost loop enclosing every block in `blocks`, or None."""
    nests = [list(sch.get_loops(b)) for b in blocks]
    common = None
    for depth, loop in enumerate(nests[0]):
        if all(len(nest) > depth and sch.get(nest[depth]).same_as(sch.get(loop)) for nest in nests[1:]):
            common = loop
        else:
            break
    return common


def _move_into_consumers(sch, block_rv, receivers: set[str], outputs: set[str]) -> bool:
    """compute_at one block at the innermost loop around all its consumers, when that loop is
    deeper than the block's own position; records the consumers as receivers."""
    block = sch.get(block_rv)
    if block.name_hint in receivers or block.name_hint in outputs or tir_walk.is_reduction(block):
        return False
    consumers = list(sch.get_consumers(block_rv))
    if not consumers:
        return False
    loop = _innermost_common_loop(sch, consumers)
    if loop is None or any(sch.get(loop).same_as(sch.get(own)) for own in sch.get_loops(block_rv)):
        return False
    try:
        sch.compute_at(block_rv, loop, preserve_unit_loops=True)
    except tvm.error.TVMError:
        return False
    receivers.update(sch.get(c).name_hint for c in consumers)
    return True


def fuse_level_loops(sch) -> frozenset[str]:
    """Moves each materialized value of a gather chain into the loop of its consumers (see the
    module doc); returns the names of the blocks that received one, whose loops must stay
    scalar: vectorized, their data-dependent loads would be gathers, and TVM 0.27 vectorized
    such a loop with its index checks inside into code that computed wrong indices.

    A block that received a value is never moved itself: that is what stops one level's loop at
    the next level's (each level's result is read by the next level's lookups, so without the
    rule every level would end up inside the last one). Producers are visited first, and the
    walk repeats until nothing moves: a value read by two blocks of a level can follow them only
    once the first of them has moved into the second."""
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(sch.get_sblock("root"))}
    receivers: set[str] = set()
    moved = True
    while moved:
        moved = False
        for block_rv in tir_walk.leaf_blocks(sch):
            moved |= _move_into_consumers(sch, block_rv, receivers, outputs)
    for block_rv in tir_walk.leaf_blocks(sch):
        if sch.get(block_rv).name_hint in receivers:
            _split_rows_from_trees(sch, block_rv)
    return frozenset(receivers)


def _split_rows_from_trees(sch, block_rv) -> None:
    """A level's loop runs over the tile's rows x trees flattened (Hummingbird reshapes the
    index to [N*T]), so every lookup divides the flat index by T for the row and takes it modulo
    T for the tree. Split into a row loop and a tree loop, that index arithmetic simplifies
    away: 1.2-1.6x on the 8-row tiles of three forests at batch 1,000 (kernel alone, alternating
    rounds; docs/benchmarks.md). The loop is the one right under the row tile; T is the largest
    constant the block divides or reduces an index by that divides the loop's extent."""
    loops = list(sch.get_loops(block_rv))
    if len(loops) < 2:
        return
    loop = loops[1]
    extent = getattr(sch.get(loop).extent, "value", None)
    if not isinstance(extent, int):
        return
    divisors = {d for expr in tir_walk.store_value_exprs(sch.get(block_rv)) for d in _index_divisors(expr)}
    trees = max((d for d in divisors if 1 < d < extent and extent % d == 0), default=None)
    if trees is None:
        return
    try:
        sch.split(loop, [extent // trees, trees])
    except tvm.error.TVMError:
        return


def _index_divisors(expr) -> set[int]:
    """The constants `expr` floor-divides or takes a floor-modulo by."""
    return {int(node.b.value) for node in tir_walk.iter_nodes(expr)
            if isinstance(node, (tvm.tirx.FloorDiv, tvm.tirx.FloorMod)) and isinstance(node.b, tvm.tirx.IntImm)}
