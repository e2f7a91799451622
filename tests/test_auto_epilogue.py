"""`--select auto` leaves convolutions to onnxruntime without taking their epilogue down with them.

The Conv is planned as opaque; what onnxruntime fuses into its own Conv (BatchNormalization, an
activation) stays with it; elementwise ops between convolutions stay too (onnxruntime keeps them in
its blocked layout); the rest of the epilogue fuses into a kernel of its own."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import MODELS, assert_outputs_match, run_both
from onnx import helper
from onnx_builder import model, node, resnet_block, weights

from onnxfuse import optimize
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.select.auto import competitive_convolutions, is_competitive_conv, leave_to_onnxruntime


def _auto_plan(source):
    return plan_fusion(load_model(source), leave_out=leave_to_onnxruntime)


def _reasons(plan) -> dict[str, str]:
    return {u.where: u.reason for u in plan.unfused}


def conv_silu_residual() -> onnx.ModelProto:
    """Conv → SiLU (Sigmoid, Mul) → + X → Relu: the epilogue reaches the graph output."""
    return model(
        [node("Conv", ["X", "W", "B"], "conv", pads=[1, 1, 1, 1]),
         node("Sigmoid", ["conv"], "sig"), node("Mul", ["conv", "sig"], "silu"),
         node("Add", ["silu", "X"], "res"), node("Relu", ["res"], "Y")],
        {"X": ["N", 8, 10, 10]}, {"Y": ["N", 8, 10, 10]},
        {"W": weights(8, 8, 3, 3, seed=1) * 0.2, "B": weights(8, seed=2)})


def conv_relu_conv() -> onnx.ModelProto:
    """Conv → Relu → Conv → Sigmoid → Mul → Conv: the first Relu fuses into onnxruntime's Conv, the
    SiLU sits between two convolutions."""
    return model(
        [node("Conv", ["X", "W1"], "c1", pads=[1, 1, 1, 1]), node("Relu", ["c1"], "r1"),
         node("Conv", ["r1", "W2"], "c2", pads=[1, 1, 1, 1]), node("Sigmoid", ["c2"], "s2"),
         node("Mul", ["c2", "s2"], "silu2"), node("Conv", ["silu2", "W3"], "Y")],
        {"X": ["N", 4, 6, 6]}, {"Y": ["N", 4, 6, 6]},
        {f"W{k}": weights(4, 4, 3, 3, seed=k) * 0.3 for k in (1, 2, 3)})


def test_the_conv_stays_out_and_its_epilogue_fuses(tmp_path, cache):
    source = conv_silu_residual()
    plan = _auto_plan(source)
    assert [g.op_types for g in plan.groups] == [("Sigmoid", "Mul", "Add", "Relu")]
    assert _reasons(plan)["#0"].startswith("opaque: auto: onnxruntime's Conv")
    path = tmp_path / "m.onnx"
    onnx.save(source, str(path))
    result = optimize(path, tmp_path / "m.fused.onnx", cache_dir=cache, jobs=1)
    assert [(g["op_types"], g["status"] != "fallback") for g in result.report["groups"]] == [
        (["Sigmoid", "Mul", "Add", "Relu"], True)]
    fused = onnx.load(str(result.model_path))
    assert [n.op_type for n in fused.graph.node][0] == "Conv"
    for batch in (1, 3):
        feeds = {"X": np.random.default_rng(batch).standard_normal((batch, 8, 10, 10)).astype(np.float32)}
        expected, actual = run_both(path, result.model_path, feeds)
        assert_outputs_match(expected, actual)


def test_what_onnxruntime_fuses_into_its_conv_and_what_lies_between_convs_stay():
    plan = _auto_plan(conv_relu_conv())
    assert plan.groups == []
    reasons = _reasons(plan)
    assert reasons["#1"] == "opaque: auto: onnxruntime fuses it into Conv#0, which it runs faster than our kernel"
    for between in ("#3", "#4"):
        assert "between convolutions" in reasons[between]


def test_without_auto_the_plan_still_puts_the_conv_in_its_group():
    (group,) = plan_fusion(load_model(conv_silu_residual())).groups
    assert group.op_types == ("Conv", "Sigmoid", "Mul", "Add", "Relu")


def test_batch_norm_and_relu_stay_with_the_conv_the_residual_epilogue_fuses():
    """A ResNet block on 12 x 12 images: rows of 12 fill no whole vectors, so onnxruntime keeps
    its convolutions (the front end has folded each batch norm into its Conv, as onnxruntime does)."""
    graph = load_model(resnet_block(8, 12))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu", "Conv", "Add", "Relu"]
    plan = plan_fusion(graph, leave_out=leave_to_onnxruntime)
    assert [g.op_types for g in plan.groups] == [("Add", "Relu")]
    reasons = _reasons(plan)
    assert "fuses it into Conv#0" in reasons["#1"]
    assert reasons["#2"].startswith("opaque: auto: onnxruntime's Conv")


def test_convolutions_that_are_all_competitive_fuse_with_their_epilogues():
    """The bundled block (16 x 16 images, stride 1): both convolutions compile, each with its
    epilogue, and no Conv is left to onnxruntime's blocked layout."""
    plan = _auto_plan(MODELS / "conv_block.onnx")
    assert [g.op_types for g in plan.groups] == [("Conv", "Relu"), ("Conv", "Add", "Relu")]
    assert plan.unfused == [] or all("Conv" not in u.reason for u in plan.unfused)


