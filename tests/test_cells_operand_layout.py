"""The group rewrites that let a cell's kernel read its operands in place (codegen/operand_layout):
each rewritten model computes what the original does (onnxruntime on both), and the kernel of a
state read by a constant Gather carries no run-time index check."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx_builder import model, node, weights

from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.operand_layout import operands_in_place
from onnxfuse.session import quiet_session_options
from onnxfuse.target import resolve_target


def _run(m, feeds):
    session = ort.InferenceSession(m.SerializeToString(), quiet_session_options(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _state_read_gemm(index: int, axis: int = 0):
    state = (2, 5, 8) if axis in (0, -3) else (5, 2, 8)
    return model(
        [node("Gather", ["state", "k"], "h", axis=axis), node("Gemm", ["h", "w", "b"], "y", transB=1, alpha=0.5)],
        {"state": state}, {"y": (5, 12)},
        {"k": np.array(index, np.int64), "w": weights(12, 8), "b": weights(12, seed=1)},
    )


@pytest.mark.parametrize("index, axis", [(0, 0), (1, 0), (-1, 0), (1, 1), (0, -3)])
def test_rewritten_group_computes_the_same(index, axis):
    m = _state_read_gemm(index, axis)
    rewritten = operands_in_place(m)
    assert [n.op_type for n in rewritten.graph.node] == ["Slice", "Squeeze", "Gemm"]
    gemm = rewritten.graph.node[-1]
    assert all(a.name != "transB" for a in gemm.attribute)
    assert "w" not in {i.name for i in rewritten.graph.initializer}
    shape = (2, 5, 8) if axis in (0, -3) else (5, 2, 8)
    feeds = {"state": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    np.testing.assert_allclose(_run(rewritten, feeds)[0], _run(m, feeds)[0], rtol=1e-6, atol=1e-6)


def test_out_of_range_index_is_left_as_it_was():
    m = _state_read_gemm(2)
    assert [n.op_type for n in operands_in_place(m).graph.node] == ["Gather", "Gemm"]


def test_nothing_to_rewrite_gives_the_same_model():
    m = model([node("Gemm", ["x", "w"], "y")], {"x": (4, 8)}, {"y": (4, 6)}, {"w": weights(8, 6)})
    assert operands_in_place(m) is m


def test_state_read_kernel_has_no_index_check(tmp_path):
    m = _state_read_gemm(1)
    compiled = compile_group(m, "state_read", resolve_target("native"), tmp_path)
    assert compiled.stats["index_checks"] == 0
    feeds = {"state": np.random.default_rng(3).standard_normal((2, 5, 8)).astype(np.float32)}
    np.testing.assert_allclose(compiled.run(feeds)[0], _run(m, feeds)[0], rtol=1e-4, atol=1e-5)
