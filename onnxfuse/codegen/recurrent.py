"""One ONNX LSTM / GRU / RNN node → one sequence kernel, written directly in TIR.

Why not through Relax: its ONNX importer unrolls a recurrent op into per-step ops, and nothing
then keeps the weights hot across steps. Here the whole sequence is one loop nest:

    for each direction, for each tile of batch rows (4 rows, then the ragged rows one by one):
        projection: xp[t, row, :] = X[t, row] @ W^T   for every step at once (a GEMM whose
                    rows are (step, row) pairs, 4 at a time, per tile of W's columns kept in L1;
                    the RNN starts it from the bias)
        recurrence: for each step t (reversed for a reverse direction):
                        for each block of `lanes` hidden units (snake order; at batch 1 up to 4
                        blocks together when a block has under 4 gate vectors):
                            acc[row, gate, :] = h[row] @ R^T for every gate   (register tile)
                            the gate math of those units (activations, c and h updates) on acc
                        Y[t] = the new h (0 for rows whose sequence has ended)
        Y_h, Y_c = the last state of each row

At one row (batch 1, and the ragged rows) the LSTM projects only the first 8 steps upfront and
the rest inside the recurrence, whose GEMV streams R from L2 with the FMA units half idle
(_OverlappedProjection). Without initial_h the first step skips its GEMV: h starts at 0.

The register tile of the recurrence (rows x gates vectors) computes all gates of the same hidden
units together, so the gate math runs straight on the accumulators: no gates buffer, no
separate elementwise pass. Rows are independent over the whole sequence, so a batch tile's state
(h double-buffered, c in place) is a few KB, and W and R (hundreds of KB) stay in L2.

Semantics (ONNX, as onnxruntime computes them; recurrent_op.py reads the attributes):
sequence_lens freezes a row's state after its last step and zeroes its Y beyond it; a reverse
direction starts at each row's last valid step; clip bounds every gate's pre-activation. The
LSTM and the GRU sum, clip and activate in onnxruntime's order and with its functions, so their
outputs are its bits (pre_activation, k_blocks, recurrent_op.gru_*_gate; docs/recurrent.md).
"""

from __future__ import annotations

import contextlib
import pathlib
from dataclasses import dataclass, field

import numpy as np
import onnx
import tvm
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..errors import CompileError
from ..kernel_spec import KernelSpec, TensorSpec, level_kernel_name
from ..target import Target
from . import param_alignment, register_file, sigmoid_clamp, sum_orders
from .compile import CompiledGroup, _stage, build_object
from .fast_math import cpp_multiply_add
from .index_math import i64
from .recurrent_op import (
    PackedWeights,
    RecurrentOp,
    gru_output_gate,
    gru_reset_gate,
    pack_weights,
    read_recurrent_op,
)
from .rounded_products import rounded

TILE_ROWS = 4  # batch rows of the register tile: LSTM 4 rows x 4 gates = 16 accumulators
PROJECTION_ROWS = 4  # (step, row) pairs per projection micro-kernel
SEQ, BATCH = "seq", "batch"

F32, I64 = "float32", "int64"
FLOAT32_MAX = float(np.finfo(np.float32).max)
# MLAS sums a product by prepacked weights in blocks of this many k's (onnxruntime 1.32; measured:
# an LSTM with 200 inputs and hidden units is bit for bit in one chain, with 300 it is not).
MLAS_PACKED_STRIDE_K = 256


class _RegisterTile:
    """A register tile as one small buffer per row (indexed by a Python int). TVM gives a CPU
    buffer a stack array only under 1,024 bytes (else a workspace, whose pointer LLVM must assume
    aliases the state it reads); on the stack, LLVM keeps the tile in registers across k."""

    def __init__(self, rows: int, vectors: int, lanes: int):
        self.rows = [T.alloc_buffer((vectors, lanes), F32) for _ in range(rows)]

    def __getitem__(self, index):
        r, g, v = index
        return self.rows[r][g, v]

    def store(self, value, r: int, g, v) -> None:
        T.buffer_store(self.rows[r], value, [g, v])


class _ValueSlots:
    """Names for the gate math's intermediate values: a value stored to a small stack buffer and
    read back. T.Bind's let is not enough: TVM's simplifier substitutes every let whose value
    reads no memory into its uses, which turned the activations (each exp reads its argument 18
    times) into expression trees of millions of nodes, and TVM's passes took 20-130 s on one LSTM
    kernel. A load is kept, and LLVM turns the buffers back into registers.

    One region (a row's gate math in one vectorized loop) uses at most SLOTS values per dtype;
    binder() begins the next region, whose values reuse the slots of the last one's (dead) values."""

    SLOTS = 64

    def __init__(self, lanes: int):
        self.pools = {dtype: [T.alloc_buffer((lanes,), dtype) for _ in range(self.SLOTS)] for dtype in (F32, "int32")}
        self.used = dict.fromkeys(self.pools, 0)

    def binder(self, v):
        """A fresh region at vector lane index v: bind(value) → the value, named."""
        self.used = dict.fromkeys(self.pools, 0)

        def bind(value):
            dtype = str(value.ty.dtype)
            slot = self.used[dtype]
            if slot >= self.SLOTS:
                raise CompileError(f"recurrent: the gate math names more than {self.SLOTS} {dtype} values")
            self.used[dtype] = slot + 1
            buffer = self.pools[dtype][slot]
            T.buffer_store(buffer, value, [v])
            return buffer[v]

        return bind


