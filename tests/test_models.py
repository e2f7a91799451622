"""Tests of the bundled models and of their generator, models/make_models.py.

The generator lives outside the package (it is a script next to the files it writes), so it
is imported here by path rather than through a global conftest.
"""

import filecmp
import importlib.util
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(REPO, "models")


def _load_generator():
    """Import models/make_models.py by path (registered in sys.modules: its dataclasses need it)."""
    name = "make_models"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(MODELS_DIR, "make_models.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


mm = _load_generator()
BUNDLED = sorted(mm.bundled_models())
MAX_FILE_BYTES = 300 * 1024


def _session(model_or_path):
    if isinstance(model_or_path, onnx.ModelProto):
        model_or_path = model_or_path.SerializeToString()
    return ort.InferenceSession(model_or_path, providers=["CPUExecutionProvider"])


def _dims(value_info, batch):
    """Declared shape with the symbolic batch dim replaced by `batch`."""
    dims = value_info.type.tensor_type.shape.dim
    return tuple(batch if d.dim_param == mm.BATCH else d.dim_value for d in dims)


def _random_feeds(model, batch, rng):
    feeds = {}
    for value in model.graph.input:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        feeds[value.name] = rng.standard_normal(_dims(value, batch)).astype(np.float32)
    return feeds


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# --- every bundled file ------------------------------------------------------------------


@pytest.mark.parametrize("file_name", BUNDLED)
def test_bundled_file_is_small_and_valid(file_name):
    path = os.path.join(MODELS_DIR, file_name)
    assert os.path.getsize(path) < MAX_FILE_BYTES
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version in (8, 9)
    assert {o.domain: o.version for o in model.opset_import}[""] == 17
    for value in list(model.graph.input) + list(model.graph.output):
        assert value.type.tensor_type.elem_type != onnx.TensorProto.UNDEFINED
        assert value.type.tensor_type.HasField("shape")
    for value in model.graph.input:
        assert value.type.tensor_type.shape.dim[0].dim_param == mm.BATCH


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("file_name", BUNDLED)
def test_bundled_file_runs_with_declared_output_shapes(file_name, batch):
    path = os.path.join(MODELS_DIR, file_name)
    model = onnx.load(path)
    feeds = _random_feeds(model, batch, np.random.default_rng(batch))
    results = _session(path).run(None, feeds)
    for declared, result in zip(model.graph.output, results):
        assert result.shape == _dims(declared, batch), declared.name
        if np.issubdtype(result.dtype, np.floating):
            assert np.isfinite(result).all(), declared.name


def test_regenerating_gives_byte_identical_files(tmp_path):
    mm.write_models(str(tmp_path))
    for file_name in BUNDLED:
        assert filecmp.cmp(os.path.join(MODELS_DIR, file_name), tmp_path / file_name, shallow=False), file_name


# --- recurrent cells against numpy -------------------------------------------------------


def _lstm_reference(p, x, h, c):
    gi, gf, gg, go = np.split(x @ p["W"] + h @ p["R"] + p["b"], 4, axis=1)
    c_new = _sigmoid(gf) * c + _sigmoid(gi) * np.tanh(gg)
    return _sigmoid(go) * np.tanh(c_new), c_new


def _gru_reference(p, x, h):
    xz, xr, xn = np.split(x @ p["W"] + p["bw"], 3, axis=1)
    hz, hr, hn = np.split(h @ p["R"] + p["br"], 3, axis=1)
    z, r = _sigmoid(xz + hz), _sigmoid(xr + hr)
    n = np.tanh(xn + r * hn)
    return (1 - z) * n + z * h


def test_lstm_gate_matches_numpy():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = np.random.default_rng(0)  # same seed as lstm_gate_model's default
    weights = mm._weights(w, [64, 192], 64)
    a, b, c = np.split(x @ weights, 3, axis=1)
    expected = _sigmoid(a) * np.tanh(b) + np.exp(c)
    (got,) = _session(os.path.join(MODELS_DIR, "lstm_gate.onnx")).run(None, {"X": x})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_lstm_cell_matches_numpy():
    rng = np.random.default_rng(11)
    x, h, c = (rng.standard_normal((5, 64)).astype(np.float32) for _ in range(3))
    params = mm.lstm_cell_params(64, 64, seed=1)
    h_out, c_out = _session(os.path.join(MODELS_DIR, "lstm_cell.onnx")).run(None, {"X": x, "H": h, "C": c})
    h_ref, c_ref = _lstm_reference(params, x, h, c)
    np.testing.assert_allclose(h_out, h_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c_out, c_ref, rtol=1e-4, atol=1e-5)


def test_gru_cell_matches_numpy():
    rng = np.random.default_rng(12)
    x, h = (rng.standard_normal((5, 64)).astype(np.float32) for _ in range(2))
    params = mm.gru_cell_params(64, 64, seed=2)
    (h_out,) = _session(os.path.join(MODELS_DIR, "gru_cell.onnx")).run(None, {"X": x, "H": h})
    np.testing.assert_allclose(h_out, _gru_reference(params, x, h), rtol=1e-4, atol=1e-5)


# --- tree ensembles ----------------------------------------------------------------------

TREE_BUILDERS = [mm.tree_trav_model, mm.perf_tree_trav_model, mm.tree_ensemble_model]


def _forest_inputs(forest, rows=64, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, forest.n_features)).astype(np.float32)


