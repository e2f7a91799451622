"""stack_buffers: a register tile's small buffers are allocas LLVM promotes to registers, not TVM
workspace memory (zeroed by memset and loaded around every tile's k loop)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from conftest import run_both
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnxfuse import optimize
from onnxfuse.codegen import relax_import, schedule
from onnxfuse.codegen.compile import build_module
from onnxfuse.codegen.stack_buffers import DISABLE_LOWER_BUILTIN, STACK_BUDGET, STACK_BYTES, stack_buffers
from onnxfuse.target import resolve_target


def _allocations(*shapes, scope="local"):
    """A PrimFunc allocating one buffer of each shape (and storing to each)."""
    from tvm import tirx

    stmts = []
    for shape in shapes:
        buffer = tirx.decl_buffer(shape, "float32", scope=scope)
        stmts += [tirx.AllocBuffer(buffer), tirx.BufferStore(buffer, tirx.const(0.0, "float32"), [0] * len(shape))]
    return tirx.PrimFunc([], tirx.SeqStmt(stmts))


def _stacked(func) -> list[bool]:
    from tvm import tirx

    return [DISABLE_LOWER_BUILTIN in s.annotations for s in func.body.seq if isinstance(s, tirx.AllocBuffer)]


@pytest.mark.parametrize("shape, scope, kept_on_stack", [
    ((4, 64), "local", True),  # a 4 x 4 zmm tile: 1,024 bytes, just too large for TVM's own rule
    ((6, 64), "local", True),
    ((4, 64), "global", False),  # the copy a per-tile epilogue reads: memory, only 16-byte aligned
    ((STACK_BYTES // 4 + 1,), "local", False),  # larger than any register tile
    ((4, 64), "shared", False),
])
def test_which_buffers_stay_on_the_stack(shape, scope, kept_on_stack):
    assert _stacked(stack_buffers(_allocations(shape, scope=scope))) == [kept_on_stack]


def test_the_stack_takes_at_most_its_budget():
    tiles = STACK_BUDGET // STACK_BYTES
    stacked = _stacked(stack_buffers(_allocations(*[(STACK_BYTES // 4,)] * (tiles + 2))))
    assert stacked == [True] * tiles + [False, False]


def _projection() -> onnx.ModelProto:
    """[N, 8, 64] @ [64, 256] + b: rows of 8 take 4 x 4 register tiles (1,024 bytes of accumulators)."""
    rng = np.random.default_rng(2)
    graph = h.make_graph([h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["y"])], "g",
                         [h.make_tensor_value_info("x", TP.FLOAT, ["N", 8, 64])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["N", 8, 256])],
                         [nh.from_array(rng.standard_normal((64, 256)).astype(np.float32), "W"),
                          nh.from_array(rng.standard_normal(256).astype(np.float32), "b")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_a_register_tile_is_neither_workspace_nor_memset():
    func, stats = schedule.schedule_group(relax_import.import_group(_projection(), "k").prim_func)
    assert stats.register_tiles == 1
    ll = build_module({"k": func.with_attr("global_symbol", "k")}, resolve_target("native").tvm_target()).mod.inspect_source("ll")
    workspace = re.findall(r"%(\w+) = tail call ptr %\w+\(i32 1, i32 %\w+, i64 \d+,", ll)  # TVMBackendAllocWorkspace
    assert not [name for name in workspace if "_local" in name], workspace  # the accumulators are not among them
    assert not re.search(r"llvm\.memset[^(]*\([^)]*i64 1024", ll)


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_a_projection_with_stacked_accumulators_is_onnxruntimes(batch, tmp_path):
    source = tmp_path / "p.onnx"
    onnx.save(_projection(), str(source))
    result = optimize(source, tmp_path / "p.fused.onnx", cache_dir=False, jobs=1, select="all")
    x = np.random.default_rng(batch).standard_normal((batch, 8, 64)).astype(np.float32)
    expected, actual = run_both(source, result.model_path, {"x": x})
    np.testing.assert_array_equal(expected[0].view(np.uint32), actual[0].view(np.uint32))
