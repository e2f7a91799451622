"""Build the custom-op library: kernel objects + a generated kernel table + the C glue → one .so.

The glue (`onnxfuse_runtime.c`) is the same for every library; what differs is the kernel table,
which this module writes as C (`onnxfuse_kernels.inc`, #included by the glue). The table holds,
per kernel, its name, its `__tvm_ffi_<name>` entry point (and `__tvm_ffi_<name>_small` with the
batch below which the glue calls it, or NULL and 0; and `__tvm_ffi_<name>_serial`, which the glue
calls instead of running the parallel kernel inline, or NULL), its work per row (for the glue's
choice between onnxruntime's pool and running inline) and the element type and shape of each input
and output. A static dimension is stored as itself; a symbolic one as `-1 - k`, where k
indexes the kernel's own list of symbol names (in order of first appearance in the inputs).
An output with derived dims (symbol [* second symbol] * multiplier // divisor) also gets a
(multiplier, divisor, second symbol's index or -1) triple per dim, (1, 1, -1) for plain ones;
other tensors have none (NULL).

Kernels built for several ISA levels (KernelSpec.levels) get one table per level, and the glue
runs the best level the CPU supports, chosen once (docs/portability.md): the generated source
lists the levels best first, each with a function that asks the CPU for every feature the level
needs (gcc's __builtin_cpu_supports on x86-64, the Linux HWCAP bits on aarch64).

The library exports only `RegisterCustomOps` and `onnxfuse_isa_level` (the level it runs; a
version script hides the kernels too, so two onnxfuse libraries in one process never bind each
other's symbols) and has no dependency on TVM:
TVM's calling convention is compiled in from the headers the installed apache-tvm-ffi and
apache-tvm wheels ship (see tvm_abi.h), for every target alike.
"""

from __future__ import annotations

import functools
import os
import pathlib
import platform
import secrets
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import CompileError
from ..kernel_spec import DerivedDim, KernelSpec, serial_variant_name, small_variant_name
from ..target import default_cc, missing_compiler_message

RUNTIME_DIR = pathlib.Path(__file__).resolve().parent
GLUE_SOURCE = RUNTIME_DIR / "onnxfuse_runtime.c"
KERNEL_TABLE = "onnxfuse_kernels.inc"  # the name the glue #includes
EXPORTS = "{ global: RegisterCustomOps; onnxfuse_isa_level; local: *; };\n"
MAX_MESSAGE_LINES = 20


