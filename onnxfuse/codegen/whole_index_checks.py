"""Every index a Gather reads is checked, also where the kernel computes only part of its output.

Why: onnxruntime computes each Gather/GatherElements whole and raises on any index outside its
axis. A fused kernel computes what the group's outputs need: with a Slice after the Gather, the
schedule inlines the gather into the Slice and reads (and checks, bounds.py) only the indices of
the kept columns. The fuzzer's `Gather(table, i) -> Slice(columns 2:3)` with 7 (of 5 rows) in
column 0 returned a value where onnxruntime raises.

So for every gather in the group whose index comes from the group's inputs (directly, or through
elementwise producers without gathers of their own, such as the importer's `i < 0 ? i + n : i`
or a Floor -> Cast of a float input), the kernel first runs a loop nest over the gather's whole
output domain (the axes the index varies along) that computes the index again and checks it,
`0 <= index < extent`, failing as bounds.py's checks do. Gathers with the same domain and index share one nest. Indices computed
through other gathers (the tree chains' node indices) get none: it would compute the chain again
per level, and a chain's gathers are read whole by the next level, whose own checks (bounds.py)
cover them. On a depth-8 tree chain (one nest, over the root indices) the kernel's time did not
move measurably (batch 1,000 and 64; medians of alternating rounds, within the VM's noise), nor
did an embedding Gather's ([8, 128] ids into a [30000, 128] table: ratio 1.00).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from . import bounds, tir_walk

_SPATIAL = 0


def _blocks(func) -> list:
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    return [sch.get(b) for b in tir_walk.leaf_blocks(sch)]


def _written(blocks) -> list:
    """Every buffer a block writes: intermediates, and outputs (which other blocks may read)."""
    written = []
    for block in blocks:
        store = block.body
        if hasattr(store, "value") and not any(store.buffer.same_as(b) for b in written):
            written.append(store.buffer)
    return written


def _elementwise_producers(blocks) -> list:
    """(buffer, iter vars, value) of each block that writes its buffer element by element: no
    reduction, indices exactly its spatial iter vars."""
    producers = []
    for block in blocks:
        store = block.body
        if block.init is not None or not hasattr(store, "value"):
            continue
        variables = [iv.var for iv in block.iter_vars]
        if (all(int(iv.iter_type) == _SPATIAL for iv in block.iter_vars) and len(store.indices) == len(variables)
                and all(i.same_as(v) for i, v in zip(store.indices, variables))):
            producers.append((store.buffer, variables, store.value))
    return producers


def _substitute(expr, mapping: dict):
    return tvm_ffi.structural_map(expr, [(tirx.Var, lambda v: mapping.get(v, v))], order="post")


class _Materialiser:
    """Rewrites an index to read the kernel's inputs only: each intermediate it loads is computed
    again from its elementwise producer into a one-element scratch buffer (LLVM keeps it in a
    register), once per buffer and index. Inlining the producers' values instead repeated them
    (each `where` reads its operand three times): the Floor -> Cast chain's check was 640 nodes,
    and TVM's simplifier took 44 s on it."""

    def __init__(self, producers: list, written: list):
        self.producers, self.written = producers, written
        self.stores: list = []
        self.scratch: list = []
        self._done: dict = {}

    def inputs_only(self, expr, depth: int = 0):
        """`expr` reading scratch instead of intermediates, or None if a load reaches a gather
        or a producer that is not elementwise."""
        failed = []

        def replace(load):
            if not any(load.source.same_as(b) for b in self.written):
                return load
            replaced = self._computed(load, depth) if depth < 32 else None
            if replaced is None:
                failed.append(load)
                return load
            return replaced

        result = tvm_ffi.structural_map(expr, [(tvm.ir.TensorLoad, replace)], order="post")
        return None if failed else result

    def _computed(self, load, depth: int):
        key = (load.source.name, str(load.source.ty.dtype), str(list(load.indices)))
        if key in self._done:
            return self._done[key]
        producer = next((p[1:] for p in self.producers if p[0].same_as(load.source)), None)
        if producer is None or any(tir_walk.contains_load(i) for i in load.indices):
            return None
        variables, value = producer
        if any(tir_walk.contains_load(i) for ld in tir_walk.iter_loads(value) for i in ld.indices):
            return None  # the producer gathers: its index is its own gather's to check
        value = self.inputs_only(_substitute(value, dict(zip(variables, load.indices))), depth + 1)
        if value is None:
            return None
        scratch = tirx.decl_buffer((1,), str(load.source.ty.dtype), f"{load.source.name}_checked", scope="local")
        zero = tirx.const(0, "int64")
        self.stores.append(tirx.BufferStore(scratch, value, [zero]))
        self.scratch.append(scratch)
        self._done[key] = tirx.BufferLoad(scratch, [zero])
        return self._done[key]


