"""How many register-wide vectors one iteration of an elementwise loop computes side by side.

A loop vectorized one register wide runs its value as one chain of dependent instructions per
iteration. For a short value (an Add, a Relu) that is memory-bound anyway. For a long one
(onnxruntime's Erf: two polynomials, an exp and a select, about 40 vector instructions, each
waiting about 4 cycles for the one before) the out-of-order core cannot reach far enough ahead
into the next iterations to keep both vector units busy, so the loop runs at its chains' latency.
Vectorizing such a loop 4 registers wide makes every TIR operation 4 independent machine
instructions, issued next to each other: the chains interleave and the loop runs at the units'
throughput. Each lane computes the same operations in the same order, so the bits are unchanged.

Measured (transformer_mlp's GELU, a loop of its own after the first GEMM; fused model through
onnxruntime, alternating rounds, ratio over onnxruntime at batch 64 / 1,000): 1 register 1.15x /
1.16x, 2 registers 1.26x / 1.18x, 4 registers 1.28x / 1.25x, 8 registers 0.91x / 0.93x (LLVM
spills the 8 chains' values, and compiles 8x longer). The cells' gate math is already unrolled
across a register tile's columns, so it was left as it is (4 registers: par on the LSTM and GRU
cells). On 16 registers (AVX2, SSE) half as many chains fit beside their constants.
"""

from __future__ import annotations

import tvm

from . import tir_walk
from .register_file import RegisterFile

LONG_VALUE_OPS = 16  # arithmetic operations from which a value's chain is latency-bound

_LEAVES = (tvm.ir.TensorLoad, tvm.tirx.IntImm, tvm.tirx.FloatImm, tvm.tirx.Var)


def value_ops(block) -> int:
    """The arithmetic operations of the value `block` stores (index arithmetic not counted)."""
    value = getattr(block.body, "value", None)
    if value is None:
        return 0
    return sum(1 for node in tir_walk.iter_nodes_outside_indices(value) if not isinstance(node, _LEAVES))


def side_by_side(registers: RegisterFile) -> int:
    """Vectors computed side by side for a long value: 4 on 32 registers, 2 on 16."""
    return max(1, registers.count // 8)


def vector_lanes(ops: int, extent: int, lanes: int, registers: RegisterFile) -> int:
    """The lanes to vectorize a loop of `extent` iterations with, for a value of `ops` operations
    and registers of `lanes` elements: side_by_side registers' worth where the value is long and
    the loop divides into such vectors (else fewer, down to one: no ragged tail either way)."""
    if ops < LONG_VALUE_OPS:
        return lanes
    vectors = side_by_side(registers)
    while vectors > 1 and extent % (lanes * vectors):
        vectors //= 2
    return lanes * vectors
