"""One object file from a kernel's per-ISA-level objects.

Each level is built by LLVM into its own object (one target per build). Besides the kernel entry
points, such an object defines helpers that LLVM emits as weak, global functions (e.g.
`__truncsfhf2` for float16 casts). Linked side by side, the linker would keep ONE of them for all
levels, and the baseline's kernels could end up calling the AVX-512 copy: an illegal instruction on
the very CPU the baseline is for. So each level's object keeps only its entry points
(`__tvm_ffi_*`) and TVM's hook slots (`__TVMBackend*`, which must stay shared: the library fills
them once) global; everything else becomes local to that level. Then `cc -r` joins the levels
into one relocatable object, which the cache and the library builder treat like any other.
"""

from __future__ import annotations

import pathlib
import shlex
import shutil
import subprocess

from ..errors import CompileError
from ..target import Target

KEPT_GLOBAL = ("__tvm_ffi_*", "__TVMBackend*")


def join_levels(parts: list[pathlib.Path], out_path: pathlib.Path, target: Target) -> pathlib.Path:
    """Localizes each part's helpers, then links the parts into `out_path` (relocatable)."""
    objcopy = objcopy_for(target)
    keep = [arg for pattern in KEPT_GLOBAL for arg in ("--keep-global-symbol", pattern)]
    for part in parts:
        _run([objcopy, "--wildcard", *keep, str(part)], "objcopy")
    _run([*shlex.split(target.cc), "-r", "-nostdlib", "-o", str(out_path), *map(str, parts)], "joining levels")
    return out_path


def objcopy_for(target: Target) -> str:
    """binutils' objcopy for the target's triple (Debian ships `<triple>-objcopy`), else `objcopy`."""
    return shutil.which(f"{target.triple}-objcopy") or shutil.which("objcopy") or "objcopy"


def _run(command: list[str], what: str) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise CompileError(f"build: {what} needs {command[0]!r} (binutils), which is not installed") from None
    if result.returncode != 0:
        raise CompileError(f"build: {what} failed: {result.stderr.strip()[:300]}")
