"""Shape decisions for the GEMM micro-kernel (schedule.schedule_matmul), as plain functions of the
matrix sizes and the register file, so each choice can be read and tested without TVM.

Why per shape: gate cells have small K and N (10-64 each), tall-skinny batches and batch 1.
A tile sized for wide matrices runs them badly: N = 30 is no multiple of AVX-512's 16 lanes,
so the GEMM ran as scalar dot products (the seed gate `[1000, 10] @ [10, 30]` at 0.58x
onnxruntime).

Tried and slower on the seed gate (fused, through onnxruntime, batch 1,000, 3 runs): unrolling
K = 10 completely (0.59-0.63x against 1.14-1.26x kept as a loop: LLVM then hoists all 20 weight
vectors, invariant across row tiles, out of the tile loop and spills the accumulators).
"""

from __future__ import annotations

from .register_file import RegisterFile

NARROW_ROWS = 4  # rows of a register tile whose columns do not fill it (the seed gate's 2 vectors)
SINGLE_VECTOR_ROWS = 8  # rows of a register tile of a GEMM whose columns are one vector (see register_tile)
CLAMPED_ROWS = 24  # the row extent register_tile plans a root GEMM's symbolic rows for (every tile height divides it)
PAD_MAX_WEIGHT_ELEMENTS = 4096  # pad N only for weights up to 64 x 64: the padded copy is made every call


def padded_columns(cols: int, k: int, lanes: int) -> int | None:
    """The column count to compute a GEMM with N = `cols` over, when N is no multiple of the
    vector width: the next multiple, so every column vector is whole and runs unpredicated (the
    pad columns are computed from zero weights and never read). None when N is a multiple
    already, or when the padded weight copy (K x padded N, made on every call) would cost more
    than a small GEMM gains from it."""
    if cols % lanes == 0:
        return None
    padded = -(-cols // lanes) * lanes
    return padded if k * padded <= PAD_MAX_WEIGHT_ELEMENTS else None


def fills_register_tile(col_vectors: int, registers: RegisterFile) -> bool:
    """Whether a GEMM's columns fill the widest register tile (whole groups of registers.count / 8
    vectors): only such a GEMM takes registers.gemm_rows rows."""
    return col_vectors % (registers.count // 8) == 0


def register_tile(row_extent: int | None, col_vectors: int, registers: RegisterFile) -> tuple[int, int]:
    """(rows, column vectors) of the accumulator tile.

    Several rows share their weight vectors: at most an eighth of the registers of them (4 on 32
    registers, 2 on AVX2's 16), and up to registers.gemm_rows rows when the columns fill those
    vectors, SINGLE_VECTOR_ROWS when the columns are one vector, else NARROW_ROWS (rows first,
    since each broadcast feeds a whole row of FMAs). With
    the weight vectors and the broadcast (an FMA operand straight from memory on AVX-512) beside
    them, LLVM spills nothing. A single row
    (batch 1, a GEMV) reuses no weight vector across rows, so half the registers become column
    vectors: more independent FMAs per broadcast.
    AVX-512 takes 6 x 4 (24 accumulators): against 4 x 4, paired rounds, one run each, ratio over
    onnxruntime at batch 64 / 1,000: a [N, 64] @ [64, 256] MatMul + bias 1.01x -> 1.09x / 1.02x ->
    1.13x, lstm_cell 1.29x -> 1.37x / 1.36x -> 1.50x (both with clamped_tail, 6-row tiles); the
    seed gate's 2 vectors as 6 x 2 fell from 1.59x to 1.34x at 1,000, so narrow tiles keep 4 rows.
    Tried and slower: 4 x 3 on AVX2; 8 x 2, 2 x 8 and 8 x 4 on the LSTM cell's 256 columns; and
    for the seed gate's 32 padded columns 8 x 2 (its 16 accumulators beside 2 weight vectors and
    8 broadcasts: 1.14-1.26x onnxruntime at batch 1,000 against 1.20-1.38x for 4 x 2, 3 runs).
    One vector of columns (N = 10, padded to 16, or 16): 4 x 1 loaded a weight vector for every
    4 FMAs; 8 x 1, paired rounds at 1,000 rows: `[N, 128] @ [128, 10]` + Relu 0.69x -> 0.99x
    onnxruntime, + Tanh 0.78x -> 1.08x, `[N, 16] @ [16, 16]` + Relu 1.21x -> 1.28x."""
    shared = registers.count // 8
    widest = registers.count // 2 if row_extent == 1 else shared
    vectors = max(v for v in range(1, min(col_vectors, widest) + 1) if col_vectors % v == 0)
    rows = 1
    if row_extent is not None:
        if vectors == shared:
            most = registers.gemm_rows
        elif col_vectors == 1:
            most = SINGLE_VECTOR_ROWS
        else:
            most = min(registers.gemm_rows, NARROW_ROWS)
        for r in range(min(most, row_extent), 0, -1):
            if row_extent % r == 0:
                rows = r
                break
    return rows, vectors
