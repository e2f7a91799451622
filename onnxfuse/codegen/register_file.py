"""The vector register file a target offers a GEMM micro-kernel: how wide and how many.

Why it matters: the register tile of schedule.schedule_matmul holds its accumulators in vector
registers. A tile sized for AVX-512's 32 zmm registers needs 64 ymm accumulators on an AVX2
machine (16 ymm registers) or 64 q registers on NEON (32 registers), so LLVM spills them and
every FMA goes through the stack (measured here: the LSTM cell at batch 64 built for haswell took
108 us against 58 us for the same schedule built for this AVX-512 machine).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RegisterFile:
    vector_bytes: int  # one vector register
    count: int  # vector registers the compiler may allocate
    gemm_rows: int = 4  # rows of a GEMM register tile whose columns fill it (gemm_shapes.register_tile)

    def lanes(self, bits: int) -> int:
        """Elements of `bits` each in one register."""
        return max(1, self.vector_bytes * 8 // max(8, bits))


AVX512 = RegisterFile(vector_bytes=64, count=32, gemm_rows=6)  # 6 x 4 zmm: 24 accumulators
AVX2 = RegisterFile(vector_bytes=32, count=16)  # AVX/AVX2: 16 ymm registers
SSE = RegisterFile(vector_bytes=16, count=16)  # portable x86-64: 16 xmm registers
NEON = RegisterFile(vector_bytes=16, count=32)  # AArch64 Advanced SIMD: 32 q registers


def for_target(tvm_target) -> RegisterFile:
    """The register file of a TVM llvm target (its triple, CPU and features)."""
    from tvm.target import codegen

    triple = str(tvm_target.attrs.get("mtriple", "") or "")
    if triple.startswith(("aarch64", "arm64")):
        return NEON
    if codegen.target_has_features("avx512f", tvm_target):
        return AVX512
    if codegen.target_has_features("avx", tvm_target):
        return AVX2
    return SSE
