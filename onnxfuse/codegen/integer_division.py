"""Integer division and remainder by a divisor from data: fail cleanly on zero, never trap on -1.

Why: x86's integer divide traps (SIGFPE, the whole serving process dies) on a zero divisor and
on INT_MIN / -1. onnxruntime refuses a zero divisor with an error ("Integer division by zero")
and computes int8/int16 in wider registers, so -128 % -1 is 0 there; our kernel killed the
process on both (found by a dtype sweep).

So, after scheduling, for every Div/Mod/FloorDiv/FloorMod on integers whose divisor is loaded
from a tensor:
- the kernel checks `divisor != 0` first and fails with "integer division by zero", in the same
  guard as the index checks (bounds.add_index_checks);
- a signed divisor of -1 is replaced by 1, where the answer is known: a % -1 is 0 (= a % 1) and
  a / -1 is -a (wrapping, as onnxruntime's int8 Div does). The trap-free form costs a compare
  and a select per element, and only where the divisor is data.
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx

from . import tir_walk

_DIVISIONS = (tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod)
_QUOTIENTS = (tirx.Div, tirx.FloorDiv)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _data_divisor(node) -> bool:
    return _dtype(node).startswith(("int", "uint")) and tir_walk.contains_load(node.b)


def _without_minus_one(node):
    if not _data_divisor(node) or not _dtype(node).startswith("int"):
        return node
    a, b = node.a, node.b
    minus_one, one = tirx.const(-1, _dtype(b)), tirx.const(1, _dtype(b))
    safe = type(node)(a, tirx.Select(b == minus_one, one, b))
    if isinstance(node, _QUOTIENTS):
        return tirx.Select(b == minus_one, tirx.const(0, _dtype(a)) - a, safe)
    return safe


def zero_divisor_conditions(block) -> list:
    """`divisor != 0` for every integer division in the block's store by a divisor from data."""
    conditions, seen = [], set()

    def collect(node):
        if isinstance(node, _DIVISIONS) and _data_divisor(node) and str(node.b) not in seen:
            seen.add(str(node.b))
            conditions.append(node.b != tirx.const(0, _dtype(node.b)))
        return node

    for expr in tir_walk.store_value_exprs(block):
        tvm_ffi.structural_map(expr, [(_DIVISIONS, collect)], order="post")
    return conditions


def _rewrite_store(store):
    value = tvm_ffi.structural_map(store.value, [(_DIVISIONS, _without_minus_one)], order="post")
    return store if value.same_as(store.value) else tirx.BufferStore(store.buffer, value, list(store.indices))


def trap_free_body(block):
    """The block's body with every signed division by -1 from data replaced by its answer."""
    return tvm_ffi.structural_map(block.body, [(tirx.BufferStore, _rewrite_store)], order="post")
