"""The shipped check (select/shipped.py): after packaging, optimize runs the written model with its
library against the original, and falls back the groups that make it differ.

The case it exists for: a kernel within an ulp of onnxruntime (Softplus: Exp, Erf, Sigmoid and Tanh
are onnxruntime's own functions, bit for bit, its Softplus is not) right before a
DynamicQuantizeLinear. Each kernel
passes its own check, but where its output sits on a rounding boundary of the quantization, one
ulp flips the quantized value by a whole step.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto
from onnx_builder import model, node
from onnxfuse_cli.main import main

import onnxfuse
from onnxfuse import optimize
from onnxfuse.select.shipped import ShippedModelDiffers, _responsible, check_shipped

WIDTH = 10240


def quantized_softplus_model(path) -> None:
    """q = DynamicQuantizeLinear(Softplus(x * 0.5 + 0.1)), beside an exact group r = Relu(x * 2 + 1)."""
    scalars = {name: np.array(value, np.float32) for name, value in (("half", 0.5), ("tenth", 0.1), ("two", 2),
                                                                      ("one", 1))}
    nodes = [node("Mul", ["x", "half"], "a"), node("Add", ["a", "tenth"], "b"), node("Softplus", ["b"], "y"),
             node("DynamicQuantizeLinear", ["y"], ["q", "scale", "zp"]),
             node("Mul", ["x", "two"], "m"), node("Add", ["m", "one"], "n"), node("Relu", ["n"], "r")]
    built = model(nodes, {"x": ("N", WIDTH)}, ["q", "scale", "zp", "r"], scalars)
    for output, dtype in zip(built.graph.output, (TensorProto.UINT8, TensorProto.FLOAT, TensorProto.UINT8,
                                                  TensorProto.FLOAT)):
        output.type.tensor_type.elem_type = dtype
    onnx.save(built, str(path))


def inputs_on_rounding_boundaries() -> np.ndarray:
    """x where Softplus(x * 0.5 + 0.1) is within 20 float32 steps of a rounding boundary of the
    quantization, (j + 0.5) * top / 255, for every j; one x = 39.8 makes the maximum top =
    Softplus(b) = b, about 20 (log1p(exp(-20)) is under half its ulp), on both sides, so the scale
    is the same (and the zero point 0: every Softplus is positive)."""
    top = float(np.float32(np.float32(39.8) * np.float32(0.5)) + np.float32(0.1))
    boundary = (np.arange(255) + 0.5) * top / 255
    centre = ((np.log(np.expm1(boundary)) - 0.1) / 0.5).astype(np.float32)
    steps = np.arange(-20, 20, dtype=np.int32)
    near = (centre.view(np.int32)[:, None] + steps[None, :]).view(np.float32).ravel()
    x = np.full((1, WIDTH), -40, np.float32)
    x[0, 0] = 39.8
    x[0, 1:1 + near.size] = near
    return x


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    directory = tmp_path_factory.mktemp("shipped")
    original, inputs = directory / "quantized.onnx", directory / "inputs.npz"
    quantized_softplus_model(original)
    np.savez(inputs, x=inputs_on_rounding_boundaries())
    return original, inputs


def outputs(path, feeds, fused=False):
    session = (onnxfuse.InferenceSession if fused else ort.InferenceSession)(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_unchecked_the_fused_model_flips_quantized_values(quantized, tmp_path, cache):
    """Without the check (--no-verify) both groups ship, and the quantized output differs."""
    original, inputs = quantized
    result = optimize(original, tmp_path / "q.fused.onnx", verify=False, cache_dir=cache, jobs=1)
    assert [g["status"] for g in result.report["groups"]] == ["compiled", "compiled"]
    feeds = dict(np.load(inputs))
    expected, actual = outputs(original, feeds), outputs(result.model_path, feeds, fused=True)
    flipped = expected[0] != actual[0]
    assert flipped.sum() > 0
    assert np.abs(expected[0].astype(int) - actual[0].astype(int)).max() == 1  # one quantization step


def test_the_check_falls_back_only_the_group_before_the_quantization(quantized, tmp_path, cache):
    original, inputs = quantized
    result = optimize(original, tmp_path / "q.fused.onnx", inputs=inputs, cache_dir=cache, jobs=1)
    by_output = {tuple(g["outputs"]): g for g in result.report["groups"]}
    softplus, relu = by_output[("y",)], by_output[("r",)]
    assert softplus["status"] == "fallback"
    assert softplus["reason"].startswith("shipped check: with this kernel the fused model differs from the original "
                                        "(output q: max abs error 1")
    assert relu["status"] in ("compiled", "cached")
    check = result.report["shipped_check"]
    assert check["fallen_back"] == [softplus["name"]] and check["inputs"] == str(inputs)
    feeds = dict(np.load(inputs))
    for e, a in zip(outputs(original, feeds), outputs(result.model_path, feeds, fused=True)):
        assert np.array_equal(e, a)
    custom = [n for n in onnx.load(str(result.model_path)).graph.node if n.domain == "ai.onnxfuse"]
    assert len(custom) == 1  # the Relu group still ships


def test_cli_takes_inputs_and_reports_the_fallback(quantized, tmp_path, cache):
    original, inputs = quantized
    out = tmp_path / "q.fused.onnx"
    run = CliRunner().invoke(main, ["optimize", str(original), "-o", str(out), "--inputs", str(inputs),
                                    "--cache-dir", str(cache), "-j", "1", "-q"])
    assert run.exit_code == 0, run.output
    assert "2 groups:" in run.output and "1 fell back" in run.output
    assert "shipped check: with this kernel the fused model differs" in run.output


def test_when_the_model_without_kernels_still_differs_it_is_an_error(tmp_path):
    """No kernel is to blame when the model packaged with none of them differs too (the loader's
    canonicalization, not a kernel, changed the result): optimize then fails (exit 1)."""
    def doubled(factor):
        return model([node("Mul", ["x", "two"], "m"), node("Relu", ["m"], "r")], {"x": ("N", 8)}, {"r": ("N", 8)},
                     {"two": np.array(factor, np.float32)})

    original = tmp_path / "doubled.onnx"
    onnx.save(doubled(2.0), str(original))
    canonicalized_wrongly = doubled(2.5)
    packaged = []
    with pytest.raises(ShippedModelDiffers, match="even with every group left to onnxruntime") as raised:
        check_shipped(original, [(SimpleNamespace(name="g0"), None)],
                      lambda kept: packaged.append(kept) or (canonicalized_wrongly, None), canonicalized_wrongly, None)
    assert raised.value.exit_code == 1
    assert packaged[-1] == []  # it got to the model without kernels


@pytest.mark.parametrize("culprits, together", [({"g3", "g6"}, False), ({"g0"}, False), ({"g1", "g2"}, True)])
def test_bisection_finds_the_groups_responsible(culprits, together):
    """`differs(kept)`: whether the model with these groups compiled differs. Separately
    responsible groups are found one by one; a pair that differs only together falls back whole
    with the half it shares."""
    fused = [(SimpleNamespace(name=f"g{k}"), None) for k in range(8)]
    calls = []

    def differs(kept):
        names = {group.name for group, _ in kept}
        calls.append(names)
        return culprits <= names if together else bool(culprits & names)

    found = _responsible(fused, differs)
    assert culprits <= found
    assert found == culprits or together
    assert len(calls) < 2 * len(fused)


def test_an_original_that_fails_on_random_inputs_is_shipped_unchecked_with_the_reason(tmp_path):
    """Indices pushed out of range make the original itself fail (onnxruntime raises) on any
    input: the check has nothing to compare, so optimize says so instead of failing."""
    m = model([node("Neg", ["x"], "n"), node("Add", ["i", "far"], "j"), node("GatherElements", ["n", "j"], "y", axis=1)],
              {"x": ("N", 3)}, {"y": ("N", 2)}, {"far": np.array(100, np.int64)})
    m.graph.input.append(onnx.helper.make_tensor_value_info("i", TensorProto.INT64, ("N", 2)))
    original = tmp_path / "gather.onnx"
    onnx.save(m, str(original))
    run = CliRunner().invoke(main, ["optimize", str(original), "-o", str(tmp_path / "g.fused.onnx"), "--select", "all",
                                    "--no-cache"])
    assert run.exit_code == 0, run.output
    assert "shipped check skipped: the original model fails on random inputs" in run.output
    assert "running GatherElements node" in run.output
