"""Compiled kernels cached by content: the group model, the target, and the tool versions.

A CI job that optimizes the same model twice compiles nothing the second time. Entries are
written to a temporary directory and renamed into place, so a crash never leaves a half entry,
and two processes racing on one key both end with a valid entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx

from . import __version__
from .kernel_spec import DerivedDim, GroupKernel, KernelSpec, TensorSpec

OBJECT = "kernel.o"
META = "meta.json"
WEIGHTS = "weights.npz"


def default_cache_dir() -> Path:
    env = os.environ.get("ONNXFUSE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "onnxfuse"


@functools.lru_cache(maxsize=1)
def codegen_fingerprint() -> str:
    """A hash of the code generator's source: a changed lowering must never reuse old kernels."""
    h = hashlib.sha256()
    for path in sorted((Path(__file__).parent / "codegen").glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def group_key(group_model: onnx.ModelProto, target_key: str) -> str:
    import tvm

    h = hashlib.sha256()
    h.update(f"onnxfuse {__version__}+{codegen_fingerprint()}|tvm {tvm.__version__}|{target_key}|".encode())
    h.update(group_model.SerializeToString(deterministic=True))
    return h.hexdigest()


def kernel_name(key: str) -> str:
    return f"k_{key[:20]}"


class KernelCache:
    def __init__(self, root: Path | None):
        self.root = Path(root) if root is not None else None

    def _entry(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / key

    def load(self, key: str) -> tuple[GroupKernel, dict] | None:
        """The cached kernel and its recorded metadata, or None (also for a damaged entry)."""
        if self.root is None:
            return None
        entry = self._entry(key)
        try:
            meta = json.loads((entry / META).read_text())
            spec = KernelSpec(
                name=meta["name"],
                inputs=tuple(TensorSpec(t["dtype"], _dims_from_json(t["shape"])) for t in meta["inputs"]),
                outputs=tuple(TensorSpec(t["dtype"], _dims_from_json(t["shape"])) for t in meta["outputs"]),
                object_file=str(entry / OBJECT),
                small_batch_below=int(meta.get("small_batch_below", 0)),
                row_work=int(meta.get("row_work", 0)),
                serial_variant=bool(meta.get("serial_variant", False)),
            )
            if not (entry / OBJECT).is_file():
                return None
            weights = dict(np.load(entry / WEIGHTS)) if (entry / WEIGHTS).is_file() else {}
        except (OSError, ValueError, KeyError):
            return None
        return GroupKernel(spec, tuple(meta["arg_sources"]), weights), meta.get("info", {})

    def store(self, key: str, kernel: GroupKernel, info: dict) -> GroupKernel:
        """Copy the kernel into the cache; returns it pointing at the cached object file."""
        if self.root is None:
            return kernel
        entry = self._entry(key)
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
        try:
            shutil.copyfile(kernel.spec.object_file, staging / OBJECT)
            if kernel.extra_weights:
                np.savez(staging / WEIGHTS, **kernel.extra_weights)
            meta = {
                "name": kernel.spec.name,
                "inputs": [{"dtype": t.dtype, "shape": _dims_to_json(t.shape)} for t in kernel.spec.inputs],
                "outputs": [{"dtype": t.dtype, "shape": _dims_to_json(t.shape)} for t in kernel.spec.outputs],
                "arg_sources": list(kernel.arg_sources),
                "small_batch_below": kernel.spec.small_batch_below,
                "row_work": kernel.spec.row_work,
                "serial_variant": kernel.spec.serial_variant,
                "info": info,
            }
            (staging / META).write_text(json.dumps(meta, indent=1))
            try:
                os.rename(staging, entry)
            except OSError:  # another process stored the same key first: keep theirs
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        cached = self.load(key)
        return cached[0] if cached else kernel


def _dims_to_json(shape) -> list:
    """Dims as JSON: ints and symbol names as themselves, derived dims as objects."""
    return [{"symbol": d.symbol, "multiplier": d.multiplier, "divisor": d.divisor} if isinstance(d, DerivedDim) else d
            for d in shape]


def _dims_from_json(dims: list) -> tuple:
    return tuple(DerivedDim(**d) if isinstance(d, dict) else d for d in dims)
