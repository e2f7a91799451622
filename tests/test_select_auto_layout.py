"""`--select auto`'s rules calibrated by measurement (select/auto.py, docs/selection.md): nodes in
batch-last layout (a static first axis, the batch in the last one, where our schedule strides
every access by the batch) and groups that only move data stay with onnxruntime. Only plans and
decisions are asserted here; the outputs still match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import assert_outputs_match, run_both
from onnx_builder import const_i64, model, node, weights

import onnxfuse
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.select.auto import auto_rejects, leave_to_onnxruntime, only_moves_data, transposes_a_copy


def save(tmp_path, proto, name="m.onnx"):
    path = tmp_path / name
    onnx.save(proto, str(path))
    return path


def hummingbird_gemm():
    """W @ X^T -> Less -> Reshape -> Cast: Hummingbird's GEMM strategy, batch in the last axis."""
    return model([node("Gemm", ["W", "X"], "g", transB=1), node("Less", ["g", "T"], "lt"),
                  node("Reshape", ["lt", "shape"], "r"), node("Cast", ["r"], "Y", to=1)],
                 {"X": ["N", 28]}, {"Y": [4, 16, "N"]},
                 {"W": weights(64, 28), "T": weights(64, 1, seed=1), "shape": const_i64(4, 16, -1)})


def batch_first_gemm():
    """X @ W^T -> Relu: the same product with the batch in the rows, as the GEMM kernel wants it."""
    return model([node("Gemm", ["X", "W"], "g", transB=1), node("Relu", ["g"], "Y")],
                 {"X": ["N", 28]}, {"Y": ["N", 64]}, {"W": weights(64, 28)})


def plan_of(path):
    plan = plan_fusion(load_model(path), leave_out=leave_to_onnxruntime)
    return plan, {u.op_type: u.reason for u in plan.unfused}


def test_a_product_and_epilogue_with_the_batch_last_stay_with_onnxruntime(tmp_path):
    plan, reasons = plan_of(save(tmp_path, hummingbird_gemm()))
    assert not plan.groups
    assert set(reasons) == {"Gemm", "Less", "Reshape", "Cast"}
    assert all("batch in the last axis" in why for why in reasons.values())


def test_the_same_product_with_the_batch_first_still_fuses(tmp_path):
    plan, reasons = plan_of(save(tmp_path, batch_first_gemm()))
    assert [g.op_types for g in plan.groups] == [("Gemm", "Relu")] and not reasons


def test_a_unit_first_axis_or_a_batch_in_the_middle_is_not_batch_last(tmp_path):
    """[1, seq] position ids (BERT) and [seq, N, H] sequences keep fusing."""
    positions = model([node("Add", ["P", "B"], "s"), node("Relu", ["s"], "Y")],
                      {"P": [1, "seq"]}, {"Y": [1, "seq"]}, {"B": weights(1, 1)})
    sequence = model([node("Mul", ["X", "S"], "m"), node("Tanh", ["m"], "Y")],
                     {"X": [8, "N", 16]}, {"Y": [8, "N", 16]}, {"S": weights(16)})
    for proto, name in ((positions, "p.onnx"), (sequence, "s.onnx")):
        plan, reasons = plan_of(save(tmp_path, proto, name))
        assert len(plan.groups) == 1 and not reasons


def test_the_output_with_batch_last_nodes_left_out_matches_onnxruntime(tmp_path, cache):
    source = save(tmp_path, hummingbird_gemm())
    result = onnxfuse.optimize(source, tmp_path / "out" / "m.fused.onnx", cache_dir=cache, jobs=1)
    assert result.report["groups_total"] == 0
    feeds = {"X": np.random.default_rng(0).standard_normal((5, 28)).astype(np.float32)}
    expected, actual = run_both(source, result.model_path, feeds)
    assert_outputs_match(expected, actual)


