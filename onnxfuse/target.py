"""Compilation targets: one name the user types → the ISA levels to build and the C toolchain.

A target is a set of ISA levels, best first. Every kernel is built once per level, under
level-suffixed symbols, and the library runs the best level the CPU it is loaded on supports:
chosen once, at registration, from the CPU's feature bits (docs/portability.md). A CPU that
supports none of them gets an onnxruntime error at session creation, never an illegal instruction.

- `portable` (the default): the levels of this machine's architecture, so a model optimized on a
  build machine runs on any CPU of that architecture where it is served.
- `x86_64`, `aarch64`: the same level sets, named explicitly (aarch64 is cross-compiled).
- `native`: one level, this machine's exact CPU; the library refuses CPUs that lack a feature it
  was built with. `--mcpu`/`--mattr` with any target name also build one level, for that CPU.
"""

from __future__ import annotations

import difflib
import os
import platform
import re
import shlex
import shutil
from dataclasses import dataclass, field

from .errors import UsageError

TARGET_NAMES = ("portable", "native", "x86_64", "aarch64")
DEFAULT_TARGET = "portable"
TARGET_ENV = "ONNXFUSE_TARGET"
"""Names the target when the caller does not: a build farm that serves on its own CPUs (or a test
suite that needs no portability) says `native` once, instead of on every command."""


def default_target_name() -> str:
    return os.environ.get(TARGET_ENV) or DEFAULT_TARGET


@dataclass(frozen=True)
class IsaLevel:
    """One instruction-set level: the LLVM CPU and features its kernels are built for, and the CPU
    features the library checks before it runs them (`requires`, in the runtime's vocabulary:
    gcc's __builtin_cpu_supports names on x86-64, Linux HWCAP names on aarch64)."""

    name: str
    mcpu: str
    mattr: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()

    @property
    def suffix(self) -> str:
        """The level as a C identifier part: "x86-64-v3" → "x86_64_v3"."""
        return re.sub(r"\W", "_", self.name)


# The portable level sets, best first. x86-64: the psABI levels; the baseline is plain x86-64
# (SSE2), which every x86-64 CPU that runs onnxruntime has (numpy, which onnxruntime's Python
# package needs, asks for x86-64-v2; onnxruntime's own library does not). aarch64: ARMv8-A with
# Advanced SIMD only: no higher level has been measured worth its compile time yet.
PORTABLE_LEVELS = {
    "x86_64-linux-gnu": (("x86-64-v4", "x86-64-v4", ()), ("x86-64-v3", "x86-64-v3", ()), ("x86-64", "x86-64", ())),
    "aarch64-linux-gnu": (("armv8-a", "generic", ("+neon",)),),
}

# CPU features the library can ask the CPU about, as LLVM names them → as the runtime names them.
X86_CHECKABLE = {f: f for f in (
    "sse3 ssse3 sse4.1 sse4.2 sse4a popcnt avx avx2 fma fma4 xop f16c bmi bmi2 lzcnt movbe aes pclmul gfni "
    "vpclmulqdq avx512f avx512vl avx512bw avx512dq avx512cd avx512vnni avx512bf16 avx512fp16 avx512vbmi "
    "avx512vbmi2 avx512ifma avx512bitalg avx512vpopcntdq").split()}
AARCH64_CHECKABLE = {"neon": "asimd", "fullfp16": "asimdhp", "dotprod": "asimddp", "sve": "sve", "rdm": "asimdrdm",
                     "crc": "crc32", "lse": "atomics", "aes": "aes", "sha2": "sha2", "fp16fml": "asimdfhm",
                     "rcpc": "lrcpc", "jsconv": "jscvt", "complxnum": "fcma"}


