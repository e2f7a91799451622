"""The orders in which onnxruntime's CPU kernels add, where they differ by CPU, per ISA level.

MLAS picks its kernels by CPU at run time, and some of them add in an order tied to their vector
width: a Conv's input channels in blocks of its NCHWc block (`NchwcBlockSize`: 16 with AVX-512,
8 on other x86-64 CPUs, AVX2 and the SSE baseline alike; conv_blocks.py), and a Softmax row's
exps in the lanes of one accumulator (16 with AVX-512, 8 with AVX2, 4 on the SSE baseline, whose
generic kernel adds the elements past its whole vectors one by one; fast_math.py). And a
LayerNormalization row of 8 or more floats takes a vectorized path on CPUs with AVX2 (8 lanes
of fused multiply-adds), Welford's update on the others, as rows under 8 do everywhere
(layer_norm.py). MLAS's one-row product (a MatMul by a weight it has not prepacked, at batch 1, and a
ReduceSum or ReduceMean over middle axes, a product by ones) adds in groups of four in its AVX
kernel and in order in its SSE one (one_row_products.py, row_sums.py). A portable
library runs one of its levels on each CPU (docs/portability.md), so each level is lowered in
the order onnxruntime follows on the CPUs that level serves: compile.py imports a group once per
distinct SumOrders, under `summing_as`, and the lowerings read `current()`.

On aarch64 (measured against the arm64 onnxruntime under `qemu-aarch64 -cpu neoverse-n1`; the
table in docs/aarch64.md) the vector code is NEON's: four lanes added pairwise as `faddp` adds
them, (l0 + l1) + (l2 + l3), where x86-64's SSE code adds halves, (l0 + l2) + (l1 + l3)
(Softmax, Eigen's row sums, GlobalAveragePool); there is no one-row kernel (a batch-1 product is
one chain of fused multiply-adds from the bias, as MLAS's general kernel sums it); onnxruntime's
own C++ is compiled with multiply-adds contracted (GCC's default on aarch64), so LayerNorm's
Welford update, the recurrent ops' gate math and FastGelu's inner sum fuse theirs (layer_norm.py,
recurrent_op.py, contracted_gelu.py);
and a Conv is an im2col product in MLAS's K blocks of 128 products or more (conv_blocks.py).
A float32 Reciprocal there is not even a division: Eigen's NEON estimate refined twice
(arm_reciprocal.py).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from . import register_file

# How MLAS sums a product of one row by a run-time weight (one_row_products.py) and a sum over
# middle axes (row_sums.py): its AVX kernel's groups of four; its SSE kernel's order; or, on
# aarch64, its general kernel's one chain of fused multiply-adds in order (from the bias; a
# middle sum in order from +0.0).
GROUPS_OF_FOUR, IN_ORDER, FUSED_CHAIN = "groups of four", "in order", "one fused chain"
# How four lanes of a vector are added into one: x86-64's SSE shuffles add halves, NEON's faddp pairs.
HALVES, ADJACENT = "(l0 + l2) + (l1 + l3)", "(l0 + l1) + (l2 + l3)"


@dataclass(frozen=True)
class SumOrders:
    conv_channel_block: int  # input channels per block of a Conv's sums (conv_blocks)
    conv_k_block: int | None  # aarch64: im2col products per block (MLAS's base K stride; conv_blocks); None on x86-64
    softmax_lanes: int  # lanes of a Softmax row's sum of exps (fast_math._fast_softmax)
    layer_norm_welford_below: int | None  # rows of LayerNorm taking Welford's update; None: all (layer_norm)
    one_row_products: str  # GROUPS_OF_FOUR, IN_ORDER or FUSED_CHAIN
    four_lanes_added: str  # HALVES or ADJACENT
    scalar_multiply_adds_fused: bool  # onnxruntime's C++ built with a * b + c contracted (layer_norm, recurrent_op)
    reciprocal_estimated: bool = False  # Reciprocal as NEON's estimate and two Newton steps (arm_reciprocal)
    nchwc_block: int | None = None  # channels per block of onnxruntime's NCHWc layout; None: none (row_sums' pools)


AVX512 = SumOrders(conv_channel_block=16, conv_k_block=None, softmax_lanes=16, layer_norm_welford_below=8,
                   one_row_products=GROUPS_OF_FOUR, four_lanes_added=HALVES, scalar_multiply_adds_fused=False,
                   nchwc_block=16)
AVX2 = SumOrders(conv_channel_block=8, conv_k_block=None, softmax_lanes=8, layer_norm_welford_below=8,
                 one_row_products=GROUPS_OF_FOUR, four_lanes_added=HALVES, scalar_multiply_adds_fused=False,
                 nchwc_block=8)
SSE = SumOrders(conv_channel_block=8, conv_k_block=None, softmax_lanes=4, layer_norm_welford_below=None,
                one_row_products=IN_ORDER, four_lanes_added=HALVES, scalar_multiply_adds_fused=False,
                nchwc_block=8)
NEON = SumOrders(conv_channel_block=16, conv_k_block=128, softmax_lanes=4, layer_norm_welford_below=None,
                 one_row_products=FUSED_CHAIN, four_lanes_added=ADJACENT, scalar_multiply_adds_fused=True,
                 reciprocal_estimated=True)

_current = contextvars.ContextVar("onnxruntime_sum_orders", default=AVX512)


def for_target(tvm_target) -> SumOrders:
    """onnxruntime's orders on the CPUs of an ISA level's TVM target: NEON's on aarch64; on
    x86-64 MLAS takes its AVX-512 kernels with AVX-512F, its AVX2 ones with AVX2 and FMA, its
    generic or SSE ones otherwise. An AVX CPU without AVX2 (Sandy Bridge) runs the baseline level,
    where MLAS takes its AVX one-row kernel: only those products differ there (docs/portability.md)."""
    from tvm.target import codegen

    registers = register_file.for_target(tvm_target)
    if registers == register_file.NEON:
        return NEON
    if registers == register_file.AVX512:
        return AVX512
    if codegen.target_has_features("avx2", tvm_target) and codegen.target_has_features("fma", tvm_target):
        return AVX2
    return SSE


def add_four_lanes(lanes: list):
    """Four lane sums added into one in the current orders' way (HALVES or ADJACENT)."""
    a0, a1, a2, a3 = lanes
    if current().four_lanes_added == ADJACENT:
        return (a0 + a1) + (a2 + a3)
    return (a0 + a2) + (a1 + a3)


def current() -> SumOrders:
    """The orders of the lowering in progress (AVX-512's outside `summing_as`)."""
    return _current.get()


@contextlib.contextmanager
def summing_as(orders: SumOrders):
    """Ops lowered inside the `with` add in `orders`."""
    token = _current.set(orders)
    try:
        yield
    finally:
        _current.reset(token)
