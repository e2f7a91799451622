"""Reduction epilogues (fusion/partition.py): an anchored group's epilogue may end in a reduction
that keeps the batch axis (a weighted sum over each row's last axis, an ArgMax over classes).
TVM stops an anchor's group at any reduction; the per-tree leaf values of Hummingbird's GEMM
strategy (frontend/batch_first_trees.py) and an MLP's ArgMax then went to memory and back, the
former through onnxruntime's ReduceSum."""

from __future__ import annotations

import numpy as np
import onnx
from onnx_builder import const_i64, model, node, weights
from test_fusion_rules import groups
from test_optimize import run_both

from onnxfuse import optimize


def weighted_row_sum(reduce_op: str = "ReduceSum", second_reader: bool = False) -> onnx.ModelProto:
    """x[N, 16] @ w[16, 32] -> Equal(b) -> Cast -> * v -> reduce over the last axis -> y[N]."""
    nodes = [node("MatMul", ["x", "w"], "mm"), node("Equal", ["mm", "b"], "hit"),
             node("Cast", ["hit"], "one_hot", to=onnx.TensorProto.FLOAT), node("Mul", ["one_hot", "v"], "weighted")]
    nodes.append(node(reduce_op, ["weighted", "axes"], "y", keepdims=0) if reduce_op == "ReduceSum"
                 else node(reduce_op, ["weighted"], "y", axis=-1, keepdims=0))
    outputs = {"y": ("N",)}
    if second_reader:
        nodes.append(node("Neg", ["weighted"], "z"))
        outputs["z"] = ("N", 32)
    inits = {"w": np.round(weights(16, 32)), "b": np.round(weights(32, seed=1)), "v": weights(32, seed=2),
             "axes": const_i64(-1)}
    m = model(nodes, {"x": ("N", 16)}, outputs, inits)
    if reduce_op == "ArgMax":
        m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.INT64
    return m


def test_the_row_sum_joins_the_products_group():
    assert groups(weighted_row_sum()) == [{"mm", "hit", "one_hot", "weighted", "y"}]
    assert groups(weighted_row_sum("ArgMax")) == [{"mm", "hit", "one_hot", "weighted", "y"}]


def test_without_reduction_epilogues_the_reduction_stays_out():
    assert groups(weighted_row_sum(), reduction_epilogues=False) == [{"mm", "hit", "one_hot", "weighted"}]


def test_a_reduction_that_is_not_the_only_way_on_stays_out():
    """`weighted` is also read by a Neg: the product's post-dominator is no reduction."""
    assert {"y"} not in groups(weighted_row_sum(second_reader=True))
    assert not any("y" in g and "mm" in g for g in groups(weighted_row_sum(second_reader=True)))


def test_the_product_with_its_row_sum_is_onnxruntimes_bits(tmp_path):
    for reduce_op in ("ReduceSum", "ArgMax"):
        source = tmp_path / f"{reduce_op}.onnx"
        onnx.save(weighted_row_sum(reduce_op), str(source))
        result = optimize(source, tmp_path / f"{reduce_op}.fused.onnx", cache_dir=False, jobs=1, select="all")
        (group,) = result.report["groups"]
        assert group["status"] == "compiled" and "y" in group["outputs"], group.get("reason")
        for rows in (1, 7, 64):
            x = np.round(np.random.default_rng(rows).standard_normal((rows, 16)) * 2).astype(np.float32)
            expected, actual = run_both(source, result.model_path, {"x": x})
            np.testing.assert_array_equal(np.asarray(actual[0]).view(np.uint32 if reduce_op == "ReduceSum" else np.int64),
                                          np.asarray(expected[0]).view(np.uint32 if reduce_op == "ReduceSum" else np.int64))
