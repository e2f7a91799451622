"""Kernel parameters declared at element alignment instead of TVM's default 64 bytes.

Why: TVM declares every parameter buffer 64-byte aligned, so LLVM emits aligned vector loads
(and alignment assumptions) that fault on any other address. onnxruntime hands a kernel the
caller's memory as it is, and numpy's large arrays sit 16 bytes past a page boundary, so the
glue had to copy such inputs to aligned memory first: half the time of a memory-bound kernel
(a row sum at batch 64). Declared at element alignment, the kernel uses unaligned vector loads
instead, which cost the same on aligned data.
"""

from __future__ import annotations

import tvm
from tvm.tirx import decl_buffer
from tvm.tirx.buffer import is_buffer_var
from tvm.tirx.transform.common import BufferReplacer


def element_bytes(dtype: str) -> int:
    data_type = tvm.runtime.DataType(dtype)
    return max(1, (data_type.bits * data_type.lanes + 7) // 8)


def element_aligned(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with each parameter buffer re-declared at its element size's alignment."""
    replacements = {}
    for param in func.params:
        if not is_buffer_var(param):
            continue
        ty = param.ty
        alignment = element_bytes(str(ty.dtype))
        if ty.data_alignment == alignment:
            continue
        replacements[param] = decl_buffer(ty.shape, ty.dtype, param.name, None, ty.strides, ty.elem_offset,
                                          param.scope(), alignment, ty.offset_factor)
    return BufferReplacer(replacements)(func) if replacements else func
