"""host_kernel.py: the verification kernel is the shipped schedule with its loops serial."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from test_codegen import lstm_gate_model, tree_chain_model

from onnxfuse.codegen import compile as compile_module
from onnxfuse.codegen import register_file, relax_import, schedule
from onnxfuse.codegen.host_kernel import host_functions, serial_loops
from onnxfuse.kernel_spec import small_variant_name
from onnxfuse.target import resolve_target

REGISTERS = register_file.for_target(resolve_target("portable").tvm_target())


def _parallel_loops(func) -> int:
    kinds = []
    tvm_ffi.structural_map(func, [(tvm.tirx.For, lambda loop: kinds.append(loop.kind) or loop)], order="post")
    return kinds.count(tvm.tirx.ForKind.PARALLEL)


@pytest.mark.parametrize("model", [lstm_gate_model(hidden=64, k=64), tree_chain_model(3)[0]], ids=["gemm", "tree"])
def test_serial_loops_equals_scheduling_again_without_parallel(model):
    fused = relax_import.import_group(model, "k").prim_func
    parallel, stats = schedule.schedule_group(fused, True, registers=REGISTERS)
    serial, _ = schedule.schedule_group(fused, False, registers=REGISTERS)
    assert stats.parallel, "the test needs a schedule with a parallel loop"
    assert _parallel_loops(parallel) > 0
    assert not tvm_ffi.structural_equal(parallel, serial)
    assert _parallel_loops(serial_loops(parallel)) == 0
    assert tvm_ffi.structural_equal(serial_loops(parallel), serial)


def test_host_functions_take_the_spec_names():
    model = lstm_gate_model(hidden=64, k=64)
    fused = relax_import.import_group(model, "k").prim_func
    funcs, _, _ = compile_module._variants(fused, "k__x86_64_v4", 1, True, REGISTERS)
    host = host_functions(funcs, "k__x86_64_v4", "k")
    assert sorted(host) == ["k", small_variant_name("k")]
    assert all(f.attrs["global_symbol"] == name for name, f in host.items())
    assert all(_parallel_loops(f) == 0 for f in host.values())