def test_a_group_that_only_moves_data_is_declined_and_one_that_computes_is_not(tmp_path, cache):
    """The Transpose + Reshape exporters put after a GRU: onnxruntime keeps it."""
    moves = model([node("Transpose", ["X"], "t", perm=[0, 2, 1, 3]), node("Reshape", ["t", "shape"], "Y")],
                  {"X": [8, 2, "N", 16]}, {"Y": [8, "N", 32]}, {"shape": const_i64(8, -1, 32)})
    computes = model([node("Transpose", ["X"], "t", perm=[0, 2, 1, 3]), node("Tanh", ["t"], "h"),
                      node("Reshape", ["h", "shape"], "Y")],
                     {"X": [8, 2, "N", 16]}, {"Y": [8, "N", 32]}, {"shape": const_i64(8, -1, 32)})
    assert only_moves_data(("Transpose", "Reshape")) and only_moves_data(("Gather", "Unsqueeze", "Concat"))
    assert not only_moves_data(("Transpose", "Tanh", "Reshape")) and not only_moves_data(())
    for proto, name, declined in ((moves, "moves.onnx", True), (computes, "computes.onnx", False)):
        source = save(tmp_path, proto, name)
        plan, _ = plan_of(source)
        assert len(plan.groups) == 1
        assert (auto_rejects(plan.groups[0]) is not None) == declined
        result = onnxfuse.optimize(source, tmp_path / "out" / f"{name}.fused.onnx", cache_dir=cache, jobs=1)
        group = result.report["groups"][0]
        assert (group["status"] == "fallback") == declined
        if declined:
            assert group["fallback_kind"] == "declined" and "only moves data" in group["reason"]
        feeds = {"X": np.random.default_rng(1).standard_normal((8, 2, 3, 16)).astype(np.float32)}
        expected, actual = run_both(source, result.model_path, feeds)
        assert_outputs_match(expected, actual)


def test_a_head_split_that_transposes_a_copy_is_compiled(tmp_path, cache):
    """v of a ViT's packed projection split into heads (Gather, Reshape, Transpose, Reshape): two
    copies in onnxruntime, one in the kernel; the GRU's Transpose + Reshape above stays declined."""
    split = model([node("Gather", ["X", "zero"], "v", axis=0), node("Reshape", ["v", "by_head"], "r"),
                   node("Transpose", ["r"], "t", perm=[1, 0, 2]), node("Reshape", ["t", "heads"], "Y")],
                  {"X": [3, 17, "N", 32]}, {"Y": ["N", 4, 17, 8]},
                  {"zero": np.array(2, np.int64), "by_head": const_i64(17, -1, 8), "heads": const_i64(-1, 4, 17, 8)})
    assert transposes_a_copy(("Gather", "Reshape", "Transpose", "Reshape"))
    assert not transposes_a_copy(("Transpose", "Reshape")) and not transposes_a_copy(("Gather", "Unsqueeze", "Concat"))
    source = save(tmp_path, split)
    plan, _ = plan_of(source)
    assert len(plan.groups) == 1 and auto_rejects(plan.groups[0]) is None
    result = onnxfuse.optimize(source, tmp_path / "out" / "split.fused.onnx", cache_dir=cache, jobs=1)
    assert result.report["groups"][0]["status"] == "compiled"
    for batch in (1, 5):
        feeds = {"X": np.random.default_rng(batch).standard_normal((3, 17, batch, 32)).astype(np.float32)}
        expected, actual = run_both(source, result.model_path, feeds)
        np.testing.assert_array_equal(expected[0], actual[0])


def test_a_product_with_symbolic_columns_and_its_elementwise_chain_stay_with_onnxruntime(tmp_path):
    """Attention scores Q @ K^T * scale: the columns are the symbolic sequence."""
    scores = model([node("MatMul", ["Q", "K"], "qk"), node("Mul", ["qk", "scale"], "s"),
                    node("Softmax", ["s"], "Y", axis=-1)],
                   {"Q": ["N", 4, "seq", 8], "K": ["N", 4, 8, "seq"]}, {"Y": ["N", 4, "seq", "seq"]},
                   {"scale": np.array(0.35, dtype=np.float32)})
    plan, reasons = plan_of(save(tmp_path, scores))
    assert all("symbolic columns" in reasons[op] for op in ("MatMul", "Mul"))
    assert not any("MatMul" in g.op_types for g in plan.groups)
    static = model([node("MatMul", ["X", "W"], "m"), node("Relu", ["m"], "Y")],
                   {"X": ["N", "seq", 64]}, {"Y": ["N", "seq", 32]}, {"W": weights(64, 32)})
    plan, reasons = plan_of(save(tmp_path, static, "static.onnx"))
    assert [g.op_types for g in plan.groups] == [("MatMul", "Relu")] and not reasons


def _dense(k: int, n: int, gemm: bool = False):
    product = node("Gemm", ["X", "W"], "g", transB=1) if gemm else node("MatMul", ["X", "W"], "g")
    return model([product, node("Add", ["g", "b"], "z"), node("Relu", ["z"], "Y")],
                 {"X": ["N", k]}, {"Y": ["N", n]},
                 {"W": weights(n, k) if gemm else weights(k, n), "b": weights(n, seed=1)})