def test_one_untiled_conv_leaves_every_conv_of_the_graph_to_onnxruntime():
    """A stride-2 Conv after a tiled one: onnxruntime runs the strided one in its blocked layout,
    so a kernel for the first would cost layout conversions between them; both stay."""
    m = model([node("Conv", ["X", "W1"], "c1", pads=[1, 1, 1, 1]), node("Relu", ["c1"], "r1"),
               node("Conv", ["r1", "W2"], "Y", pads=[1, 1, 1, 1], strides=[2, 2])],
              {"X": ["N", 4, 16, 16]}, {"Y": ["N", 4, 8, 8]},
              {f"W{k}": weights(4, 4, 3, 3, seed=k) * 0.3 for k in (1, 2)})
    graph = load_model(m)
    assert competitive_convolutions(graph) == set()
    assert _auto_plan(m).groups == []
    assert is_competitive_conv(graph, graph.nodes[0]) and not is_competitive_conv(graph, graph.nodes[2])


def test_mobilenet_keeps_its_between_conv_activations_with_onnxruntime():
    """Measured slower as kernels (see select/auto.py): every SiLU, HardSwish and residual Add of
    the exported mobilenet sits between convolutions, or feeds the final pooling reduction."""
    for exporter in ("ts", "dynamo"):
        plan = _auto_plan(MODELS / "exported" / f"mobilenet_tiny_{exporter}.onnx")
        assert plan.groups == []
        graph = load_model(MODELS / "exported" / f"mobilenet_tiny_{exporter}.onnx")
        reasons = _reasons(plan)
        for n in graph.nodes:
            if n.op_type in ("Sigmoid", "HardSwish", "Add"):
                assert "between convolutions" in reasons[f"#{n.index}"], (exporter, n.label)


def test_a_single_conv_activation_pair_is_left_whole():
    """Conv → Clip: onnxruntime runs it as one fused Conv; nothing is left for a kernel."""
    m = model([node("Conv", ["X", "W"], "c"),
               helper.make_node("Clip", ["c", "lo", "hi"], ["Y"], name="Y")],
              {"X": ["N", 2, 5, 5]}, {"Y": ["N", 2, 3, 3]},
              {"W": weights(2, 2, 3, 3), "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)})
    plan = _auto_plan(m)
    assert plan.groups == [] and "fuses it into Conv#0" in _reasons(plan)["#1"]


def test_a_real_resnet_with_strided_stages_leaves_every_conv_to_onnxruntime():
    """PyTorch's CIFAR-style ResNet export: its stem and first stage are convolutions ours win
    alone, the strided stages are not; mixing them cost layout conversions (0.85-0.94x at batch
    64, select/auto.py), so `auto` leaves all of them, and their epilogues, to onnxruntime."""
    for exporter in ("ts", "dynamo"):
        graph = load_model(MODELS / "exported" / f"resnet_cifar_tiny_{exporter}.onnx")
        convs = [n for n in graph.nodes if n.op_type == "Conv"]
        assert len(convs) == 11  # stem, 4 in the first stage, 3 in each strided stage
        competitive = [is_competitive_conv(graph, n) for n in convs]
        assert competitive[:5] == [True] * 5 and not all(competitive)
        assert competitive_convolutions(graph) == set()
        plan = _auto_plan(MODELS / "exported" / f"resnet_cifar_tiny_{exporter}.onnx")
        assert not any("Conv" in g.op_types for g in plan.groups)
