"""A kernel with a register-tiled GEMM is built a second time without LLVM's MachineLICM when its
vector registers spill, and the second build is kept if it spills at most half as often.

Why: MachineLICM hoists the constants of the gate math (a dozen broadcast polynomial
coefficients) out of the row-tile loop to the function's entry, where they hold vector
registers for the whole kernel; the GEMM's register tile inside the same loop then lost its
accumulators to the stack. With LLVM's generic x86-64-v4 tuning (every Intel model alike; its
znver4 tuning did not), the seed-shaped `lstm_gate` ([N, 64] @ [64, 192] -> Split -> gates)
stored its 16 accumulators to the stack and loaded them back around every FMA: 22-29 us at batch
64 where the same kernel without MachineLICM took 20-22 (0.86-1.09x onnxruntime against 1.15-1.25x,
paired rounds). Turned off for every GEMM kernel, it cost transformer_mlp 6% at batch 1,000 and
changed nothing else measured, and that kernel spills as often either way: so the spill count
decides, per kernel and ISA level. x86-64 only: it is the architecture this was measured on.
Since its GEMM runs column blocks first (schedule._tile_loop_order) that gate no longer needs the
guard: its v4 build spills 4 vector registers with MachineLICM or without (36 and 4 before).
"""

from __future__ import annotations

import re
from collections.abc import Callable

RETRY_OPTIONS = {"x86_64": ("-disable-machine-licm",)}

_VECTOR_SPILLS = {  # a vector register stored into the stack frame
    "x86_64": re.compile(r"\bvmov[au]p[sd]\s+%[xyz]mm\d+,\s*(?:-?(?:0x[0-9a-f]+|\d+))?\(%rsp\)"),
}


def vector_spills(assembly: str, arch: str) -> int:
    """How many stores of a vector register into the stack frame `assembly` holds."""
    pattern = _VECTOR_SPILLS.get(arch)
    return len(pattern.findall(assembly)) if pattern else 0


def fewer_spills(build: Callable[[tuple[str, ...]], object], options: tuple[str, ...], arch: str):
    """(built, its vector spills): `build(options)`, or `build(options + RETRY_OPTIONS[arch])` if
    that spills at most half as many vector registers. `build` returns what tvm.compile does; the
    count is passed on so that stack_realign need not ask LLVM for the assembly again."""
    first = build(options)
    retry = RETRY_OPTIONS.get(arch)
    if not retry:
        return first, None
    spills = vector_spills(first.mod.inspect_source("asm"), arch)
    if spills == 0:
        return first, spills
    second = build(options + retry)
    second_spills = vector_spills(second.mod.inspect_source("asm"), arch)
    return (second, second_spills) if 2 * second_spills <= spills else (first, spills)
