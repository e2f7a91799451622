"""Each fusion rule on a tiny graph: the graph, then the groups it must give.

Groups are written as sets of node names (each node is named after its first output); nodes
not listed stay unfused.
"""

from __future__ import annotations

import numpy as np
import pytest
from cell_forms import GRU_FORMS, LSTM_FORMS, gru_cell, lstm_cell
from onnx_builder import const_i64, model, node, weights

from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.partition import FusionOptions
from onnxfuse.fusion.plan import plan_fusion

X = {"x": (4, 8)}


def groups(m, canonical=True, **options) -> list[set[str]]:
    graph = load_model(m, canonical)
    plan = plan_fusion(graph, FusionOptions(**options))
    return [{graph.nodes[i].name for i in g.node_indices} for g in plan.groups]


def reasons(m, canonical=True, **options) -> dict[str, str]:
    graph = load_model(m, canonical)
    plan = plan_fusion(graph, FusionOptions(**options))
    return {graph.nodes[u.node_index].name: u.reason for u in plan.unfused}


def test_elementwise_diamond_is_one_group():
    m = model(
        [node("Relu", ["x"], "r"), node("Sigmoid", ["r"], "s"), node("Tanh", ["r"], "t"), node("Add", ["s", "t"], "y")],
        X, {"y": (4, 8)},
    )
    assert groups(m) == [{"r", "s", "t", "y"}]


def test_fan_out_that_never_rejoins_stays_apart():
    m = model(
        [node("Relu", ["x"], "r"), node("Sigmoid", ["r"], "s"), node("Tanh", ["r"], "t")],
        X, {"s": (4, 8), "t": (4, 8)},
    )
    assert groups(m) == []
    why = reasons(m)
    assert "never rejoin" in why["r"]
    assert "graph outputs" in why["s"]


LSTM_GATE = [
    node("MatMul", ["x", "w"], "mm"),
    node("Split", ["mm"], ["a", "b", "c"], axis=1),
    node("Sigmoid", ["a"], "sig"),
    node("Tanh", ["b"], "tanh"),
    node("Exp", ["c"], "exp"),
    node("Mul", ["sig", "tanh"], "mul"),
    node("Add", ["mul", "exp"], "y"),
]


def test_split_fanout_puts_the_matmul_in_the_gate_group():
    m = model(LSTM_GATE, X, {"y": (4, 8)}, {"w": weights(8, 24)})
    assert groups(m) == [{"mm", "a", "sig", "tanh", "exp", "mul", "y"}]


def test_without_split_fanout_the_matmul_stays_out_like_tvm():
    m = model(LSTM_GATE, X, {"y": (4, 8)}, {"w": weights(8, 24)})
    assert groups(m, split_fanout=False) == [{"a", "sig", "tanh", "exp", "mul", "y"}]
    assert "absorbs only elementwise" in reasons(m, split_fanout=False)["mm"]


def test_split_with_two_levels_of_consumers():
    m = model(
        [
            node("MatMul", ["x", "w"], "mm"),
            node("Split", ["mm"], ["a", "b"], axis=1),
            node("Sigmoid", ["a"], "sa"),
            node("Neg", ["sa"], "na"),
            node("Tanh", ["b"], "tb"),
            node("Exp", ["tb"], "eb"),
            node("Mul", ["na", "eb"], "y"),
        ],
        X, {"y": (4, 8)}, {"w": weights(8, 16)},
    )
    assert groups(m) == [{"mm", "a", "sa", "na", "tb", "eb", "y"}]


def test_two_anchors_meeting_at_an_elementwise_sink_share_a_group():
    m = model(
        [
            node("MatMul", ["x", "w1"], "m1"),
            node("MatMul", ["h", "w2"], "m2"),
            node("Add", ["m1", "m2"], "s"),
            node("Sigmoid", ["s"], "y"),
        ],
        {"x": (4, 8), "h": (4, 8)}, {"y": (4, 8)}, {"w1": weights(8, 8), "w2": weights(8, 8, seed=1)},
    )
    assert groups(m) == [{"m1", "m2", "s", "y"}]
    assert len(groups(m, multi_anchor=False)) == 1
    assert groups(m, multi_anchor=False)[0] in ({"m1", "s", "y"}, {"m2", "s", "y"})


