"""The two leading dims of a group, [batch, seq, ...], folded into one row axis of batch x seq.

Why: PyTorch's TorchScript exporter writes a transformer's linear layers on 3D activations
(`[batch, seq, 128] @ W[128, 64]`); its dynamo exporter flattens them to 2D first. The schedule
tiles rows along the outermost loop (schedule.tile_rows), so on 3D data a row tile held 8 whole
sequences and the GEMM's register tile ran along the symbolic seq loop, one row at a time: such
a group (MatMul + bias + residual, [64, 16, 128] @ [128, 64]) took 0.93x onnxruntime's time where
the same group written in 2D took 1.03x. Folded, its kernel tiles 8 rows of the batch x seq axis
like the 2D one.

The fold is a re-indexing, not a copy: every block's first two iteration variables (b, s) become
one, r = b * seq + s, and every intermediate buffer indexed by them becomes [batch * seq, ...].
The kernel's parameters keep their shapes, so the custom op's inputs and outputs do not change;
they are read and written at [r // seq, r % seq, ...], which LLVM computes once per row.

A group is folded only when each of its blocks iterates first over exactly the two leading dims
of its first output, and each buffer access either indexes a buffer's own two leading dims by
(b, s) themselves or does not depend on b and s at all (weights, biases). Anything else (a
Reshape that splits the hidden axis reads through flattened index arithmetic, a Transpose, a
reduction over seq) leaves the group as it was; blocks over no row-indexed buffer (a padded
weight copy) are left out of the fold. A group whose output block is a reduction (a GEMM without
an epilogue) gets a copy block to write its output (_copied_out). A GEMM whose columns the
schedule pads to whole vectors is padded before the fold (schedule._padded_then_folded says why).
Only groups whose two leading dims are both symbolic are folded: the runtime picks a kernel's
small-batch variant (1-row tiles, for fewer than 8 rows) by the product of its symbolic dims,
which is then the row count. Folding `[N, 8, 64]` (transformer_mlp) made that product 1 at
batch 1 for 8 rows, and its GEMMs ran 1-row tiles: 1.08x onnxruntime where the unfolded kernel
(8 static rows per N) ran 1.35x.
"""

from __future__ import annotations

import functools

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from . import ieee_order, tir_walk

SPATIAL = 0  # IterVar.iter_type of a data-parallel axis


def _sink_shape(sch) -> tuple | None:
    """The shape of the first buffer the group's output blocks write (its first output)."""
    outputs = list(sch.get_output_blocks(sch.get_sblock("root")))
    if not outputs or not sch.get(outputs[0]).writes:
        return None
    return tuple(sch.get(outputs[0]).writes[0].source.shape)


def _same(a, b) -> bool:
    return str(a) == str(b)


def _is_one(extent) -> bool:
    return getattr(extent, "value", None) == 1


def _foldable_access(region, b, s, leading) -> bool:
    """(b, s) index the buffer's own two leading dims, or the access ignores both."""
    uses = [tir_walk.uses_var(r.min, b) or tir_walk.uses_var(r.min, s) for r in region.region]
    if not any(uses):
        return True
    shape = list(region.source.shape)
    if len(shape) < 2 or not (_same(shape[0], leading[0]) and _same(shape[1], leading[1])):
        return False
    first, second = region.region[0], region.region[1]
    if not (first.min.same_as(b) and second.min.same_as(s)):
        return False
    if not (_is_one(first.extent) and _is_one(second.extent)):
        return False
    return not any(uses[2:])


def _foldable_block(block, leading) -> bool:
    if len(block.iter_vars) < 2:
        return False
    b, s = block.iter_vars[0], block.iter_vars[1]
    if int(b.iter_type) != SPATIAL or int(s.iter_type) != SPATIAL:
        return False
    if not (_same(b.dom.extent, leading[0]) and _same(s.dom.extent, leading[1])):
        return False
    return all(_foldable_access(region, b.var, s.var, leading) for region in [*block.reads, *block.writes])


def _terms(expr) -> list:
    if isinstance(expr, tirx.Add):
        return [*_terms(expr.a), *_terms(expr.b)]
    return [expr]


def _quotient_and_rest(expr, divisor):
    """(q, r) with expr = q * divisor + r, q the sum of the terms that are multiples of `divisor`."""
    quotient, rest = [], []
    for term in _terms(expr):
        if isinstance(term, tirx.Mul) and term.b.same_as(divisor):
            quotient.append(term.a)
        elif isinstance(term, tirx.Mul) and term.a.same_as(divisor):
            quotient.append(term.b)
        else:
            rest.append(term)
    return quotient, rest


