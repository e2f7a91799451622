"""Output dims computed from input dims (N*100, M//4, N*S): groups that flatten or fold a batch."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx_builder import const_i64, model, node
from test_optimize import assert_outputs_match, run_both

from onnxfuse import optimize
from onnxfuse.cache import _dims_from_json, _dims_to_json
from onnxfuse.codegen.relax_import import _dim
from onnxfuse.errors import CompileError
from onnxfuse.kernel_spec import DerivedDim, KernelSpec, TensorSpec


def test_shape_expressions_become_derived_dims():
    n = tvm.tirx.Var("N", "int64")
    c = lambda v: tvm.tirx.IntImm("int64", v)  # noqa: E731
    assert _dim(n * c(100)) == DerivedDim("N", 100)
    assert _dim(c(100) * n) == DerivedDim("N", 100)
    assert _dim(tvm.tirx.floordiv(n, c(4))) == DerivedDim("N", 1, 4)
    assert _dim(tvm.tirx.floordiv(n * c(6), c(4))) == DerivedDim("N", 6, 4)
    with pytest.raises(CompileError, match="expression"):
        _dim(n + c(1))
    s = tvm.tirx.Var("S", "int64")
    assert _dim(s * n) == DerivedDim("S", times="N")
    assert _dim(s * c(4) * n) == DerivedDim("S", 4, times="N")
    assert _dim(tvm.tirx.floordiv(s * n * c(64), c(256))) == DerivedDim("S", 64, 256, times="N")
    with pytest.raises(CompileError, match="expression"):
        _dim(s * n * n)


def test_derived_dims_compute_their_value_and_survive_the_cache():
    spec = TensorSpec("float32", (DerivedDim("N", 6, 4), "N", 3))
    assert spec.concrete({"N": 10}) == (15, 10, 3)
    assert spec.symbols == ("N", "N")
    assert _dims_from_json(_dims_to_json(spec.shape)) == spec.shape
    assert str(DerivedDim("N", 100)) == "N*100" and str(DerivedDim("M", 1, 4)) == "M//4"
    product = TensorSpec("float32", (DerivedDim("S", 2, times="N"), 3))
    assert product.concrete({"S": 5, "N": 7}) == (70, 3)
    assert product.symbols == ("S", "N") and str(product.shape[0]) == "S*N*2"
    assert _dims_from_json(_dims_to_json(product.shape)) == product.shape


def test_an_input_derives_a_dim_only_from_dims_other_inputs_bind():
    def spec(first):
        return KernelSpec("k", (TensorSpec("float32", first), TensorSpec("float32", ("n", 10))),
                          (TensorSpec("float32", ("n", 10)),), "k.o")

    assert spec((DerivedDim("n", 10), 32)).inputs[0].concrete({"n": 3}) == (30, 32)
    with pytest.raises(ValueError, match="product of dims other inputs bind"):
        spec((DerivedDim("m", 10), 32))  # m is no input's dim
    with pytest.raises(ValueError, match="product of dims other inputs bind"):
        spec((DerivedDim("n", 1, 2), 32))  # a quotient, not a product
    with pytest.raises(ValueError, match="product of dims other inputs bind"):
        KernelSpec("k", (TensorSpec("float32", (DerivedDim("N", 2),)),), (TensorSpec("float32", ("N",)),), "k.o")


def _flatten_model():
    """x[N, 4] → Reshape [-1] → Relu → y[N*4]: the output's dim is four times the input's."""
    return model([node("Reshape", ["x", "flat_shape"], "flat"), node("Relu", ["flat"], "y")],
                 {"x": ("N", 4)}, {"y": ("F",)}, {"flat_shape": const_i64(-1)})


def _fold_model():
    """f[M] → Reshape [-1, 4] → Sigmoid → y[M//4, 4]: the output's first dim is a quarter of the input's."""
    return model([node("Reshape", ["f", "fold_shape"], "folded"), node("Sigmoid", ["folded"], "y")],
                 {"f": ("M",)}, {"y": ("R", 4)}, {"fold_shape": const_i64(-1, 4)})


def _flatten_two_symbols_model():
    """x[S, N, 4] → Reshape [-1, 4] → Relu → y[S*N, 4]: a product of two symbolic dims (PyTorch's
    nn.MultiheadAttention flattens its [seq, batch, 64] context this way before out_proj)."""
    return model([node("Reshape", ["x", "rows_shape"], "rows"), node("Relu", ["rows"], "y")],
                 {"x": ("S", "N", 4)}, {"y": ("R", 4)}, {"rows_shape": const_i64(-1, 4)})


def _split_product_model():
    """x[S, N, 64] → Reshape [16, -1, 16] → Relu → y[S*N//4, ...]: TorchScript's attention head
    split with seq baked to 16; the kernel checks S*N is a multiple of 4, as onnxruntime fails."""
    return model([node("Reshape", ["x", "heads_shape"], "heads"), node("Relu", ["heads"], "y")],
                 {"x": ("S", "N", 64)}, {"y": (16, "R", 16)}, {"heads_shape": const_i64(16, -1, 16)})


@pytest.mark.parametrize("build, feed_name, shapes", [
    (_flatten_model, "x", [(1, 4), (3, 4), (50, 4)]),
    (_fold_model, "f", [(4,), (12,), (200,)]),
    (_flatten_two_symbols_model, "x", [(1, 1, 4), (3, 5, 4), (16, 50, 4)]),
    (_split_product_model, "x", [(2, 2, 64), (16, 1, 64), (6, 10, 64)]),
])
def test_flattening_and_folding_groups_compile_and_match_onnxruntime(tmp_path, build, feed_name, shapes):
    import onnx

    source = tmp_path / "m.onnx"
    onnx.save(build(), str(source))
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    (group,) = result.report["groups"]
    assert group["status"] == "compiled", group.get("reason")
    assert group["verify"]["checked"], group["verify"]  # against onnxruntime on inputs that fold evenly
    for shape in shapes:
        x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
        expected, actual = run_both(source, result.model_path, {feed_name: x})
        assert np.asarray(actual[0]).shape == np.asarray(expected[0]).shape
        assert_outputs_match(expected, actual)


def test_verification_folds_random_inputs_evenly_for_every_divisor():
    from onnxfuse.codegen.worker import _whole_multiples

    spec = KernelSpec("k", (TensorSpec("float32", ("M", "N")),),
                      (TensorSpec("float32", (DerivedDim("M", 1, 4), "N")), TensorSpec("float32", (DerivedDim("M", 1, 6),)),
                       TensorSpec("float32", (DerivedDim("N", 3),))), "k.o")
    assert _whole_multiples(spec, 3) == {"M": 3 * 12}  # lcm(4, 6); N is only multiplied


def test_a_split_of_a_product_that_does_not_divide_fails_as_onnxruntime_does(tmp_path):
    import onnx
    import onnxruntime as ort

    source = tmp_path / "m.onnx"
    onnx.save(_split_product_model(), str(source))
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups"][0]["status"] == "compiled"
    x = np.zeros((3, 3, 64), np.float32)  # 9 rows of 64 do not split into rows of 16 x 16
    with pytest.raises(Exception, match="cannot be reshaped"):
        ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    import onnxfuse

    fused = onnxfuse.InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="cannot be reshaped"):
        fused.run(None, {"x": x})
