"""Front end: a Slice of an axis' last element followed by the Squeeze of that axis (tf2onnx's last
step of a Keras RNN) becomes one Gather of index -1 (frontend/last_element_gathers.py), and the
layer after it compiles over a symbolic time axis, with onnxruntime's bits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from frontend_helpers import as_exported
from onnx_builder import const_i64, model, node, weights
from test_ieee_order import assert_bitwise_equal, original_session

from onnxfuse import InferenceSession, optimize
from onnxfuse.frontend.loader import load_model

CORPUS = Path(__file__).resolve().parent.parent / "models" / "exported"
INT_MAX = 2**31 - 1


def last_step_dense(starts=-1, ends=INT_MAX, steps=1, squeezed=0, second_reader=False) -> onnx.ModelProto:
    """y = last step of x [T, B, 16] over T (symbolic) @ W + b, as tf2onnx writes it."""
    nodes = [node("Slice", ["x", "starts", "ends", "axes", "steps"], "last"), node("Squeeze", ["last", "sq"], "h"),
             node("MatMul", ["h", "w"], "p"), node("Add", ["p", "b"], "y")]
    outputs = {"y": ("B", 4)}
    if second_reader:
        nodes.append(node("Neg", ["last"], "z"))
        outputs["z"] = [1, "B", 16]
    inits = {"starts": const_i64(starts), "ends": const_i64(ends), "axes": const_i64(0), "steps": const_i64(steps),
             "sq": const_i64(squeezed), "w": weights(16, 4), "b": weights(4, seed=1)}
    return model(nodes, {"x": ("T", "B", 16)}, outputs, inits)


def op_types(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in load_model(m).nodes]


def test_the_pair_becomes_one_gather_even_from_constant_nodes():
    for m in (last_step_dense(), as_exported(last_step_dense())):
        assert op_types(m) == ["Gather", "MatMul", "Add"]


@pytest.mark.parametrize("case", [dict(starts=-2), dict(steps=2), dict(ends=5), dict(second_reader=True)])
def test_other_slices_stay(case):
    assert "Slice" in op_types(last_step_dense(**case))


def test_the_layer_after_it_compiles_with_onnxruntimes_bits(tmp_path):
    m = last_step_dense()
    onnx.save(m, str(tmp_path / "m.onnx"))
    result = optimize(tmp_path / "m.onnx", tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups_fallback"] == 0 and result.report["fused_node_count"] == 3, result.report["groups"]
    fused = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    original = original_session(m)
    for steps, batch in ((1, 1), (7, 3), (12, 64)):
        x = np.random.default_rng(steps).standard_normal((steps, batch, 16)).astype(np.float32)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


def test_keras_lstm_export_has_no_slice_left():
    """The corpus' Keras LSTM (tf2onnx): its last step feeds the Dense layer through a Gather."""
    types = op_types(onnx.load(str(CORPUS / "keras_lstm.onnx")))
    assert "Gather" in types and types.count("Squeeze") == 1  # the LSTM's direction axis stays a Squeeze