def test_anchor_chain_does_not_merge_two_matmuls_in_sequence():
    """TVM's phases keep anchors in sequence apart; by constant weights they are a GEMM chain,
    joined after the phases (test_row_prologues.py)."""
    m = model(
        [node("MatMul", ["x", "w1"], "m1"), node("Relu", ["m1"], "r"),
         node("MatMul", ["r", "w2"], "m2"), node("Relu", ["m2"], "y")],
        X, {"y": (4, 8)}, {"w1": weights(8, 8), "w2": weights(8, 8)},
    )
    assert groups(m, gemm_chains=False) == [{"m1", "r"}, {"m2", "y"}]
    assert groups(m) == [{"m1", "r", "m2", "y"}]


def test_bias_add_is_an_elementwise_edge_for_the_anchor():
    m = model(
        [node("MatMul", ["x", "w"], "mm"), node("Add", ["mm", "b"], "ab"), node("Relu", ["ab"], "y")],
        X, {"y": (4, 8)}, {"w": weights(8, 8), "b": weights(8)},
    )
    assert groups(m) == [{"mm", "ab", "y"}]


def test_anchor_does_not_absorb_a_transpose():
    m = model(
        [node("MatMul", ["x", "w"], "mm"), node("Transpose", ["mm"], "t", perm=[1, 0]), node("Relu", ["t"], "y")],
        X, {"y": (8, 4)}, {"w": weights(8, 8)},
    )
    assert groups(m) == [{"t", "y"}]
    assert "absorbs only elementwise" in reasons(m)["mm"]


def test_concat_is_the_exit_of_its_group():
    m = model(
        [node("Relu", ["x"], "r"), node("Sigmoid", ["x"], "s"), node("Concat", ["r", "s"], "y", axis=1)],
        X, {"y": (4, 16)},
    )
    graph = load_model(m)
    plan = plan_fusion(graph)
    assert [set(g.op_types) for g in plan.groups] == [{"Relu", "Sigmoid", "Concat"}]
    assert plan.groups[0].outputs == ("y",)


def test_opaque_op_is_a_barrier():
    m = model(
        [node("Relu", ["x"], "r"), node("Opaque", ["r"], "o", domain="custom"), node("Sigmoid", ["o"], "y")],
        X, ["y"],
    )
    assert groups(m) == []
    assert "opaque" in reasons(m)["o"]


def test_opaque_op_on_a_side_path_would_create_a_cycle():
    m = model(
        [
            node("Relu", ["x4"], "r4"),
            node("Sigmoid", ["r4"], "s4"),
            node("LRN", ["r4"], "o", size=3),
            node("Add", ["s4", "o"], "y"),
        ],
        {"x4": (1, 2, 4, 8)}, ["y"],
    )
    assert groups(m) == [{"s4", "y"}]
    assert "would create a cycle" in reasons(m)["r4"]


def test_depth_bound_cuts_a_long_chain():
    chain = [node("Relu", ["x"], "r0")] + [node("Relu", [f"r{i-1}"], f"r{i}") for i in range(1, 10)]
    m = model(chain, X, {"r9": (4, 8)})
    assert [len(g) for g in groups(m, max_depth=4)] == [4, 4, 2]
    assert "depth bound" in reasons(m, max_depth=1)["r0"]
    assert [len(g) for g in groups(m)] == [10]


def test_input_bound():
    adds = [node("Add", ["x", "b0"], "a0")] + [node("Add", [f"a{i-1}", f"b{i}"], f"a{i}") for i in range(1, 6)]
    m = model(adds, X, {"a5": (4, 8)}, {f"b{i}": weights(4, 8, seed=i) for i in range(6)})
    sizes = [len(g) for g in groups(m, max_inputs=3)]
    assert sum(sizes) <= 6 and max(sizes) < 6
    assert [len(g) for g in groups(m)] == [6]


def _relu_sum_sigmoid(axis: int):
    shape = (4, 1) if axis == 1 else (1, 8)
    return model(
        [node("Relu", ["x"], "r"), node("ReduceSum", ["r", "axes"], "s", keepdims=1), node("Sigmoid", ["s"], "y")],
        X, {"y": shape}, {"axes": const_i64(axis)},
    )


