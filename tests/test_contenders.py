"""IREE and OpenVINO as bench contenders (measure/peers.py): their outputs against onnxruntime on
the original model, and why a peer that cannot take a model is not timed.

The peers come with the optional `bench` extra, which CI does not install: the tests that run them
skip where it is missing. No assertion here depends on how fast anything runs.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import MODELS
from onnx_builder import model, node
from onnxfuse_cli.main import main

from onnxfuse.measure import peers
from onnxfuse.measure.contenders import BASELINE, ort_contender
from onnxfuse.measure.inputs import index_limits, load_model_skeleton, make_feeds, model_inputs
from onnxfuse.measure.peers import IREE, OPENVINO, PeerBuildError, static_model
from onnxfuse.measure.timing import Timing, check_outputs, race

needs_iree = pytest.mark.skipif(peers.not_installed(IREE) is not None, reason="the bench extra (IREE) is not installed")
needs_openvino = pytest.mark.skipif(peers.not_installed(OPENVINO) is not None,
                                    reason="the bench extra (OpenVINO) is not installed")
# A float cell (two outputs) and a tree program (an int64 label from ArgMax, Gather indices).
BUNDLED = [("lstm_cell", 3), ("tree_trav_d3", 5)]


def feeds_and_reference(name: str, batch: int):
    path = MODELS / f"{name}.onnx"
    feeds = make_feeds(model_inputs(path), batch, None, None, 0, index_limits(load_model_skeleton(path)))
    baseline = ort_contender(BASELINE, path, feeds, threads=1)
    return path, feeds, baseline, baseline.outputs(baseline.call())


def shapes(feeds):
    return {name: list(array.shape) for name, array in feeds.items()}


def unknown_op_model(path) -> str:
    """A model no peer knows: one node of a custom domain (as onnxfuse's own output has)."""
    onnx.save_model(model([node("Mystery", ["x"], "y", domain="example.custom")], {"x": ("N", 4)}, {"y": ("N", 4)}),
                    str(path))
    return str(path)


def test_static_model_binds_the_batch_in_inputs_and_outputs():
    bound = static_model(MODELS / "lstm_cell.onnx", {"X": [5, 64], "H": [5, 64], "C": [5, 64]})
    dims = lambda values: [[d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]
                           for v in values]  # noqa: E731
    assert dims(bound.graph.input) == [[5, 64]] * 3
    assert dims(bound.graph.output) == [[5, 64]] * 2


def test_a_missing_package_is_named_with_the_extra_that_brings_it(monkeypatch):
    monkeypatch.setitem(peers._MODULES, IREE, ("no_such_package_here.runtime",))
    reason = peers.not_installed(IREE)
    assert reason is not None and "no_such_package_here" in reason and "onnxfuse[bench]" in reason


def test_cli_refuses_an_unknown_peer(tmp_path):
    path = unknown_op_model(tmp_path / "m.onnx")
    result = CliRunner().invoke(main, ["bench", path, "--fused", path, "--no-tvm", "--peers", "iree,tflite"])
    assert result.exit_code != 0 and "unknown tflite" in result.output


@needs_iree
@pytest.mark.parametrize("name, batch", BUNDLED)
def test_iree_matches_onnxruntime_on_a_bundled_model(tmp_path, name, batch):
    path, feeds, baseline, reference = feeds_and_reference(name, batch)
    module = tmp_path / f"{name}.vmfb"
    peers.build_iree(path, shapes(feeds), module)
    contender = peers.iree_contender(module, path, feeds, threads=1)
    for _ in range(2):  # the inputs stay in their device buffers from call to call
        outputs = contender.outputs(contender.call())
        assert sorted(outputs) == sorted(reference)
        assert check_outputs(reference, outputs) is None
    timings = race([baseline, contender], reference, rounds=2, round_seconds=0.0)
    assert isinstance(timings[IREE], Timing)


@needs_openvino
@pytest.mark.parametrize("name, batch", BUNDLED)
def test_openvino_matches_onnxruntime_on_a_bundled_model(name, batch):
    path, feeds, baseline, reference = feeds_and_reference(name, batch)
    contender = peers.openvino_contender(path, feeds, threads=1)
    for _ in range(2):  # one InferRequest, reused
        outputs = contender.outputs(contender.call())
        assert sorted(outputs) == sorted(reference)
        assert check_outputs(reference, outputs) is None
    timings = race([baseline, contender], reference, rounds=2, round_seconds=0.0)
    assert isinstance(timings[OPENVINO], Timing)


@needs_iree
def test_iree_says_why_it_cannot_import_a_model(tmp_path):
    path = unknown_op_model(tmp_path / "m.onnx")
    with pytest.raises(PeerBuildError, match="iree-"):
        peers.build_iree(path, {"x": [2, 4]}, tmp_path / "m.vmfb")


@needs_openvino
def test_openvino_says_why_it_cannot_compile_a_model(tmp_path):
    path = unknown_op_model(tmp_path / "m.onnx")
    with pytest.raises(PeerBuildError, match="OpenVINO cannot compile it"):
        peers.openvino_contender(path, {"x": np.zeros((2, 4), np.float32)}, threads=1)


@needs_iree
@needs_openvino
def test_bench_times_both_peers_or_says_why_not(tmp_path):
    """A one-op model both peers compile: each gets a timed cell. The bundled forest as one ONNX-ML
    TreeEnsembleClassifier, which onnxruntime runs and neither peer knows: bench still times
    onnxruntime, each peer's cell says why it was not timed, and the exit code is 1."""
    relu = tmp_path / "relu.onnx"
    onnx.save_model(model([node("Relu", ["x"], "y")], {"x": ("N", 4)}, {"y": ("N", 4)}), str(relu))
    ensemble = str(MODELS / "tree_ensemble_d8.onnx")
    out = tmp_path / "r.json"
    runs = {}
    for name, path in (("relu", str(relu)), ("ensemble", ensemble)):
        result = CliRunner().invoke(main, ["bench", path, "--fused", path, "--batch", "2", "--no-tvm",
                                           "--rounds", "2", "--peers", "all", "--json", str(out)])
        runs[name] = result.exit_code, json.loads(out.read_text())["models"][0]["runs"][0]["contenders"]

    exit_code, cells = runs["relu"]
    assert exit_code == 0
    assert cells[IREE]["median_ms"] > 0 and cells[OPENVINO]["median_ms"] > 0
    exit_code, cells = runs["ensemble"]
    assert exit_code == 1 and cells[BASELINE]["median_ms"] > 0
    iree, openvino = cells[IREE]["na"], cells[OPENVINO]["na"]
    assert iree.startswith("IREE build failed: iree-compile failed") and "TreeEnsembleClassifier" in iree
    assert openvino.startswith("OpenVINO cannot compile it") and "TreeEnsembleClassifier" in openvino
