"""x86-64 kernels that spill vector registers realign their stack frame, so each spill is one
aligned store and each reload one aligned load.

Why: LLVM decides to spill during register allocation, too late to reserve the frame pointer a
realignment needs, so it gives a zmm spill slot the frame's own 16-byte alignment and moves it
with vmovups. Whether the slots then straddle cache lines depends on where the caller's stack
pointer happens to be: per process (the stack's address is randomized), or per thread. The same
GEMM kernel (`[1024, 128] @ [128, 64]` + bias + residual, 14 zmm spills in its register-tile
loops) took 160-170 us per call in some processes and 218-337 us in others, against a steady
172-176 us for onnxruntime (2026-11-26, five and six processes each); on a thread of its own it
was always slow. With the function attribute "stackrealign" LLVM reserves the frame pointer up
front, aligns the frame to 64 bytes and spills with vmovaps: 164-167 us in every process, paired
rounds against onnxruntime 1.039-1.047x where the unaligned kernel read 1.026-1.033x or 0.725x.

How: TVM offers no way to set an LLVM function attribute, so a module that spills is taken back
as LLVM IR (`inspect_source("ll")`), "stackrealign" is added to the attributes of its functions
(every attribute group naming a target-cpu), and TVM compiles that IR into the object. The IR
carries its target, cl-opts included, as the `tvm_target` module flag, so the object is built as
the first one was. Only for x86-64 and only when there are vector spills: realigning reserves a
register (the frame pointer), which a kernel without spills has no reason to give up.
"""

from __future__ import annotations

import os
import pathlib
import re
import tempfile

import tvm

from . import spill_guard

ATTRIBUTE = '"stackrealign"'
_TARGETED_ATTRIBUTES = re.compile(r'^(attributes #\d+ = \{)([^}\n]*"target-cpu")', re.MULTILINE)


def with_stackrealign(llvm_ir: str) -> str:
    """`llvm_ir` with "stackrealign" in every attribute group that names a target-cpu (those of
    the functions TVM generated; intrinsics' groups name none)."""
    return _TARGETED_ATTRIBUTES.sub(lambda m: f"{m.group(1)} {ATTRIBUTE}{m.group(2)}"
                                    if ATTRIBUTE not in m.group(2) else m.group(0), llvm_ir)


def needs_realignment(built, arch: str, spills: int | None = None) -> bool:
    """Whether `built` (what tvm.compile returns) is x86-64 code that spills vector registers;
    `spills` is their count when the caller has it (spill_guard.fewer_spills), else it is counted."""
    if arch != "x86_64":
        return False
    if spills is None:
        spills = spill_guard.vector_spills(built.mod.inspect_source("asm"), arch)
    return spills > 0


def write_object(built, path: pathlib.Path, arch: str, spills: int | None = None) -> None:
    """`built`'s object file at `path`, rebuilt with realigned frames if it spills vector registers
    (`spills`: their count, if known)."""
    if not needs_realignment(built, arch, spills):
        built.mod.write_to_file(str(path))
        return
    with tempfile.TemporaryDirectory(prefix="onnxfuse-realign-") as work:
        source = os.path.join(work, "kernel.ll")
        pathlib.Path(source).write_text(with_stackrealign(built.mod.inspect_source("ll")))
        tvm.runtime.load_module(source).write_to_file(str(path))
