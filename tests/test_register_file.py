"""The GEMM register tile is sized by the target's vector registers (codegen/register_file.py).

A tile sized for AVX-512's 32 zmm registers spills on AVX2 (16 ymm) and on NEON (32 x 128-bit):
every FMA then reads and writes its accumulator on the stack. These tests check the mapping from
targets to register files, that every tile fits, that the compiled inner loops really keep their
accumulators in registers (disassembled object code, x86 and AArch64), and that kernels built for
an AVX2-only CPU give onnxruntime's answers when run on this machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import onnx
import pytest
import tvm
from test_optimize import MODELS, assert_outputs_match, random_inputs, run_both

from onnxfuse import optimize
from onnxfuse.codegen import register_file
from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.gemm_shapes import register_tile
from onnxfuse.codegen.register_file import AVX2, AVX512, NEON, SSE
from onnxfuse.codegen.schedule import GEMM_TILE_ROWS
from onnxfuse.target import resolve_target


@pytest.mark.parametrize("name, mcpu, expected", [
    ("native", "skylake-avx512", AVX512),
    ("native", "znver4", AVX512),
    ("native", "haswell", AVX2),
    ("native", "sandybridge", AVX2),  # AVX without AVX2: still 16 ymm registers
    ("x86_64", "x86-64", SSE),  # the portable baseline level
    ("aarch64", None, NEON),
    ("aarch64", "neoverse-n1", NEON),
])
def test_register_file_of_target(name, mcpu, expected):
    assert register_file.for_target(resolve_target(name, mcpu).tvm_target()) == expected


def test_host_default_target_is_sse():
    """In-process verification builds for plain `llvm`: the portable register file."""
    assert register_file.for_target(tvm.target.Target({"kind": "llvm"})) == SSE


@pytest.mark.parametrize("registers", [AVX512, AVX2, SSE, NEON], ids=["avx512", "avx2", "sse", "neon"])
def test_register_tile_fits(registers):
    """Accumulators, the weight vectors the rows share and one broadcast fit the registers, and
    the tile divides the loops it tiles (no ragged register tile). A one-row tile uses each
    weight vector once (an FMA operand straight from memory), so it keeps none."""
    for row_extent in (1, 2, GEMM_TILE_ROWS, 12, None):
        for col_vectors in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
            rows, vectors = register_tile(row_extent, col_vectors, registers)
            shape = f"{rows} x {vectors} for {row_extent} rows, {col_vectors} column vectors"
            shared_weights = vectors if rows > 1 else 0
            assert rows * vectors + shared_weights + 1 <= registers.count, shape
            assert rows * vectors <= registers.count * 3 // 4, shape
            assert col_vectors % vectors == 0, shape
            assert row_extent is None or row_extent % rows == 0, shape


def test_register_tile_uses_the_registers():
    """The tile is as large as the budget allows, for the shapes of the bundled cells."""
    assert register_tile(6, 256 // 16, AVX512) == (6, 4)  # 6 x 64 floats
    assert register_tile(GEMM_TILE_ROWS, 256 // 16, AVX512) == (4, 4)  # 8 rows of [N, 8, 64]: 4 x 64
    assert register_tile(GEMM_TILE_ROWS, 256 // 8, AVX2) == (4, 2)  # 4 x 16 floats
    assert register_tile(GEMM_TILE_ROWS, 256 // 4, NEON) == (4, 4)  # 4 x 16 floats
    assert register_tile(1, 256 // 8, AVX2) == (1, 8)  # a GEMV row: all accumulators


# ---- the object code: FMA loops keep their accumulators in registers --------------------------

X86_SPILL = re.compile(r"[xyz]mm\d+.*\(%rsp\)|\(%rsp\).*[xyz]mm\d+")
ARM_SPILL = re.compile(r"\b(ldr|str|ldp|stp|ld1|st1)\b.*\bq\d+.*\[sp")


OTHER_FLOAT_MATH = re.compile(r"^(v(mul|add|sub|div|max|min)[ps]s|f(mul|add|sub|div|max|min))\b")


def fma_loops(disassembly: str, fma: str) -> list[list[str]]:
    """The bodies of the loops (backward branches) with at least 8 `fma` instructions and no
    other floating-point arithmetic: GEMM micro-kernels, not the gate math's polynomials."""
    addresses, instructions = [], []
    for line in disassembly.splitlines():
        match = re.match(r"\s+([0-9a-f]+):\s+(.*)", line)
        if match:
            addresses.append(int(match.group(1), 16))
            instructions.append(match.group(2))
    index = {a: i for i, a in enumerate(addresses)}
    loops = []
    for i, text in enumerate(instructions):
        branch = re.match(r"(j\w+|b\.\w+|b|cbnz|cbz|tbnz|tbz)\s.*?([0-9a-f]+) <", text)
        if branch and int(branch.group(2), 16) in index and int(branch.group(2), 16) < addresses[i]:
            body = instructions[index[int(branch.group(2), 16)]:i + 1]
            if sum(fma in line for line in body) >= 8 and not any(OTHER_FLOAT_MATH.match(line) for line in body):
                loops.append(body)
    return loops


