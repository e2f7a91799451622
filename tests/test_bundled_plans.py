"""The fusion plan of every bundled model, pinned: how many kernels each becomes and how large.

A change to the fusion rules that splits a cell or a tree chain shows up here as a changed row,
not only as a slower benchmark (the style of tinygrad's check_schedule).
"""

from __future__ import annotations

import pytest
from conftest import MODELS

import onnxfuse

# model → (ops per group in plan order, nodes left to onnxruntime)
EXPECTED = {
    "concat_exit": ([5], 0),
    "conv_block": ([2, 3], 0),  # each BatchNormalization folded into its Conv by the front end
    "diamond": ([5], 0),
    "gru_cell": ([17], 0),
    "lstm_cell": ([14], 0),
    "lstm_gate": ([7], 0),
    "perf_tree_trav_d3": ([27], 0),
    "perf_tree_trav_d8": ([72], 0),
    "transformer_mlp": ([19], 0),  # LayerNorm -> FFN -> residual: a row prologue and a GEMM chain
    "tree_ensemble_d8": ([], 1),  # one ONNX-ML TreeEnsemble op: opaque
    # The 3 left (Shape → Slice → Concat) compute the Expand's target, which the kernel rebuilds
    # from X's dims: the written model drops them (fusion/rebuilt_shapes.py). Its int64→int64
    # Casts (3 at depth 3, 8 at depth 8) are dropped by the front end.
    "tree_trav_d3": ([45], 3),
    "tree_trav_d8": ([110], 3),
}


def test_every_bundled_model_is_pinned():
    assert sorted(p.stem for p in MODELS.glob("*.onnx")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bundled_model_plan(name):
    plan = onnxfuse.plan(MODELS / f"{name}.onnx")
    sizes, unfused = EXPECTED[name]
    assert [len(g.node_indices) for g in plan.groups] == sizes
    assert len(plan.unfused) == unfused