def test_a_product_whose_columns_cannot_be_whole_vectors_stays_with_onnxruntime(tmp_path):
    """[N, 100] @ [100, 100]: 100 columns are no whole vectors and a 100 x 112 padded weight is
    too large to copy on every call, so the GEMM would get no register tile (0.03x onnxruntime
    at batch 64). Whole vectors (64) or a weight small enough to pad (the seed gate's 10 x 30,
    40 x 40) still fuse; a Gemm's transposed weight gives its K from its second axis. A GELU
    after such a product stays with it (alone, its kernel ran 0.42-0.50x onnxruntime at batch 1)."""
    for k, n, gemm in ((100, 100, False), (128, 200, False), (512, 10, False), (100, 100, True)):
        plan, reasons = plan_of(save(tmp_path, _dense(k, n, gemm), f"d{k}_{n}_{gemm}.onnx"))
        assert not plan.groups, (k, n, gemm)
        assert all("fill no whole vectors" in reasons[op] for op in ("Gemm" if gemm else "MatMul", "Add", "Relu"))
    gelu = model([node("MatMul", ["X", "W"], "g"), node("Add", ["g", "b"], "z"), node("Div", ["z", "r2"], "d"),
                  node("Erf", ["d"], "e"), node("Add", ["e", "one"], "e1"), node("Mul", ["z", "e1"], "m"),
                  node("Mul", ["m", "half"], "Y")], {"X": ["N", 64]}, {"Y": ["N", 72]},
                 {"W": weights(64, 72), "b": weights(72, seed=1), "r2": np.array(1.4142135, np.float32),
                  "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)})
    plan, reasons = plan_of(save(tmp_path, gelu, "gelu.onnx"))
    assert not plan.groups and len(plan.unfused) == 7  # the GELU reads z twice: not a one-reader chain
    for k, n, gemm in ((100, 64, False), (10, 30, False), (40, 40, True), (256, 384, False)):
        plan, reasons = plan_of(save(tmp_path, _dense(k, n, gemm), f"d{k}_{n}_{gemm}.onnx"))
        assert len(plan.groups) == 1 and not reasons, (k, n, gemm)


def attention_values(head: int):
    """Softmax(scores) @ V, then the heads transposed back: V [N, 4, 17, head] computed by a Relu
    (as attention's V is), not a weight."""
    return model([node("Softmax", ["S"], "p", axis=-1), node("Relu", ["V"], "v"), node("MatMul", ["p", "v"], "o"),
                  node("Transpose", ["o"], "Y", perm=[0, 2, 1, 3])],
                 {"S": ["N", 4, 17, 17], "V": ["N", 4, 17, head]}, {"Y": ["N", 17, 4, head]})


def test_a_product_with_a_computed_weight_of_partial_vectors_stays_with_onnxruntime(tmp_path):
    """Attention's probabilities @ V with heads of 8: a weight computed at run time would be padded
    to whole vectors on every call (vit_block_ts: 0.56-0.62x of onnxruntime). Heads of 16 fill
    whole vectors and still fuse."""
    plan, reasons = plan_of(save(tmp_path, attention_values(8), "heads8.onnx"))
    assert "MatMul" not in {op for g in plan.groups for op in g.op_types}
    assert all("fill no whole vectors" in reasons[op] for op in ("MatMul", "Transpose"))
    plan, reasons = plan_of(save(tmp_path, attention_values(16), "heads16.onnx"))
    assert "MatMul" in {op for g in plan.groups for op in g.op_types} and "MatMul" not in reasons


def test_a_product_left_for_its_columns_matches_onnxruntime(tmp_path, cache):
    source = save(tmp_path, _dense(100, 100))
    result = onnxfuse.optimize(source, tmp_path / "out.onnx", cache_dir=cache)
    x = {"X": np.random.default_rng(2).standard_normal((37, 100)).astype(np.float32)}
    assert result.report["groups_total"] == 0
    assert_outputs_match(*run_both(source, result.model_path, x))


def test_a_large_matrix_vector_product_and_its_activation_stay_with_onnxruntime(tmp_path):
    """One static row over 4M weights (alexnet's fully connected layers), with the Relu after it."""
    fc = model([node("Gemm", ["X", "W"], "g", transB=1), node("Relu", ["g"], "Y")],
               {"X": [1, 2048], "W": [2048, 2048]}, {"Y": [1, 2048]})
    plan, reasons = plan_of(save(tmp_path, fc))
    assert not plan.groups and all("matrix-vector" in reasons[op] for op in ("Gemm", "Relu"))
    small = model([node("Gemm", ["X", "W"], "g", transB=1), node("Relu", ["g"], "Y")],
                  {"X": [1, 64]}, {"Y": [1, 32]}, {"W": weights(32, 64)})
    plan, reasons = plan_of(save(tmp_path, small, "small.onnx"))
    assert [g.op_types for g in plan.groups] == [("Gemm", "Relu")] and not reasons


def test_a_product_over_more_than_256_ks_and_its_activation_stay_with_onnxruntime(tmp_path):
    """onnxruntime sums K in blocks of 256 and so does our kernel; there its GEMM is as fast, and
    faster from 64 rows (PyTorch's MNIST MLP 0.92-0.95x at batch 64 once its kernel built). Up to
    256 k's (transformer_mlp's second product) the product still fuses."""
    for k, gemm in ((784, True), (320, False)):
        plan, reasons = plan_of(save(tmp_path, _dense(k, 64, gemm), f"long{k}.onnx"))
        assert not plan.groups, k
        assert all("more than 256 k's" in reasons[op] for op in ("Gemm" if gemm else "MatMul", "Add", "Relu"))
    plan, reasons = plan_of(save(tmp_path, _dense(256, 64), "k256.onnx"))
    assert len(plan.groups) == 1 and not reasons


def pooled_layer_norm(shape):
    """A LayerNormalization's moments written as tf2onnx writes Keras': the mean and the variance
    of each row by GlobalAveragePool, the normalization elementwise between and after them."""
    scalar = {"eps": np.array(1e-3, np.float32)}
    return model([node("GlobalAveragePool", ["X"], "mean"), node("Sub", ["X", "mean"], "d"),
                  node("Mul", ["d", "d"], "sq"), node("GlobalAveragePool", ["sq"], "var"),
                  node("Add", ["var", "eps"], "ve"), node("Sqrt", ["ve"], "sd"),
                  node("Reciprocal", ["sd"], "inv"), node("Mul", ["d", "inv"], "Y")],
                 {"X": shape}, {"Y": shape}, scalar)


def test_a_row_mean_pool_and_the_ops_between_stay_ours_and_an_image_pool_does_not(tmp_path):
    """Over [N, 16, 32] each pool is a mean of a row's 32 values, and nothing is a convolution,
    so nothing stays with onnxruntime; over an image [N, 16, 8, 8] both pools are its and the
    normalization between them is what it runs in its blocked layout."""
    rows, rows_reasons = plan_of(save(tmp_path, pooled_layer_norm(["N", 16, 32]), "rows.onnx"))
    assert not [why for why in rows_reasons.values() if why.startswith("auto:")]
    assert sum(op == "GlobalAveragePool" for g in rows.groups for op in g.op_types) >= 1
    assert all(auto_rejects(g, load_model(tmp_path / "rows.onnx")) is None for g in rows.groups)
    images, image_reasons = plan_of(save(tmp_path, pooled_layer_norm(["N", 16, 8, 8]), "images.onnx"))
    assert "onnxruntime's GlobalAveragePool" in image_reasons["GlobalAveragePool"]
    assert "between convolutions" in image_reasons["Sub"]


def test_a_row_mean_layer_norm_under_auto_is_onnxruntimes_bits(tmp_path, cache):
    source = save(tmp_path, pooled_layer_norm(["N", 16, 32]))
    result = onnxfuse.optimize(source, tmp_path / "out" / "m.fused.onnx", cache_dir=cache, jobs=1)
    assert result.report["groups_compiled"] >= 1
    for batch in (1, 5, 64):
        feeds = {"X": np.random.default_rng(batch).standard_normal((batch, 16, 32)).astype(np.float32)}
        (expected,), (actual,) = run_both(source, result.model_path, feeds)
        assert actual.tobytes() == expected.tobytes(), batch


def test_the_keras_encoders_layer_norms_are_ours_under_auto(tmp_path):
    """tf2onnx's export of a Keras encoder block: each of its two LayerNormalizations, pools and
    normalization, is one group (auto left them all to onnxruntime as 'between convolutions')."""
    from conftest import MODELS

    plan = plan_fusion(load_model(MODELS / "exported" / "keras_encoder.onnx"), leave_out=leave_to_onnxruntime)
    pooled = [g.op_types.count("GlobalAveragePool") for g in plan.groups if "GlobalAveragePool" in g.op_types]
    assert pooled == [2, 2]  # each layer norm one group, both its pools in it
    assert not [u for u in plan.unfused if "between convolutions" in u.reason]