def build_library(kernels: Sequence[KernelSpec], out_path, target=None, cc: str | None = None) -> pathlib.Path:
    """Compile `kernels` into one onnxruntime custom-op library at `out_path`, atomically.

    `target` is an `onnxfuse.target.Target` (its `.cc` is the C compiler); `cc` overrides it;
    the default is `$CC`, else `gcc`. Either may carry arguments (`CC="ccache gcc"`).
    Raises CompileError with the compiler's message on failure, or saying how to get a compiler.
    """
    kernels = list(kernels)
    if not kernels:
        raise ValueError("a library needs at least one kernel")
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise ValueError(f"kernel names must be unique, got {names}")
    levels = table_levels(kernels, target)
    compiler = cc or (target.cc if target is not None else default_cc())
    target_name = target.name if target is not None else "native"
    out_path = pathlib.Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="onnxfuse-build-") as build_dir:
        build = pathlib.Path(build_dir)
        (build / KERNEL_TABLE).write_text(kernel_table_source(kernels, levels, target.arch if target else None))
        (build / "exports.map").write_text(EXPORTS)
        # Linked under a unique name beside the target, then renamed: readers never see half a file.
        partial = str(out_path.parent / f".{out_path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
        command = [
            *shlex.split(compiler), "-std=gnu11", "-O2", *glue_arch_flags(target), "-fPIC", "-shared", "-pthread",
            "-fvisibility=hidden",
            f"-I{build}", f"-I{RUNTIME_DIR}", *(f"-I{path}" for path in tvm_include_dirs()),
            str(GLUE_SOURCE), *(str(k.object_file) for k in kernels),
            f"-Wl,--version-script={build / 'exports.map'}", "-Wl,--no-undefined",
            "-o", partial, "-lm",
        ]
        try:
            _run_compiler(command, missing_compiler_message(compiler, target_name))
            os.replace(partial, out_path)
        except BaseException:
            pathlib.Path(partial).unlink(missing_ok=True)
            raise
    return out_path


@functools.lru_cache(maxsize=1)
def tvm_include_dirs() -> tuple[str, ...]:
    """Where the wheels keep the C headers tvm_abi.h includes: tvm/ffi/c_api.h and dlpack/dlpack.h
    (apache-tvm-ffi), tvm/runtime/c_backend_api.h (apache-tvm)."""
    import tvm.libinfo
    import tvm_ffi.libinfo

    return tuple(dict.fromkeys([tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path(),
                                tvm.libinfo.find_include_path()]))


@dataclass(frozen=True)
class TableLevel:
    """One ISA level as the kernel table names it: its name, the suffix of its entry points
    (empty for a single-level build) and the CPU features the glue checks before using it."""

    name: str
    suffix: str = ""
    requires: tuple[str, ...] = ()


UNCHECKED = TableLevel("unchecked")  # a library built without a target: one level, no CPU check

# Linux's AT_HWCAP bits on arm64 (arch/arm64/include/uapi/asm/hwcap.h), by the names target.py uses.
AARCH64_HWCAP_BITS = {"fp": 0, "asimd": 1, "aes": 3, "pmull": 4, "sha1": 5, "sha2": 6, "crc32": 7, "atomics": 8,
                      "fphp": 9, "asimdhp": 10, "asimdrdm": 12, "jscvt": 13, "fcma": 14, "lrcpc": 15, "dcpop": 16,
                      "sha3": 17, "asimddp": 20, "sha512": 21, "sve": 22, "asimdfhm": 23}


def table_levels(kernels: Sequence[KernelSpec], target=None) -> list[TableLevel]:
    """The levels the library's table holds: the target's (every kernel must have been built for
    exactly them), or one unchecked level without a target."""
    if target is None:
        if any(k.levels for k in kernels):
            raise ValueError("kernels built for several ISA levels need the target that built them")
        return [UNCHECKED]
    multi = len(target.levels) > 1
    levels = [TableLevel(lv.name, lv.suffix if multi else "", lv.requires) for lv in target.levels]
    expected = tuple(lv.suffix for lv in levels) if multi else ()
    for kernel in kernels:
        if tuple(kernel.levels) != expected:
            raise ValueError(f"kernel {kernel.name} holds ISA levels {list(kernel.levels)}, the target {list(expected)}")
    return levels


def glue_arch_flags(target) -> list[str]:
    """The glue runs before any level is chosen, so it is built for the architecture's baseline,
    whatever the compiler's own default (CC may say -march=native)."""
    arch = target.arch if target is not None else platform.machine()
    return {"x86_64": ["-march=x86-64", "-mtune=generic"], "aarch64": ["-march=armv8-a"]}.get(arch, [])


def kernel_table_source(kernels: Sequence[KernelSpec], levels: Sequence[TableLevel] = (UNCHECKED,),
                        arch: str | None = None) -> str:
    """The C kernel table for `kernels` (see the module docstring for the encoding): the shapes
    once, then one KERNELS_<i> table of entry points per level, then LEVELS, best first."""
    lines = ["/* Generated by onnxfuse.runtime.library. Do not edit. */"]
    entries: list[list[str]] = [[] for _ in levels]
    for index, kernel in enumerate(kernels):
        prefix = f"k{index}"
        symbols = kernel_symbols(kernel)
        tensors = [*kernel.inputs, *kernel.outputs]
        dims = [encode_dim(d, symbols) for t in tensors for d in t.shape]
        if dims:
            lines.append(f"static const int64_t {prefix}_dims[] = {{{', '.join(map(str, dims))}}};")
        offset = 0
        for role, group in (("inputs", kernel.inputs), ("outputs", kernel.outputs)):
            if not group:
                continue
            descs = []
            for position, tensor in enumerate(group):
                derived = "NULL"
                if tensor.has_derived_dims:
                    derived = f"{prefix}_{role}{position}_derived"
                    triples = ", ".join(map(str, derived_triples(tensor.shape, symbols)))
                    lines.append(f"static const int64_t {derived}[] = {{{triples}}};")
                descs.append(f"{{{tensor.onnx_dtype}, {len(tensor.shape)}, {prefix}_dims + {offset}, {derived}}}"
                             if tensor.shape else f"{{{tensor.onnx_dtype}, 0, NULL, NULL}}")
                offset += len(tensor.shape)
            lines.append(f"static const tensor_desc {prefix}_{role}[] = {{{', '.join(descs)}}};")
        if symbols:
            lines.append(f"static const char *const {prefix}_symbols[] = {{{', '.join(map(c_string, symbols))}}};")
        for level, level_entries in zip(levels, entries):
            name = kernel.level_name(level.suffix) if level.suffix else kernel.name
            small_name, serial_name = small_variant_name(name), serial_variant_name(name)
            entry_points = ([name] + ([small_name] if kernel.small_batch_below else [])
                            + ([serial_name] if kernel.serial_variant else []))
            for entry in entry_points:
                lines.append(f"int __tvm_ffi_{entry}(void *self, const TVMFFIAny *args, int32_t n, TVMFFIAny *ret);")
            below = kernel.small_batch_below_at(level.suffix)
            small = (f"__tvm_ffi_{small_name}, {int(below)}, {int(kernel.row_tile_at(level.suffix))}"
                     if kernel.small_batch_below else "NULL, 0, 0")
            serial = f"__tvm_ffi_{serial_name}" if kernel.serial_variant else "NULL"
            level_entries.append(
                f"    {{{c_string(kernel.name)}, __tvm_ffi_{name}, {small}, {serial}, {int(kernel.row_work)}, "
                f"{len(kernel.inputs)}, {f'{prefix}_inputs' if kernel.inputs else 'NULL'}, "
                f"{len(kernel.outputs)}, {f'{prefix}_outputs' if kernel.outputs else 'NULL'}, "
                f"{len(symbols)}, {f'{prefix}_symbols' if symbols else 'NULL'}}},"
            )
    lines.append(f"#define NUM_KERNELS {len(kernels)}")
    level_rows = []
    for index, (level, level_entries) in enumerate(zip(levels, entries)):
        lines += [f"static const kernel_desc KERNELS_{index}[] = {{", *level_entries, "};"]
        lines.append(f"static int cpu_supports_{index}(void) {{ return {cpu_check(level.requires, arch)}; }}")
        level_rows.append(f"    {{{c_string(level.name)}, {c_string(' '.join(level.requires))}, cpu_supports_{index}, "
                          f"KERNELS_{index}}},")
    lines += ["static const isa_level LEVELS[] = {", *level_rows, "};", ""]
    return "\n".join(lines)


def cpu_check(requires: Sequence[str], arch: str | None) -> str:
    """A C expression that is true on a CPU with every feature in `requires`."""
    if not requires:
        return "1"
    if arch == "aarch64":
        mask = sum(1 << AARCH64_HWCAP_BITS[f] for f in requires)
        return f"(getauxval(AT_HWCAP) & {mask:#x}UL) == {mask:#x}UL"
    return " && ".join(f"__builtin_cpu_supports({c_string(f)})" for f in requires)


def kernel_symbols(kernel: KernelSpec) -> list[str]:
    """The kernel's symbolic dims, in order of first appearance in its inputs (where they bind)."""
    return list(dict.fromkeys(s for t in kernel.inputs for s in t.symbols))


def encode_dim(dim, symbols: Sequence[str]) -> int:
    """A static dim as itself, symbol k (or a dim derived from it) as -1 - k."""
    if isinstance(dim, DerivedDim):
        dim = dim.symbol
    if isinstance(dim, str):
        return -1 - symbols.index(dim)
    if dim < 0:
        raise ValueError(f"static dims must be >= 0, got {dim}")
    return int(dim)


def derived_triples(shape, symbols: Sequence[str]) -> list[int]:
    """(multiplier, divisor, index of the second symbol or -1) per dim, flattened; (1, 1, -1) for
    dims that are not derived."""
    return [v for d in shape for v in (
        (d.multiplier, d.divisor, -1 if d.times is None else symbols.index(d.times)) if isinstance(d, DerivedDim)
        else (1, 1, -1))]


def c_string(text: str) -> str:
    """`text` as a C string literal (octal escapes for anything but plain printable ASCII)."""
    plain = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_ .:-+/")
    return '"' + "".join(chr(b) if b in plain else f"\\{b:03o}" for b in text.encode()) + '"'


def _run_compiler(command: list[str], missing_compiler: str) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise CompileError(missing_compiler) from None
    if result.returncode != 0:
        raise CompileError(f"building the kernel library failed ({command[0]}):\n{_shorten(result.stderr)}")


def _shorten(message: str) -> str:
    lines = message.strip().splitlines()
    if len(lines) > MAX_MESSAGE_LINES:
        lines = lines[:MAX_MESSAGE_LINES] + [f"... ({len(lines) - MAX_MESSAGE_LINES} more lines)"]
    return "\n".join(lines)


__all__ = ["build_library", "kernel_table_source"]
