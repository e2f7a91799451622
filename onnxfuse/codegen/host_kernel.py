"""The kernel that verification runs in this process: the best ISA level's scheduled functions
with their parallel loops made serial, built for the host CPU.

Serial, because TVM's own single-thread launcher ignores a failing task, so an index assert
inside a parallel loop would go unnoticed (schedule.schedule_group). A copy of the scheduled
functions rather than a second schedule with allow_parallel=False: the two differ only in that
loop's kind (tests/test_host_kernel.py checks it), and scheduling again cost a second per group,
a third of what building a tree kernel for one level takes.
"""

from __future__ import annotations

import tvm
import tvm_ffi

from ..kernel_spec import small_variant_name


def _serial(loop):
    if loop.kind != tvm.tirx.ForKind.PARALLEL:
        return loop
    return tvm.tirx.For(loop.loop_var, loop.min, loop.extent, tvm.tirx.ForKind.SERIAL, loop.body,
                        loop.thread_binding, loop.annotations, loop.step, loop.span)


def serial_loops(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every parallel loop serial."""
    return tvm_ffi.structural_map(func, [(tvm.tirx.For, _serial)], order="post")


def host_functions(level_funcs: dict, level_name: str, name: str) -> dict:
    """The verification kernel's functions, named as the kernel spec names them (`name` and its
    small-batch variant), from one level's functions named after `level_name`."""
    funcs = {name: level_funcs[level_name]}
    if small_variant_name(level_name) in level_funcs:
        funcs[small_variant_name(name)] = level_funcs[small_variant_name(level_name)]
    return {host_name: serial_loops(func).with_attr("global_symbol", host_name) for host_name, func in funcs.items()}