def test_reduction_takes_its_producers_but_not_its_consumers_in_tvm_rules():
    assert groups(_relu_sum_sigmoid(axis=1), row_reductions=False) == [{"r", "s"}]


def test_row_reduction_takes_its_consumers():
    """Past TVM: a reduction within rows (axis 0 kept) goes on into its elementwise consumers."""
    assert groups(_relu_sum_sigmoid(axis=1)) == [{"r", "s", "y"}]


def test_reduction_over_the_batch_axis_does_not_take_its_consumers():
    """Each output row would need every input row: no row tile could compute it alone."""
    assert groups(_relu_sum_sigmoid(axis=0)) == [{"r", "s"}]
    alone = model([node("ReduceSum", ["x", "axes"], "s", keepdims=1), node("Sigmoid", ["s"], "y")],
                  X, {"y": (1, 8)}, {"axes": const_i64(0)})
    assert groups(alone) == []
    assert "batch axis" in reasons(alone)["s"]
    assert "reduction" in reasons(alone, row_reductions=False)["s"]


def test_layernorm_of_plain_ops_is_one_group():
    """Two row reductions, each broadcast back onto its rows: TVM makes three groups of it."""
    m = model(
        [
            node("ReduceMean", ["x", "axes"], "mu", keepdims=1),
            node("Sub", ["x", "mu"], "d"),
            node("Pow", ["d", "two"], "d2"),
            node("ReduceMean", ["d2", "axes"], "var", keepdims=1),
            node("Add", ["var", "eps"], "ve"),
            node("Sqrt", ["ve"], "sd"),
            node("Div", ["d", "sd"], "n"),
            node("Mul", ["n", "gamma"], "y"),
        ],
        X, {"y": (4, 8)},
        {"axes": const_i64(-1), "two": np.array([2.0], np.float32), "eps": np.array(1e-5, np.float32),
         "gamma": weights(8)},
        opset=18,
    )
    assert groups(m) == [{"mu", "d", "d2", "var", "ve", "sd", "n", "y"}]
    assert len(groups(m, row_reductions=False)) > 1


def test_softmax_of_plain_ops_is_one_group():
    m = model(
        [
            node("ReduceMax", ["x", "axes"], "m", keepdims=1),
            node("Sub", ["x", "m"], "d"),
            node("Exp", ["d"], "e"),
            node("ReduceSum", ["e", "axes"], "s", keepdims=1),
            node("Div", ["e", "s"], "y"),
        ],
        X, {"y": (4, 8)}, {"axes": const_i64(1)}, opset=18,
    )
    assert groups(m) == [{"m", "d", "e", "s", "y"}]


def test_row_reduction_stops_at_an_anchor():
    m = model(
        [node("ReduceMean", ["x", "axes"], "mu", keepdims=1), node("Sub", ["x", "mu"], "d"),
         node("MatMul", ["d", "w"], "y")],
        X, {"y": (4, 3)}, {"axes": const_i64(1), "w": weights(8, 3)}, opset=18,
    )
    assert {"mu", "d"} in groups(m, row_prologues=False)
    assert not any("y" in g and "mu" in g for g in groups(m, row_prologues=False))
    assert groups(m) == [{"mu", "d", "y"}]  # after both phases, as a row prologue (test_row_prologues.py)


def test_injective_chain_into_a_reduction():
    m = model(
        [
            node("Gather", ["table", "idx"], "g", axis=0),
            node("Reshape", ["g", "shape"], "r"),
            node("ReduceMean", ["r", "axes"], "y", keepdims=0),
        ],
        {"idx": (4, 8)}, ["y"],
        {"table": weights(16), "shape": const_i64(4, 8), "axes": const_i64(1)},
    )
    m.graph.input[0].type.tensor_type.elem_type = 7  # int64 indices
    assert groups(m) == [{"g", "r", "y"}]
    assert groups(m, injective_into_reduce=False) == [{"g", "r"}]


