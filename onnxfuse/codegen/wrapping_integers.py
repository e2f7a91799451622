"""Integer Add, Sub and Mul on data wrap in two's complement, as onnxruntime's do.

Why: TVM's LLVM code generator emits every add, sub and mul of a 32- or 64-bit integer with
LLVM's no-signed-wrap flag (`nsw`; unsigned ones `nuw`): a promise that the result never
overflows, which LLVM may rewrite through. The fuzzer found int64 `ReduceMax(Neg(x))` over a
row holding INT64_MIN computed as `-ReduceMin(x)`: INT64_MIN, where onnxruntime negates
INT64_MIN to itself (wrapping) and gives the row's true max. No target option turns the flags
off, and every integer type TVM has of those widths gets one.

The machine's add, sub and mul wrap whatever the flag says; only the rewrites LLVM makes in the
instructions that *use* a flagged result can differ. Rewrites among adds, subs and muls are ring
identities, true for wrapping integers too; the ones that are not look at the result from an
operation outside the ring: a comparison (`a + 1 > a` is true), a min or max (`max(-a, -b)` is
`-min(a, b)`), a cast (`sext(a + b)` is `sext a + sext b`), a division (`a * 2 / 2` is `a`).

So after scheduling, every operand of those operations that is a 32/64-bit integer add, sub or
mul of data (an operand reads a buffer; also through the arms of a select) is passed through a
fence LLVM cannot see through: a bitcast to the float type of the same width,
`llvm.arithmetic.fence`, and a bitcast back (`llvm.ssa.copy`, which costs nothing, LLVM sees
through: measured, the bug stayed). On vectors the fence is no instruction; on scalars it is a
move to a vector register and back. Values that are only stored, or used as an index (the tree chains'
`node + offset`, the importer's `i < 0 ? i + n : i`), get none: fencing those too made a
depth-8 tree chain 1.34x slower at batch 1,000, where fencing only what is observed leaves it
without a fence. An index that overflows is read with the same expression it is checked with
(bounds.py), so the kernel never reads outside its table; at worst it raises where onnxruntime's
wrapped index lands inside. Loop-variable arithmetic (no loads) is left alone, and TVM gives
narrower integers no flag.

The fence hides the value but not its sign: LLVM's float-class analysis reads the sign bit through
it. Where a branch on x's sign dominates (TVM turns a select whose arms read memory into one),
the fenced `0 - x` under `x < 0` is still taken as positive: int64 `Abs(x) < -3` was false for
INT64_MIN, so legalize.py writes a signed Abs as `max(x, 0 - x)`, with no select. A model's own
`Where(x < 0, -x, x)` still folds (an xfail in tests/test_wrapping_integers.py).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from . import tir_walk

_RING = (tirx.Add, tirx.Sub, tirx.Mul)
_COMPARISONS = (tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE)
_BINARY_OBSERVERS = _COMPARISONS + (tirx.Min, tirx.Max, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod)
_FLAGGED = {tvm.runtime.DataTypeCode.INT, tvm.runtime.DataTypeCode.UINT}


def _flagged_type(expr) -> tvm.runtime.DataType | None:
    """The type of `expr` if TVM emits its arithmetic with nsw/nuw: 32- or 64-bit integers."""
    dtype = tvm.runtime.DataType(str(expr.ty.dtype))
    return dtype if dtype.type_code in _FLAGGED and dtype.bits >= 32 else None


def opaque(expr):
    """`expr` (a 32/64-bit integer) as a value LLVM knows nothing about."""
    dtype = _flagged_type(expr)
    as_float = tirx.reinterpret(f"float{dtype.bits}" + (f"x{dtype.lanes}" if dtype.lanes > 1 else ""), expr)
    fenced = tirx.call_llvm_pure_intrin(str(as_float.ty.dtype), "llvm.arithmetic.fence", as_float)
    return tirx.reinterpret(str(expr.ty.dtype), fenced)


def _observed(expr):
    """`expr`, as an operand of a non-ring operation: fenced if it is flagged arithmetic on data."""
    if isinstance(expr, tirx.Select):
        true_value, false_value = _observed(expr.true_value), _observed(expr.false_value)
        if true_value.same_as(expr.true_value) and false_value.same_as(expr.false_value):
            return expr
        return tirx.Select(expr.condition, true_value, false_value)
    if (isinstance(expr, _RING) and _flagged_type(expr) is not None
            and (tir_walk.contains_load(expr.a) or tir_walk.contains_load(expr.b))):
        return opaque(expr)
    return expr


def _fence_operands(node):
    if isinstance(node, tirx.Cast):
        value = _observed(node.value)
        return node if value.same_as(node.value) else tirx.Cast(str(node.ty.dtype), value)
    a, b = _observed(node.a), _observed(node.b)
    return node if a.same_as(node.a) and b.same_as(node.b) else type(node)(a, b)


def _one_element(buffer) -> bool:
    return all(isinstance(d, tirx.IntImm) and d.value == 1 for d in buffer.shape)


def _observed_buffers(func) -> list:
    """One-element buffers a comparison, min, max, cast or division in a stored value reads
    directly (or through a select's arms): a value stored there reaches that operation through
    memory, and LLVM keeps a one-element intermediate in a register. Larger intermediates are
    left alone: the tree chains store each level's `node + offset` in [N, trees] buffers that their
    index normalization (`i < 0 ? i + n : i`) reads, and fencing those put 14 fences on the hot
    path of a depth-8 chain; their values are node numbers, which do not overflow."""
    buffers = []

    def operand_loads(expr):
        if isinstance(expr, tirx.Select):
            yield from operand_loads(expr.true_value)
            yield from operand_loads(expr.false_value)
        elif isinstance(expr, tvm.ir.TensorLoad):
            yield expr

    def collect(node):
        operands = [node.value] if isinstance(node, tirx.Cast) else [node.a, node.b]
        for operand in operands:
            buffers.extend(load.source for load in operand_loads(operand) if _one_element(load.source))

    def in_store(store):
        for node in tir_walk.iter_nodes_outside_indices(store.value):  # an index is not a value (see above)
            if isinstance(node, _BINARY_OBSERVERS + (tirx.Cast,)):
                collect(node)
        return store

    tvm_ffi.structural_map(func.body, [(tirx.BufferStore, in_store)], order="post")
    return buffers


def _fence_stores_into(buffers):
    def fence_store(store):
        if not any(store.buffer.same_as(b) for b in buffers):
            return store
        value = _observed(store.value)
        return store if value.same_as(store.value) else tirx.BufferStore(store.buffer, value, list(store.indices))
    return fence_store


def wrap_data_arithmetic(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every 32/64-bit integer add, sub and mul of data fenced where a comparison,
    min, max, cast or division reads it: as its operand, or through a buffer it is stored in
    (LLVM forwards a one-element intermediate's store to the load: int64 `Neg(s) >= 3` of a
    [1, 1] input s = INT64_MIN was folded to `s <= -3`, fuzzer, November 26)."""
    observed = _observed_buffers(func)
    if observed:
        func = tvm_ffi.structural_map(func, [(tirx.BufferStore, _fence_stores_into(observed))], order="post")
    return tvm_ffi.structural_map(func, [(_BINARY_OBSERVERS + (tirx.Cast,), _fence_operands)], order="post")