OVERLAP_CHUNK = 8  # steps projected together inside the recurrence (W is read once per chunk)
OVERLAP_GROUP = 2  # column vectors of that projection's register tile (8 x 2 accumulators)


@dataclass(frozen=True)
class _OverlappedProjection:
    """The input projection woven into the recurrence, at one batch row.

    At batch 1 a step streams all of R from L2 and the FMA units wait half the time. So only the
    first chunk of steps is projected upfront; while the steps of chunk c run, the GEMV loop of
    each column block also computes a share of chunk c + 1's projection: `items` (column group,
    input k) products of a chunk x group register tile, one every `spacing` k's of the GEMV. A
    chunk's work is (column vectors / group) x input_size items over chunk x blocks blocks.

    Only for the LSTM, a sequence of at least 2 chunks (checked at run time when it is symbolic)
    and sizes that divide evenly; otherwise everything is projected upfront. The last chunk may be
    partial (its steps past the end repeat the last step)."""

    chunk: int
    group: int
    items: int  # per block of the sweep
    spacing: int

    @staticmethod
    def plan(op: RecurrentOp, packed: PackedWeights, steps):
        chunk, group = OVERLAP_CHUNK, OVERLAP_GROUP
        if isinstance(steps, tvm.tirx.IntImm) and steps.value < 2 * chunk:
            return None
        if op.op_type != "LSTM":  # the GRUs already beat onnxruntime at batch 1 (docs/recurrent.md)
            return None
        if max(op.input_size, op.hidden) > MLAS_PACKED_STRIDE_K:  # sums in one chain: not onnxruntime's
            return None
        vectors = packed.blocks * op.gates
        if vectors % group or packed.tile_vectors % group:
            return None
        items, blocks = vectors // group * op.input_size, chunk * packed.blocks
        if items % blocks:
            return None
        per_block = items // blocks
        if op.input_size % per_block or op.hidden % per_block:
            return None
        return _OverlappedProjection(chunk, group, per_block, op.hidden // per_block)


@dataclass
class _Buffers:
    x: object
    w_in: object
    w_rec: object
    w_rec_h: object | None  # GRU without linear_before_reset: the h gate's R, a stream of its own
    b_in: object
    b_rec: object | None
    peep: object | None
    seq_lens: object | None
    init_h: object | None
    init_c: object | None
    y: object | None
    y_h: object | None
    y_c: object | None
    xp: object = None  # workspace: projected inputs of one batch tile, [steps * rows, NB*G, V]
    h: object = None  # [2, TILE_ROWS, NB*V]: the state before and after a step
    c: object = None  # [TILE_ROWS, NB*V]
    rh: object = None  # GRU without linear_before_reset: r * h_prev, [TILE_ROWS, NB*V]
    z: object = None  # and z, kept from the first phase, [TILE_ROWS, NB*V]
    lin: object = None  # GRU with linear_before_reset past one k block: h Rh^T + Rbh so far
    acc: object = None  # the recurrence's register tile, [TILE_ROWS, G, V]
    acc_in: object = None  # the projection's register tile, [PROJECTION_ROWS, 4, V]
    acc_proj: object = None  # the projection's tile inside the recurrence, [chunk, group, V]
    slots: object = None  # names of the gate math's values (_ValueSlots)


class _KernelWriter:
    """Emits the kernel's TIR with the IR builder; one method per loop nest."""

    overlap = True  # project later steps inside the recurrence where _OverlappedProjection allows
    gemv_runs = None  # the condition under which a step's GEMV runs (None: always)

    def __init__(self, op: RecurrentOp, packed: PackedWeights, steps, batch, fma_sigmoid: bool = True):
        self.op, self.packed = op, packed
        self.steps, self.batch = steps, batch
        self.lanes, self.blocks, self.gates = packed.lanes, packed.blocks, op.gates
        self.fma_sigmoid = fma_sigmoid  # the level's CPUs run onnxruntime's FMA Sigmoid kernel
        # The LSTM and the GRU sum as onnxruntime's ops do (pre_activation, k_blocks); the RNN
        # starts the projection from the bias and sums each product in one chain.
        self.onnxruntime_order = op.op_type in ("LSTM", "GRU")

    # -- indexing by layout -------------------------------------------------------------------
    def x_at(self, b: _Buffers, t, row, k):
        return b.x[t, row, k] if self.op.layout == 0 else b.x[row, t, k]

    def y_index(self, d, t, row, j):
        return [t, d, row, j] if self.op.layout == 0 else [row, t, d, j]

    def state_index(self, d, row, j):
        return [d, row, j] if self.op.layout == 0 else [row, d, j]

    # -- the function -------------------------------------------------------------------------
    def write(self, name: str, params: list[tuple[str, tuple, str]]):
        with IRBuilder() as builder:
            with T.prim_func():
                T.func_name(name)
                T.func_attr({"tir.noalias": True})
                handles = [T.arg(pname, T.handle()) for pname, _, _ in params]
                bound = {pname: T.match_buffer(h, shape, dtype) for h, (pname, shape, dtype) in zip(handles, params)}
                b = _Buffers(**{k: bound.get(k) for k in ("x", "w_in", "w_rec", "w_rec_h", "b_in", "b_rec", "peep", "seq_lens",
                                                          "init_h", "init_c", "y", "y_h", "y_c")})
                hp = self.blocks * self.lanes
                b.xp = T.alloc_buffer((self.steps * TILE_ROWS, self.blocks * self.gates, self.lanes), F32)
                b.h = T.alloc_buffer((2, TILE_ROWS, hp), F32)
                b.c = T.alloc_buffer((TILE_ROWS, hp), F32)
                if self.op.op_type == "GRU" and not self.op.linear_before_reset:
                    b.rh = T.alloc_buffer((TILE_ROWS, hp), F32)
                    b.z = T.alloc_buffer((TILE_ROWS, hp), F32)
                if self.is_linear_output(2) and len(self.k_blocks(self.op.hidden)) > 1:
                    b.lin = T.alloc_buffer((TILE_ROWS, hp), F32)
                b.acc = _RegisterTile(TILE_ROWS, self.gates, self.lanes)
                b.acc_in = _RegisterTile(PROJECTION_ROWS, 4, self.lanes)
                b.acc_proj = _RegisterTile(OVERLAP_CHUNK, OVERLAP_GROUP, self.lanes)
                b.slots = _ValueSlots(self.lanes)
                if len(set(self.op.activations)) == 1:  # one loop over directions: half the code
                    with T.serial(i64(0), i64(len(self.op.directions))) as d:
                        self.batch_tiles(b, d)
                else:
                    for d in range(len(self.op.directions)):
                        self.batch_tiles(b, d)
        return builder.get()

    def batch_tiles(self, b: _Buffers, d) -> None:
        with T.serial(i64(0), self.batch // TILE_ROWS) as tile:
            self.tile(b, d, tile * TILE_ROWS, TILE_ROWS)
        with T.serial(self.batch // TILE_ROWS * TILE_ROWS, self.batch) as row:
            self.tile(b, d, row, 1)

    def time_of(self, d, step):
        """The time index of `step` in direction d (bidirectional: forward, then reverse)."""
        backwards = self.steps - 1 - step
        if len(self.op.directions) == 1:
            return step if self.op.directions[0] == "forward" else backwards
        if isinstance(d, int):
            return step if d == 0 else backwards
        return tvm.tirx.Select(d == 0, step, backwards)

    def tile(self, b: _Buffers, d: int, row0, rows: int) -> None:
        self.initial_state(b, d, row0, rows)
        overlap = self.overlapped_projection(rows)
        if overlap is not None and not isinstance(self.steps, tvm.tirx.IntImm):
            with T.If(self.steps >= 2 * overlap.chunk):  # a symbolic sequence: both forms
                with T.Then():
                    self.sequence(b, d, row0, rows, overlap)
                with T.Else():
                    self.sequence(b, d, row0, rows, None)
        else:
            self.sequence(b, d, row0, rows, overlap)
        self.final_state(b, d, row0, rows)

    def sequence(self, b: _Buffers, d: int, row0, rows: int, overlap) -> None:
        """The projection and the steps of one batch tile."""
        if overlap is None:
            self.projection(b, d, row0, rows)
        else:
            self.projection_of_steps(b, d, row0, overlap.chunk)
        with T.serial(i64(0), self.steps) as step:
            # Without initial_h the state starts at 0: the first step's h @ R^T is 0, R is not read.
            self.gemv_runs = step > 0 if b.init_h is None else None
            t = T.Bind(self.time_of(d, step))
            self.step(b, d, row0, rows, t, step % 2, step, overlap)
            self.gemv_runs = None

    # -- state in and out ---------------------------------------------------------------------
    def initial_state(self, b, d, row0, rows):
        hp = self.blocks * self.lanes
        with T.serial(i64(0), i64(rows)) as r:
            with T.serial(i64(0), i64(hp)) as j:
                inside = j < self.op.hidden
                for state, given in ((b.h, b.init_h), (b.c, b.init_c)):
                    if state is b.c and self.op.op_type != "LSTM":
                        continue
                    value = (tvm.tirx.Select(inside, given[self.state_index(d, row0 + r, tvm.tirx.min(j, self.op.hidden - 1))],
                                             _f32(0.0)) if given is not None else _f32(0.0))
                    T.buffer_store(state, value, [0, r, j] if state is b.h else [r, j])

    def final_state(self, b, d, row0, rows):
        last = self.steps % 2
        with T.serial(i64(0), i64(rows)) as r:
            with T.serial(i64(0), i64(self.op.hidden)) as j:
                if b.y_h is not None:
                    T.buffer_store(b.y_h, b.h[last, r, j], self.state_index(d, row0 + r, j))
                if b.y_c is not None:
                    T.buffer_store(b.y_c, b.c[r, j], self.state_index(d, row0 + r, j))

    # -- the input projection -----------------------------------------------------------------
    def projection(self, b, d, row0, rows):
        """xp[q] = X[t, row] @ W^T + b_in for q = t * rows + r: per tile of W's columns (its 16 KB
        slice stays in L1 across the tile's pairs), 4 q's at a time, then the rest."""
        pairs = self.steps * rows
        with T.serial(i64(0), i64(self.packed.column_tiles)) as cb:
            with T.serial(i64(0), pairs // PROJECTION_ROWS) as quad:
                self.projection_rows(b, d, row0, rows, cb, quad * PROJECTION_ROWS, PROJECTION_ROWS)
            with T.serial(pairs // PROJECTION_ROWS * PROJECTION_ROWS, pairs) as q:
                self.projection_rows(b, d, row0, rows, cb, q, 1)

    def projection_rows(self, b, d, row0, rows, cb, q0, count):
        self.projection_tile(b, d, cb, count, lambda q, k: self.x_at(b, (q0 + q) // rows, row0 + (q0 + q) % rows, k),
                             lambda q: q0 + q)

    def k_blocks(self, size: int) -> list[tuple[int, int]]:
        """The k ranges a sum over `size` products runs in: onnxruntime's LSTM and GRU multiply
        by prepacked weights, which MLAS sums in blocks of MLAS_PACKED_STRIDE_K k's, each block
        from 0 and then added to the output; one range for the RNN."""
        stride = MLAS_PACKED_STRIDE_K if self.onnxruntime_order else size
        return [(k, min(size, k + stride)) for k in range(0, size, stride)]

    def projection_tile(self, b, d, cb, count: int, x_of, xp_row_of):
        """Column tile cb of `count` projected rows: xp[xp_row_of(q)] = b_in + sum over k of
        x_of(q, k) * w_in (LSTM and GRU: no b_in, and block by block: k_blocks), the
        accumulators in registers (acc_in)."""
        v_lanes, per_tile = self.lanes, self.packed.tile_vectors
        acc = b.acc_in
        for n, (k_low, k_high) in enumerate(self.k_blocks(self.op.input_size)):
            for q in range(count):
                with T.unroll(i64(0), i64(per_tile)) as c:
                    with T.vectorized(i64(0), i64(v_lanes)) as v:
                        first = b.b_in[d, cb * per_tile + c, v] if n == 0 and not self.onnxruntime_order else _f32(0.0)
                        acc.store(first, q, c, v)
            with T.serial(i64(k_low), i64(k_high)) as k:
                for q in range(count):
                    xk = x_of(q, k)
                    with T.unroll(i64(0), i64(per_tile)) as c:
                        with T.vectorized(i64(0), i64(v_lanes)) as v:
                            acc.store(acc[q, c, v] + xk * b.w_in[d, cb, k, c, v], q, c, v)
            for q in range(count):
                with T.unroll(i64(0), i64(per_tile)) as c:
                    with T.vectorized(i64(0), i64(v_lanes)) as v:
                        index = [xp_row_of(q), cb * per_tile + c, v]
                        T.buffer_store(b.xp, acc[q, c, v] if n == 0 else b.xp[index] + acc[q, c, v], index)

    def projection_of_steps(self, b, d, row0, count: int):
        """At one row: xp[t] for the times of steps 0 .. count-1 only (the rest is projected
        during the recurrence, _OverlappedProjection), PROJECTION_ROWS steps at a time."""
        with T.serial(i64(0), i64(self.packed.column_tiles)) as cb:
            with T.serial(i64(0), i64(count // PROJECTION_ROWS)) as quad:
                times = [T.Bind(self.time_of(d, quad * PROJECTION_ROWS + q)) for q in range(PROJECTION_ROWS)]
                self.projection_tile(b, d, cb, PROJECTION_ROWS, lambda q, k: self.x_at(b, times[q], row0, k),
                                     lambda q: times[q])

    def overlapped_projection(self, rows: int):
        """The plan of the projection done inside the recurrence (or None: all of it upfront)."""
        if rows != 1 or not self.overlap:
            return None
        return _OverlappedProjection.plan(self.op, self.packed, self.steps)

    # -- one time step ------------------------------------------------------------------------
    def span(self, rows: int, gates: int) -> int:
        """Column blocks one register tile covers. At batch 1 a block's tile is only `gates`
        vectors: for the GRU's phases (2 gates, then 1) and the RNN that is a chain of dependent
        FMAs, 4 cycles each, so 2 or 4 blocks go together for 4 independent accumulators (GRU
        without linear_before_reset, batch 1, kernel alone: 1.13x). LSTM (4 gates) and GRU (3)
        keep one block: two blocks measured 0.93x (the step is bound by reading R from L2)."""
        return next(s for s in (4, 2, 1) if s == 1 or (self.blocks % s == 0 and s * rows <= TILE_ROWS and s * rows * gates <= 4))

    def recurrent_sum(self, b, d, rows, lhs, lhs_index, jbs, gates, first_gate=0, project=None, fold=None):
        """acc[s * rows + r, g] = lhs[r] @ R[gate first_gate + g]^T over the columns of block
        jbs[s]. With `project` (overlap plan, step, sweep, row0) and a next chunk of steps to
        project, the k loop also computes this block's share of that chunk's projection. With
        `fold`, the sum runs in k_blocks, fold(tile row, batch row, column block, block number)
        adding each but the last block's sums where they go (and zeroing the tile)."""
        if b.w_rec_h is not None and first_gate == 2:
            weight = (lambda jb, k, g, v: b.w_rec_h[d, jb, k, g, v])
        else:
            weight = (lambda jb, k, g, v: b.w_rec[d, jb, k, first_gate + g, v])
        for s in range(len(jbs)):
            for r in range(rows):
                with T.unroll(i64(0), i64(gates)) as g:
                    with T.vectorized(i64(0), i64(self.lanes)) as v:
                        b.acc.store(_f32(0.0), s * rows + r, g, v)

        def gemv_at(k):
            for r in range(rows):
                hk = lhs[lhs_index(r, k)]
                for s, jb in enumerate(jbs):
                    with T.unroll(i64(0), i64(gates)) as g:
                        with T.vectorized(i64(0), i64(self.lanes)) as v:
                            a = s * rows + r
                            b.acc.store(b.acc[a, g, v] + hk * weight(jb, k, g, v), a, g, v)

        def plain():
            with self.if_gemv_runs():
                k_blocks = self.k_blocks(self.op.hidden) if fold is not None else [(0, self.op.hidden)]
                for n, (k_low, k_high) in enumerate(k_blocks):
                    with T.serial(i64(k_low), i64(k_high)) as k:
                        gemv_at(k)
                    if n + 1 < len(k_blocks):
                        for s, r in ((s, r) for s in range(len(jbs)) for r in range(rows)):
                            fold(s * rows + r, r, jbs[s], n)

        if project is None:
            plain()
            return
        plan, step, sweep, row0 = project
        base = (step // plan.chunk + 1) * plan.chunk  # the first step of the chunk to project
        with T.If(base < self.steps):
            with T.Then():
                self.gemv_with_projection(b, d, row0, plan, step, sweep, base, gemv_at)
            with T.Else():
                plain()

    def gemv_with_projection(self, b, d, row0, plan, step, sweep, base, gemv_at):
        """The k loop of one block with `plan.items` projection k's of the next chunk woven in, one
        every `plan.spacing` k's of the GEMV: a register tile of the chunk's steps x `plan.group`
        column vectors, started from the bias (or the partial sums of the block before) and
        stored back to xp after the loop. The GEMV streams R from L2 with the FMA units half
        idle; this tile's FMAs fill them, and W is read once per chunk."""
        per_tile, lanes = self.packed.tile_vectors, self.lanes
        item0 = T.Bind(((step % plan.chunk) * self.blocks + sweep) * plan.items)
        group = T.Bind(item0 // self.op.input_size)  # the tile's column vectors: group * plan.group + gv
        k0 = T.Bind(item0 % self.op.input_size)
        tile, tv0 = T.Bind(group * plan.group // per_tile), T.Bind(group * plan.group % per_tile)
        steps = [base + p for p in range(plan.chunk)]
        if not (isinstance(self.steps, tvm.tirx.IntImm) and self.steps.value % plan.chunk == 0):
            # A partial last chunk: its steps past the end are the last step again. Every copy
            # starts from the same partial sums and adds the same products, so they all store
            # the same value into the last step's row.
            steps = [tvm.tirx.min(s, self.steps - 1) for s in steps]
        times = [T.Bind(self.time_of(d, s)) for s in steps]
        acc = b.acc_proj
        for p in range(plan.chunk):
            with T.unroll(i64(0), i64(plan.group)) as gv:
                with T.vectorized(i64(0), i64(lanes)) as v:
                    c = group * plan.group + gv
                    first = b.b_in[d, c, v] if not self.onnxruntime_order else _f32(0.0)
                    acc.store(tvm.tirx.Select(k0 == 0, first, b.xp[times[p], c, v]), p, gv, v)
        inner = T.unroll if plan.spacing <= 8 else T.serial
        with T.serial(i64(0), i64(plan.items)) as i:
            with self.if_gemv_runs():
                with inner(i64(0), i64(plan.spacing)) as kk:
                    gemv_at(i * plan.spacing + kk)
            k_in = k0 + i
            for p in range(plan.chunk):
                xk = self.x_at(b, times[p], row0, k_in)
                with T.unroll(i64(0), i64(plan.group)) as gv:
                    with T.vectorized(i64(0), i64(lanes)) as v:
                        acc.store(acc[p, gv, v] + xk * b.w_in[d, tile, k_in, tv0 + gv, v], p, gv, v)
        for p in range(plan.chunk):
            with T.unroll(i64(0), i64(plan.group)) as gv:
                with T.vectorized(i64(0), i64(lanes)) as v:
                    T.buffer_store(b.xp, acc[p, gv, v], [times[p], group * plan.group + gv, v])

    @contextlib.contextmanager
    def if_gemv_runs(self):
        """The body only when the step's GEMV runs (a loop-invariant branch, not a second copy
        of the step: the gate math is most of the kernel's code)."""
        if self.gemv_runs is None:
            yield
            return
        with T.If(self.gemv_runs):
            with T.Then():
                yield

    def sweep_blocks(self, sweep, cur, span: int, reverse=False) -> list:
        """The column blocks of the sweep's iteration, `span` at a time: forward on even steps,
        backward on odd ones (reverse: the other way round), so a sweep starts on the blocks of R
        the last one ended on, which are still in L1 (at batch 1 a step streams R from L2)."""
        forward = (cur == 1) if reverse else (cur == 0)
        group = tvm.tirx.Select(forward, sweep, self.blocks // span - 1 - sweep)
        return [group * span + s for s in range(span)]

    def step(self, b, d, row0, rows, t, cur, step_index=None, overlap=None):
        op = self.op
        acts = op.activations[d] if isinstance(d, int) else op.activations[0]
        nxt = 1 - cur
        lanes, gates = self.lanes, self.gates

        def pre(r, g, jb, v, value, bind):
            """A gate's pre-activation: value + the projected input, clipped (bound to a name:
            each value is computed once, however often the gate math reads it)."""
            total = value + b.xp[t * rows + r, jb * gates + g, v]
            if op.clip is not None:
                total = tvm.tirx.max(_f32(-op.clip), tvm.tirx.min(_f32(op.clip), total))
            return bind(total)

        def active(r):
            if b.seq_lens is None:
                return None
            return t < b.seq_lens[row0 + r].astype(I64)

        def keep_or(r, new, old):
            cond = active(r)
            return new if cond is None else tvm.tirx.Select(cond, new, old)

        h_prev = (lambda r, k: [cur, r, k])
        if op.op_type == "GRU" and not op.linear_before_reset:
            self.gru_reset_first_phase(b, d, rows, t, cur, acts)
        reset_first = op.op_type == "GRU" and not op.linear_before_reset
        span = self.span(rows, 1 if reset_first else gates)
        with T.serial(i64(0), i64(self.blocks // span)) as sweep:
            jbs = self.sweep_blocks(sweep, cur, span, reverse=reset_first)
            if reset_first:
                self.recurrent_sum(b, d, rows, b.rh, lambda r, k: [r, k], jbs, 1, first_gate=2,
                                   fold=self.folder(b, d, t, rows, 1, first_gate=2))
            else:
                project = (overlap, step_index, sweep, row0) if overlap is not None else None
                self.recurrent_sum(b, d, rows, b.h, h_prev, jbs, gates, project=project,
                                   fold=self.folder(b, d, t, rows, gates))
            for s, jb, r in ((s, jb, r) for s, jb in enumerate(jbs) for r in range(rows)):
                a = s * rows + r  # the register tile's row
                with T.vectorized(i64(0), i64(lanes)) as v:
                    j = jb * lanes + v
                    bind = b.slots.binder(v)
                    hp = bind(b.h[cur, r, j])
                    if op.op_type == "LSTM":
                        f_act, g_act, h_act = (act.as_onnxruntime(self.fma_sigmoid) for act in acts)
                        c_prev = bind(b.c[r, j])

                        def gate(g, act, cell=None, r=r, jb=jb, v=v, a=a, bind=bind):
                            total = self.pre_activation(b, d, t * rows + r, jb, g, v, b.acc[a, g, v], cell, bind)
                            return bind(act(total, bind))

                        i_gate = gate(0, f_act, c_prev)
                        f_gate = _f32(1.0) - i_gate if op.input_forget else gate(2, f_act, c_prev)
                        # merge_lstm_gates_to_memory: c_prev * f + i * g, a C++ line
                        c_new = bind(cpp_multiply_add(c_prev, f_gate, rounded(i_gate * gate(3, g_act))))
                        o_gate = gate(1, f_act, c_new)
                        h_new = o_gate * h_act(c_new, bind)
                        T.buffer_store(b.c, keep_or(r, c_new, c_prev), [r, j])
                    elif op.op_type == "GRU":
                        f_act, g_act = acts
                        row = t * rows + r
                        if op.linear_before_reset:
                            update = f_act.as_onnxruntime(self.fma_sigmoid)
                            z_gate = bind(update(self.pre_activation(b, d, row, jb, 0, v, b.acc[a, 0, v], None, bind), bind))
                            pre_r = self.pre_activation(b, d, row, jb, 1, v, b.acc[a, 1, v], None, bind)
                            reset = bind(gru_reset_gate(f_act, bind(self.linear_output(b, d, a, r, jb, v)), pre_r, bind))
                            pre_h = self.pre_activation(b, d, row, jb, 2, v, reset, None, bind)
                        else:
                            z_gate = bind(b.z[r, j])
                            pre_h = self.pre_activation(b, d, row, jb, 2, v, b.acc[a, 0, v], None, bind)
                        h_new = gru_output_gate(g_act, pre_h, z_gate, hp, bind)
                    else:
                        h_new = acts[0](pre(r, 0, jb, v, b.acc[a, 0, v], bind), bind)
                    T.buffer_store(b.h, keep_or(r, h_new, hp), [nxt, r, j])
        if b.y is not None:
            with T.serial(i64(0), i64(rows)) as r:
                with T.serial(i64(0), i64(op.hidden)) as j:
                    T.buffer_store(b.y, keep_or(r, b.h[nxt, r, j], _f32(0.0)), self.y_index(d, t, row0 + r, j))

    def fold_block_sums(self, b, d, a, xp_row, r, jb, gates, first_gate, n):
        """MLAS adds each block's sums into the output, then starts the next block from 0. The
        output is the step's projected input, or (GRU with linear_before_reset, its h gate)
        the linear output h Rh^T + Rbh (b.lin: Rbh, then each block's sums)."""
        for g in range(gates):
            with T.vectorized(i64(0), i64(self.lanes)) as v:
                if self.is_linear_output(first_gate + g):
                    index = [r, jb * self.lanes + v]
                    prior = b.lin[index] if n > 0 else (b.b_rec[d, jb, v] if self.op.has_bias else None)
                    T.buffer_store(b.lin, b.acc[a, g, v] if prior is None else prior + b.acc[a, g, v], index)
                else:
                    index = [xp_row, jb * self.gates + first_gate + g, v]
                    T.buffer_store(b.xp, b.xp[index] + b.acc[a, g, v], index)
                b.acc.store(_f32(0.0), a, g, v)

    def is_linear_output(self, gate: int) -> bool:
        return self.op.op_type == "GRU" and self.op.linear_before_reset and gate == 2

    def linear_output(self, b, d, a, r, jb, v):
        """GRU with linear_before_reset: h Rh^T + Rbh as onnxruntime sums it (Rbh, then the
        GEMM's blocks added into it; no Rbh without B). b.lin (past one k block) holds the blocks
        before the last only where this step's GEMV ran (the first step without initial_h skips it)."""
        start = b.b_rec[d, jb, v] if self.op.has_bias else None
        if b.lin is not None:
            folded = b.lin[r, jb * self.lanes + v]
            if self.gemv_runs is not None:
                folded = tvm.tirx.Select(self.gemv_runs, folded, start if start is not None else _f32(0.0))
            return folded + b.acc[a, 2, v]
        return start + b.acc[a, 2, v] if start is not None else b.acc[a, 2, v]

    def folder(self, b, d, t, rows, gates, first_gate=0):
        """recurrent_sum's `fold` in onnxruntime's order (None otherwise)."""
        if not self.onnxruntime_order:
            return None
        return lambda a, r, jb, n: self.fold_block_sums(b, d, a, t * rows + r, r, jb, gates, first_gate, n)

    def pre_activation(self, b, d, xp_row, jb, g, v, product, cell, bind):
        """An LSTM or GRU gate's input to its activation in onnxruntime's order: x W and the
        recurrent `product` each summed from 0 (MLAS adds the second GEMM into the first's
        output), plus the peephole product (with `cell`), plus the bias, then its clip, which
        runs with or without a clip attribute (FLT_MAX then: it moves only NaN, to FLT_MAX, and
        the infinities)."""
        total = b.xp[xp_row, jb * self.gates + g, v] + product
        if cell is not None and b.peep is not None:
            total = cpp_multiply_add(b.peep[d, g, jb, v], cell, total)  # elementwise_product: dest += a * b
        bound = _f32(self.op.clip if self.op.clip is not None else FLOAT32_MAX)
        if not self.op.has_bias:  # clip_ignore_bias: a NaN stays NaN
            total = bind(total)
            return bind(tvm.tirx.Select(bound < total, bound, tvm.tirx.Select(total < -bound, -bound, total)))
        # clip_add_bias: std::min(bound, x), then std::max(-bound, x)
        total = bind(total + b.b_in[d, jb * self.gates + g, v])
        low = bind(tvm.tirx.Select(total < bound, total, bound))
        return bind(tvm.tirx.Select(-bound < low, low, -bound))

    def gru_reset_first_phase(self, b, d, rows, t, cur, acts):
        """GRU without linear_before_reset: r multiplies h *before* the h gate's GEMM, so z and r
        of every unit come first (kept in b.z and b.rh = r * h_prev)."""
        f_act = acts[0]
        span = self.span(rows, 2)
        with T.serial(i64(0), i64(self.blocks // span)) as sweep:
            jbs = self.sweep_blocks(sweep, cur, span)
            self.recurrent_sum(b, d, rows, b.h, lambda r, k: [cur, r, k], jbs, 2, fold=self.folder(b, d, t, rows, 2))
            for s, jb, r in ((s, jb, r) for s, jb in enumerate(jbs) for r in range(rows)):
                a = s * rows + r
                with T.vectorized(i64(0), i64(self.lanes)) as v:
                    j = jb * self.lanes + v
                    bind = b.slots.binder(v)
                    update = f_act.as_onnxruntime(self.fma_sigmoid)
                    z = update(self.pre_activation(b, d, t * rows + r, jb, 0, v, b.acc[a, 0, v], None, bind), bind)
                    pre_r = self.pre_activation(b, d, t * rows + r, jb, 1, v, b.acc[a, 1, v], None, bind)
                    T.buffer_store(b.z, z, [r, j])
                    T.buffer_store(b.rh, gru_reset_gate(f_act, bind(b.h[cur, r, j]), pre_r, bind), [r, j])


def _f32(value: float):
    return tvm.tirx.const(value, F32)


# ---------------------------------------------------------------- the kernel's signature

@dataclass
class RecurrentKernel:
    """The PrimFunc and its signature: parameters (name, shape, dtype) and where each input
    comes from (a model value, or a packed weight)."""

    func: object
    params: list
    arg_sources: list[str]
    extra_weights: dict[str, np.ndarray]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    stats: dict = field(default_factory=dict)


def _spec_dim(dim, symbol: str):
    return dim if dim is not None else symbol


def build_recurrent_kernel(op: RecurrentOp, name: str, lanes: int, fma_sigmoid: bool = True) -> RecurrentKernel:
    packed = pack_weights(op, lanes)
    seq_dim, batch_dim = (op.x_dims[0], op.x_dims[1]) if op.layout == 0 else (op.x_dims[1], op.x_dims[0])
    steps = seq_dim if seq_dim is not None else tvm.tirx.Var(SEQ, I64)
    batch = batch_dim if batch_dim is not None else tvm.tirx.Var(BATCH, I64)
    spec_seq, spec_batch = _spec_dim(seq_dim, SEQ), _spec_dim(batch_dim, BATCH)
    num_d, h, tir_steps, tir_batch = len(op.directions), op.hidden, i64(steps), i64(batch)

    def by_layout(seq_first: tuple, batch_first: tuple) -> tuple:
        return seq_first if op.layout == 0 else batch_first

    params, specs, sources, extra = [], [], [], {}

    def add_input(pname, value_name, tir_shape, spec_shape, dtype=F32):
        params.append((pname, tir_shape, dtype))
        specs.append(TensorSpec(dtype, spec_shape))
        sources.append(value_name)

    x_shape = by_layout((tir_steps, tir_batch, op.input_size), (tir_batch, tir_steps, op.input_size))
    add_input("x", op.inputs["X"], x_shape, by_layout((spec_seq, spec_batch, op.input_size),
                                                     (spec_batch, spec_seq, op.input_size)))
    for key, array in packed.arrays.items():
        weight_name = f"{name}__{key}"
        extra[weight_name] = array
        add_input(key, weight_name, tuple(i64(int(s)) for s in array.shape), tuple(int(s) for s in array.shape))
    if "sequence_lens" in op.inputs:
        add_input("seq_lens", op.inputs["sequence_lens"], (tir_batch,), (spec_batch,), "int32")
    for key, pname in (("initial_h", "init_h"), ("initial_c", "init_c")):
        if key in op.inputs:
            add_input(pname, op.inputs[key], by_layout((num_d, tir_batch, h), (tir_batch, num_d, h)),
                      by_layout((num_d, spec_batch, h), (spec_batch, num_d, h)))
    outputs = []
    for key in op.outputs:
        pname = {"Y": "y", "Y_h": "y_h", "Y_c": "y_c"}[key]
        if key == "Y":
            tir_shape = by_layout((tir_steps, num_d, tir_batch, h), (tir_batch, tir_steps, num_d, h))
            spec_shape = by_layout((spec_seq, num_d, spec_batch, h), (spec_batch, spec_seq, num_d, h))
        else:
            tir_shape = by_layout((num_d, tir_batch, h), (tir_batch, num_d, h))
            spec_shape = by_layout((num_d, spec_batch, h), (spec_batch, num_d, h))
        params.append((pname, tir_shape, F32))
        outputs.append(TensorSpec(F32, spec_shape))
    if "initial_c" in op.inputs and op.op_type != "LSTM":
        raise CompileError("recurrent: initial_c on a non-LSTM op")
    func = _KernelWriter(op, packed, tir_steps, tir_batch, fma_sigmoid).write(name, params)
    stats = {"recurrent": op.op_type, "directions": len(op.directions), "column_blocks": packed.blocks,
             "lanes": lanes, "tile_rows": TILE_ROWS}
    return RecurrentKernel(func, params, sources, extra, specs, outputs, stats)


# ---------------------------------------------------------------- compile

def is_recurrent_group(model: onnx.ModelProto) -> bool:
    nodes = model.graph.node
    return len(nodes) == 1 and nodes[0].op_type in ("LSTM", "GRU", "RNN") and nodes[0].domain in ("", "ai.onnx")


def compile_recurrent(model: onnx.ModelProto, name: str, target: Target, out_dir: pathlib.Path,
                      parallel_levels: int = 0) -> CompiledGroup:
    """One object with the kernel built for each ISA level of `target`. The weights are packed
    once, for the best level's vector width (they are extra weights every level reads); a lower
    level runs those wider vectors as several of its own."""
    stats: dict = {}
    op = _stage("import", stats, lambda: read_recurrent_op(model))
    registers = register_file.for_target(target.tvm_target())
    lanes = registers.lanes(32)
    kernels = {}  # per Sigmoid kernel onnxruntime runs on the level's CPUs (sigmoid_clamp), per sum orders

    def kernel_for(level) -> RecurrentKernel:
        fma_sigmoid = sigmoid_clamp.runs_fma_kernel(target.tvm_target(level))
        orders = sum_orders.for_target(target.tvm_target(level))
        if (fma_sigmoid, orders) not in kernels:
            with sum_orders.summing_as(orders):
                kernels[fma_sigmoid, orders] = build_recurrent_kernel(op, name, lanes, fma_sigmoid)
        return kernels[fma_sigmoid, orders]

    kernel = _stage("schedule", stats, lambda: kernel_for(target.levels[0]))
    # One entry point per level, named as the library's table expects (the same name in every
    # level's object made joining them fail: every portable build fell back). onnxruntime's
    # tensors are only element aligned: TVM's default 64-byte declaration would let LLVM emit
    # aligned vector loads that fault on them.
    level_funcs = []
    for level in target.levels:
        level_name = level_kernel_name(name, level.suffix, len(target.levels))
        level_func = param_alignment.element_aligned(kernel_for(level).func.with_attr("global_symbol", level_name))
        level_funcs.append((level, {level_name: level_func}))
    func = param_alignment.element_aligned(kernel.func.with_attr("global_symbol", name))
    obj = _stage("build", stats, lambda: build_object(level_funcs, name, target, pathlib.Path(out_dir),
                                                      parallel=parallel_levels))
    stats.update(kernel.stats)
    stats["isa_levels"] = ",".join(level.name for level in target.levels)
    levels = tuple(level.suffix for level in target.levels) if len(target.levels) > 1 else ()
    try:
        spec = KernelSpec(name, tuple(kernel.inputs), tuple(kernel.outputs), str(obj), levels=levels)
    except ValueError as exc:
        raise CompileError(f"spec: {exc}") from exc
    return CompiledGroup(spec, tuple(kernel.arg_sources), dict(kernel.extra_weights), stats, model, {name: func})
