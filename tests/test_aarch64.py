"""aarch64 end to end on this x86-64 machine: cross-compile with `--target aarch64`, then run the
fused model with the arm64 onnxruntime under qemu-user (tests/aarch64/harness.py, an emulated
Neoverse-N1) and require the bits that onnxruntime gives there for the ORIGINAL model (at one
thread: with more, onnxruntime's own Conv changes its bits; the fused model runs at two).

Needs what `make install` installs (scripts/install-aarch64.sh): gcc-aarch64-linux-gnu,
qemu-user and the arm64 libonnxruntime from npm's onnxruntime-node in .cache/aarch64/. Where one
is missing the end-to-end tests skip and say which; the missing-toolchain error test always runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_builder import model, node

from onnxfuse.errors import UsageError
from onnxfuse.kernel_spec import DOMAIN
from onnxfuse.measure.inputs import random_feeds_for_session
from onnxfuse.session import quiet_session_options
from onnxfuse.target import resolve_target

sys.path.insert(0, str(Path(__file__).resolve().parent / "aarch64"))
import harness  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "models"
# The installed console script (as users run it); `python -m onnxfuse_cli.main` would import main twice.
_SCRIPT = Path(sys.executable).parent / "onnxfuse"
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from onnxfuse_cli.main import main; main()"]
MISSING = harness.missing_pieces()
needs_harness = pytest.mark.skipif(
    bool(MISSING), reason="aarch64 harness not installed (run `make install`); missing: " + "; ".join(MISSING))

# model, extra optimize flags (the CPU tuning variants the issue names), batch sizes to run
CASES = [
    ("conv_block", [], (1, 2)),  # a ResNet block: its second Conv + bias + residual, onnxruntime's Conv with a sum input
    ("lstm_cell", ["--mcpu", "cortex-a72", "--mattr", "+neon,+crc"], (1, 37)),
    ("tree_trav_d8", [], (1, 37)),
    ("transformer_mlp", ["--mcpu", "neoverse-n1"], (1, 5)),
    # exporters' own outputs: PyTorch dynamo's BERT (SkipLayerNormalization, Softmax, GELU, a
    # Gemm), TorchScript's GRU op and its 3x3-conv denoiser
    ("exported/bert_tiny_2l_dynamo", [], (1, 3)),
    ("exported/gru_1l_ts", [], (1, 3)),
    ("exported/denoiser_tiny_ts", [], (1, 2)),
    # dynamo's RMSNorm: a Reciprocal of a Sqrt, NEON's estimate refined there (arm_reciprocal)
    ("exported/prenorm_block_dynamo", [], (1, 3)),
    # tf2onnx's Keras encoder: its tanh GELU is onnxruntime's FastGelu, contracted there (contracted_gelu)
    ("exported/keras_encoder", [], (1, 3)),
]


def optimize_cli(model: Path, out: Path, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "optimize", str(model), "-o", str(out), "--target", "aarch64", "-q", *flags],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )


# ---- the toolchain error -------------------------------------------------------------------
def test_missing_cross_compiler_is_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "ONNXFUSE_AARCH64_CC": "onnxfuse-no-such-aarch64-gcc"}
    out = tmp_path / "lstm.fused.onnx"
    result = optimize_cli(MODELS / "lstm_cell.onnx", out, "--cache-dir", str(tmp_path / "cache"), env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "onnxfuse-no-such-aarch64-gcc" in lines[0] and "not installed" in lines[0], lines
    assert not out.exists() and not list(tmp_path.glob("*.so"))


def test_missing_cross_compiler_in_process(monkeypatch):
    monkeypatch.setenv("ONNXFUSE_AARCH64_CC", "onnxfuse-no-such-aarch64-gcc")
    target = resolve_target("aarch64", "neoverse-n1", "+neon")
    assert target.cc == "onnxfuse-no-such-aarch64-gcc"
    with pytest.raises(UsageError, match="not installed"):
        target.require_toolchain()


# ---- end to end under qemu -----------------------------------------------------------------
@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    if MISSING:
        pytest.skip("aarch64 harness not installed (run `make install`); missing: " + "; ".join(MISSING))
    return harness.Aarch64Runner(tmp_path_factory.mktemp("aarch64-host"), threads=2)


@pytest.fixture(scope="module")
def reference_runner(tmp_path_factory):
    """The arm64 onnxruntime at one thread, for the original models."""
    if MISSING:
        pytest.skip("aarch64 harness not installed (run `make install`); missing: " + "; ".join(MISSING))
    return harness.Aarch64Runner(tmp_path_factory.mktemp("aarch64-reference"), threads=1)


def _assert_same_bits(expected: list, actual: list, names: list[str], context: str) -> None:
    for name, e, a in zip(names, expected, actual, strict=True):
        assert e.shape == a.shape and e.dtype == a.dtype, (context, name, e.shape, a.shape, e.dtype, a.dtype)
        assert np.array_equal(e.view(np.uint8), a.view(np.uint8)), \
            (context, name, float(np.max(np.abs(e.astype(np.float64) - a.astype(np.float64)))))


@needs_harness
@pytest.mark.parametrize("name,flags,batches", CASES, ids=[c[0] for c in CASES])
def test_fused_model_on_aarch64_gives_the_arm64_onnxruntimes_bits(runner, reference_runner, tmp_path, name, flags,
                                                                  batches):
    original = MODELS / f"{name}.onnx"
    fused = tmp_path / f"{Path(name).name}.fused.onnx"
    report = tmp_path / "report.json"
    result = optimize_cli(original, fused, *flags, "--cache-dir", str(tmp_path / "cache"), "--report", str(report))
    assert result.returncode == 0, result.stderr
    library = fused.with_suffix(".so")
    summary = json.loads(report.read_text())
    not_selected = [g for g in summary["groups"] if g.get("status") == "fallback" and g.get("reason", "").startswith("auto:")]
    assert summary["groups_fallback"] == len(not_selected), [g.get("reason") for g in summary["groups"]]
    assert summary["library"] and Path(summary["library"]).name == library.name
    assert any(n.domain == DOMAIN for n in onnx.load(str(fused)).graph.node)

    # The library is an aarch64 shared object that needs no TVM library.
    described = subprocess.run(["file", "-L", str(library)], capture_output=True, text=True, check=True).stdout
    assert "ARM aarch64" in described, described
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    needed = [line for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed and not any("tvm" in line.lower() for line in needed), needed

    reference = ort.InferenceSession(str(original), quiet_session_options(), providers=["CPUExecutionProvider"])
    output_names = [o.name for o in reference.get_outputs()]
    for seed, batch in enumerate(batches):
        feeds = random_feeds_for_session(reference, default_dim=batch, seed=seed)
        expected = reference_runner.run(original, feeds, output_names)
        actual = runner.run(fused, feeds, output_names, library=library)
        _assert_same_bits(expected, actual, output_names, f"{name} batch {batch}")


# The ONNX LSTM and GRU ops are sequence kernels of their own (codegen/recurrent.py), written for
# NEON's 4 lanes here, with onnxruntime's C++ gate math contracted as GCC builds it for aarch64
# (recurrent_op.cpp_multiply_add): the arm64 onnxruntime's bits, which differ from its x86 build's.
RECURRENT_CASES = {"lstm": dict(op="LSTM", direction="bidirectional", states=True, peepholes=True),
                   "gru": dict(op="GRU", linear_before_reset=1, seq_lens=True)}


@needs_harness
@pytest.mark.parametrize("case", sorted(RECURRENT_CASES))
def test_recurrent_op_on_aarch64_gives_the_arm64_onnxruntimes_bits(runner, reference_runner, tmp_path, case):
    from test_recurrent_ops import feeds_for, recurrent_model

    model = recurrent_model(**RECURRENT_CASES[case], steps=5)
    original, fused = tmp_path / f"{case}.onnx", tmp_path / f"{case}.fused.onnx"
    onnx.save(model, original)
    result = optimize_cli(original, fused, "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    assert any(n.domain == DOMAIN for n in onnx.load(str(fused)).graph.node)
    reference = ort.InferenceSession(str(original), quiet_session_options(), providers=["CPUExecutionProvider"])
    output_names = [o.name for o in reference.get_outputs()]
    for seed, batch in enumerate((1, 6)):
        feeds = feeds_for(model, 5, batch, seed)
        expected = reference_runner.run(original, feeds, output_names)
        actual = runner.run(fused, feeds, output_names, library=fused.with_suffix(".so"))
        _assert_same_bits(expected, actual, output_names, f"{case} batch {batch}")


# ---- onnxruntime's orders on aarch64 ---------------------------------------------------------
def _orders_model() -> onnx.ModelProto:
    """One model holding each op whose sums onnxruntime orders differently on aarch64
    (codegen/sum_orders.NEON), each then a Neg so that it is a group: Softmax rows of 3, 13 and
    333 (NEON's lane pairs); LayerNormalization rows of 5, 64 and 333 (Welford's update with
    fused multiply-adds); ReduceSum over a middle axis (in order) and over the last (Eigen's lanes);
    GlobalAveragePool over 24 and 32 channels (its lanes: no NCHWc layout there); a MatMul and a
    Gemm by run-time weights (one fused chain at one row); two
    Convs, of 27 products (one chain in im2col order) and of 180 (two blocks and the bias), and
    one of 288 over 25 pixels (one chain: MLAS's K stride grows for few pixels), and a 32 x 32
    image (conv_schedule.is_conv_stage: its padding inlined, the kernel read outside the image); a
    residual and bias Add before a LayerNormalization (onnxruntime's SkipLayerNormalization); a
    Reciprocal of 13 floats a row (NEON's estimate in packets of 4, a division past them); a Conv
    with a bias read only by a residual Add (onnxruntime's Conv with a sum input: conv_sum_input)."""
    rng = np.random.default_rng(5)
    nodes, inputs, outputs, inits = [], {}, {}, {}

    def case(name, op, shape, out_shape, extra=(), **attrs):
        inputs[name] = shape
        nodes.extend([node(op, [name, *extra], f"{name}_op", **attrs), node("Neg", [f"{name}_op"], f"{name}_out")])
        outputs[f"{name}_out"] = out_shape

    for n in (3, 13, 333):
        case(f"softmax{n}", "Softmax", ("N", n), ("N", n), axis=-1)
    for n in (5, 64, 333):
        inits[f"g{n}"], inits[f"b{n}"] = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        case(f"ln{n}", "LayerNormalization", ("N", n), ("N", n), (f"g{n}", f"b{n}"), axis=-1, epsilon=1e-5)
    inits["axis1"] = np.array([1], np.int64)
    case("middle", "ReduceSum", ("N", 13, 5), ("N", 5), ("axis1",), keepdims=0)
    case("last", "ReduceSum", ("N", 37), ("N",), ("axis1",), keepdims=0)
    case("pool", "GlobalAveragePool", ("N", 24, 7, 9), ("N", 24, 1, 1))
    case("pool32", "GlobalAveragePool", ("N", 32, 3, 3), ("N", 32, 1, 1))  # no NCHWc on aarch64: its lanes
    inputs["v"], inputs["w"], inputs["c"] = (13, 40), (64, 6), (6,)
    case("matmul", "MatMul", ("N", 13), ("N", 40), ("v",))
    case("gemm", "Gemm", ("N", 64), ("N", 6), ("w", "c"))
    inits["k3"], inits["k20"], inits["bias20"] = (rng.standard_normal(shape).astype(np.float32)
                                                  for shape in ((16, 3, 3, 3), (8, 20, 3, 3), (8,)))
    case("conv3", "Conv", ("N", 3, 10, 11), ("N", 16, 10, 11), ("k3",), pads=[1, 1, 1, 1])
    case("conv20", "Conv", ("N", 20, 10, 11), ("N", 8, 10, 11), ("k20", "bias20"), pads=[1, 1, 1, 1])
    inits["k32"] = rng.standard_normal((8, 32, 3, 3)).astype(np.float32)
    case("conv32", "Conv", ("N", 32, 5, 5), ("N", 8, 5, 5), ("k32",), pads=[1, 1, 1, 1])
    # a bias Add, a residual Add and a LayerNormalization, whose output a MatMul reads, as BERT's
    # exports write them: onnxruntime's SkipLayerNormalization (the MatMul stays onnxruntime's)
    inputs["residual"], inputs["skip"] = ("N", 4, 64), ("N", 4, 64)
    inits["bias64"], inits["w64"] = rng.standard_normal(64).astype(np.float32), rng.standard_normal((64, 8)).astype(np.float32)
    nodes.extend([node("Add", ["residual", "bias64"], "residual_biased"),
                  node("Add", ["residual_biased", "skip"], "residual_sum"),
                  node("LayerNormalization", ["residual_sum", "g64", "b64"], "residual_norm", axis=-1, epsilon=1e-5),
                  node("MatMul", ["residual_norm", "w64"], "residual_out")])
    outputs["residual_out"] = ("N", 4, 8)
    inits["k16"] = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    case("conv16", "Conv", ("N", 16, 32, 32), ("N", 16, 32, 32), ("k16",), pads=[1, 1, 1, 1])
    case("reciprocal", "Reciprocal", ("N", 13), ("N", 13))
    # a Conv of one K block (72 products) with a bias, whose output only a residual Add reads
    inits["k8"], inits["bias8"] = rng.standard_normal((8, 8, 3, 3)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    inputs["sum_x"], inputs["sum_z"] = ("N", 8, 6, 7), ("N", 8, 6, 7)
    nodes.extend([node("Conv", ["sum_x", "k8", "bias8"], "sum_conv", pads=[1, 1, 1, 1]),
                  node("Add", ["sum_z", "sum_conv"], "sum_added"), node("Neg", ["sum_added"], "sum_out")])
    outputs["sum_out"] = ("N", 8, 6, 7)
    return model(nodes, inputs, outputs, inits, opset=17)


@needs_harness
def test_fused_ops_give_the_arm64_onnxruntimes_bits(runner, reference_runner, tmp_path):
    """Each op of _orders_model, fused and run by the arm64 onnxruntime on an emulated
    Neoverse-N1, gives the bits that onnxruntime gives there for the original (before
    sum_orders.NEON each differed there, measured one op at a time: in 14% to 100% of its values)."""
    original, fused = tmp_path / "orders.onnx", tmp_path / "orders.fused.onnx"
    onnx.save(_orders_model(), original)
    result = optimize_cli(original, fused, "--select", "all", "--cache-dir", str(tmp_path / "cache"),
                          "--report", str(tmp_path / "report.json"))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["groups_fallback"] == 0 and len(summary["groups"]) == 19, summary["groups"]
    reference = ort.InferenceSession(str(original), quiet_session_options(), providers=["CPUExecutionProvider"])
    output_names = [o.name for o in reference.get_outputs()]
    for seed, batch in enumerate((1, 3)):
        feeds = random_feeds_for_session(reference, default_dim=batch, seed=seed)
        expected = reference_runner.run(original, feeds, output_names)
        actual = runner.run(fused, feeds, output_names, library=fused.with_suffix(".so"))
        _assert_same_bits(expected, actual, output_names, f"batch {batch}")
