"""Fusion inside If branches and Loop/Scan bodies: planned like graphs, compiled into the one
library, written back as custom nodes inside the bodies, and run by onnxruntime.

Every comparison is against onnxruntime running the original model on the same inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from conftest import assert_outputs_match
from onnx import TensorProto, helper, numpy_helper
from onnx_builder import node, weights
from onnxfuse_cli.main import main

import onnxfuse
from onnxfuse import optimize
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.kernel_spec import DOMAIN
from onnxfuse.session import quiet_session_options

F = TensorProto.FLOAT
IN, HID = 16, 32


def _vi(name: str, shape, dtype=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "main", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _lstm_like_cell(prefix: str, x: str, h: str, c: str, h_out: str, c_out: str) -> list[onnx.NodeProto]:
    """Gates of an LSTM cell: two MatMuls, Split, Sigmoid×3, Tanh×2, Mul×3, Add×2."""
    p = prefix
    return [
        node("MatMul", [x, "Wx"], f"{p}xw"),
        node("MatMul", [h, "Wh"], f"{p}hw"),
        node("Add", [f"{p}xw", f"{p}hw"], f"{p}gates"),
        node("Split", [f"{p}gates"], [f"{p}i", f"{p}f", f"{p}g", f"{p}o"], axis=1),
        node("Sigmoid", [f"{p}i"], f"{p}si"),
        node("Sigmoid", [f"{p}f"], f"{p}sf"),
        node("Tanh", [f"{p}g"], f"{p}tg"),
        node("Sigmoid", [f"{p}o"], f"{p}so"),
        node("Mul", [f"{p}sf", c], f"{p}fc"),
        node("Mul", [f"{p}si", f"{p}tg"], f"{p}ig"),
        node("Add", [f"{p}fc", f"{p}ig"], c_out),
        node("Tanh", [c_out], f"{p}tc"),
        node("Mul", [f"{p}so", f"{p}tc"], h_out),
    ]


def _cell_weights() -> dict[str, np.ndarray]:
    return {"Wx": weights(IN, 4 * HID, seed=1) * 0.3, "Wh": weights(HID, 4 * HID, seed=2) * 0.3,
            "Wg": weights(IN, HID, seed=3) * 0.3}


def if_model() -> onnx.ModelProto:
    """`If(use_cell)`: then an LSTM-like cell step, else x·Wg → Sigmoid → Mul by h (a gate).
    Both branches read x, h, c and the weights from the outer scope; the else branch returns c
    unchanged."""
    then_branch = helper.make_graph(
        _lstm_like_cell("t_", "x", "h", "c", "t_h", "t_c"), "then_branch", [],
        [_vi("t_h", ["N", HID]), _vi("t_c", ["N", HID])])
    else_branch = helper.make_graph(
        [node("MatMul", ["x", "Wg"], "e_mm"), node("Sigmoid", ["e_mm"], "e_sig"), node("Mul", ["e_sig", "h"], "e_h"),
         node("Identity", ["c"], "e_c")],
        "else_branch", [], [_vi("e_h", ["N", HID]), _vi("e_c", ["N", HID])])
    nodes = [helper.make_node("If", ["use_cell"], ["h_out", "c_out"], name="if",
                              then_branch=then_branch, else_branch=else_branch)]
    inputs = [_vi("use_cell", [], TensorProto.BOOL), _vi("x", ["N", IN]), _vi("h", ["N", HID]), _vi("c", ["N", HID])]
    return _model(nodes, inputs, [_vi("h_out", ["N", HID]), _vi("c_out", ["N", HID])], _cell_weights())


def loop_model() -> onnx.ModelProto:
    """`Loop(steps)` carrying (h, c) through the LSTM-like cell, x read from the outer scope, and
    each step's h scanned out (scaled, so the scan output is a value of its own)."""
    body_nodes = [node("Identity", ["cond_in"], "cond_out"),
                  *_lstm_like_cell("b_", "x", "h_in", "c_in", "h_next", "c_next"),
                  node("Mul", ["h_next", "two"], "h_scan")]
    body = helper.make_graph(
        body_nodes, "body",
        [_vi("iter", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL),
         _vi("h_in", ["N", HID]), _vi("c_in", ["N", HID])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("h_next", ["N", HID]), _vi("c_next", ["N", HID]),
         _vi("h_scan", ["N", HID])])
    nodes = [helper.make_node("Loop", ["steps", "", "h0", "c0"], ["h_last", "c_last", "hs"], name="loop", body=body)]
    inputs = [_vi("steps", [], TensorProto.INT64), _vi("x", ["N", IN]), _vi("h0", ["N", HID]), _vi("c0", ["N", HID])]
    outputs = [_vi("h_last", ["N", HID]), _vi("c_last", ["N", HID]), _vi("hs", [None, "N", HID])]
    return _model(nodes, inputs, outputs, {**_cell_weights(), "two": np.array(2.0, np.float32)})


