"""Integer Add, Sub and Mul on data wrap in two's complement, as onnxruntime's do.

Why: TVM's LLVM code generator emits every add, sub and mul of a 32- or 64-bit integer with
LLVM's no-signed-wrap flag (`nsw`; unsigned ones get `nuw`, which is worse: `sub nuw 0, x` is
folded to 0). The flag promises that the result never overflows, and LLVM rewrites through the
promise: int64 `ReduceMax(Neg(x))` over a row holding INT64_MIN became `-ReduceMin(x)`, and under
a branch on `x < 0` the flagged `0 - x` was taken as positive, so a hand-written Abs,
`Where(x < 0, -x, x) < -3`, was false for INT_MIN (fuzzer and tests). No target option turns
the flags off, and every integer type TVM has of those widths gets one.

So every such add, sub or mul of data (an operand reads a buffer) is computed in an integer twice
as wide and truncated back: `T(W(a) op W(b))`, W = int64 for 32-bit operands, int128 for 64-bit.
In W the operation cannot overflow (a product of two 64-bit values fits in 127 bits), so TVM's
flag there is a true promise, and the truncation gives exactly the wrapped two's-complement
result. LLVM then narrows `trunc(sext a op sext b)` back to one plain add, sub or mul of the
original width, without the flag (its known-bits reasoning is exact for that): the machine code is
the same instruction, and LLVM has nothing to rewrite through. For an Abs written as a select it
even recognised `llvm.abs` with INT_MIN allowed. Unsigned operands widen to the signed type for add
and sub (a difference of unsigned values may be negative) and to the unsigned one for mul.

Arithmetic inside a load's or store's indices (gather indices, the importer's `i < 0 ? i + n : i`)
and on loop variables alone (no loads) is index arithmetic and left as TVM emits it: an index that overflows
is read with the same expression it is checked with (bounds.py), so the kernel never reads outside
its table. Narrower integers get no flag from TVM and need nothing.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from . import tir_walk

_RING = (tirx.Add, tirx.Sub, tirx.Mul)
_INT, _UINT = tvm.runtime.DataTypeCode.INT, tvm.runtime.DataTypeCode.UINT


def wide_type(node) -> str | None:
    """The type `node` (an add, sub or mul) is computed in so it cannot overflow, if TVM flags its own
    type (32- or 64-bit integers); None otherwise."""
    dtype = tvm.runtime.DataType(str(node.ty.dtype))
    if dtype.type_code not in (_INT, _UINT) or dtype.bits not in (32, 64):
        return None
    signed = dtype.type_code == _INT or not isinstance(node, tirx.Mul)
    lanes = f"x{dtype.lanes}" if dtype.lanes > 1 else ""
    return f"{'int' if signed else 'uint'}{2 * dtype.bits}{lanes}"


def wrapping(node):
    """`node` (an add, sub or mul) computed in its wide type and truncated back: two's complement."""
    wide = wide_type(node)
    if wide is None:
        return node
    return tirx.Cast(str(node.ty.dtype), type(node)(tirx.Cast(wide, node.a), tirx.Cast(wide, node.b)))


def _index_nodes(func) -> set[int]:
    """Handles of every node inside a load's or a store's indices (index arithmetic, left as it is)."""
    handles: set[int] = set()

    def collect(access):
        for index in access.indices:
            handles.update(node.__chandle__() for node in tir_walk.iter_nodes(index))
        return access

    tvm_ffi.structural_map(func.body, [((tvm.ir.TensorLoad, tirx.BufferStore), collect)], order="post")
    return handles


def wrap_data_arithmetic(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every 32/64-bit integer add, sub and mul of data (an operand reads a buffer;
    not inside indices) computed so it wraps in two's complement, as onnxruntime's."""
    in_indices = _index_nodes(func)

    def wrap(node):
        if node.__chandle__() in in_indices or not (tir_walk.contains_load(node.a) or tir_walk.contains_load(node.b)):
            return node
        return wrapping(node)

    return tvm_ffi.structural_map(func, [(_RING, wrap)], order="post")
