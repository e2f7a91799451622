"""float32 Erf and Exp per ISA level: the portable library, on emulated CPUs (qemu-user, as in
test_portable_levels.py), against onnxruntime on the same emulated CPU, bit for bit.

onnxruntime's Erf and Exp (MLAS) are each one algorithm with fused multiply-adds on CPUs with FMA
and separate multiplies and adds elsewhere (codegen/fast_math.py: LLVM contracts exactly where the
level has FMA): `-cpu Haswell` runs the AVX2 level and onnxruntime's FMA kernels, `-cpu Nehalem`
the baseline level and its generic kernels. The native level is tests/test_ieee_fast_math.py's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from fuzz.levels import _cpu_flags
from onnx_builder import model, node
from test_ieee_order import assert_bitwise_equal, original_session
from test_portable_levels import QEMU, needs_qemu

from onnxfuse import optimize
from onnxfuse.codegen.fast_math import ERF_CLAMP, ERF_SPLIT, EXP_HIGH, EXP_LOW

PROBE = Path(__file__).resolve().parent / "portable" / "sigmoid_probe.py"  # runs any model of one input x
F32 = np.float32
LEVELS = {"Haswell": "x86-64-v3", "Nehalem": "x86-64"}


# op → (grid, edges of its pieces and clamps)
OPS = {"Erf": ((-5, 5), (ERF_SPLIT, -ERF_SPLIT, ERF_CLAMP, -ERF_CLAMP)),
       "Exp": ((-110, 95), (EXP_LOW, EXP_HIGH, -87.33654, 88.72284))}  # clamps; subnormal and inf from


def inputs(op: str, points: int = 200_001) -> np.ndarray:
    """A grid over the op's interesting range and every float32 next to its edges, tiny,
    subnormal and special values."""
    (start, stop), edges = OPS[op]
    edges = [F32(e) for e in edges]
    near = [np.nextafter(e, F32(s) * np.inf, dtype=F32) for e in edges for s in (-1, 1)]
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-20, -3e38, *edges, *near]
    return np.concatenate([np.linspace(start, stop, points, dtype=F32), np.array(specials, F32)])


@needs_qemu
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("cpu", list(LEVELS))
def test_each_level_is_onnxruntimes_function_on_that_cpu_bit_for_bit(tmp_path, cpu, op):
    source = tmp_path / f"{op}.onnx"
    onnx.save(model([node(op, ["x"], "e"), node("Neg", ["e"], "y")], {"x": ("N",)}, {"y": ("N",)}), source)
    result = optimize(source, tmp_path / f"{op}.fused.onnx", cache_dir=False, jobs=1, select="all", target="portable")
    assert result.report["groups_compiled"] == 1, result.report["groups"]
    x = inputs(op)
    np.save(tmp_path / "x.npy", x)
    command = [QEMU, "-cpu", cpu, sys.executable, str(PROBE), str(source), str(result.model_path),
               str(result.library_path), str(tmp_path / "x.npy"), str(tmp_path / "out.npz")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    out = np.load(tmp_path / "out.npz")
    assert str(out["level"]) == LEVELS[cpu]
    assert_bitwise_equal(out["fused"], out["onnxruntime"])
    if cpu == "Nehalem" and "fma" in _cpu_flags():  # what makes the level matter: the FMA kernel's bits differ
        here = original_session(onnx.load(source)).run(None, {"x": x})[0]
        assert (here.view(np.uint32) != out["onnxruntime"].view(np.uint32)).sum() > 1000
