"""Group inputs whose dims are products of other inputs' dims (`10*batch`): the kernel computes
and checks them instead of binding a symbol of their own (dim_products.py, kernel_spec.DerivedDim),
and its GEMM over those symbolic rows runs in register-tile blocks (clamped_tail). Compared with
onnxruntime on the original model."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from conftest import run_both
from onnx import TensorProto, helper
from onnx_builder import const_i64, model, node, weights
from onnxfuse_cli.main import main

import onnxfuse
from onnxfuse.dim_products import Product, parse_product
from onnxfuse.kernel_identity import _plain_symbols, _renamed_info

SEQ, DIM = 10, 32


@pytest.mark.parametrize("text, expected", [
    ("10*batch", Product(10, ("batch",))), ("batch*10", Product(10, ("batch",))),
    ("seq*batch", Product(1, ("seq", "batch"))), ("2*seq*batch", Product(2, ("seq", "batch"))),
    ("batch", None), ("batch + 1", None), ("batch/2", None), ("a*b*c", None), ("0*batch", None), ("3*4", None),
])
def test_products_are_read_from_dim_names(text, expected):
    assert parse_product(text) == expected


def test_a_product_of_bound_dims_is_named_by_their_canonical_names():
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["10*batch", DIM]),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", SEQ, DIM]),
              helper.make_tensor_value_info("c", TensorProto.FLOAT, ["4*heads", DIM])]
    symbols = _plain_symbols(inputs)
    assert symbols == {"batch": "s0"}  # heads is no dim of its own anywhere: 4*heads stays a symbol
    dims = [[d.dim_param or d.dim_value for d in _renamed_info(v, v.name, symbols).type.tensor_type.shape.dim]
            for v in inputs]
    assert dims == [["10*s0", DIM], ["s0", SEQ, DIM], ["s1", DIM]]


def out_projection(tmp_path):
    """nn.MultiheadAttention's out-projection and residual as the dynamo exporter leaves them at a
    static sequence: the attention's `[10*batch, 32]`, a product, reshaped to `[10, batch, 32]`,
    transposed to the residual's `[batch, 10, 32]` and added."""
    m = model([node("MatMul", ["flat", "W"], "projected"),
               node("Reshape", ["projected", "shape"], "by_seq"),
               node("Transpose", ["by_seq"], "by_batch", perm=[1, 0, 2]),
               node("Add", ["x", "by_batch"], "y")],
              {"flat": (f"{SEQ}*batch", DIM), "x": ("batch", SEQ, DIM)}, {"y": ("batch", SEQ, DIM)},
              {"W": weights(DIM, DIM, seed=1), "shape": const_i64(SEQ, -1, DIM)})
    m.graph.value_info.extend([helper.make_tensor_value_info("by_seq", TensorProto.FLOAT, [SEQ, "batch", DIM]),
                               helper.make_tensor_value_info("by_batch", TensorProto.FLOAT, ["batch", SEQ, DIM])])
    path = tmp_path / "out_projection.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def feeds(batch: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"flat": rng.standard_normal((SEQ * batch, DIM)).astype(np.float32),
            "x": rng.standard_normal((batch, SEQ, DIM)).astype(np.float32)}


def test_the_out_projection_is_one_kernel_with_onnxruntimes_bits(tmp_path, cache):
    original, fused, report = out_projection(tmp_path), tmp_path / "fused.onnx", tmp_path / "report.json"
    result = CliRunner().invoke(main, ["optimize", str(original), "-o", str(fused), "--cache-dir", str(cache),
                                       "--select", "all", "--report", str(report)])
    assert result.exit_code == 0, result.output
    (group,) = json.loads(report.read_text())["groups"]
    assert group["status"] in ("compiled", "cached") and group["op_types"] == ["MatMul", "Reshape", "Transpose", "Add"]
    assert group["stats"]["clamped_row_blocks"] == 1  # the GEMM's 10*batch rows in register-tile blocks
    for batch in (1, 3, 7, 64):  # 10, 30, 70, 640 rows: blocks of 4 with a ragged last one but at 640
        expected, actual = run_both(original, fused, feeds(batch, seed=batch))
        assert np.array_equal(expected[0], actual[0]), f"batch {batch}"


def test_a_derived_dim_that_does_not_match_is_refused_with_one_line(tmp_path, cache):
    original, fused = out_projection(tmp_path), tmp_path / "fused.onnx"
    result = CliRunner().invoke(main, ["optimize", str(original), "-o", str(fused), "--cache-dir", str(cache),
                                       "--select", "all"])
    assert result.exit_code == 0, result.output
    wrong = feeds(2)
    wrong["flat"] = np.zeros((3 * SEQ, DIM), np.float32)  # 30 rows where x says batch 2
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument,
                       match="input 0 dim 0 is 30, expected 20 from the other inputs' dims"):
        onnxfuse.InferenceSession(str(fused)).run(None, wrong)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="broadcast"):  # nor can the original
        ort.InferenceSession(str(original), providers=["CPUExecutionProvider"]).run(None, wrong)