def _numpy_walk_single_tree(forest, tree, sample):
    """Deliberately naive walk (one sample, one tree) to check the vectorised reference."""
    node = 0
    for _ in range(forest.depth):
        node = 2 * node + 1 if sample[forest.features[tree, node]] <= forest.thresholds[tree, node] else 2 * node + 2
    return forest.leaf_values[tree, node - (2 ** forest.depth - 1)]


def test_forest_reference_matches_naive_walk():
    forest = mm.make_forest(4, 5, 6, n_classes=3, seed=1)
    x = _forest_inputs(forest, rows=10)
    expected = np.array([np.mean([_numpy_walk_single_tree(forest, t, s) for t in range(forest.n_trees)], axis=0)
                         for s in x])
    np.testing.assert_allclose(mm.forest_predict_proba(forest, x), expected, rtol=1e-6, atol=1e-7)


def test_make_forest_is_deterministic_and_shaped():
    a, b = mm.make_forest(3, 4, 28, seed=5), mm.make_forest(3, 4, 28, seed=5)
    assert (a.features == b.features).all() and (a.thresholds == b.thresholds).all()
    assert a.features.shape == (3, 15) and a.leaf_values.shape == (3, 16, 2)
    assert (a.n_trees, a.depth, a.n_features, a.n_classes) == (3, 4, 28, 2)
    np.testing.assert_allclose(a.leaf_values.sum(axis=2), 1.0, rtol=1e-6)


@pytest.mark.parametrize("builder", TREE_BUILDERS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("depth", [3, 8])
def test_tree_programs_match_numpy_traversal(builder, depth):
    forest = mm.make_forest(10, depth, 28, n_classes=2, seed=depth)
    x = _forest_inputs(forest)
    label, proba = _session(builder(forest)).run(None, {"X": x})
    expected = mm.forest_predict_proba(forest, x)
    np.testing.assert_allclose(proba, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(label, expected.argmax(axis=1))


@pytest.mark.parametrize("builder", TREE_BUILDERS, ids=lambda b: b.__name__)
def test_tree_programs_multiclass(builder):
    forest = mm.make_forest(5, 4, 12, n_classes=4, seed=3)
    x = _forest_inputs(forest, rows=32)
    label, proba = _session(builder(forest)).run(None, {"X": x})
    expected = mm.forest_predict_proba(forest, x)
    np.testing.assert_allclose(proba, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(label, expected.argmax(axis=1))


@pytest.mark.parametrize("depth", [1, 5, 32])
def test_spine_tree_program_matches_numpy_traversal(depth):
    forest = mm.make_spine_forest(7, depth, 28, n_classes=3, seed=depth)
    assert forest.features.shape == (7, 2 * depth + 1)
    x = _forest_inputs(forest)
    model = mm.spine_tree_trav_model(forest)
    assert sum(n.op_type == "GatherElements" for n in model.graph.node) == depth  # one per level
    label, proba = _session(model).run(None, {"X": x})
    expected = mm.spine_forest_predict_proba(forest, x)
    np.testing.assert_allclose(proba, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(label, expected.argmax(axis=1))


@pytest.mark.parametrize("depth", [3, 8])
def test_bundled_tree_files_agree_with_their_forest(depth):
    forest = mm.bundled_forest(depth)
    x = _forest_inputs(forest, rows=33, seed=depth)
    expected = mm.forest_predict_proba(forest, x)
    names = [f"tree_trav_d{depth}.onnx", f"perf_tree_trav_d{depth}.onnx"]
    names += ["tree_ensemble_d8.onnx"] if depth == 8 else []
    for name in names:
        _, proba = _session(os.path.join(MODELS_DIR, name)).run(None, {"X": x})
        np.testing.assert_allclose(proba, expected, rtol=1e-5, atol=1e-6, err_msg=name)


def _count(model, op_type):
    return sum(node.op_type == op_type for node in model.graph.node)


@pytest.mark.parametrize("depth", [3, 8])
def test_traversal_op_counts_per_level(depth):
    """The graph shapes the fuser is measured on: 14 ops per level (tree_trav), 9 (perf)."""
    forest = mm.make_forest(2, depth, 4, seed=0)
    trav, perf = mm.tree_trav_model(forest), mm.perf_tree_trav_model(forest)
    # tree_trav: 4 setup ops + 1 Reshape, 14 per level, leaf Gather + Reshape + ReduceMean + ArgMax.
    assert len(trav.graph.node) == 5 + 14 * depth + 4
    assert _count(trav, "Gather") == 4 * depth + 1
    assert _count(trav, "GatherElements") == _count(trav, "Where") == depth
    # perf_tree_trav: 5-op root level, 9 per further level, same 4-op head.
    assert len(perf.graph.node) == 5 + 9 * (depth - 1) + 4
    assert _count(perf, "GatherElements") == depth - 1


def test_benchmark_forest_builds_and_matches():
    forest = mm.benchmark_forest()
    assert (forest.n_trees, forest.depth, forest.n_features) == (100, 8, 28)
    x = _forest_inputs(forest, rows=16)
    expected = mm.forest_predict_proba(forest, x)
    for builder in TREE_BUILDERS:
        _, proba = _session(builder(forest)).run(None, {"X": x})
        np.testing.assert_allclose(proba, expected, rtol=1e-5, atol=1e-6, err_msg=builder.__name__)