def test_a_graph_output_inside_a_group_is_exported():
    m = model(
        [node("Relu", ["x"], "r"), node("Sigmoid", ["r"], "y")],
        X, {"r": (4, 8), "y": (4, 8)},
    )
    plan = plan_fusion(load_model(m))
    assert len(plan.groups) == 1
    assert set(plan.groups[0].outputs) == {"r", "y"}


def test_shape_computations_are_left_to_onnxruntime():
    m = model(
        [
            node("Shape", ["x"], "shp"),
            node("Gather", ["shp", "zero"], "n", axis=0),
            node("Unsqueeze", ["n", "axes"], "n1"),
            node("Concat", ["n1", "minus1"], "newshape", axis=0),
            node("Relu", ["x"], "r"),
            node("Reshape", ["r", "newshape"], "y"),
        ],
        X, ["y"],
        {"zero": np.array(0, dtype=np.int64), "axes": const_i64(0), "minus1": const_i64(-1)},
    )
    # The front end makes this shape a constant; the rule covers the shapes it cannot.
    why = reasons(m, canonical=False)
    assert "computes a shape" in why["n"] and "computes a shape" in why["newshape"]
    found = groups(m, canonical=False)
    assert {"n", "n1", "newshape"}.isdisjoint(set().union(*found) if found else set())


def test_subgraph_reads_are_dataflow_edges():
    then_graph = helper_branch("r")
    m = model(
        [
            node("Relu", ["x"], "r"),
            node("Sigmoid", ["r"], "s"),
            node("If", ["cond"], "o", then_branch=then_graph, else_branch=then_graph),
        ],
        {"x": (4, 8), "cond": ()}, ["s", "o"],
    )
    m.graph.input[1].type.tensor_type.elem_type = 9  # bool
    graph = load_model(m)
    if_node = next(n for n in graph.nodes if n.op_type == "If")
    assert if_node.implicit_inputs == ["r"]
    assert if_node.index in graph.value("r").consumers
    for g in plan_fusion(graph).groups:
        if "Relu" in g.op_types:
            assert "r" in g.outputs


def helper_branch(captured: str):
    from onnx import TensorProto, helper

    out = helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, None)
    return helper.make_graph([helper.make_node("Identity", [captured], ["branch_out"])], "branch", [], [out])


@pytest.mark.parametrize(
    "path, expected_ops",
    [
        ("models/lstm_gate.onnx", 7),
        ("models/lstm_cell.onnx", 14),
        ("models/gru_cell.onnx", 17),
    ],
)
def test_recurrent_cells_are_one_group(path, expected_ops):
    plan = plan_fusion(load_model(path))
    assert len(plan.groups) == 1
    assert len(plan.groups[0].node_indices) == expected_ops
    assert plan.groups[0].op_types.count("MatMul") >= 1


@pytest.mark.parametrize("path", ["models/tree_trav_d8.onnx", "models/perf_tree_trav_d8.onnx"])
def test_tree_chain_fuses_into_one_long_group(path):
    graph = load_model(path)
    plan = plan_fusion(graph)
    gathers = sum(n.op_type in ("Gather", "GatherElements") for n in graph.nodes)
    assert len(plan.groups) == 1
    group = plan.groups[0]
    assert group.op_types.count("Gather") + group.op_types.count("GatherElements") == gathers
    assert "ReduceMean" in group.op_types


def test_reuse_inside_a_group_is_reported():
    m = model(
        [node("Relu", ["x"], "r"), node("Sigmoid", ["r"], "s"), node("Tanh", ["r"], "t"), node("Add", ["s", "t"], "y")],
        X, {"y": (4, 8)},
    )
    (group,) = plan_fusion(load_model(m)).groups
    assert group.reuse == {"r": 2}


@pytest.mark.parametrize("depth", [3, 8])
def test_tree_level_index_is_read_four_times_per_level(depth):
    (group,) = plan_fusion(load_model(f"models/tree_trav_d{depth}.onnx")).groups
    assert group.to_json()["max_reuse"] == 4
    assert sum(1 for n in group.reuse.values() if n == 4) == depth