def _check_nest(block, stores: list, conditions: list[tuple[int, object]], what: str):
    """for v in the block's domain: the scratch stores, then fail unless every condition holds.
    Conditions are (nesting of loads, condition), checked in order of nesting, each level its own
    guard (bounds.py: TIR's `and` reads both sides)."""
    guards = []
    for level in sorted({depth for depth, _ in conditions}):
        condition = tirx.all(*[c for depth, c in conditions if depth == level])
        failed = tirx.AssertStmt(tirx.const(False, "bool"), tvm.ir.StringImm(bounds.ERROR_KIND),
                                 [tvm.ir.StringImm(bounds.index_message(what))])
        guards.append(tirx.IfThenElse(tirx.Not(condition), failed, None))
    body = [*stores, *guards]
    nest = body[0] if len(body) == 1 else tirx.SeqStmt(body)
    # Only the axes the indices vary along: an embedding Gather's [N, S, D] output reads its index
    # at [n, s], and looping over D too would check each index D times.
    read = [iv for iv in block.iter_vars
            if any(tir_walk.uses_var(c, iv.var) for _, c in conditions)
            or any(tir_walk.uses_var(st.value, iv.var) for st in stores)]
    loop_vars = [tirx.Var(f"{iv.var.name}_checked", iv.var.ty.dtype) for iv in read]
    nest = _substitute(nest, dict(zip([iv.var for iv in read], loop_vars)))
    for iv, var in reversed(list(zip(read, loop_vars))):
        nest = tirx.For(var, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, nest)
    return nest


def _key(block, indices: list) -> str:
    """The block's domain and its gathers' indices, with its iteration variables named by position."""
    canonical = {iv.var: tirx.Var(f"i{k}", iv.var.ty.dtype) for k, iv in enumerate(block.iter_vars)}
    return str([str(iv.dom.extent) for iv in block.iter_vars]) + str([str(_substitute(i, canonical)) for i in indices])


def whole_gather_checks(unscheduled, what: str = "kernel") -> tuple[list, list]:
    """Loop nests that check every index of every gather of `unscheduled` whose index reads the
    kernel's inputs only (see the module docstring), and the scratch buffers they use."""
    blocks = _blocks(unscheduled)
    written, producers = _written(blocks), _elementwise_producers(blocks)
    nests, scratch, seen = [], [], set()
    for block in blocks:
        indices = [(index, extent) for expr in tir_walk.store_value_exprs(block)
                   for load in bounds.data_dependent_loads(expr)
                   for index, extent in zip(load.indices, load.source.shape) if tir_walk.contains_load(index)]
        key = _key(block, [i for i, _ in indices])
        if not indices or key in seen:
            continue  # the tree chains' four Gathers of one level read one index
        seen.add(key)
        materialiser = _Materialiser(producers, written)
        conditions = []
        for index, extent in indices:
            index = materialiser.inputs_only(index)
            if index is not None:
                conditions.append((bounds.nesting(index), bounds.in_range(index, extent)))
        if conditions:
            nests.append(_check_nest(block, materialiser.stores, conditions, what))
            scratch.extend(materialiser.scratch)
    return nests, scratch


def check_whole_gathers_first(scheduled, unscheduled, what: str = "kernel"):
    """`scheduled` running the checks of whole_gather_checks(unscheduled) before anything else."""
    nests, scratch = whole_gather_checks(unscheduled, what)
    if not nests:
        return scheduled
    realize = scheduled.body
    root = realize.block
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                            tirx.SeqStmt([*nests, root.body]), root.init, [*root.alloc_buffers, *scratch],
                            root.match_buffers, root.annotations)
    return scheduled.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_root))
