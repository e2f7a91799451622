"""Compiled kernels cached by content: the group model, the target, and the tool versions.

A CI job that optimizes the same model twice compiles nothing the second time. What comes back
from the cache is linked into the library the user ships, so an entry is trusted only as far as
it checks out (docs/cache.md):

- An entry is a directory `<root>/<key[:2]>/<key>/` holding the kernel object, its lifted
  weights (if any) and `meta.json`: the spec, the sha256 and size of every other file, the cache
  format, the key, and the sha256 of meta.json's own content.
- It is written into a private temporary directory and renamed into place, so it becomes visible
  only complete; two processes racing on one key both end with a valid entry.
- Every load checks all of it. A damaged entry (truncated, overwritten, edited, unreadable, from
  another cache format or another key) is a miss: it is removed, reported in one line on stderr,
  and the kernel is compiled and stored again. It is never linked.
- Directories are created 0700 and files 0600, whatever the umask: kernels are code.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from . import __version__
from .kernel_spec import DerivedDim, GroupKernel, KernelSpec, TensorSpec

FORMAT = 2  # 1: the same files without checksums (before onnxfuse checked entries)
OBJECT = "kernel.o"
META = "meta.json"
WEIGHTS = "weights.npz"
DIR_MODE = 0o700
FILE_MODE = 0o600


def default_cache_dir() -> Path:
    env = os.environ.get("ONNXFUSE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "onnxfuse"


@functools.lru_cache(maxsize=1)
def codegen_fingerprint() -> str:
    """A hash of the code generator's source and of the canonical form it compiles
    (kernel_identity.py): a changed lowering must never reuse old kernels."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for path in [*sorted((here / "codegen").glob("*.py")), here / "kernel_identity.py"]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def group_key(group_model: onnx.ModelProto, target_key: str) -> str:
    """The cache key of a group's kernel: `group_model` is its canonical form
    (kernel_identity.canonical_group), so groups differing only in names and weights share it."""
    import tvm

    h = hashlib.sha256()
    h.update(f"onnxfuse {__version__}+{codegen_fingerprint()}|tvm {tvm.__version__}|{target_key}|".encode())
    h.update(group_model.SerializeToString(deterministic=True))
    return h.hexdigest()


def kernel_name(key: str) -> str:
    return f"k_{key[:20]}"


class DamagedEntry(Exception):
    """A cache entry that must not be used; the message says why."""