def scan_model() -> onnx.ModelProto:
    """`Scan` over xs [T, N, IN] with state s [N, HID]: s' = tanh(x_t·Wg + s) * sigmoid(s), and
    each step's s' scanned out."""
    body = helper.make_graph(
        [node("MatMul", ["x_t", "Wg"], "s_mm"), node("Add", ["s_mm", "s_in"], "s_pre"),
         node("Tanh", ["s_pre"], "s_t"), node("Sigmoid", ["s_in"], "s_gate"),
         node("Mul", ["s_t", "s_gate"], "s_next"), node("Neg", ["s_next"], "s_out")],
        "body", [_vi("s_in", ["N", HID]), _vi("x_t", ["N", IN])],
        [_vi("s_next", ["N", HID]), _vi("s_out", ["N", HID])])
    nodes = [helper.make_node("Scan", ["s0", "xs"], ["s_last", "ys"], name="scan", body=body, num_scan_inputs=1)]
    inputs = [_vi("s0", ["N", HID]), _vi("xs", ["T", "N", IN])]
    return _model(nodes, inputs, [_vi("s_last", ["N", HID]), _vi("ys", ["T", "N", HID])], _cell_weights())


def nested_model() -> onnx.ModelProto:
    """A Loop whose body holds an If (on an outer input) that reads the Loop's carried value:
    a body inside a body, capturing from both enclosing scopes."""
    then_branch = helper.make_graph(
        [node("MatMul", ["x", "Wg"], "n_mm"), node("Sigmoid", ["n_mm"], "n_sig"), node("Mul", ["n_sig", "acc_in"], "n_then")],
        "then_branch", [], [_vi("n_then", ["N", HID])])
    else_branch = helper.make_graph(
        [node("Tanh", ["acc_in"], "n_tanh"), node("Mul", ["n_tanh", "acc_in"], "n_sq"),
         node("Sub", ["acc_in", "n_sq"], "n_else")],
        "else_branch", [], [_vi("n_else", ["N", HID])])
    body = helper.make_graph(
        [node("Identity", ["cond_in"], "cond_out"),
         helper.make_node("If", ["flag"], ["acc_next"], name="inner_if", then_branch=then_branch, else_branch=else_branch)],
        "body",
        [_vi("iter", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc_in", ["N", HID])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_next", ["N", HID])])
    nodes = [helper.make_node("Loop", ["steps", "", "acc0"], ["acc_last"], name="loop", body=body)]
    inputs = [_vi("steps", [], TensorProto.INT64), _vi("flag", [], TensorProto.BOOL),
              _vi("x", ["N", IN]), _vi("acc0", ["N", HID])]
    return _model(nodes, inputs, [_vi("acc_last", ["N", HID])], _cell_weights())


def _feeds(batch: int, seed: int, **extra) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((batch, IN)).astype(np.float32),
             "h": rng.standard_normal((batch, HID)).astype(np.float32),
             "c": rng.standard_normal((batch, HID)).astype(np.float32)}
    return {**feeds, **extra}


