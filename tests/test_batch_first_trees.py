"""Front end: Hummingbird's GEMM strategy for trees (three batch-last products) becomes per-tree
products batch first (frontend/batch_first_trees.py); the pipeline keeps that form only when its
products all become kernels, and otherwise optimizes the original (fusion/tree_rewrite.py); the
plan `inspect` shows follows the same rule.

Checked against onnxruntime running the original: the rewritten model alone, on a small forest
written as Hummingbird writes it and on Hummingbird's own exports in models/exported/, and the
optimized output end to end, bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from frontend_helpers import as_exported
from onnx_builder import const_i64, model, node
from test_ieee_order import assert_bitwise_equal, original_session

from onnxfuse import InferenceSession, optimize, plan
from onnxfuse.frontend.batch_first_trees import NODE_PREFIX, trees_per_pack
from onnxfuse.frontend.canonicalize import canonicalize
from onnxfuse.frontend.loader import load_model

CORPUS = Path(__file__).resolve().parent.parent / "models" / "exported"
FEATURES, TREES, DEPTH = 5, 3, 4
PACKED = dict(depth=3, trees=5, feature_count=28)  # two trees a pack, the last pack half empty


def tree_paths(depth: int) -> tuple[np.ndarray, np.ndarray]:
    """A complete tree of `depth` as Hummingbird encodes it: internal nodes numbered level by
    level, leaves left to right; a leaf's row holds +1 at each node where its path turns left
    (the decision holds), -1 where it turns right, and it is reached when the sum over the
    decisions equals its count of left turns (the second array)."""
    leaves, internal = 2**depth, 2**depth - 1
    paths = np.zeros((leaves, internal), np.float32)
    for leaf in range(leaves):
        for level in range(depth):
            turn = (leaf >> (depth - 1 - level)) & 1
            paths[leaf, 2**level - 1 + (leaf >> (depth - level))] = -1 if turn else 1
    return paths, (paths == 1).sum(axis=1).astype(np.float32)


def forest(batch_in_reshape: int = -1, alpha: float = 1.0, second_reader: bool = False,
           compare: str = "LessOrEqual", depth: int = DEPTH, trees: int = TREES,
           feature_count: int = FEATURES, classes: int = 1) -> onnx.ModelProto:
    """`trees` trees of `depth` over `feature_count` features, the sums over trees [N, classes] of
    the leaves' values (one a class), in the nodes and layout Hummingbird's `gemm` strategy writes."""
    rng = np.random.default_rng(0)
    paths, left_turns = tree_paths(depth)  # at DEPTH 4: 15 internal nodes, 16 leaves
    internal, leaves = paths.shape[1], paths.shape[0]
    selector = np.zeros((trees * internal, feature_count), np.float32)
    selector[np.arange(trees * internal), rng.integers(0, feature_count, trees * internal)] = 1
    inits = {
        "w1": selector, "b1": rng.standard_normal((trees * internal, 1)).astype(np.float32),
        "w2": np.stack([paths] * trees), "b2": np.tile(left_turns, trees).reshape(-1, 1),
        "w3": rng.standard_normal((trees, classes, leaves)).astype(np.float32),
        "split": const_i64(trees, internal, batch_in_reshape), "flat": const_i64(trees * leaves, -1),
        "unflat": const_i64(trees, leaves, -1), "trees": const_i64(0),
    }
    nodes = [node("Gemm", ["w1", "x"], "g", alpha=alpha, transB=1), node(compare, ["g", "b1"], "d"),
             node("Reshape", ["d", "split"], "ds"), node("Cast", ["ds"], "df", to=onnx.TensorProto.FLOAT),
             node("MatMul", ["w2", "df"], "counts"), node("Reshape", ["counts", "flat"], "cf"),
             node("Equal", ["b2", "cf"], "hit"), node("Reshape", ["hit", "unflat"], "hs"),
             node("Cast", ["hs"], "onehot", to=onnx.TensorProto.FLOAT), node("MatMul", ["w3", "onehot"], "values"),
             node("ReduceSum", ["values", "trees"], "sums", keepdims=0), node("Transpose", ["sums"], "y", perm=[1, 0])]
    outputs = {"y": ("N", classes)}
    if second_reader:
        nodes.append(node("Not", ["d"], "z"))
        outputs["z"] = [trees * internal, "N"]
    return model(nodes, {"x": ("N", feature_count)}, outputs, inits, opset=13)


def rewritten(m: onnx.ModelProto) -> bool:
    return any(n.name.startswith(NODE_PREFIX) for n in load_model(m).nodes)


def features(batch: int, seed: int = 1, count: int = FEATURES) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, count)).astype(np.float32)


def test_the_forest_is_computed_per_tree_batch_first_with_the_originals_bits():
    for m in (forest(), as_exported(forest()), forest(compare="Less")):
        types = [n.op_type for n in load_model(m).nodes]
        assert "Gemm" not in types and types.count("MatMul") == 2 and "Transpose" in types
        canonical = ort.InferenceSession(canonicalize(m).SerializeToString(), providers=["CPUExecutionProvider"])
        original = original_session(m)
        for batch in (1, 7, 64):
            x = features(batch)
            assert_bitwise_equal(canonical.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


@pytest.mark.parametrize("case", [dict(batch_in_reshape=8), dict(alpha=2.0), dict(second_reader=True),
                                  dict(classes=2)])
def test_other_chains_stay_batch_last(case):
    """A Reshape with the batch baked in, a scaled Gemm, a decision read elsewhere, and leaves with
    a value per class (a random forest's: _one_value_a_leaf)."""
    assert not rewritten(forest(**case))


def test_the_pass_can_be_turned_off():
    assert not any(n.name.startswith(NODE_PREFIX) for n in load_model(forest(), batch_first_trees=False).nodes)


@pytest.mark.parametrize("name", ["hb_gbdt_gemm", "hb_lgbm_gemm", "hb_xgb_gemm", "hb_gbdt_defaults", "hb_gbr_defaults"])
def test_hummingbird_exports_rewritten_keep_onnxruntimes_bits(name):
    """Under plain onnxruntime, on the export's recorded inputs (batch 64: some of these exports
    bake that batch into a later node, so onnxruntime runs them at no other)."""
    m = onnx.load(str(CORPUS / f"{name}.onnx"))
    assert rewritten(m)
    feeds = dict(np.load(CORPUS / f"{name}.inputs.npz"))
    canonical = ort.InferenceSession(canonicalize(m).SerializeToString(), providers=["CPUExecutionProvider"])
    for got, expected in zip(canonical.run(None, feeds), original_session(m).run(None, feeds)):
        assert_bitwise_equal(got, expected)


def test_random_forest_classifiers_stay_batch_last():
    """hb_rf_gemm's trees (146 internal nodes, 147 leaves) pad past MAX_PADDED_COLUMNS; hb_rf_d3's
    (depth 3) would pack, but their leaves hold a value per class (_one_value_a_leaf)."""
    for name in ("hb_rf_gemm", "hb_rf_d3"):
        assert not rewritten(onnx.load(str(CORPUS / f"{name}.onnx"))), name


def test_shallow_trees_share_their_products_two_by_two():
    """Depth-3 trees (7 internal nodes, 8 leaves) padded to 16 columns each would do 4.6 times
    the work; two trees side by side fill the 16 columns (trees_per_pack). Five trees make three
    packs, the last with an empty place that the rewrite slices off."""
    assert trees_per_pack(100, 28, 7, 8) == 2 and trees_per_pack(50, 28, 15, 16) == 1
    m = forest(**PACKED)
    types = [n.op_type for n in load_model(m).nodes]
    assert "Gemm" not in types and "Slice" in types
    canonical = ort.InferenceSession(canonicalize(m).SerializeToString(), providers=["CPUExecutionProvider"])
    original = original_session(m)
    for batch in (1, 7, 64):
        x = features(batch, count=28)
        assert_bitwise_equal(canonical.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


def test_trees_too_small_for_any_packing_stay_batch_last():
    """Depth-2 trees over 5 features: even packed, the padded products are over twice the work."""
    assert trees_per_pack(TREES, FEATURES, 3, 4) is None
    assert not rewritten(forest(depth=2))


@pytest.mark.parametrize("shape", [{}, PACKED])
def test_optimized_forest_runs_its_products_in_kernels_with_the_originals_bits(tmp_path, shape):
    onnx.save(forest(**shape), str(tmp_path / "f.onnx"))
    result = optimize(tmp_path / "f.onnx", tmp_path / "f.fused.onnx", cache_dir=False, jobs=1)
    products = [g for g in result.report["groups"] if "MatMul" in g["op_types"]]
    assert len(products) == 2 and all(g["status"] in ("compiled", "cached") for g in products), result.report["groups"]
    fused = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    original = original_session(forest(**shape))
    for batch in (1, 5, 64, 300):
        x = features(batch, seed=batch, count=shape.get("feature_count", FEATURES))
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


def test_products_left_to_onnxruntime_mean_the_original_is_optimized(tmp_path):
    """With one op per group nothing fuses, so the per-tree products would run in onnxruntime,
    where they are slower than the original's: the output keeps the original's nodes."""
    onnx.save(forest(), str(tmp_path / "f.onnx"))
    result = optimize(tmp_path / "f.onnx", tmp_path / "f.fused.onnx", cache_dir=False, jobs=1, max_depth=1)
    written = onnx.load(str(result.model_path))
    assert [n.op_type for n in written.graph.node][:1] == ["Gemm"]
    assert not any(n.name.startswith(NODE_PREFIX) for n in written.graph.node)
    x = features(9)
    assert_bitwise_equal(InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0],
                         original_session(forest()).run(None, {"x": x})[0])


def test_the_plan_shown_is_the_one_optimize_compiles():
    """onnxfuse.plan (and `inspect`) plan the rewritten form only where its products all land
    in groups: with one op a group they would not, and the original's plan is shown."""
    def op_types(p):
        return [t for g in p.groups for t in g.op_types] + [u.op_type for u in p.unfused]

    assert "Gemm" not in op_types(plan(forest())) and "MatMul" in op_types(plan(forest()))
    assert "Gemm" in op_types(plan(forest(), max_depth=1))


def test_an_export_saved_with_its_weights_beside_it_is_rewritten(tmp_path):
    """Hummingbird's export of scikit-learn's default GradientBoosting, its weights in a file
    of their own: rewritten as when they are inline, and the optimized output keeps the bits."""
    source = tmp_path / "gbr.onnx"
    onnx.save_model(onnx.load(str(CORPUS / "hb_gbr_defaults.onnx")), str(source), save_as_external_data=True,
                    all_tensors_to_one_file=True,
                    location="gbr.onnx.data", size_threshold=0)
    assert any(n.name.startswith(NODE_PREFIX) for n in load_model(source).nodes)
    feeds = dict(np.load(CORPUS / "hb_gbr_defaults.inputs.npz"))
    result = optimize(source, tmp_path / "gbr.fused.onnx", cache_dir=False, jobs=1,
                      inputs=CORPUS / "hb_gbr_defaults.inputs.npz")
    assert any(g["status"] in ("compiled", "cached") and "MatMul" in g["op_types"] for g in result.report["groups"])
    fused = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    original = original_session(onnx.load(str(CORPUS / "hb_gbr_defaults.onnx")))
    assert_bitwise_equal(fused.run(None, feeds)[0], original.run(None, feeds)[0])