def test_ops_the_code_generator_would_get_wrong_stay_unfused():
    """Found by sweeping the ONNX node tests: each compiled, verified on random inputs, and
    differed from onnxruntime on others."""
    isinf = model([node("IsInf", ["x"], "i", detect_negative=0), node("Not", ["i"], "y")], X, ["y"])
    assert groups(isinf) == [] and "detect_negative" in reasons(isinf)["i"]
    assert groups(model([node("IsInf", ["x"], "i"), node("Not", ["i"], "y")], X, ["y"])) == [{"i", "y"}]
    thresholded = model([node("ThresholdedRelu", ["x"], "t", alpha=0.5), node("Neg", ["t"], "y")], X, {"y": (4, 8)})
    assert groups(thresholded) == [] and "NaN" in reasons(thresholded)["t"]


def test_dropout_in_training_mode_stays_unfused():
    """With a training_mode that is not a constant false, Dropout is not the identity."""
    import onnx

    m = model([node("Dropout", ["x", "ratio", "training"], "d"), node("Neg", ["d"], "y")], X, {"y": (4, 8)},
              {"ratio": np.array(0.5, np.float32)})
    m.graph.input.append(onnx.helper.make_tensor_value_info("training", onnx.TensorProto.BOOL, []))
    assert groups(m) == [] and "training_mode" in reasons(m)["d"]
    inference = model([node("Dropout", ["x", "ratio", "training"], "d"), node("Neg", ["d"], "y")], X, {"y": (4, 8)},
                      {"ratio": np.array(0.5, np.float32), "training": np.array(False)})
    assert groups(inference) == [{"d", "y"}]


def test_nodes_that_read_only_constants_are_left_to_onnxruntime():
    """A weight re-laid out in the graph (Transpose + Reshape of an initializer) is a constant:
    onnxruntime folds it at load; as a kernel it would have no run-time input at all."""
    m = model(
        [
            node("Transpose", ["wp"], "wt", perm=[1, 0, 2]),
            node("Reshape", ["wt", "shape"], "w"),
            node("MatMul", ["x", "w"], "mm"),
            node("Relu", ["mm"], "y"),
        ],
        X, {"y": (4, 16)},
        {"wp": weights(2, 8, 8), "shape": const_i64(8, 16)},
    )
    # The front end folds this small weight; the rule covers what it leaves (over its size bound).
    assert groups(m, canonical=False) == [{"mm", "y"}]
    why = reasons(m, canonical=False)
    assert "reads only constants" in why["wt"] and "reads only constants" in why["w"]


# --- cells as exporters write them (tests/cell_forms.py) ----------------------------------------

@pytest.mark.parametrize("form", sorted(LSTM_FORMS))
def test_lstm_cell_is_one_group(form):
    m, cell = lstm_cell(**LSTM_FORMS[form])
    assert groups(m) == [cell]


@pytest.mark.parametrize("form", sorted(GRU_FORMS))
def test_gru_cell_is_one_group(form):
    m, cell = gru_cell(**GRU_FORMS[form])
    assert groups(m) == [cell]


def test_without_view_prologues_the_state_reads_stay_out():
    """h's Gather feeds only the GEMM, c's only the gates: an anchored group takes neither
    injective op by TVM's rules."""
    m, cell = lstm_cell(state_in="gather", state_out="stacked")
    assert groups(m, view_prologues=False) == [cell - {"h", "c"}]
    assert "cannot take it" in reasons(m, view_prologues=False)["h"]


def test_state_read_joins_only_an_anchored_group_that_reads_it():
    """A constant index on an outer axis reads whole rows in place; on the last axis it would
    read one element per row, a strided gather: it stays out."""
    def gemm_of(axis: int):
        state = {0: (2, 4, 8), 1: (4, 2, 8), 2: (4, 8, 2)}[axis]
        return model(
            [node("Gather", ["state", "zero"], "h", axis=axis), node("MatMul", ["h", "w"], "mm"),
             node("Relu", ["mm"], "y")],
            {"state": state}, {"y": (4, 8)}, {"zero": np.array(0, np.int64), "w": weights(8, 8)},
        )
    assert groups(gemm_of(0)) == [{"h", "mm", "y"}]
    assert groups(gemm_of(1)) == [{"h", "mm", "y"}]
    assert groups(gemm_of(2)) == [{"mm", "y"}]


