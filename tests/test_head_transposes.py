"""Head transposes in a GEMM's epilogue (fusion/forward_graph.py: transposes_whole_rows): a
Transpose that keeps the last axis last, as attention's head split [b, s, h, d] -> [b, h, s, d],
joins the projection's kernel, which stores its rows at their new places; one that moves the last
axis (the key's [b, h, d, s]) stays with onnxruntime. Fused models match onnxruntime on the
original (a GEMM's sum is reassociated, docs/numerics.md: within rounding; elementwise groups bit
for bit)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import MODELS, assert_outputs_match
from onnx_builder import const_i64, model, node, weights
from test_fusion_rules import groups
from test_ieee_order import fused_session, original_session

from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.plan import FusionOptions, plan_fusion

SEQ, HEADS, HEAD_DIM = 5, 2, 8
HIDDEN = HEADS * HEAD_DIM
PROJECTION = {"mm", "biased", "heads"}


def head_projection(perm, seq=SEQ) -> onnx.ModelProto:
    """x [N, seq, hidden] @ w + b, split into heads, transposed by `perm`."""
    nodes = [node("MatMul", ["x", "w"], "mm"), node("Add", ["mm", "b"], "biased"),
             node("Reshape", ["biased", "heads_shape"], "heads"), node("Transpose", ["heads"], "y", perm=perm)]
    inits = {"w": weights(HIDDEN, HIDDEN, seed=1), "b": weights(HIDDEN, seed=2),
             "heads_shape": const_i64(0, 0, HEADS, HEAD_DIM)}
    return model(nodes, {"x": ("N", seq, HIDDEN)}, {"y": None}, inits)


def test_a_transpose_keeping_the_last_axis_joins_the_projection():
    assert groups(head_projection([0, 2, 1, 3])) == [PROJECTION | {"y"}]


def test_a_transpose_bringing_a_symbolic_axis_last_stays_apart():
    """[N, seq, h, d] -> [N, h, d, seq] with seq known at run time only scatters every element;
    with seq static the rows are whole (partition: view epilogues, tests/test_view_epilogues.py)."""
    found = groups(head_projection([0, 2, 3, 1], seq="seq"))
    assert PROJECTION in found and not any("y" in g for g in found if g & PROJECTION)
    assert groups(head_projection([0, 2, 3, 1])) == [PROJECTION | {"y"}]


@pytest.mark.parametrize("seq", [SEQ, "seq"])
@pytest.mark.parametrize("batch", [1, 3, 13])
def test_the_fused_head_split_matches_onnxruntime(tmp_path, batch, seq):
    """Static and run-time sequence lengths; batches below, at and across the GEMM's row tile."""
    x = np.random.default_rng(batch).standard_normal((batch, SEQ, HIDDEN), dtype=np.float32)
    m = head_projection([0, 2, 1, 3], seq)
    expected = original_session(m).run(None, {"x": x})
    assert_outputs_match(expected, fused_session(m, tmp_path).run(None, {"x": x}))


def test_torchscript_bert_projections_store_query_and_value_heads():
    """The TorchScript BERT as exported: per layer, the query's and the value's projections end in
    their head Transpose; the key's ends at its Reshape (its Transpose moves the last axis)."""
    graph = load_model(onnx.load(str(MODELS / "exported" / "bert_tiny_2l_ts.onnx")))
    plan = plan_fusion(graph, FusionOptions())
    ops = [[graph.nodes[i].op_type for i in g.node_indices] for g in plan.groups]
    projections = [o for o in ops if o[:3] == ["MatMul", "Add", "Reshape"]]
    assert sorted(map(tuple, projections)) == sorted([("MatMul", "Add", "Reshape", "Transpose")] * 4
                                                     + [("MatMul", "Add", "Reshape")] * 2)
