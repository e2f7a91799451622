"""A register tile's accumulators live on the stack, so LLVM keeps them in registers.

TVM puts a buffer on the stack (an `alloca`) only if it is a "global" one under 1,024 bytes;
every other one is allocated through TVMBackendAllocWorkspace, memory LLVM cannot promote to
registers. A register tile of 4 x 4 zmm accumulators is exactly 1,024 bytes, "local", and so was
workspace: its 16 zero stores became a call to memset for every tile (LLVM merges them), and the
accumulators were loaded from memory before each tile's k loop and stored back after it
(transformer_mlp: 2.5% of the kernel's samples in memset alone). Marked to stay out of TVM's
builtin lowering, such a buffer is an `alloca` that LLVM's SROA promotes to registers.

Measured (fused models through onnxruntime, alternating rounds, ratio over onnxruntime, before ->
after): transformer_mlp at batch 64 1.24x -> 1.26x and at 1,000 1.23x -> 1.24x; lstm_gate,
lstm_cell and gru_cell 1-3% faster at 64 and 1,000.

Only "local" buffers (the accumulators, which LLVM promotes to registers whole). Small "global"
ones (the copy a per-tile epilogue reads) were faster on the stack too (transformer_mlp 1.30x at
64), but they stay in memory there, and TVM asks no more than 16-byte alignment of an `alloca` of
scalars (x_var_lanes, the per-tile copies): their zmm stores and loads may straddle cache lines,
as unaligned spills did (stack_realign.py), and spill_guard counted them as spills (the GRU
cell's kernel: 234 "spills" -> 1,087).

Only buffers of at most STACK_BYTES (the widest register tile) are marked, and at most
STACK_BUDGET bytes of them per function: a row tile's intermediates ([rows, 256] floats and
more) stay in the workspace, off the stack of whichever thread runs the kernel.
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx

from .index_math import static_length

STACK_BYTES = 2048  # the widest register tile: 32 zmm registers' worth
STACK_BUDGET = 64 * 1024  # bytes per function that this pass may put on the stack
DISABLE_LOWER_BUILTIN = "disable_lower_builtin"  # TVM's annotation that keeps an allocation as it is


def stack_buffers(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with its small constant-size "local" buffers kept on the stack, up to STACK_BUDGET."""
    left = [STACK_BUDGET]

    def on_the_stack(alloc):
        buffer = alloc.buffer
        if buffer.scope() != "local" or DISABLE_LOWER_BUILTIN in alloc.annotations:
            return alloc
        elements = static_length(buffer.shape)
        if elements is None:
            return alloc
        size = elements * buffer.dtype.itemsize
        if size > min(STACK_BYTES, left[0]):
            return alloc
        left[0] -= size
        annotations = dict(alloc.annotations)
        annotations[DISABLE_LOWER_BUILTIN] = tirx.IntImm("int32", 1)
        return tirx.AllocBuffer(buffer, annotations, alloc.span)

    return tvm_ffi.structural_map(func, [(tirx.AllocBuffer, on_the_stack)], order="post")


@tirx.transform.prim_func_pass(opt_level=0, name="onnxfuse.StackBuffers")
def StackBuffers(func, _mod, _ctx):  # noqa: N802 - named as TVM names passes
    return stack_buffers(func)