@dataclass(frozen=True)
class Target:
    name: str
    triple: str
    cc: str
    levels: tuple[IsaLevel, ...]  # best first
    args: tuple = field(default=(), compare=False)  # what resolve_target was given, to redo it in a worker

    @property
    def mcpu(self) -> str:
        """The best level's CPU."""
        return self.levels[0].mcpu

    @property
    def mattr(self) -> tuple[str, ...]:
        return self.levels[0].mattr

    @property
    def arch(self) -> str:
        return self.triple.split("-")[0]

    def tvm_target(self, level: IsaLevel | None = None, llvm_options: tuple[str, ...] = ()):
        """The TVM target object of `level` (default: the best one), with LLVM command-line
        options for its code generation if given. TVM 0.27 takes dicts only."""
        import tvm

        level = level or self.levels[0]
        spec: dict = {"kind": "llvm", "mtriple": self.triple}
        if level.mcpu:
            spec["mcpu"] = level.mcpu
        if level.mattr:
            spec["mattr"] = list(level.mattr)
        if llvm_options:
            spec["cl-opt"] = list(llvm_options)
        return tvm.target.Target(spec)

    @property
    def key(self) -> str:
        """Identifies the generated code, for the compile cache: every level, in order."""
        return self.triple + "".join(f"|{lv.name}:{lv.mcpu}:{','.join(lv.mattr)}" for lv in self.levels)

    def require_toolchain(self) -> None:
        if shutil.which(shlex.split(self.cc)[0]) is None:
            raise UsageError(missing_compiler_message(self.cc, self.name))


def default_cc() -> str:
    """The C compiler for the host's own kernels: `$CC` (it may carry arguments), else gcc."""
    return os.environ.get("CC", "").strip() or "gcc"


def missing_compiler_message(cc: str, target_name: str) -> str:
    """Says which compiler the kernel library needs, and how a pip user gets or names one."""
    if target_name == "aarch64":
        return (f"target aarch64 needs the C compiler {cc!r} to link the kernel library, and it is not installed: "
                f"install an aarch64 cross gcc (Debian/Ubuntu: apt-get install gcc-aarch64-linux-gnu) "
                f"or set ONNXFUSE_AARCH64_CC to one")
    return (f"target {target_name} needs a C compiler to link the kernel library, and {cc!r} is not installed: "
            f"install gcc (Debian/Ubuntu: apt-get install gcc) or set CC to another C compiler (e.g. CC=clang)")