class KernelCache:
    def __init__(self, root: Path | None):
        self.root = Path(root) if root is not None else None

    def _entry(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / key

    def load(self, key: str) -> tuple[GroupKernel, dict] | None:
        """The cached kernel and its recorded metadata; None on a miss. A damaged entry is a miss
        too: it is reported on stderr and removed, so the caller compiles and stores it again."""
        if self.root is None:
            return None
        try:
            return self._read(key)
        except DamagedEntry as damage:
            print(f"onnxfuse: cache entry {key} is damaged ({damage}); rebuilding", file=sys.stderr)
            self._discard(key)
            return None

    def store(self, key: str, kernel: GroupKernel, info: dict) -> GroupKernel:
        """Copy the kernel into the cache; returns it pointing at the cached object file (or as it
        was, if what the cache then holds does not check out)."""
        if self.root is None:
            return kernel
        entry = self._entry(key)
        _make_private_dirs(entry.parent)
        staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
        try:
            os.chmod(staging, DIR_MODE)  # mkdtemp's 0700 is subject to the umask
            files = {OBJECT: Path(kernel.spec.object_file).read_bytes()}
            if kernel.extra_weights:
                weights = io.BytesIO()
                np.savez(weights, **kernel.extra_weights)
                files[WEIGHTS] = weights.getvalue()
            for name, data in files.items():
                _write_private(staging / name, data)
            _write_private(staging / META, _meta_json(key, kernel, info, files))
            try:
                os.rename(staging, entry)
            except OSError:  # another process stored this key first: keep theirs if it checks out
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            cached = self._read(key)
        except DamagedEntry:
            cached = None
        return cached[0] if cached else kernel

    def _read(self, key: str) -> tuple[GroupKernel, dict] | None:
        """The entry, checked whole; None if there is none. Raises DamagedEntry."""
        entry = self._entry(key)
        if not entry.exists():
            return None
        try:
            meta = _checked_meta(key, (entry / META).read_bytes())
            data = {name: _checked_file(entry / name, name, recorded) for name, recorded in meta["files"].items()}
            if OBJECT not in data:
                raise DamagedEntry(f"{META} lists no {OBJECT}")
            weights = dict(np.load(io.BytesIO(data[WEIGHTS]), allow_pickle=False)) if WEIGHTS in data else {}
            spec = KernelSpec(
                name=meta["name"],
                inputs=tuple(TensorSpec(t["dtype"], _dims_from_json(t["shape"])) for t in meta["inputs"]),
                outputs=tuple(TensorSpec(t["dtype"], _dims_from_json(t["shape"])) for t in meta["outputs"]),
                object_file=str(entry / OBJECT),
                small_batch_below=int(meta["small_batch_below"]),
                row_work=int(meta["row_work"]),
                serial_variant=bool(meta["serial_variant"]),
                levels=tuple(meta["levels"]),
                level_small_batch_below=tuple(int(v) for v in meta.get("level_small_batch_below", ())),
                row_tile=int(meta.get("row_tile", 0)),
                level_row_tiles=tuple(int(v) for v in meta.get("level_row_tiles", ())),
                multiples=tuple((str(symbol), int(n)) for symbol, n in meta.get("multiples", ())),
            )
            return GroupKernel(spec, tuple(meta["arg_sources"]), weights), meta["info"]
        except FileNotFoundError as missing:
            raise DamagedEntry(f"{Path(missing.filename).name} is missing") from None
        except OSError as unreadable:
            raise DamagedEntry(f"unreadable: {unreadable.strerror or unreadable}") from None
        except (AttributeError, KeyError, TypeError, ValueError) as malformed:  # checks out, yet not ours
            raise DamagedEntry(f"{META} is malformed: {type(malformed).__name__}: {malformed}") from None

    def _discard(self, key: str) -> None:
        """Moves the entry aside (one atomic step, so a racing reader sees it whole or not at all),
        then deletes it. Failing to is no error: the entry keeps failing its checks."""
        entry = self._entry(key)
        doomed = entry.with_name(f".damaged-{key}-{secrets.token_hex(4)}")
        try:
            os.rename(entry, doomed)
        except OSError:
            return
        shutil.rmtree(doomed, ignore_errors=True)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _meta_json(key: str, kernel: GroupKernel, info: dict, files: dict[str, bytes]) -> bytes:
    body = {
        "format": FORMAT,
        "key": key,
        "files": {name: {"bytes": len(data), "sha256": _sha256(data)} for name, data in files.items()},
        "name": kernel.spec.name,
        "inputs": [{"dtype": t.dtype, "shape": _dims_to_json(t.shape)} for t in kernel.spec.inputs],
        "outputs": [{"dtype": t.dtype, "shape": _dims_to_json(t.shape)} for t in kernel.spec.outputs],
        "arg_sources": list(kernel.arg_sources),
        "small_batch_below": kernel.spec.small_batch_below,
        "row_work": kernel.spec.row_work,
        "serial_variant": kernel.spec.serial_variant,
        "levels": list(kernel.spec.levels),
        "level_small_batch_below": list(kernel.spec.level_small_batch_below),
        "row_tile": kernel.spec.row_tile,
        "level_row_tiles": list(kernel.spec.level_row_tiles),
        "multiples": [list(pair) for pair in kernel.spec.multiples],
        "info": info,
    }
    # Round-trip first, so the checksum covers exactly what a reader will parse back.
    body = json.loads(_canonical(body))
    return json.dumps({**body, "sha256": _sha256(_canonical(body))}, indent=1, sort_keys=True).encode()


def _checked_meta(key: str, raw: bytes) -> dict:
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise DamagedEntry(f"{META} is not JSON ({len(raw)} bytes)") from None
    if not isinstance(meta, dict):
        raise DamagedEntry(f"{META} is not a JSON object")
    if meta.get("format") != FORMAT:
        raise DamagedEntry(f"cache format {meta.get('format', 1)!r}, this onnxfuse reads {FORMAT}")
    recorded = meta.pop("sha256", None)
    if recorded != _sha256(_canonical(meta)):
        raise DamagedEntry(f"{META} does not match its checksum")
    if meta.get("key") != key:
        raise DamagedEntry(f"it holds the entry for key {meta.get('key')!r}")
    return meta


def _checked_file(path: Path, name: str, recorded: dict) -> bytes:
    if name not in (OBJECT, WEIGHTS):
        raise DamagedEntry(f"{META} lists an unknown file {name!r}")
    data = path.read_bytes()
    if len(data) != recorded["bytes"]:
        raise DamagedEntry(f"{name} has {len(data)} bytes, expected {recorded['bytes']}")
    if _sha256(data) != recorded["sha256"]:
        raise DamagedEntry(f"{name} does not match its checksum")
    return data


def _make_private_dirs(path: Path) -> None:
    """mkdir -p, each directory it creates 0700 (the umask does not apply to chmod)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:  # created meanwhile by another process
            continue
        os.chmod(directory, DIR_MODE)


def _write_private(path: Path, data: bytes) -> None:
    """A new file, mode 0600 whatever the umask, its data on disk before the entry is renamed in."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb", closefd=False) as out:
            out.write(data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _dims_to_json(shape) -> list:
    """Dims as JSON: ints and symbol names as themselves, derived dims as objects."""
    return [{"symbol": d.symbol, "multiplier": d.multiplier, "divisor": d.divisor, "times": d.times}
            if isinstance(d, DerivedDim) else d for d in shape]


def _dims_from_json(dims: list) -> tuple:
    return tuple(DerivedDim(**d) if isinstance(d, dict) else d for d in dims)
