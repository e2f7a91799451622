"""`--target native` builds for the machine it runs on: x86-64 or aarch64, each with its own gcc.

Before, `native` always meant x86-64, so on an arm64 server (Graviton, Ampere) the default
command asked LLVM for an x86 object tuned for an ARM CPU. These tests pretend to be other hosts
by replacing platform.machine().
"""

from __future__ import annotations

import platform

import pytest
from click.testing import CliRunner
from onnxfuse_cli.main import main
from test_optimize import MODELS

from onnxfuse.codegen import register_file
from onnxfuse.errors import UsageError
from onnxfuse.target import TARGET_ENV, host_triple, resolve_target


@pytest.mark.parametrize("machine, triple", [
    ("x86_64", "x86_64-linux-gnu"), ("AMD64", "x86_64-linux-gnu"),
    ("aarch64", "aarch64-linux-gnu"), ("arm64", "aarch64-linux-gnu"),
])
def test_host_triple(machine, triple):
    assert host_triple(machine) == triple


def test_native_on_an_arm64_host_builds_aarch64_with_the_hosts_gcc(monkeypatch):
    monkeypatch.delenv("CC", raising=False)  # the host's own gcc unless CC names another
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    target = resolve_target("native", mcpu="neoverse-n1")
    assert (target.name, target.triple, target.cc, target.mcpu) == ("native", "aarch64-linux-gnu", "gcc", "neoverse-n1")
    assert register_file.for_target(target.tvm_target()) == register_file.NEON


def test_native_here_is_this_machine():
    assert resolve_target("native").triple == host_triple(platform.machine())


def test_native_on_another_architecture_is_a_usage_error(monkeypatch, tmp_path):
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    with pytest.raises(UsageError, match="riscv64.*--target x86_64 or --target aarch64"):
        resolve_target("native")
    out = tmp_path / "cell.fused.onnx"
    result = CliRunner().invoke(main, ["optimize", str(MODELS / "lstm_gate.onnx"), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "riscv64" in result.output and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--mcpu", "notacpu"], "--mcpu 'notacpu' is not an x86_64 CPU that LLVM knows"),
    (["--target", "aarch64", "--mcpu", "neoverse_n1"], "did you mean neoverse-n1"),
    (["--target", "aarch64", "--mcpu", "znver4"], "'znver4' is not an aarch64 CPU"),
    (["--mattr", "+notafeature"], "'+notafeature' is not an x86_64 CPU feature"),
    (["--mattr", "avx2"], "each feature is +name or -name"),
])
def test_a_cpu_or_feature_llvm_does_not_know_is_a_usage_error(args, message, tmp_path):
    """LLVM alone would warn and build for a generic CPU: a typo would quietly cost speed."""
    out = tmp_path / "gate.fused.onnx"
    result = CliRunner().invoke(main, ["optimize", str(MODELS / "lstm_gate.onnx"), "-o", str(out), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("name, mcpu, mattr, expected", [
    ("native", "skylake-avx512", "+avx512f,-avx512bw", ("skylake-avx512", ("+avx512f", "-avx512bw"))),
    ("x86_64", None, "+avx2", ("x86-64", ("+avx2",))),  # features alone: one level on the baseline CPU
    ("aarch64", "neoverse-n1", "+neon,+dotprod", ("neoverse-n1", ("+neon", "+dotprod"))),
    ("aarch64", "cortex-a72", None, ("cortex-a72", ("+neon",))),
])
def test_known_cpus_and_features_resolve(name, mcpu, mattr, expected):
    target = resolve_target(name, mcpu, mattr)
    assert (target.mcpu, target.mattr) == expected


def test_the_default_target_is_portable_unless_the_environment_names_another(monkeypatch):
    monkeypatch.delenv(TARGET_ENV, raising=False)
    assert resolve_target().name == "portable"
    monkeypatch.setenv(TARGET_ENV, "native")
    assert resolve_target().name == "native" and len(resolve_target().levels) == 1
    assert resolve_target("portable").name == "portable"  # a named target wins
