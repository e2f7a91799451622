"""The last step of a float32 Sigmoid, as onnxruntime's kernel for the CPU at hand takes it.

onnxruntime's float32 Sigmoid is MLAS's rational function r = x p(x^2) / q(x^2) + 0.5
(fast_math.py computes the same), but which kernel runs depends on the CPU:
- x86-64 with AVX2 and FMA: a hand-written FMA kernel that returns max(r, 0): at x = 17.84 it
  gives 1.0000001, above 1;
- everywhere else (x86-64 without FMA, aarch64): the generic kernel, which clamps r to [0, 1].
  On x86-64 without FMA its r is computed with separate multiplies and adds, and is negative
  (down to -1.2e-7) for 317 thousand inputs between -18 and -10; the clamp makes those 0.
The Horner steps need nothing from us: LLVM contracts them into FMAs exactly where the level
has FMA, as onnxruntime's kernels for those CPUs do. The clamp differs, so fast_math writes the
generic one as its own block (CLAMP_BLOCK), and `for_level` drops its upper bound when the
kernel is built for an x86 level with FMA. Each ISA level of a portable build then computes what
onnxruntime computes on the CPUs that run that level (tests/test_sigmoid_levels.py checks the
baseline under an emulated CPU without FMA).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir

CLAMP_BLOCK = "onnxruntime_sigmoid_clamp"


def clamp_to_unit(ratio):
    """The generic kernel's clamp of `ratio` (a float PrimExpr) to [0, 1]; NaN stays NaN (both
    compares are false). `ratio` is bound once (a Let), so the schedule inlines the rational
    block into this one (it reads it once). `for_level` recognises exactly this shape."""
    r = tvm.tirx.Var("sigmoid_ratio", ratio.ty.dtype)
    return tvm.tirx.Let(r, ratio, clamp_as_kernel(r, fma_kernel=False))


def clamp_as_kernel(ratio, fma_kernel: bool):
    """`ratio` (a named value: it is read more than once) clamped as onnxruntime's kernel for the
    CPUs at hand clamps it, for code written per level (the recurrent kernel) rather than
    rewritten by `for_level`."""
    dtype = ratio.ty.dtype
    zero, one = tvm.tirx.const(0.0, dtype), tvm.tirx.const(1.0, dtype)
    if fma_kernel:
        return tvm.tirx.Select(ratio < zero, zero, ratio)
    return tvm.tirx.Select(ratio < zero, zero, tvm.tirx.Select(one < ratio, one, ratio))


def runs_fma_kernel(tvm_target) -> bool:
    """Whether onnxruntime runs its FMA Sigmoid kernel on the CPUs a level built for `tvm_target`
    serves: x86-64 with AVX2 and FMA."""
    from tvm.target import codegen

    triple = str(tvm_target.attrs.get("mtriple", "") or "")
    if not triple.startswith("x86_64"):
        return False
    return bool(codegen.target_has_features("avx2", tvm_target) and codegen.target_has_features("fma", tvm_target))


def _floor_only(value):
    """let r = ... in Select(r < 0, 0, Select(1 < r, 1, r)) → let r = ... in Select(r < 0, 0, r)."""
    outer = value.body if isinstance(value, tvm.tirx.Let) else None
    inner = outer.false_value if isinstance(outer, tvm.tirx.Select) else None
    if not isinstance(inner, tvm.tirx.Select):
        raise ValueError(f"{CLAMP_BLOCK}: not the clamp clamp_to_unit writes: {value}")
    return tvm.tirx.Let(value.var, value.value, clamp_as_kernel(value.var, fma_kernel=True))


def _without_upper_bound(block):
    if not block.name_hint.startswith(CLAMP_BLOCK):
        return block
    store = block.body
    body = tvm.tirx.BufferStore(store.buffer, _floor_only(store.value), list(store.indices))
    return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                        block.alloc_buffers, block.match_buffers, block.annotations)


def for_level(func: tvm.tirx.PrimFunc, tvm_target) -> tvm.tirx.PrimFunc:
    """`func` (unscheduled) with each Sigmoid clamp as onnxruntime's kernel for the level's CPUs
    has it: the FMA kernel's max(r, 0), or the generic [0, 1] clamp left as fast_math wrote it."""
    if not runs_fma_kernel(tvm_target):
        return func
    return tvm_ffi.structural_map(func, [(s_tir.SBlock, _without_upper_bound)], order="post")