def functions(disassembly: str) -> dict[str, str]:
    """The listing of each function, by name."""
    parts = re.split(r"^[0-9a-f]+ <([^>]+)>:$", disassembly, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def innermost(loops: list[list[str]]) -> list[list[str]]:
    """The loops that contain no other listed loop (the micro-kernels' k loops)."""
    return [body for body in loops if not any(len(other) < len(body) and other[0] in body for other in loops)]


CROSS_OBJDUMP = shutil.which("aarch64-linux-gnu-objdump")


@pytest.mark.parametrize("name, mcpu, objdump, fma, spill", [
    ("native", "haswell", "objdump", "vfmadd", X86_SPILL),
    ("native", "skylake-avx512", "objdump", "vfmadd", X86_SPILL),
    pytest.param("aarch64", None, CROSS_OBJDUMP, "fmla", ARM_SPILL, marks=pytest.mark.skipif(
        CROSS_OBJDUMP is None, reason="aarch64-linux-gnu-objdump not installed (run `make install`)")),
], ids=["avx2", "avx512", "neon"])
def test_gemm_inner_loops_do_not_spill(tmp_path, name, mcpu, objdump, fma, spill):
    """The LSTM cell (batch x 64 @ 64 x 256, twice) built for each register file: the main
    kernel's micro-kernel k loops hold every accumulator in a register (before register files,
    the AVX2 and NEON builds moved accumulators to and from the stack around their FMAs).

    Only the main kernel: in the batch-below-8 variant (`cell_small`, a GEMV per row) LLVM keeps
    some accumulators of one of its two GEMVs in memory whatever the tile (2 of 16 on AVX-512);
    that variant's time is dominated by the call, not by its FMAs."""
    model = onnx.load(str(MODELS / "lstm_cell.onnx"))
    compiled = compile_group(model, "cell", resolve_target(name, mcpu), tmp_path)
    listing = subprocess.run([objdump, "-d", "--no-show-raw-insn", compiled.spec.object_file],
                             capture_output=True, text=True, check=True).stdout
    (main,) = [text for function, text in functions(listing).items() if function == "cell_compute_"]
    loops = innermost(fma_loops(main, fma))
    assert len(loops) >= 2, "expected the two MatMuls' micro-kernel loops"
    spilling = [[line for line in body if spill.search(line)] for body in loops]
    assert not any(spilling), [s for s in spilling if s][:2]


@pytest.mark.parametrize("target, mcpu", [("native", "haswell"), ("x86_64", None)], ids=["avx2", "sse"])
def test_narrow_register_builds_match_onnxruntime(tmp_path, target, mcpu):
    """Kernels built for an AVX2-only CPU (haswell) and for portable x86-64 (SSE, 16 xmm
    registers) run here and give onnxruntime's answers, at batches on both sides of the
    small-batch switch and with a ragged tail."""
    for name in ("lstm_cell", "gru_cell"):
        source = MODELS / f"{name}.onnx"
        result = optimize(source, tmp_path / f"{name}.fused.onnx", target=target, mcpu=mcpu, cache_dir=False, jobs=1)
        assert result.report["groups_fallback"] == 0
        for batch in (1, 13, 64):
            expected, actual = run_both(source, result.model_path, random_inputs(source, batch, seed=batch))
            assert_outputs_match(expected, actual)