def test_gemm_between_an_anchor_and_its_post_dominator_joins_it():
    """GRU with linear_before_reset=0: W_hn (r * h) lies inside the cell. Without the rule the
    cell falls into four groups (three when r * h joins W_hn as its row prologue)."""
    m, cell = gru_cell(linear_before_reset=0)
    assert groups(m) == [cell]
    assert len(groups(m, enclosed_gemms=False, row_prologues=False)) == 4
    assert len(groups(m, enclosed_gemms=False)) == 3


def test_gemm_by_weights_computed_at_run_time_is_not_enclosed():
    """Only a GEMM by constant weights is row-local (row i of its output needs row i of its
    input): a run-time weight may mix rows, so the cell stays cut around it."""
    m, cell = gru_cell(linear_before_reset=0)
    w_hn = next(i for i in m.graph.initializer if i.name == "w_hn")
    m.graph.initializer.remove(w_hn)
    m.graph.input.append(helper_tensor("w_hn", list(w_hn.dims)))
    assert len(groups(m)) > 1


def helper_tensor(name, dims):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def test_anchor_whose_post_dominator_is_a_gemm_by_run_time_weights_stays_apart_from_it():
    """Anchors in sequence join as a GEMM chain only when the second GEMM is row-local: by
    run-time weights it may mix rows."""
    m = model(
        [node("MatMul", ["x", "w1"], "m1"), node("Relu", ["m1"], "r"),
         node("MatMul", ["r", "w2"], "m2"), node("Relu", ["m2"], "y")],
        {**X, "w2": (8, 8)}, {"y": (4, 8)}, {"w1": weights(8, 8)},
    )
    assert groups(m) == [{"m1", "r"}, {"m2", "y"}]


def test_gemms_enclosed_by_a_layernorm_stay_apart_from_it():
    """LayerNorm → FFN → residual Add: the LayerNorm's post-dominator lies past both GEMMs, but
    only a GEMM encloses GEMMs. The FFN is one GEMM chain (test_row_prologues.py); the LayerNorm,
    read by the residual Add as well, is no prologue of it."""
    m = model(
        [node("LayerNormalization", ["x", "g", "b"], "ln", axis=-1), node("MatMul", ["ln", "w1"], "m1"),
         node("Relu", ["m1"], "r"), node("MatMul", ["r", "w2"], "m2"), node("Add", ["m2", "ln"], "y")],
        X, {"y": (4, 8)}, {"g": weights(8), "b": weights(8), "w1": weights(8, 16), "w2": weights(16, 8)},
    )
    assert groups(m, gemm_chains=False) == [{"m1", "r"}, {"m2", "y"}]
    assert groups(m) == [{"m1", "r", "m2", "y"}]


def _pooled_layer_norm(shape):
    """tf2onnx's Keras LayerNormalization: mean and variance by GlobalAveragePool."""
    return model([node("GlobalAveragePool", ["x"], "mean"), node("Sub", ["x", "mean"], "d"),
                  node("Mul", ["d", "d"], "sq"), node("GlobalAveragePool", ["sq"], "var"),
                  node("Add", ["var", "eps"], "ve"), node("Sqrt", ["ve"], "sd"),
                  node("Reciprocal", ["sd"], "inv"), node("Mul", ["d", "inv"], "y")],
                 {"x": shape}, {"y": shape}, {"eps": np.array(1e-3, np.float32)})


def test_a_layer_norm_by_row_mean_pools_is_one_group():
    """Over [N, C, L] a GlobalAveragePool is ReduceMean over L, a reduction within rows: the
    pools, the centring and the scaling are one group, as an exporter's ReduceMean form is."""
    assert groups(_pooled_layer_norm(["N", 16, 32])) == [{"mean", "d", "sq", "var", "ve", "sd", "inv", "y"}]


def test_image_pools_stay_anchors_of_their_own():
    """Over [N, C, H, W] the pools stay image pools: each takes only elementwise consumers, so
    the layer norm does not come together."""
    parts = groups(_pooled_layer_norm(["N", 16, 8, 8]))
    assert {"mean", "d", "sq", "var", "ve", "sd", "inv", "y"} not in parts
    assert not any({"mean", "var"} <= part for part in parts)