def exact_row_indices(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with `(q * d + v) // d` written q and `(q * d + v) % d` written v, for every block
    iteration variable v over [0, d) and symbolic d. TVM's simplifier cannot bound v by a symbolic
    extent, so a Reshape that splits the hidden axis ([batch, seq, 64] -> [batch, seq, 4, 16])
    read its source at [b + s // seq, (b * seq + s) % seq, ...] rather than at [b, s, ...]."""
    func = ieee_order.simplify(func)  # first (v2 * 16 + v3) // 64 becomes 0: (b * seq + s) // seq is left
    extents = {}

    def collect(block):
        for iv in block.iter_vars:
            if getattr(iv.dom.min, "value", None) == 0:
                extents[iv.var] = iv.dom.extent
        return block

    tvm_ffi.structural_map(func.body, [(s_tir.SBlock, collect)], order="post")

    body = _exact_divisions(func.body, extents)
    return ieee_order.simplify(func.with_body(body))


def _exact_divisions(node, extents: dict):
    """`node` with `(q * d + v) // d` written q and `(q * d + v) % d` written v, for every v in
    `extents` (a block variable over [0, d), d its extent)."""
    def exact(division):
        quotient, rest = _quotient_and_rest(division.a, division.b)
        if len(rest) != 1 or rest[0] not in extents or not extents[rest[0]].same_as(division.b):
            return division
        if isinstance(division, tirx.FloorMod):
            return rest[0]
        return functools.reduce(lambda a, b: a + b, quotient, tirx.const(0, rest[0].ty.dtype))

    return tvm_ffi.structural_map(node, [(tirx.FloorDiv, exact), (tirx.FloorMod, exact)], order="post")


def block_index_simplifier(block):
    """A function simplifying an integer index expression of `block`, its variables bounded by
    their domains and exact divisions by their extents written out (_exact_divisions); other
    expressions are returned as they are."""
    analyzer = tvm.sym.Analyzer()
    extents = {}
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
        if getattr(iv.dom.min, "value", None) == 0:
            extents[iv.var] = iv.dom.extent

    def index(expr):
        if not str(getattr(getattr(expr, "ty", None), "dtype", "")).startswith("int"):
            return expr
        return analyzer.simplify(_exact_divisions(analyzer.simplify(expr), extents))

    return index


def exact_load_indices(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """exact_row_indices on a scheduled kernel's buffer indices alone, each simplified with its
    block's variables bounded by their domains. Inlining joins a chain of Reshapes' reads into
    one, where `(b * 4 + h) // 4 // batch` appears only then (a ViT's heads split from a packed
    projection). Unlike exact_row_indices it leaves every value alone: inlined integer data
    arithmetic wraps, which TVM's simplifier assumes it does not (abs of INT_MIN)."""
    def rewrite_block(block):
        index = block_index_simplifier(block)

        def load(node):
            return tirx.BufferLoad(node.source, [index(i) for i in node.indices])

        def store(node):
            return tirx.BufferStore(node.buffer, node.value, [index(i) for i in node.indices])

        body = tvm_ffi.structural_map(block.body, [(tvm.ir.TensorLoad, load), (tirx.BufferStore, store)], order="post")
        return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                            block.alloc_buffers, block.match_buffers, block.annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, [(s_tir.SBlock, rewrite_block)], order="post"))


def leading_dims(func: tvm.tirx.PrimFunc) -> tuple | None:
    """(batch, seq) when `func` can be folded over its first output's two leading dims, else None."""
    return _leading_dims(s_tir.Schedule(tvm.IRModule({"main": func})))


def _leading_dims(sch) -> tuple | None:
    shape = _sink_shape(sch)
    if shape is None or len(shape) < 3:
        return None
    leading = shape[:2]
    if any(isinstance(getattr(d, "value", None), int) for d in leading):
        return None
    blocks = _row_blocks(sch, leading)
    if not blocks or not all(_foldable_block(sch.get(block), leading) for block in blocks):
        return None
    return leading


def _row_blocks(sch, leading) -> list:
    """The root's blocks that the fold re-indexes: all but the rowless ones."""
    return [block for block in sch.get_child_blocks(sch.get_sblock("root")) if not _rowless(sch.get(block), leading)]


def _rowless(block, leading) -> bool:
    """Whether the block touches no buffer over the rows (a GEMM's weight copied into columns
    padded to whole vectors, schedule.pad_gemm_columns): folding leaves it as it is."""
    def over_rows(region) -> bool:
        shape = list(region.source.shape)
        return len(shape) >= 2 and _same(shape[0], leading[0]) and _same(shape[1], leading[1])
    return not any(over_rows(region) for region in [*block.reads, *block.writes])


def _copied_out(sch) -> None:
    """A reduction that writes the group's output (a GEMM without epilogue) writes a folded
    intermediate instead, and a copy block writes the output: left to write the [batch, seq, ...]
    parameter itself, its register tile's cache kept that 3D shape, and the copy out of the cache
    spanned a bounding box of the tile's rows that crossed into other tiles' rows (garbage written
    there: a 3D MatMul -> Add -> MatMul chain came out wrong by 1e10)."""
    for block in list(sch.get_output_blocks(sch.get_sblock("root"))):
        if tir_walk.is_reduction(sch.get(block)):
            sch.cache_write(block, 0, "global")


def fold_leading_dims(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with its two leading dims folded into one row axis (module doc), or `func` itself
    when it does not qualify. `func` has exact row indices already (schedule_group applies
    exact_row_indices to every group first, folded or not)."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    leading = _leading_dims(sch)
    if leading is None:
        return func
    try:
        return _folded(sch, leading)
    except Exception:  # noqa: BLE001 - TVM refuses with several error types (e.g. a block axis of
        return func  # extent 1 bound to a constant, which transform_block_layout does not take)


def _folded(sch, leading) -> tvm.tirx.PrimFunc:
    seq = leading[1]
    _copied_out(sch)
    params = {p.name for p in sch.mod["main"].params}
    blocks = _row_blocks(sch, leading)
    for block in blocks:
        for index, region in enumerate(sch.get(block).writes):
            shape = list(region.source.shape)
            if region.source.name not in params and len(shape) >= 2 and _same(shape[0], leading[0]) \
                    and _same(shape[1], seq):
                sch.transform_layout(block, ("write", index), lambda b, s, *rest: [b * seq + s, *rest])
    for block in blocks:
        axes = len(sch.get(block).iter_vars)
        rows = tvm.tirx.IndexMap.from_func(lambda b, s, *rest: [b * seq + s, *rest], ndim=axes)
        sch.transform_block_layout(block, rows)
    return sch.mod["main"]
