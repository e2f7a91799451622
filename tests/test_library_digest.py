"""A fused model records its kernel library's SHA-256, and onnxfuse.InferenceSession checks it
before loading the library: a damaged or replaced library is a one-line error instead of a crash
in the dynamic loader (a truncated library ended the process with SIGBUS)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx_builder import model, node, weights

from onnxfuse import InferenceSession, optimize
from onnxfuse.kernel_spec import LIBRARY_DIGEST_METADATA_KEY


@pytest.fixture
def fused(tmp_path, cache):
    """A one-kernel model (MatMul -> Relu) optimized into tmp_path."""
    source = tmp_path / "m.onnx"
    onnx.save(model([node("MatMul", ["x", "w"], "p"), node("Relu", ["p"], "y")], {"x": ["N", 8]}, {"y": ["N", 16]},
                    {"w": weights(8, 16)}), str(source))
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=cache, jobs=1, select="all")
    assert result.report["groups_compiled"] + result.report["groups_cached"] == 1
    return result.model_path, result.library_path


def digest_of(model_path) -> str | None:
    props = onnx.load(str(model_path), load_external_data=False).metadata_props
    return next((p.value for p in props if p.key == LIBRARY_DIGEST_METADATA_KEY), None)


def test_the_model_records_its_librarys_sha256(fused):
    model_path, library = fused
    assert digest_of(model_path) == hashlib.sha256(library.read_bytes()).hexdigest()
    out = InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": np.ones((3, 8), np.float32)})
    assert out[0].shape == (3, 16)


def test_a_truncated_library_is_an_error_not_a_crash(fused):
    """Run in a child process: without the check, loading it killed the process."""
    model_path, library = fused
    library.write_bytes(library.read_bytes()[:1000])
    code = (f"import onnxfuse\ntry:\n    onnxfuse.InferenceSession({str(model_path)!r})\n"
            f"except ValueError as e:\n    print('refused:', e)\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    assert "refused:" in child.stdout and "is not the one it was written with" in child.stdout


def test_another_models_library_is_refused(fused, tmp_path):
    model_path, library = fused
    other = tmp_path / "other.so"
    shutil.copyfile(library, other)
    with open(other, "ab") as stream:
        stream.write(b"\0")  # any other bytes: another build, another model's library
    shutil.copyfile(other, library)
    with pytest.raises(ValueError, match="SHA-256 differs"):
        InferenceSession(str(model_path), providers=["CPUExecutionProvider"])


def test_a_model_written_before_the_digest_still_loads(fused):
    model_path, _ = fused
    written = onnx.load(str(model_path))
    kept = [p for p in written.metadata_props if p.key != LIBRARY_DIGEST_METADATA_KEY]
    del written.metadata_props[:]
    written.metadata_props.extend(kept)
    onnx.save(written, str(model_path))
    out = InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": np.ones((2, 8), np.float32)})
    assert out[0].shape == (2, 16)
