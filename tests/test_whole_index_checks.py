"""A gather's every index is checked, also those of elements the fused kernel never computes
(codegen/whole_index_checks.py): onnxruntime computes the whole Gather and raises, so must the
kernel. Fused model through onnxruntime against onnxruntime on the original."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx_builder import model, node
from test_codegen import tree_chain_model
from test_ieee_order import assert_bitwise_equal, fused_session, original_session

from onnxfuse.codegen import relax_import, whole_index_checks

F32 = np.float32
TABLE = {"table": np.arange(5, dtype=F32)}
COLUMN_2 = {"starts": np.array([2], np.int64), "ends": np.array([3], np.int64), "axes": np.array([1], np.int64)}
SLICE = node("Slice", ["g", "starts", "ends", "axes"], "s")


def _sliced_gather(gather_nodes, input_type, inits) -> onnx.ModelProto:
    """gather -> Slice(column 2) -> Neg; input x (N, 3) of `input_type`, output y float32."""
    m = model([*gather_nodes, SLICE, node("Neg", ["s"], "y")], {"x": ("N", 3)}, {"y": ("N", 1)},
              {**inits, **COLUMN_2}, opset=13)
    m.graph.input[0].type.tensor_type.elem_type = input_type
    return m


CASES = {
    # case: (model, good input, bad inputs: an out-of-range index where the Slice drops it)
    "gather": (
        _sliced_gather([node("Gather", ["table", "x"], "g", axis=0)], TensorProto.INT64, TABLE),
        np.array([[0, 4, 1], [-5, -1, 2]], np.int64),
        [np.array([[7, 0, 1]], np.int64), np.array([[0, -6, 1]], np.int64), np.array([[0, 1 << 40, 1]], np.int64)]),
    "gather_elements": (
        _sliced_gather([node("GatherElements", ["table", "x"], "g", axis=1)], TensorProto.INT64,
                       {"table": np.linspace(-1, 1, 12).astype(F32).reshape(1, 12)}),
        np.array([[0, 11, -12]], np.int64),
        [np.array([[12, 0, 1]], np.int64)]),
}


def _float_input_case():
    """Indices computed in the group, Floor -> Cast of a float input (NaN is INT64_MIN)."""
    nodes = [node("Floor", ["x"], "f"), node("Cast", ["f"], "i", to=TensorProto.INT64),
             node("Gather", ["table", "i"], "g", axis=0)]
    return (_sliced_gather(nodes, TensorProto.FLOAT, TABLE), np.array([[0.5, 4.9, 1.0], [-5.0, -0.5, 2.0]], F32),
            [np.array([[np.nan, 0, 1]], F32), np.array([[5.0, 0, 1]], F32), np.array([[0, -np.inf, 1]], F32)])


CASES["computed_index"] = _float_input_case()


@pytest.mark.parametrize("case", list(CASES))
def test_index_in_a_sliced_away_column_is_an_error(tmp_path, case):
    m, good, bad_inputs = CASES[case]
    fused, original = fused_session(m, tmp_path), original_session(m)
    assert_bitwise_equal(fused.run(None, {"x": good})[0], original.run(None, {"x": good})[0])
    for bad in bad_inputs:
        with pytest.raises(Exception, match="(?i)out of"):
            original.run(None, {"x": bad})
        with pytest.raises(Exception, match="index out of range"):
            fused.run(None, {"x": bad})
    assert_bitwise_equal(fused.run(None, {"x": good})[0], original.run(None, {"x": good})[0])  # still works


def test_one_check_per_index_and_none_through_gathers():
    """A depth-2 tree chain: its first level's four Gathers read the root indices (an input), one
    check pass for all four; the second level's indices come from gathers: no pass."""
    model_, _ = tree_chain_model(2)
    nests, _ = whole_index_checks.whole_gather_checks(relax_import.import_group(model_, "k").prim_func)
    assert len(nests) == 1
    assert "idx0[" in str(nests[0])


def test_an_embedding_index_is_checked_once_not_per_column():
    """Gather(table[100, 16], ids[N, 5]) has a [N, 5, 16] output whose index varies along N and 5
    only: the check loops over those two axes, not 16 times over each index."""
    m = model([node("Gather", ["table", "ids"], "g", axis=0), node("Neg", ["g"], "y")], {"ids": ("N", 5)},
              {"y": ("N", 5, 16)}, {"table": np.ones((100, 16), F32)}, opset=17)
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    nests, _ = whole_index_checks.whole_gather_checks(relax_import.import_group(m, "k").prim_func)
    assert len(nests) == 1 and "T.grid(N, T.int64(5))" in str(nests[0]) and "16" not in str(nests[0])
