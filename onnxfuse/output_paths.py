"""Where optimize writes, checked before anything is compiled.

Never over its input (`-o m.onnx` on m.onnx, or `--report m.onnx`), never one output over another,
and only where it can write: a read-only directory used to fail after minutes of compiling, with a
traceback. Every write failure is an `OutputError`: one line, exit 2.
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError


class OutputError(UsageError):
    """An output that must not or cannot be written (exit 2)."""


@dataclass(frozen=True)
class OutputPaths:
    """Every file one optimize run may write."""

    model: Path
    library: Path  # written only when a group was compiled
    data: Path  # the model's external data, written only when the model is too large for one file
    report: Path | None = None

    @staticmethod
    def beside(model: Path, report: Path | None = None) -> OutputPaths:
        stem = model.name[: -len(".onnx")] if model.name.endswith(".onnx") else model.name
        return OutputPaths(model, model.with_name(f"{stem}.so"), model.with_name(f"{model.name}.data"), report)

    def named(self) -> list[tuple[str, Path]]:
        pairs = [("output", self.model), ("library", self.library), ("external data", self.data)]
        return pairs + ([("report", self.report)] if self.report else [])


def check_outputs(inputs: list[tuple[str, Path]], outputs: OutputPaths) -> None:
    """OutputError if an output is one of the inputs or another output, or cannot be written."""
    seen: dict[object, str] = {}
    for what, path in inputs:
        seen.setdefault(_identity(path), f"{what} {path}")
    for what, path in outputs.named():
        clash = seen.get(_identity(path))
        if clash:
            raise OutputError(f"the {what} path {path} is the {clash}: choose another path (nothing was written)")
        seen[_identity(path)] = f"{what} {path}"
    for what, path in outputs.named():
        require_writable(path, what)


def _identity(path: Path):
    """The same file however it is spelled: its inode if it exists, else its resolved path."""
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:
        return str(Path(path).resolve())


def require_writable(path: Path, what: str) -> None:
    """OutputError unless `path` could be created: it is not a directory, and its nearest existing
    directory lets us create a file (tried, then removed: root ignores permission bits, and a
    read-only mount says no only when asked)."""
    if path.is_dir():
        raise OutputError(f"cannot write the {what} {path}: it is a directory")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write the {what} {path}: {parent} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".onnxfuse-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"cannot write the {what} {path}: {describe(exc, parent)}") from None


def describe(exc: OSError, path: Path | str | None = None) -> str:
    """An OSError as the user needs it: what failed, where."""
    reason = {errno.ENOSPC: "no space left on the device", errno.EROFS: "read-only file system",
              errno.EACCES: "permission denied", errno.EDQUOT: "disk quota exceeded"}.get(exc.errno)
    reason = reason or exc.strerror or str(exc)
    where = path if path is not None else exc.filename
    return f"{reason} ({where})" if where else reason
