"""The corpus of real exporter outputs in models/exported/ (made by make_corpus.py, which is
not run here: it needs the exporters' own virtualenvs). Checks only the committed files, with
onnx, onnxruntime and numpy: each manifest entry's model exists, is valid ONNX, runs on its
recorded input batch with finite outputs of the recorded shapes, matches its recorded
outputs, and the manifest says which exporter versions made it."""

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "models", "exported")
with open(os.path.join(CORPUS, "manifest.json")) as _f:
    MANIFEST = json.load(_f)
ENTRIES = MANIFEST["models"]
OK = sorted(k for k, v in ENTRIES.items() if v["status"] == "ok")
FAILED = sorted(k for k, v in ENTRIES.items() if v["status"] != "ok")
MAX_FILE_BYTES = 4 * 1024 * 1024  # bert_tiny_24l_ts, the view tests' 800+-node plan, is 3.7 MiB
MAX_TOTAL_BYTES = 42 * 1024 * 1024  # 40.2 MiB with the transformer layers (2026-11-28)


def _matches(declared, actual, feeds_dims):
    """A declared output shape (ints, names, None) against the shape onnxruntime gave."""
    if declared is None:
        return True
    if len(declared) != len(actual):
        return False
    for d, a in zip(declared, actual):
        if isinstance(d, int) and d != a:
            return False
        if isinstance(d, str) and d in feeds_dims and feeds_dims[d] != a:
            return False
    return True


def test_manifest_lists_both_torch_exporters_the_tree_exporters_and_tf2onnx():
    exporters = {v["exporter"].split("(")[0] for v in ENTRIES.values()}
    assert {"torch.onnx.export", "hummingbird.ml.convert", "skl2onnx.to_onnx", "tf2onnx.convert.from_keras"} <= exporters
    assert any(v.get("options", {}).get("dynamo") is True for v in ENTRIES.values())
    assert any(v.get("options", {}).get("dynamo") is False for v in ENTRIES.values())
    assert len(OK) >= 30


def test_committed_files_are_small():
    total = 0
    for name in OK:
        size = os.path.getsize(os.path.join(CORPUS, ENTRIES[name]["file"]))
        assert size < MAX_FILE_BYTES, name
        total += size
    assert total < MAX_TOTAL_BYTES


def test_failed_exports_record_the_error():
    for name in FAILED:
        entry = ENTRIES[name]
        assert entry["error"].strip(), name
        assert entry["versions"], name
        assert not os.path.exists(os.path.join(CORPUS, f"{name}.onnx")), name


@pytest.mark.parametrize("name", OK)
def test_exported_model_runs_on_its_inputs(name):
    entry = ENTRIES[name]
    versions = entry["versions"]
    exporter = entry["exporter"]
    if exporter.startswith("torch.onnx"):
        assert versions["torch"]
        if entry["options"]["dynamo"]:
            assert versions["onnxscript"]
    elif exporter.startswith("hummingbird"):
        assert versions["hummingbird-ml"] and versions["torch"] and versions["scikit-learn"]
    elif exporter.startswith("tf2onnx"):
        assert versions["tf2onnx"] and versions["tensorflow"] and versions["keras"]
    else:
        assert versions["skl2onnx"] and versions["scikit-learn"]
    assert all(isinstance(v, str) and v for v in versions.values()), versions

    path = os.path.join(CORPUS, entry["file"])
    model = onnx.load(path)
    onnx.checker.check_model(model)
    assert len(model.graph.node) == entry["node_count"]
    assert {(o.domain or "ai.onnx"): o.version for o in model.opset_import} == entry["opset"]

    with np.load(os.path.join(CORPUS, entry["inputs_file"])) as npz:
        feeds = {k: npz[k] for k in npz.files}
    declared_inputs = {v["name"]: v for v in entry["inputs"]}
    assert set(feeds) == set(declared_inputs)
    dims = {}
    for k, v in feeds.items():
        decl = declared_inputs[k]
        assert str(v.dtype) == decl["dtype"], k
        assert len(v.shape) == len(decl["shape"]), k
        for d, a in zip(decl["shape"], v.shape):
            if isinstance(d, int):
                assert d == a, (k, decl["shape"], v.shape)
            else:
                assert dims.setdefault(d, a) == a, (k, d)
    for d in entry["symbolic_dims"]:
        assert d in dims

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    declared_outputs = {v["name"]: v for v in entry["outputs"]}
    with np.load(os.path.join(CORPUS, entry["expected_file"])) as npz:
        expected = {k: npz[k] for k in npz.files}
    assert set(names) == set(expected) == set(declared_outputs)
    for out_name, got in zip(names, outs):
        got = np.asarray(got)
        assert list(got.shape) == entry["output_shapes_on_feeds"][out_name]
        assert _matches(declared_outputs[out_name]["shape"], got.shape, dims), out_name
        want = expected[out_name]
        assert got.dtype == want.dtype, out_name
        if got.dtype.kind == "f":
            assert np.all(np.isfinite(got)), out_name
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=out_name)
        else:
            assert np.mean(got == want) >= 0.99, out_name
