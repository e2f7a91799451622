"""An Expand to a run-time shape that inference knows symbolically joins its kernel: the group
rebuilds the shape from a graph input's dims (fusion/rebuilt_shapes.py), and the shape nodes
left unread in onnxruntime are dropped. Checked against onnxruntime on the original model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import MODELS, assert_outputs_match, run_both
from onnx_builder import const_i64, model, node

import onnxfuse
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.plan import plan_fusion

ROW = np.array([[0.5, -1.0, 2.0, 3.5]], np.float32)


def broadcast_row_model(shape_nodes: list, shape: str) -> onnx.ModelProto:
    """y = Expand(row, shape) + x over x [N, 4], with `shape` computed by `shape_nodes`."""
    return model(
        [*shape_nodes, node("Expand", ["row", shape], "rows"), node("Add", ["rows", "x"], "y")],
        {"x": ("N", 4)}, {"y": ("N", 4)}, {"row": ROW, "zero": const_i64(0), "one": const_i64(1), "four": const_i64(4)},
    )


BATCH_FROM_X = [node("Shape", ["x"], "x_shape"), node("Slice", ["x_shape", "zero", "one"], "batch"),
                node("Concat", ["batch", "four"], "target", axis=0)]


def test_an_expand_to_a_graph_inputs_batch_joins_its_kernel(tmp_path, cache):
    source = tmp_path / "broadcast_row.onnx"
    onnx.save(broadcast_row_model(BATCH_FROM_X, "target"), str(source))
    plan = plan_fusion(load_model(source))
    (group,) = plan.groups
    graph = load_model(source)
    assert {graph.nodes[i].op_type for i in group.node_indices} == {"Expand", "Add"}
    fused = tmp_path / "broadcast_row.fused.onnx"
    result = onnxfuse.optimize(source, fused, cache_dir=cache, jobs=1)
    assert result.report["groups_fallback"] == 0
    ops = [n.op_type for n in onnx.load(str(fused)).graph.node]
    assert "Shape" not in ops and "Slice" not in ops and "Concat" not in ops and "Expand" not in ops
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        (expected,), (actual,) = run_both(source, fused, {"x": x})
        np.testing.assert_array_equal(actual, expected)


def test_an_expand_to_a_shape_no_graph_input_carries_stays_with_onnxruntime(tmp_path):
    """The count of NonZero's results is no graph input's dim: the kernel could not bind it."""
    count_of_nonzero = [node("NonZero", ["x"], "where"), node("Shape", ["where"], "where_shape"),
                        node("Slice", ["where_shape", "one", "two"], "count"),
                        node("Concat", ["count", "four"], "target", axis=0)]
    m = broadcast_row_model(count_of_nonzero, "target")
    m.graph.initializer.append(onnx.numpy_helper.from_array(const_i64(2), "two"))
    source = tmp_path / "nonzero_rows.onnx"
    onnx.save(m, str(source))
    graph = load_model(source)
    plan = plan_fusion(graph)
    fused_ops = {graph.nodes[i].op_type for g in plan.groups for i in g.node_indices}
    assert "Expand" not in fused_ops
    assert any("input 1 of Expand is computed at run time" in u.reason for u in plan.unfused)


@pytest.mark.parametrize("batch", [1, 3, 37])
def test_tree_trav_is_one_kernel_and_matches_onnxruntime(tmp_path, cache, batch):
    """Hummingbird's tree_trav broadcasts the roots with such an Expand: the whole program is now
    one custom node. Labels are onnxruntime's exactly; the mean over trees may differ in the last
    bit above batch 1 (onnxruntime sums in another order there, as before this rule)."""
    source = MODELS / "tree_trav_d3.onnx"
    fused = tmp_path / "tree_trav_d3.fused.onnx"
    onnxfuse.optimize(source, fused, cache_dir=cache, jobs=1)
    nodes = onnx.load(str(fused)).graph.node
    assert len(nodes) == 1 and nodes[0].domain == "ai.onnxfuse"
    x = np.random.default_rng(batch).standard_normal((batch, 28)).astype(np.float32)
    (expected_labels, expected_means), (labels, means) = run_both(source, fused, {"X": x})
    np.testing.assert_array_equal(labels, expected_labels)
    assert_outputs_match([expected_means], [means])
