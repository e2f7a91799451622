"""float32 Sigmoid per ISA level: each level computes what onnxruntime computes on the CPUs that
run it, bit for bit (onnxfuse/codegen/sigmoid_clamp.py).

onnxruntime has two float32 Sigmoid kernels: an FMA one on x86-64 with AVX2 and FMA, and a
generic one elsewhere (separate multiplies and adds, result clamped to [0, 1]). They differ in
the last bits everywhere, by 6% of the value near -14, and round to exactly 0 at different
inputs, so Sigmoid * inf is NaN at different inputs. The level this CPU runs is compared with
this CPU's onnxruntime; the x86-64 baseline level with onnxruntime's generic kernel, both as the
fuzzer's reference writes it (fuzz/generic_sigmoid.py) and as onnxruntime itself runs it on an
emulated CPU without FMA (qemu-user, as in test_portable_levels.py).
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fuzz.generic_sigmoid import generic_sigmoid, sigmoids_left, with_generic_sigmoid
from onnx import TensorProto
from onnx_builder import model, node
from test_ieee_order import assert_bitwise_equal, original_session
from test_portable_levels import QEMU, needs_qemu, x86_only

from onnxfuse import optimize
from onnxfuse.codegen.fast_math import SIGMOID_CLAMP

PROBE = Path(__file__).resolve().parent / "portable" / "sigmoid_probe.py"
F32 = np.float32


def inputs(points: int = 2_000_001) -> np.ndarray:
    """A dense grid over [-20, 20] (the band of scattered zeros, -18 to -15.8, included), every
    float32 near the clamps, and the special values."""
    edges = [np.float32(e) for e in (-SIGMOID_CLAMP, SIGMOID_CLAMP)]
    near = [np.nextafter(e, np.float32(s) * np.inf, dtype=F32) for e in edges for s in (-1, 1)]
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3e38, -3e38, 17.844, -15.8, *edges, *near]
    return np.concatenate([np.linspace(-20, 20, points, dtype=F32), np.array(specials, F32)])


def sigmoid_model(dtype=TensorProto.FLOAT, negated: bool = False) -> onnx.ModelProto:
    """y = Sigmoid(x), or -Sigmoid(x): a Sigmoid alone is left to onnxruntime (nothing to fuse)."""
    nodes = [node("Sigmoid", ["x"], "s"), node("Neg", ["s"], "y")] if negated else [node("Sigmoid", ["x"], "y")]
    return model(nodes, {"x": ("N",)}, {"y": ("N",)}, dtype=dtype)


def fused(tmp_path, target: str, **options):
    source = tmp_path / "sigmoid.onnx"
    onnx.save(sigmoid_model(negated=True), source)
    result = optimize(source, tmp_path / f"sigmoid.{target}.fused.onnx", cache_dir=False, jobs=1, select="all",
                      target=target, **options)
    assert result.report["groups_fallback"] == 0 and result.report["groups_compiled"] == 1, result.report["groups"]
    return source, result


def run_fused(result, x: np.ndarray) -> np.ndarray:
    """Sigmoid(x) by the fused -Sigmoid(x)."""
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(result.library_path))
    session = ort.InferenceSession(str(result.model_path), options, providers=["CPUExecutionProvider"])
    return -session.run(None, {"x": x})[0]


def test_the_level_this_cpu_runs_is_its_onnxruntime_bit_for_bit(tmp_path):
    x = inputs()
    source, result = fused(tmp_path, "native")
    expected = original_session(sigmoid_model()).run(None, {"x": x})[0]
    assert (expected == 0).sum() > 1000  # onnxruntime's zeros, scattered ones among them
    assert_bitwise_equal(run_fused(result, x), expected)


@x86_only
def test_the_baseline_level_is_onnxruntimes_generic_kernel_bit_for_bit(tmp_path):
    x = inputs()
    _, result = fused(tmp_path, "x86_64", mcpu="x86-64")
    assert_bitwise_equal(run_fused(result, x), generic_sigmoid(x))


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["float32", "float16"])
def test_the_fuzzers_expansion_is_the_generic_kernel(dtype):
    """The baseline level's fuzz reference: Sigmoid written out in ONNX ops that each round alone.
    onnxruntime computes a float16 Sigmoid in float32."""
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    with np.errstate(over="ignore"):  # 3e38 is inf in float16
        x = inputs(200_001).astype(np_type)
    expanded = with_generic_sigmoid(sigmoid_model(dtype))
    assert "Sigmoid" not in {n.op_type for n in expanded.graph.node}
    got = original_session(expanded).run(None, {"x": x})[0]
    assert_bitwise_equal(got, generic_sigmoid(x.astype(F32)).astype(np_type))


def test_the_two_kernels_differ_where_the_levels_must():
    """What makes the choice matter: at -14 the generic kernel's value is 6% off the FMA kernel's;
    between -18 and -10 it is negative before its clamp for a fifth of the inputs (the FMA
    kernel's max with 0 catches those too, its other roundings differ)."""
    x = np.linspace(-18, -10, 80_001, dtype=F32)
    generic = generic_sigmoid(x)
    if platform.machine() == "x86_64" and {"avx2", "fma"} <= _host_flags():
        fma = original_session(sigmoid_model()).run(None, {"x": x})[0]
        assert (generic != fma).mean() > 0.3
        assert ((generic == 0) != (fma == 0)).sum() > 100


@needs_qemu
def test_on_a_cpu_without_fma_onnxruntime_and_the_portable_library_agree_bit_for_bit(tmp_path):
    """Under `qemu-x86_64 -cpu Nehalem`: onnxruntime's own Sigmoid is the generic kernel (as
    generic_sigmoid computes it), and the portable library picks its baseline level and matches."""
    x = inputs(300_001)
    source, result = fused(tmp_path, "portable")
    np.save(tmp_path / "x.npy", x)
    command = [QEMU, "-cpu", "Nehalem", sys.executable, str(PROBE), str(source), str(result.model_path),
               str(result.library_path), str(tmp_path / "x.npy"), str(tmp_path / "out.npz")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    out = np.load(tmp_path / "out.npz")
    assert str(out["level"]) == "x86-64"
    assert_bitwise_equal(-out["onnxruntime"], generic_sigmoid(x))  # both models compute -Sigmoid(x)
    assert_bitwise_equal(out["fused"], out["onnxruntime"])


def _host_flags() -> set[str]:
    from fuzz.levels import _cpu_flags

    return _cpu_flags()


def test_the_fuzzers_reference_keeps_the_sigmoids_the_fused_model_leaves_to_onnxruntime():
    """A Sigmoid in a group that fell back (or in no group) runs on this CPU's onnxruntime in the
    fused model too: the baseline level's reference must not write it out (the first seed-91
    campaign counted such a Sigmoid, left unfused, as a mismatch in the last bits)."""
    two = model([node("Sigmoid", ["x"], "a"), node("Sigmoid", ["a"], "y")], {"x": ("N",)}, {"y": ("N",)})
    fused_like = model([node("Sigmoid", ["x"], "a"), node("Neg", ["a"], "y")], {"x": ("N",)}, {"y": ("N",)})
    expanded = with_generic_sigmoid(two, sigmoids_left(fused_like))
    assert [n.op_type for n in expanded.graph.node].count("Sigmoid") == 1
    assert next(n for n in expanded.graph.node if n.op_type == "Sigmoid").output[0] == "a"
