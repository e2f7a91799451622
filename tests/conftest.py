"""What many test files share: the bundled models, one kernel cache per test worker, and running
an original and its fused model side by side in onnxruntime."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import onnxfuse
from onnxfuse.session import quiet_session_options
from onnxfuse.target import TARGET_ENV
from onnxfuse.verify import compare_arrays

MODELS = Path(__file__).resolve().parent.parent / "models"

# Tests build for this machine only (one ISA level: a third of the compile time of `portable`);
# the tests of portability itself (test_portable_*.py) name their target.
os.environ[TARGET_ENV] = "native"


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One kernel cache per test worker: tests that optimize the same model share kernels."""
    return tmp_path_factory.mktemp("kernel-cache")


def run_both(original: Path, fused: Path, feeds: dict) -> tuple[list, list]:
    """The original under plain onnxruntime and the fused model with its library, on `feeds`."""
    reference = ort.InferenceSession(str(original), quiet_session_options(), providers=["CPUExecutionProvider"])
    candidate = onnxfuse.InferenceSession(str(fused), quiet_session_options(), providers=["CPUExecutionProvider"])
    return reference.run(None, feeds), candidate.run(None, feeds)


def host_has(feature: str) -> bool:
    """Whether this machine's CPU has an LLVM-named feature (avx512f, fma, sse4.1, ...)."""
    flags = {"sse3": "pni", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "lzcnt": "abm", "bmi": "bmi1", "pclmul": "pclmulqdq"}
    cpuinfo = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    words = set(next(line for line in cpuinfo.splitlines() if line.startswith("flags")).split(":")[1].split())
    return flags.get(feature, feature) in words


def assert_outputs_match(expected, actual, rtol=1e-4, atol=1e-5):
    assert len(expected) == len(actual)
    for k, (e, a) in enumerate(zip(expected, actual)):
        cmp = compare_arrays(f"output {k}", np.asarray(e), np.asarray(a), rtol, atol)
        assert cmp.ok, f"output {k}: max abs error {cmp.max_abs_error}"
