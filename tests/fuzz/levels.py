"""Which ISA level each fuzz batch is compiled for.

A portable build compiles every kernel once per ISA level (three on x86-64), but this machine
runs only the best one, so two thirds of a campaign's compile time (90-95% of its time) went into
kernels nothing ran. Instead each batch is compiled for one level, `--mcpu <level>`, taking
turns: every level this CPU can run is fuzzed, and each graph is compiled once.
"""

from __future__ import annotations

import platform
from pathlib import Path

from onnxfuse.target import PORTABLE_LEVELS, host_triple

# /proc/cpuinfo flags an x86-64 psABI level needs (what LLVM's level CPU enables, as Linux names it)
X86_LEVEL_FLAGS = {
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma", "bmi2"},
    "x86-64-v3": {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"},
    "x86-64": set(),
}


def _cpu_flags() -> set[str]:
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return set()
    for line in first.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def host_levels() -> list[tuple[str, list[str]]]:
    """(level name, the `onnxfuse optimize` options that build it alone) for each portable level
    this CPU can run, best first."""
    flags = _cpu_flags() if platform.machine() == "x86_64" else set()
    levels = []
    for name, mcpu, mattr in PORTABLE_LEVELS[host_triple(platform.machine())]:
        if X86_LEVEL_FLAGS.get(name, set()) <= flags:
            levels.append((name, ["--mcpu", mcpu] + (["--mattr", ",".join(mattr)] if mattr else [])))
    return levels


def runs_generic_sigmoid(level_name: str) -> bool:
    """Whether onnxruntime, on the CPUs a level serves, runs its generic float32 Sigmoid kernel
    where this CPU's onnxruntime runs the FMA one (generic_sigmoid.py): the x86-64 baseline on a
    CPU with AVX2 and FMA."""
    fma = {"avx2", "fma"}
    if platform.machine() != "x86_64" or not fma <= _cpu_flags():
        return False
    return not fma <= X86_LEVEL_FLAGS.get(level_name, set())


def level_for_batch(batch: int, levels: list):
    """Batches take the levels in turn, the best first."""
    return levels[batch % len(levels)]
