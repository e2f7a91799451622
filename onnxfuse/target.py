"""Compilation targets: one name the user types → the TVM target and the C toolchain for it."""

from __future__ import annotations

import os
import platform
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
        if shutil.which(self.cc) is None:
            raise UsageError(
                f"target {self.name} needs the C compiler {self.cc!r}, which is not installed "
                f"(run `make install`)"
            )


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
    `aarch64` = ARMv8 Linux (NEON), cross-compiled."""
    extra = tuple(a.strip() for a in mattr.split(",")) if mattr else ()
    if name == "native":
        import tvm

        triple = host_triple()
        return Target("native", triple, "gcc", mcpu or tvm.target.codegen.llvm_get_system_cpu(), extra)
    if name == "x86_64":
        return Target("x86_64", "x86_64-linux-gnu", "gcc", mcpu or "x86-64-v2", extra)
    if name == "aarch64":
        # The cross linker is Debian's gcc-aarch64-linux-gnu unless ONNXFUSE_AARCH64_CC names another
        # (a compiler name on PATH or a path), e.g. a vendor toolchain; the tests use it to fake a missing one.
        cc = os.environ.get("ONNXFUSE_AARCH64_CC") or "aarch64-linux-gnu-gcc"
        return Target("aarch64", "aarch64-linux-gnu", cc, mcpu or "generic", extra or ("+neon",))
    raise UsageError(f"unknown target {name!r}; choose one of {', '.join(TARGET_NAMES)}")