def _optimized(source: onnx.ModelProto, tmp_path, cache):
    path = tmp_path / "model.onnx"
    onnx.save(source, str(path))
    result = optimize(path, tmp_path / "model.fused.onnx", cache_dir=cache, jobs=1)
    return path, result


def _sessions(original, fused):
    reference = ort.InferenceSession(str(original), quiet_session_options(), providers=["CPUExecutionProvider"])
    candidate = onnxfuse.InferenceSession(str(fused), quiet_session_options(), providers=["CPUExecutionProvider"])
    return reference, candidate


def _custom_nodes_by_body(model: onnx.ModelProto, path: str = "") -> dict[str, int]:
    """Body path → custom nodes written into it ("" the model's graph), the same paths as the plan's."""
    found = {path: sum(n.domain == DOMAIN for n in model.node)} if path or model.node else {}
    for index, n in enumerate(model.node):
        for attr in n.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                own = f"{n.op_type}_{index}/{attr.name}"
                found.update(_custom_nodes_by_body(attr.g, f"{path}/{own}" if path else own))
    return found


def _fused_groups(result) -> dict[str, list[str]]:
    return {g["name"]: g["op_types"] for g in result.report["groups"] if g["status"] != "fallback"}


def test_the_plan_covers_both_branches_with_their_paths():
    plan = plan_fusion(load_model(if_model()))
    by_name = {g.name: g for g in plan.groups}
    cell = by_name["If_0/then_branch/group_0"]
    assert cell.scope == "If_0/then_branch"
    assert len(cell.node_indices) == 13  # the whole cell, both MatMuls and the Split included
    assert set(cell.outputs) == {"t_h", "t_c"}
    assert {"x", "h", "c", "Wx", "Wh"} <= set(cell.inputs)  # read from the outer scope
    gate = by_name["If_0/else_branch/group_0"]
    assert gate.op_types == ("MatMul", "Sigmoid", "Mul")
    assert plan.node_count == 1 + 13 + 4
    assert [u.where for u in plan.unfused] == ["#0", "If_0/else_branch#3"]  # the If; the Identity of c


def test_if_branches_fuse_and_match_onnxruntime_on_both_conditions(tmp_path, cache):
    original, result = _optimized(if_model(), tmp_path, cache)
    assert _fused_groups(result) == {
        "If_0/then_branch/group_0": ["MatMul", "MatMul", "Add", "Split", "Sigmoid", "Sigmoid", "Tanh",
                                     "Sigmoid", "Mul", "Mul", "Add", "Tanh", "Mul"],
        "If_0/else_branch/group_0": ["MatMul", "Sigmoid", "Mul"],
    }
    fused = onnx.load(str(result.model_path))
    onnx.checker.check_model(fused, full_check=True)
    assert _custom_nodes_by_body(fused.graph) == {"": 0, "If_0/then_branch": 1, "If_0/else_branch": 1}
    reference, candidate = _sessions(original, result.model_path)
    for use_cell in (True, False):
        for batch in (1, 7):
            feeds = _feeds(batch, seed=batch, use_cell=np.array(use_cell))
            assert_outputs_match(reference.run(None, feeds), candidate.run(None, feeds))


def test_loop_body_with_carried_state_fuses_and_matches(tmp_path, cache):
    original, result = _optimized(loop_model(), tmp_path, cache)
    groups = _fused_groups(result)
    assert list(groups) == ["Loop_0/body/group_0"]
    assert len(groups["Loop_0/body/group_0"]) == 14  # the cell and the scaled scan output
    fused = onnx.load(str(result.model_path))
    onnx.checker.check_model(fused, full_check=True)
    assert _custom_nodes_by_body(fused.graph)["Loop_0/body"] == 1
    reference, candidate = _sessions(original, result.model_path)
    rng = np.random.default_rng(0)
    for steps, batch in ((1, 1), (5, 3)):
        feeds = {"steps": np.array(steps, np.int64), "x": rng.standard_normal((batch, IN)).astype(np.float32),
                 "h0": rng.standard_normal((batch, HID)).astype(np.float32),
                 "c0": rng.standard_normal((batch, HID)).astype(np.float32)}
        assert_outputs_match(reference.run(None, feeds), candidate.run(None, feeds))


