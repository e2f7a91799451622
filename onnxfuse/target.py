"""Compilation targets: one name the user types → the TVM target and the C toolchain for it."""

from __future__ import annotations

import difflib
import os
import platform
import shlex
import shutil
from dataclasses import dataclass, field

from .errors import UsageError

TARGET_NAMES = ("native", "x86_64", "aarch64")


@dataclass(frozen=True)
class Target:
    name: str
    triple: str
    cc: str
    mcpu: str | None = None
    mattr: tuple[str, ...] = field(default_factory=tuple)

    def tvm_target(self):
        """The TVM target object (TVM 0.27 takes JSON-style dicts only)."""
        import tvm

        spec: dict = {"kind": "llvm", "mtriple": self.triple}
        if self.mcpu:
            spec["mcpu"] = self.mcpu
        if self.mattr:
            spec["mattr"] = list(self.mattr)
        return tvm.target.Target(spec)

    @property
    def key(self) -> str:
        """Identifies the generated code, for the compile cache."""
        return f"{self.triple}|{self.mcpu}|{','.join(self.mattr)}"

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


# platform.machine() of the hosts `native` builds for → their LLVM triple
HOST_TRIPLES = {"x86_64": "x86_64-linux-gnu", "amd64": "x86_64-linux-gnu",
                "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}


def host_triple(machine: str | None = None) -> str:
    """The triple of this machine (or of `machine`, as platform.machine() names it): `native`
    builds for the host, x86-64 or aarch64, with the host's own gcc."""
    machine = machine or platform.machine()
    triple = HOST_TRIPLES.get(machine.lower())
    if triple is None:
        raise UsageError(f"--target native: onnxfuse builds for x86-64 and aarch64 hosts, and this one is "
                         f"{machine!r}; cross-compile with --target x86_64 or --target aarch64")
    return triple


def resolve_target(name: str = "native", mcpu: str | None = None, mattr: str | None = None) -> Target:
    """`native` = this machine's CPU (x86-64 or aarch64); `x86_64` = portable x86-64;
    `aarch64` = ARMv8 Linux (NEON), cross-compiled. A CPU or feature LLVM does not know for the
    target is a usage error (see check_cpu_and_features)."""
    extra = tuple(a.strip() for a in mattr.split(",") if a.strip()) if mattr else ()
    if name == "native":
        import tvm

        triple = host_triple()
        target = Target("native", triple, default_cc(), mcpu or tvm.target.codegen.llvm_get_system_cpu(), extra)
    elif name == "x86_64":
        target = Target("x86_64", "x86_64-linux-gnu", default_cc(), mcpu or "x86-64-v2", extra)
    elif name == "aarch64":
        # The cross linker is Debian's gcc-aarch64-linux-gnu unless ONNXFUSE_AARCH64_CC names another
        # (a compiler name on PATH or a path), e.g. a vendor toolchain; the tests use it to fake a missing one.
        cc = os.environ.get("ONNXFUSE_AARCH64_CC") or "aarch64-linux-gnu-gcc"
        target = Target("aarch64", "aarch64-linux-gnu", cc, mcpu or "generic", extra or ("+neon",))
    else:
        raise UsageError(f"unknown target {name!r}; choose one of {', '.join(TARGET_NAMES)}")
    check_cpu_and_features(target)
    return target


def check_cpu_and_features(target: Target) -> None:
    """Raises UsageError unless LLVM knows the target's CPU and every feature for its triple.

    LLVM itself only warns and builds for a generic CPU: a typo such as `--mcpu neoverse_n1`
    would quietly give slower kernels than the user asked for."""
    import tvm
    from tvm.target import codegen

    arch = target.triple.split("-")[0]
    if target.mcpu and not codegen.llvm_is_valid_cpu(target.mcpu, target.triple):
        known = codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm", "mtriple": target.triple}))
        close = difflib.get_close_matches(target.mcpu, [str(cpu) for cpu in known], n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise UsageError(f"--mcpu {target.mcpu!r} is not an {arch} CPU that LLVM knows{hint}")
    example = "+neon,+dotprod" if arch == "aarch64" else "+avx2,+fma"
    for feature in target.mattr:
        if feature[:1] not in ("+", "-") or len(feature) < 2:
            raise UsageError(f"--mattr {feature!r}: each feature is +name or -name, e.g. {example}")
        probe = tvm.target.Target({"kind": "llvm", "mtriple": target.triple, "mattr": [f"+{feature[1:]}"]})
        if not codegen.target_has_features(feature[1:], probe):
            raise UsageError(f"--mattr {feature!r} is not an {arch} CPU feature that LLVM knows (e.g. {example})")
