"""Portable kernels: each kernel built per ISA level, the library running the best level the CPU
has, and refusing (with an onnxruntime error, not an illegal instruction) a CPU it cannot serve.

The emulated CPUs come from qemu-user (`make install` installs it): `-cpu Nehalem` has SSE4.2 but
no AVX (the x86-64 baseline level runs), `-cpu Haswell` has AVX2 and FMA but no AVX-512. Nothing
older: numpy, which onnxruntime's Python package needs, itself needs x86-64-v2 (on `-cpu qemu64`
`import numpy` dies of SIGILL). tests/portable/probe.py runs under the emulated CPU and reports
the level the library chose and its outputs' differences from onnxruntime on the original.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
from conftest import MODELS, assert_outputs_match, host_has, run_both

from onnxfuse import optimize
from onnxfuse.codegen import register_file
from onnxfuse.measure.inputs import random_feeds_for_session
from onnxfuse.runtime.library import kernel_table_source, table_levels
from onnxfuse.target import resolve_target

PROBE = Path(__file__).resolve().parent / "portable" / "probe.py"
QEMU = shutil.which("qemu-x86_64")
x86_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="the x86-64 levels run on x86-64 hosts")
needs_qemu = pytest.mark.skipif(QEMU is None or platform.machine() != "x86_64",
                                reason="qemu-x86_64 not installed (run `make install`)")

# model, batch sizes to run under emulation (kept small: everything runs emulated)
MODELS_UNDER_QEMU = [("lstm_cell", (1, 5)), ("tree_trav_d3", (1, 5)), ("transformer_mlp", (1, 3))]
# emulated CPU → the level the library must choose on it
CPUS = {"Nehalem": "x86-64", "Haswell": "x86-64-v3"}


@pytest.fixture(scope="module")
def portable(tmp_path_factory, cache):
    """Each model of MODELS_UNDER_QEMU optimized for the portable target: name → (fused, library)."""
    out = tmp_path_factory.mktemp("portable")
    built = {}
    for name, _ in MODELS_UNDER_QEMU:
        result = optimize(MODELS / f"{name}.onnx", out / f"{name}.fused.onnx", target="portable", cache_dir=cache,
                          jobs=1)
        assert result.report["groups_fallback"] == 0, result.report["groups"]
        built[name] = (result.model_path, result.library_path)
    return built


def probe(cpu: str | None, original: Path, fused: Path, library: Path, batches, env=None) -> dict:
    """tests/portable/probe.py under `qemu-x86_64 -cpu <cpu>` (or natively for cpu None)."""
    command = [sys.executable, str(PROBE), str(original), str(fused), str(library), *map(str, batches)]
    if cpu:
        command = [QEMU, "-cpu", cpu, *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_matches(report: dict, rtol=1e-4, atol=1e-5):
    assert report["outputs"], report
    for output in report["outputs"]:
        assert output["same_shape"], output
        assert output["max_abs"] <= atol + rtol * output["max_expected"], output


# ---- the levels ------------------------------------------------------------------------------

@x86_only
def test_portable_is_the_default_and_builds_three_x86_levels_each_with_its_own_register_file():
    target = resolve_target("portable")
    assert target.name == "portable"
    assert [level.name for level in target.levels] == ["x86-64-v4", "x86-64-v3", "x86-64"]
    registers = [register_file.for_target(target.tvm_target(level)) for level in target.levels]
    assert registers == [register_file.AVX512, register_file.AVX2, register_file.SSE]
    v4, v3, baseline = (set(level.requires) for level in target.levels)
    assert baseline == set()  # every x86-64 CPU runs the baseline
    assert {"avx2", "fma"} <= v3 and not any(f.startswith("avx512") for f in v3)
    assert v3 < v4 and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= v4


def test_the_cache_key_names_every_level():
    portable, host = resolve_target("x86_64"), resolve_target("x86_64", mcpu="x86-64-v4")
    assert portable.key != host.key
    assert all(level.name in portable.key for level in portable.levels)


def test_native_is_one_level_that_checks_the_build_cpus_features():
    target = resolve_target("native", mcpu="skylake-avx512")
    assert len(target.levels) == 1
    assert {"avx512f", "avx512bw", "aes"} <= set(target.levels[0].requires)


def test_each_level_has_its_table_and_cpu_check():
    target = resolve_target("x86_64")
    from onnxfuse.kernel_spec import KernelSpec, TensorSpec

    spec = KernelSpec("k", (TensorSpec("float32", ("N", 4)),), (TensorSpec("float32", ("N", 4)),), "k.o",
                      small_batch_below=8, levels=tuple(level.suffix for level in target.levels))
    source = kernel_table_source([spec], table_levels([spec], target), target.arch)
    for index, suffix in enumerate(("x86_64_v4", "x86_64_v3", "x86_64")):
        assert f"__tvm_ffi_k__{suffix}, __tvm_ffi_k__{suffix}_small, 8," in source
        assert f"static const kernel_desc KERNELS_{index}[]" in source
    assert '__builtin_cpu_supports("avx512f")' in source
    assert "static int cpu_supports_2(void) { return 1; }" in source  # the baseline needs nothing


def test_each_level_can_carry_its_own_small_batch_threshold():
    """AVX-512 tiles 6 rows, AVX2 and the baseline 8: the table row of each level carries its own
    threshold; a spec with thresholds for another number of levels is refused."""
    target = resolve_target("x86_64")
    from onnxfuse.kernel_spec import KernelSpec, TensorSpec

    levels = tuple(level.suffix for level in target.levels)
    spec = KernelSpec("k", (TensorSpec("float32", ("N", 4)),), (TensorSpec("float32", ("N", 4)),), "k.o",
                      small_batch_below=4, levels=levels, level_small_batch_below=(4, 6, 6))
    source = kernel_table_source([spec], table_levels([spec], target), target.arch)
    for suffix, below in zip(("x86_64_v4", "x86_64_v3", "x86_64"), (4, 6, 6)):
        assert f"__tvm_ffi_k__{suffix}, __tvm_ffi_k__{suffix}_small, {below}," in source
    with pytest.raises(ValueError, match="2 small-batch thresholds for 3 levels"):
        KernelSpec("k", (), (), "k.o", small_batch_below=4, levels=levels, level_small_batch_below=(4, 6))


# ---- on this machine -----------------------------------------------------------------------------

@x86_only
def test_this_machine_runs_its_best_level_and_every_level_matches_onnxruntime(portable):
    original, (fused, library) = MODELS / "lstm_cell.onnx", portable["lstm_cell"]
    best = next(level.name for level in resolve_target("portable").levels
                if all(host_has(feature) for feature in level.requires))
    assert probe(None, original, fused, library, (1, 37))["level"] == best
    if host_has("avx512f"):
        assert best == "x86-64-v4"  # an AVX-512 build host keeps running its AVX-512 kernels
    for level in resolve_target("portable").levels:
        if all(host_has(feature) for feature in level.requires):
            report = probe(None, original, fused, library, (1, 9, 37), env={"ONNXFUSE_ISA_LEVEL": level.name})
            assert report["level"] == level.name
            assert_matches(report)


def test_in_process_the_fused_model_matches_onnxruntime(portable):
    original, (fused, _) = MODELS / "transformer_mlp.onnx", portable["transformer_mlp"]
    session = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
    feeds = random_feeds_for_session(session, {}, default_dim=3, seed=0)
    assert_outputs_match(*run_both(original, fused, feeds))


@x86_only
def test_an_unknown_forced_level_is_a_session_error(portable):
    original, (fused, library) = MODELS / "lstm_cell.onnx", portable["lstm_cell"]
    report = probe(None, original, fused, library, (1,), env={"ONNXFUSE_ISA_LEVEL": "x86-64-v9"})
    assert report["level"] is None
    assert "ONNXFUSE_ISA_LEVEL=x86-64-v9 is not a level of this library; it has x86-64-v4 x86-64-v3 x86-64" \
        in report["session_error"]


# ---- on emulated CPUs ------------------------------------------------------------------------

@needs_qemu
@pytest.mark.parametrize("cpu", list(CPUS))
@pytest.mark.parametrize("name, batches", MODELS_UNDER_QEMU)
def test_fused_model_on_an_older_cpu_runs_its_level_and_matches_onnxruntime(portable, cpu, name, batches):
    fused, library = portable[name]
    report = probe(cpu, MODELS / f"{name}.onnx", fused, library, batches)
    assert report["level"] == CPUS[cpu]
    assert_matches(report)


@needs_qemu
def test_columns_that_are_no_whole_vectors_build_at_every_level(tmp_path, cache):
    """PyTorch's MNIST MLP ends in a Gemm to 10 columns, padded to whole vectors: 12 at the baseline
    level's 4 lanes. TVM's LoopPartition put an int32 0 for the int64 index of a one-iteration
    loop it peeled there, its simplifier then refused `int32 < int64`, and the whole group fell back
    to onnxruntime on every CPU (compile.BUILD_CONFIG keeps such loops)."""
    original = MODELS / "exported" / "mlp_mnist_ts.onnx"
    result = optimize(original, tmp_path / "mnist.fused.onnx", target="portable", select="all", cache_dir=cache, jobs=1)
    assert result.report["groups_fallback"] == 0, result.report["groups"]
    report = probe("Nehalem", original, result.model_path, result.library_path, (1, 3))
    assert report["level"] == "x86-64"
    assert_matches(report)


@needs_qemu
def test_a_cpu_without_the_librarys_level_gets_a_session_error_not_a_crash(tmp_path, cache):
    """A library built with the AVX-512 level only, on an AVX2 CPU: RegisterCustomOps returns an
    error status; the process lives on (before: SIGILL, exit 132, inside onnxruntime)."""
    result = optimize(MODELS / "lstm_cell.onnx", tmp_path / "cell.fused.onnx", target="native", mcpu="x86-64-v4",
                      cache_dir=cache, jobs=1)
    report = probe("Haswell", MODELS / "lstm_cell.onnx", result.model_path, result.library_path, (1,))
    assert report["level"] is None
    assert "onnxfuse kernels need a CPU with at least ISA level x86-64-v4 (" in report["session_error"]
    assert "avx512f" in report["session_error"]