# platform.machine() of the hosts `native` and `portable` build for → their LLVM triple
HOST_TRIPLES = {"x86_64": "x86_64-linux-gnu", "amd64": "x86_64-linux-gnu",
                "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}


def host_triple(machine: str | None = None, target_name: str = "native") -> str:
    """The triple of this machine (or of `machine`, as platform.machine() names it): `native` and
    `portable` build for the host, x86-64 or aarch64, with the host's own gcc."""
    machine = machine or platform.machine()
    triple = HOST_TRIPLES.get(machine.lower())
    if triple is None:
        raise UsageError(f"--target {target_name}: onnxfuse builds for x86-64 and aarch64 hosts, and this one is "
                         f"{machine!r}; cross-compile with --target x86_64 or --target aarch64")
    return triple


def resolve_target(name: str | None = None, mcpu: str | None = None, mattr: str | None = None) -> Target:
    """The target `name` (default: $ONNXFUSE_TARGET, else portable; see the module docstring).
    With `mcpu` or `mattr`: one level, that CPU.
    A CPU or feature LLVM does not know for the target is a usage error (check_cpu_and_features)."""
    name = name or default_target_name()
    extra = tuple(a.strip() for a in mattr.split(",") if a.strip()) if mattr else ()
    if name in ("portable", "native"):
        triple, cc = host_triple(target_name=name), default_cc()
    elif name == "x86_64":
        triple, cc = "x86_64-linux-gnu", default_cc()
    elif name == "aarch64":
        # The cross linker is Debian's gcc-aarch64-linux-gnu unless ONNXFUSE_AARCH64_CC names another
        # (a compiler name on PATH or a path), e.g. a vendor toolchain; the tests use it to fake a missing one.
        triple, cc = "aarch64-linux-gnu", os.environ.get("ONNXFUSE_AARCH64_CC") or "aarch64-linux-gnu-gcc"
    else:
        raise UsageError(f"unknown target {name!r}; choose one of {', '.join(TARGET_NAMES)}")
    portable = PORTABLE_LEVELS[triple]
    if name == "native" and not mcpu:
        import tvm

        mcpu = tvm.target.codegen.llvm_get_system_cpu()
    if mcpu or extra:  # one level, for the CPU asked for (the baseline's, if only features were given)
        baseline_cpu, baseline_attrs = portable[-1][1], portable[-1][2]
        cpu = mcpu or baseline_cpu
        attrs = extra or (baseline_attrs if not mcpu else ())
        if triple.startswith("aarch64") and not attrs:
            attrs = ("+neon",)
        levels = ((cpu, cpu, attrs),)
    else:
        levels = portable
    target = Target(name, triple, cc, tuple(IsaLevel(n, c, a) for n, c, a in levels), args=(name, mcpu, mattr))
    check_cpu_and_features(target)
    return Target(name, triple, cc, tuple(IsaLevel(lv.name, lv.mcpu, lv.mattr, required_features(target, lv))
                                          for lv in target.levels), args=target.args)


def required_features(target: Target, level: IsaLevel) -> tuple[str, ...]:
    """What the library checks before it runs `level`'s kernels: every feature LLVM may use for
    the level that the CPU can be asked about (a CPU LLVM knows implies its features)."""
    from tvm.target import codegen

    checkable = AARCH64_CHECKABLE if target.arch == "aarch64" else X86_CHECKABLE
    tvm_target = target.tvm_target(level)
    return tuple(dict.fromkeys(runtime_name for llvm_name, runtime_name in checkable.items()
                               if codegen.target_has_features(llvm_name, tvm_target)))


def runs_here(target: Target, level: IsaLevel) -> bool:
    """Whether this machine can run `level`'s kernels: the target's triple is this machine's and
    its CPU (as LLVM detects it) has every feature the level requires."""
    import tvm
    from tvm.target import codegen

    try:
        if target.triple != host_triple():
            return False
    except UsageError:
        return False
    host = tvm.target.Target({"kind": "llvm", "mtriple": target.triple, "mcpu": codegen.llvm_get_system_cpu()})
    checkable = AARCH64_CHECKABLE if target.arch == "aarch64" else X86_CHECKABLE
    llvm_names = {runtime_name: llvm_name for llvm_name, runtime_name in checkable.items()}
    return all(codegen.target_has_features(llvm_names.get(name, name), host) for name in level.requires)


def check_cpu_and_features(target: Target) -> None:
    """Raises UsageError unless LLVM knows each level's CPU and every feature for its triple.

    LLVM itself only warns and builds for a generic CPU: a typo such as `--mcpu neoverse_n1`
    would quietly give slower kernels than the user asked for."""
    import tvm
    from tvm.target import codegen

    arch = target.arch
    example = "+neon,+dotprod" if arch == "aarch64" else "+avx2,+fma"
    for level in target.levels:
        if level.mcpu and not codegen.llvm_is_valid_cpu(level.mcpu, target.triple):
            known = codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm", "mtriple": target.triple}))
            close = difflib.get_close_matches(level.mcpu, [str(cpu) for cpu in known], n=3)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise UsageError(f"--mcpu {level.mcpu!r} is not an {arch} CPU that LLVM knows{hint}")
        for feature in level.mattr:
            if feature[:1] not in ("+", "-") or len(feature) < 2:
                raise UsageError(f"--mattr {feature!r}: each feature is +name or -name, e.g. {example}")
            probe = tvm.target.Target({"kind": "llvm", "mtriple": target.triple, "mattr": [f"+{feature[1:]}"]})
            if not codegen.target_has_features(feature[1:], probe):
                raise UsageError(f"--mattr {feature!r} is not an {arch} CPU feature that LLVM knows (e.g. {example})")
