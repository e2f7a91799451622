"""Read-only walks over TIR expressions (TVM 0.27 exposes no Python StmtExprVisitor for TIR)."""

from __future__ import annotations

from collections.abc import Iterator

import tvm
import tvm_ffi
from tvm.tirx.buffer import is_buffer_var

TensorLoad = tvm.ir.TensorLoad
_CHILD_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value", "args", "indices", "base", "stride",
                 "vectors", "body")


def _children(node) -> Iterator:
    for field in _CHILD_FIELDS:
        child = getattr(node, field, None)
        if child is None:
            continue
        if isinstance(child, tvm.ir.expr.Expr):
            yield child
        elif isinstance(child, (list, tuple)) or type(child).__name__ == "Array":
            for item in child:
                if isinstance(item, tvm.ir.expr.Expr):
                    yield item


def iter_nodes(expr) -> Iterator:
    """Every node of `expr`'s tree, outer nodes first."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(_children(node))


def iter_nodes_outside_indices(expr) -> Iterator:
    """Every node of `expr`'s tree except those inside a load's indices, outer nodes first."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, TensorLoad):
            stack.extend(_children(node))


def iter_loads(expr) -> Iterator[TensorLoad]:
    """Every buffer load inside `expr`, outer loads before the loads in their indices."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, TensorLoad):
            yield node
            stack.extend(node.indices)
            continue
        stack.extend(_children(node))


def outer_loads(expr) -> Iterator[TensorLoad]:
    """The loads of `expr` that are not inside another load's indices."""
    return (node for node in iter_nodes_outside_indices(expr) if isinstance(node, TensorLoad))


def expr_size(expr) -> int:
    """Nodes in `expr`'s tree (a shared subexpression counts once per use)."""
    size, stack = 0, [expr]
    while stack:
        node = stack.pop()
        size += 1
        stack.extend(_children(node))
    return size


def contains_load(expr) -> bool:
    return next(iter_loads(expr), None) is not None


def store_value_exprs(block) -> list:
    """The expressions a block computes: its body store (and its reduction init store)."""
    exprs = []
    for stmt in (block.body, block.init):
        if stmt is not None and hasattr(stmt, "value"):
            exprs.append(stmt.value)
            exprs.extend(stmt.indices)
    return exprs


def count_loads_of(block, buffer) -> int:
    return sum(1 for e in store_value_exprs(block) for ld in iter_loads(e) if ld.source.same_as(buffer))


def reads_at_one_index(block, buffer) -> bool:
    """Whether every load of `buffer` in `block` has the same indices: the copies an inlined
    producer would leave there are one common subexpression, which LLVM computes once."""
    indices = [ld.indices for e in store_value_exprs(block) for ld in iter_loads(e) if ld.source.same_as(buffer)]
    return all(tvm_ffi.structural_equal(list(i), list(indices[0])) for i in indices[1:])


def gathers_along_unit_axis(block, buffer) -> bool:
    """Whether `block` reads `buffer` with an index from data along an axis of extent 1. Inlining
    the buffer's producer there would drop that index: compute_inline binds an iter var of
    extent 1 to 0, whatever the consumer indexes it with, and the index check (bounds.py) would
    have nothing left to check."""
    for expr in store_value_exprs(block):
        for load in iter_loads(expr):
            if load.source.same_as(buffer) and any(
                    contains_load(i) and getattr(extent, "value", None) == 1
                    for i, extent in zip(load.indices, load.source.shape)):
                return True
    return False


def is_index_copy(block) -> bool:
    """A pure data move (reshape/split/slice/transpose view): the body stores one load whose
    indices depend on loop variables only (a gather is not a copy: duplicating it duplicates
    its index computation)."""
    body = block.body
    if block.init is not None or not isinstance(getattr(body, "value", None), TensorLoad):
        return False
    return not any(contains_load(i) for i in body.value.indices)


def leaf_blocks(sch) -> list:
    """Every leaf block of a schedule (blocks with no child blocks), including those moved under
    loops by compute_at, in program order."""
    found = []

    def walk(block_rv):
        children = list(sch.get_child_blocks(block_rv))
        if not children:
            found.append(block_rv)
        for child in children:
            walk(child)

    for top in sch.get_child_blocks(sch.get_sblock("root")):
        walk(top)
    return found


COMM_REDUCE = 2  # IterVar.iter_type of a reduction axis


def is_reduction(block) -> bool:
    """Whether the block reduces (a GEMM, a row sum, Welford's update): it has a reduction axis."""
    return any(int(iv.iter_type) == COMM_REDUCE for iv in block.iter_vars)


def uses_var(expr, var) -> bool:
    """Whether `var` occurs in `expr` (a block's iter binding such as `ax0_0 * 8 + ax0`)."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if node.same_as(var):
            return True
        stack.extend(_children(node))
    return False


def vars_in(expr) -> set:
    """The variables occurring in `expr` (a symbolic extent: `N`, `s0 * 2`)."""
    found = set()
    tvm_ffi.structural_map(expr, [(tvm.tirx.Var, lambda v: found.add(v) or v)], order="post")
    return found


def shape_vars(func) -> set:
    """The symbolic dimensions of the kernel's parameters (N of an [N, 64] input)."""
    found = set()
    for param in func.params:
        if is_buffer_var(param):
            for extent in param.shape:
                found |= vars_in(extent)
    return found


def static_int(expr) -> int | None:
    """The value of an integer constant (a Python int or an IntImm: a static extent or dim), else None."""
    if isinstance(expr, int):
        return expr
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None