def test_scan_body_fuses_and_matches(tmp_path, cache):
    original, result = _optimized(scan_model(), tmp_path, cache)
    groups = _fused_groups(result)
    assert list(groups) == ["Scan_0/body/group_0"]
    assert sorted(groups["Scan_0/body/group_0"]) == ["Add", "MatMul", "Mul", "Neg", "Sigmoid", "Tanh"]
    onnx.checker.check_model(onnx.load(str(result.model_path)), full_check=True)
    reference, candidate = _sessions(original, result.model_path)
    rng = np.random.default_rng(1)
    for steps, batch in ((1, 2), (6, 5)):
        feeds = {"s0": rng.standard_normal((batch, HID)).astype(np.float32),
                 "xs": rng.standard_normal((steps, batch, IN)).astype(np.float32)}
        assert_outputs_match(reference.run(None, feeds), candidate.run(None, feeds))


def test_a_body_inside_a_body_fuses_and_matches(tmp_path, cache):
    original, result = _optimized(nested_model(), tmp_path, cache)
    assert set(_fused_groups(result)) == {"Loop_0/body/If_1/then_branch/group_0",
                                          "Loop_0/body/If_1/else_branch/group_0"}
    fused = onnx.load(str(result.model_path))
    onnx.checker.check_model(fused, full_check=True)
    bodies = _custom_nodes_by_body(fused.graph)
    assert bodies["Loop_0/body/If_1/then_branch"] == bodies["Loop_0/body/If_1/else_branch"] == 1
    reference, candidate = _sessions(original, result.model_path)
    rng = np.random.default_rng(2)
    for flag in (True, False):
        feeds = {"steps": np.array(3, np.int64), "flag": np.array(flag),
                 "x": rng.standard_normal((4, IN)).astype(np.float32),
                 "acc0": rng.standard_normal((4, HID)).astype(np.float32)}
        assert_outputs_match(reference.run(None, feeds), candidate.run(None, feeds))


@pytest.mark.parametrize("select", ["auto", "all"])
def test_report_and_inspect_name_body_groups(select, tmp_path, cache):
    path = tmp_path / "model.onnx"
    onnx.save(if_model(), str(path))
    result = optimize(path, tmp_path / "model.fused.onnx", cache_dir=cache, jobs=1, select=select)
    report = result.report
    scopes = {g["name"]: g.get("scope") for g in report["groups"]}
    assert scopes == {"If_0/then_branch/group_0": "If_0/then_branch", "If_0/else_branch/group_0": "If_0/else_branch"}
    assert report["node_count"] == 18 and report["fused_node_count"] == 16
    shown = CliRunner().invoke(main, ["inspect", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "If_0/then_branch/group_0: 13 ops" in shown.output
    assert "If_0/else_branch/group_0: 3 ops" in shown.output


def test_a_body_group_of_unknown_shapes_falls_back_with_the_reason(tmp_path):
    """A carried value of unknown rank (outside and in the body): the group is planned, and falls
    back at extraction, as a top-level group would; the model still runs as it was."""
    body = helper.make_graph(
        [node("Identity", ["cond_in"], "cond_out"), node("Sigmoid", ["h_in"], "s"), node("Mul", ["s", "h_in"], "h_next")],
        "body", [_vi("iter", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("h_in", None)],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("h_next", None)])
    source = _model([helper.make_node("Loop", ["steps", "", "h0"], ["h"], name="loop", body=body)],
                    [_vi("steps", [], TensorProto.INT64), _vi("h0", None)], [_vi("h", None)], {})
    path = tmp_path / "m.onnx"
    onnx.save(source, str(path))
    result = optimize(path, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1)
    (group,) = result.report["groups"]
    assert group["name"] == "Loop_0/body/group_0" and group["status"] == "fallback"
    assert group["reason"] == "extract: shape of input 'h_in' is unknown"
    assert result.library_path is None
