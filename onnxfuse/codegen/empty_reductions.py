"""A reduction writes its start (0 for a sum, -inf for a max...) even when it reduces nothing.

Why: a reduction block that keeps its `init` is lowered by TVM as `if (k == 0) acc = start`
inside the reduction loop. Over the batch axis of an empty batch that loop runs zero times, so
the start was never written and the output held whatever the buffer held before (a stale sum
of an earlier call), where onnxruntime writes the identity: the sum of nothing is 0.

So after scheduling, every reduction that still carries its init is decomposed
(`decompose_reduction`) at its outermost reduction loop: the start is stored by a loop nest of
its own before that loop, and is written whatever the loop's extent. Reductions the schedule
decomposed already (schedule.schedule_reduction) are left as they are. A block TVM refuses to
decompose keeps its init: the kernel is still valid, only not for that empty case.
"""

from __future__ import annotations

import tvm
from tvm import s_tir

from . import tir_walk

_sblock_realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")


def _outermost_reduction_loop(sch, block_rv):
    block = sch.get(block_rv)
    bindings = _sblock_realize(sch, block_rv).iter_values
    reduce_bindings = [b for iv, b in zip(block.iter_vars, bindings) if int(iv.iter_type) == tir_walk.COMM_REDUCE]
    return next((lp for lp in sch.get_loops(block_rv)
                 if any(tir_walk.uses_var(b, sch.get(lp).loop_var) for b in reduce_bindings)), None)


def write_starts_first(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every reduction's init moved before its reduction loops."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    changed = False
    for block_rv in tir_walk.leaf_blocks(sch):
        if sch.get(block_rv).init is None:
            continue
        loop = _outermost_reduction_loop(sch, block_rv)
        if loop is None:
            continue
        try:
            sch.decompose_reduction(block_rv, loop)
            changed = True
        except Exception:  # TVM refuses some loop nests; the init then stays where it was
            continue
    return sch.mod["main"] if changed else func
