"""float16 values onnxruntime carries unrounded in float32 across a group boundary
(codegen/float16_boundaries.py decides which, fusion/float32_boundaries.py rewrites the group
models and the written model). The written model in onnxruntime against onnxruntime on the
original, bit for bit, on float16 inputs that overflow, sit at 65504 or round across an integer."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_builder import model, node
from test_ieee_order import assert_bitwise_equal, original_session

from onnxfuse import optimize
from onnxfuse.codegen.float16_boundaries import carry_float32
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.extract import extract_group
from onnxfuse.fusion.float32_boundaries import carried_name, written_boundary
from onnxfuse.fusion.partition import FusionOptions
from onnxfuse.fusion.plan import FusedGroup, plan_fusion
from onnxfuse.session import InferenceSession

F16, F32, I32 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT32
ROW = ("N",)


def _float16(*values) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.array(values, np.float16)


# a, b: products that overflow float16 (70000, 90000), land at 65504 or near it, stay small
A = _float16(350, 300, 256, 255.9, -300, 2, 1e-4, np.inf)
B = _float16(200, 300, 256, 256, 300, 3, 1e-4, -1)
# x sums to 76.98 (77 once rounded to float16); a sum over the batch axis keeps the Cast out of its group
X = np.array([[25.66, 25.66, 25.67]], np.float16)
SUM_INITS = {"shape": np.array([-1, 3], np.int64), "axes": np.array([0, 1], np.int64)}
SUM = [node("Reshape", ["x", "shape"], "r"), node("ReduceSum", ["r", "axes"], "s", keepdims=0)]
LO = {"lo": np.array(-1, np.float16)}

CASES = {  # case: (nodes, inputs, outputs (name -> type), initializers, feeds, values crossing as float32)
    # the Clip is computed in float32 (isolated between float32 nodes): Abs and Neg read 70000, not 65504
    "clip_read_by_unfused": (
        [node("Mul", ["a", "b"], "p"), node("Clip", ["p", "lo"], "q"), node("Abs", ["q"], "y1"), node("Neg", ["q"], "y2")],
        {"a": ROW, "b": ROW}, {"y1": F16, "y2": F16}, LO, {"a": A, "b": B}, {"q"}),
    # the sum is also a graph output (rounded there, inf); its float32 readers still read it unrounded:
    # half of 70200 is 35100, not inf
    "sum_also_an_output": (
        [node("Mul", ["a", "b"], "p"), node("Add", ["p", "b"], "q"), node("Mul", ["q", "half"], "y1"),
         node("Neg", ["q"], "y2")],
        {"a": ROW, "b": ROW}, {"y1": F16, "y2": F16, "q": F16}, {"half": np.array(0.5, np.float16)}, {"a": A, "b": B},
        {"q"}),
    # a group reading another's output: the Less reads 122500, not inf
    "group_to_group": (
        [node("Pow", ["a", "e"], "pw"), node("Abs", ["pw"], "q"), node("Less", ["q", "c"], "l"),
         node("Where", ["l", "c", "z"], "y1"), node("Neg", ["q"], "y2")],
        {"a": ROW, "e": ROW, "c": ROW, "z": ROW}, {"y1": F16, "y2": F16}, {},
        {"a": A, "e": np.full(8, 2, np.float16), "c": np.full(8, np.inf, np.float16), "z": np.full(8, -0.0, np.float16)},
        {"q"}),
    # a Cast to int32 of a float16 sum casts the float32 sum: 76.99 is 76, not 77
    "sum_cast_to_int": (
        [*SUM, node("Cast", ["s"], "y", to=I32)], {"x": ("N", 3)}, {"y": I32}, SUM_INITS, {"x": X}, {"s"}),
    # the sum is also a graph output: onnxruntime keeps the rounding Cast, the Cast to int32 reads 77
    "sum_output_and_cast_to_int": (
        [*SUM, node("Cast", ["s"], "y", to=I32)], {"x": ("N", 3)}, {"y": I32, "s": F16}, SUM_INITS, {"x": X}, set()),
    # a sum no group takes (over the batch axis) read by a group: it reads 76.98 - 77, not 0
    "unfused_sum_into_group": (
        [node("ReduceSum", ["x", "axes"], "s", keepdims=0), node("Sub", ["s", "c"], "d"), node("Mul", ["d", "k"], "y")],
        {"x": ("N", 3)}, {"y": F16}, {"axes": np.array([0, 1], np.int64), "c": np.array(77, np.float16),
                                       "k": np.array(1000, np.float16)}, {"x": X}, {"s"}),
    # read outside by a float16 kernel (Max) only: rounded in onnxruntime too, nothing carried
    "read_by_float16_kernel": (
        [node("Mul", ["a", "b"], "p"), node("Add", ["p", "b"], "q"), node("Max", ["q", "b"], "y1"),
         node("Min", ["q", "a"], "y2")],
        {"a": ROW, "b": ROW}, {"y1": F16, "y2": F16}, {}, {"a": A, "b": B}, set()),
}


def _model(case: str) -> onnx.ModelProto:
    nodes, inputs, outputs, inits, _, _ = CASES[case]
    m = model(nodes, inputs, list(outputs), inits, dtype=F16)
    for o in m.graph.output:
        o.type.tensor_type.elem_type = outputs[o.name]
    return m


def _plan(m: onnx.ModelProto, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    graph = load_model(path)
    return graph, carry_float32(graph, plan_fusion(graph, FusionOptions()))


@pytest.mark.parametrize("case", list(CASES))
def test_written_model_equals_onnxruntime_on_the_original(tmp_path, case):
    m = _model(case)
    feeds = CASES[case][4]
    expected = original_session(m).run(None, feeds)
    source = tmp_path / "m.onnx"
    onnx.save(m, str(source))
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    report = result.report
    assert report["groups_fallback"] == 0, report["groups"]
    got = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, e in zip(got, expected, strict=True):
        assert_bitwise_equal(g, e)
    assert {v for g in report["groups"] for v in g.get("float32_outputs", []) + g.get("float32_inputs", [])} == CASES[case][5]


def test_rounding_at_the_boundary_showed(tmp_path):
    """The cases above test something: the values they read differ once rounded to float16."""
    a, b = A.astype(np.float32), B.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        assert (np.abs(a * b) > 65504).sum() >= 3 and np.isinf((A * B).astype(np.float16)).sum() >= 3
    total = X.astype(np.float32).sum()
    assert int(total) == 76 and int(total.astype(np.float16)) == 77


def test_what_is_carried(tmp_path):
    graph, plan = _plan(_model("group_to_group"), tmp_path)
    producer, reader = plan.groups
    assert producer.float32_outputs == ("q",) and producer.float32_inputs == ()
    assert reader.float32_inputs == ("q",) and reader.float32_outputs == ()
    graph, plan = _plan(_model("sum_cast_to_int"), tmp_path)
    (group,) = plan.groups
    (cast,) = [n.index for n in graph.nodes if n.op_type == "Cast"]
    assert group.float32_outputs == ("s",) and group.unrounded_casts == (cast,)


@pytest.mark.parametrize("nodes", [
    # the producer reads a lossy Cast of its group: a Cast of it to float32 would keep its rounding
    [node("Cast", ["i"], "c", to=F16), node("Add", ["c", "b"], "q"), node("Abs", ["q"], "y1"), node("Neg", ["q"], "y2")],
], ids=["producer_reads_a_cast"])
def test_not_carried_where_the_group_model_would_change(tmp_path, nodes):
    m = model(nodes, {"a": ROW, "b": ROW, "i": ROW}, [o for n in nodes for o in n.output if o.startswith("y")], dtype=F16)
    m.graph.input[2].type.tensor_type.elem_type = TensorProto.INT64
    graph, plan = _plan(onnx.shape_inference.infer_shapes(m), tmp_path)
    (group,) = plan.groups
    assert group.op_types == ("Cast", "Add") and group.outputs == ("q",)  # read by unfused Abs and Neg
    assert not group.float32_outputs


def test_float32_models_keep_their_plan(tmp_path):
    m = model([node("Mul", ["a", "b"], "p"), node("Abs", ["p"], "y1"), node("Neg", ["p"], "y2")],
              {"a": ROW, "b": ROW}, {"y1": ROW, "y2": ROW})
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    graph = load_model(path)
    plan = plan_fusion(graph, FusionOptions())
    assert carry_float32(graph, plan) is plan


def test_group_models_output_and_read_float32(tmp_path):
    """The producer's group model computes the Pow in float32 and outputs it unrounded (122500);
    the reader's takes it as float32: both as onnxruntime runs them as the kernels' reference."""
    graph, plan = _plan(_model("group_to_group"), tmp_path)
    producer, reader = (extract_group(graph, g) for g in plan.groups)
    assert [(o.name, o.type.tensor_type.elem_type) for o in producer.graph.output] == [(carried_name("q"), F32)]
    assert (carried_name("q"), F32) in [(i.name, i.type.tensor_type.elem_type) for i in reader.graph.input]
    feeds = {"a": A, "e": np.full(8, 2, np.float16)}
    (q,) = ort.InferenceSession(producer.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_array_equal(q, np.abs(A.astype(np.float32) ** 2))


def test_written_model_without_the_producer_widens_the_value():
    """A reader group kept while its producer falls back reads a Cast of the value to float32
    (onnxruntime removes it with the rounding Cast after a float32 node)."""
    reader = FusedGroup("group_1", (2, 3), ("Less", "Where"), ("q", "c", "z"), ("y1",), False, float32_inputs=("q",))
    added, rewired = written_boundary([], [reader])
    assert rewired == {}
    ((after, cast),) = added
    assert after is None and list(cast.input) == ["q"] and list(cast.output) == [carried_name("q")]
    assert cast.attribute[0].i == F32


def _session(nodes, inputs, outputs):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, t, [4]) for k, t in inputs.items()],
                          [helper.make_tensor_value_info(k, t, [4]) for k, t in outputs.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def test_onnxruntime_removes_the_written_rounding_cast():
    """What the written model relies on (onnxruntime 1.32): float32 nodes after a model's
    Cast(float32 -> float16) read the float32 value, also when the Cast's output is a graph output;
    a Cast to int32 after it keeps it (so such a Cast is rewired to read the float32 value)."""
    x = np.array([70000, 76.99, 2.5, -1e5], np.float32)
    cast = helper.make_node("Cast", ["x"], ["c"], to=F16)
    sub = helper.make_node("Sub", ["c", "c"], ["d"])
    (d, c) = _session([cast, sub], {"x": F32}, {"d": F16, "c": F16}).run(None, {"x": x})
    np.testing.assert_array_equal(d, np.zeros(4, np.float16))  # 70000 - 70000, not inf - inf
    assert np.isinf(c[0])
    to_int = helper.make_node("Cast", ["c"], ["i"], to=I32)
    (i,) = _session([cast, to_int], {"x": F32}, {"i": I32}).run(None, {"x": x})
    assert i[1] == 77  # rounded first: the Cast pair stays


def test_cached_kernels_read_and_write_the_float32_values(tmp_path):
    """A second run takes both kernels from the cache and binds the reader's float32 argument."""
    m = _model("group_to_group")
    feeds = CASES["group_to_group"][4]
    source = tmp_path / "m.onnx"
    onnx.save(m, str(source))
    for run in ("first", "second"):
        result = optimize(source, tmp_path / f"{run}.onnx", cache_dir=tmp_path / "cache", jobs=1, select="all")
    assert result.report["groups_cached"] == 2
    got = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, e in zip(got, original_session(m).run(None, feeds), strict=True):
        assert_bitwise_equal(g, e)


def test_not_carried_when_a_body_reads_it(tmp_path):
    """A value an If branch reads by name: onnxruntime's Cast removal counts that reader, the
    analysis does not, so the boundary is left as it was."""
    nodes, inputs, outputs, inits, _, _ = CASES["sum_cast_to_int"]
    branch = helper.make_graph([node("Identity", ["s"], "t")], "branch", [],
                               [helper.make_tensor_value_info("t", F16, None)])
    reads_s = node("If", ["flag"], "z", then_branch=branch, else_branch=branch)
    m = model([*nodes, reads_s], {**inputs, "flag": ()}, ["y", "z"], inits, dtype=F16)
    m.graph.input[1].type.tensor_type.elem_type = TensorProto.BOOL
    graph, plan = _plan(onnx.shape_inference.infer_shapes(m), tmp_path)
    (group,) = [g for g in plan.groups if not g.scope]
    assert group.outputs == ("s",) and not group.float32_outputs
    graph, plan = _plan(_model("sum_cast_to_int"), tmp_path)
    assert plan.groups[0].float32_outputs == ("s",)  # the same without the If


def test_a_group_ending_in_a_cast_to_float16_carries_its_float32_source(tmp_path):
    """Split -> Cast(float32 -> float16) in a group, read by an unfused Reciprocal and Sin: onnxruntime
    drops the Cast with the one back to float32 it inserts, so they read the float32 value (Sin of
    70000 is finite); the group carries the Cast's source (fuzzer, seed 95: NaN for 0.93)."""
    x = helper.make_tensor_value_info("x", F32, ["N", 4])
    outputs = [helper.make_tensor_value_info(name, F16, ["N", 2]) for name in ("r", "s")]
    graph = helper.make_graph(
        [helper.make_node("Split", ["x", "halves"], ["a", "b"], axis=-1), helper.make_node("Cast", ["b"], ["c"], to=F16),
         helper.make_node("Reciprocal", ["c"], ["r"]), helper.make_node("Sin", ["c"], ["s"])], "cast_boundary", [x],
        [*outputs, helper.make_tensor_value_info("a", F32, ["N", 2])],
        [helper.make_tensor("halves", TensorProto.INT64, [2], [2, 2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": np.array([[1, 2, 70000, -3.3333], [0, 0, 0.1234567, 1e-3]], np.float32)}
    expected = original_session(m).run(None, feeds)
    assert np.isfinite(expected[1]).all()  # Sin of the unrounded 70000
    source = tmp_path / "m.onnx"
    onnx.save(m, str(source))
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    groups = result.report["groups"]
    assert [g["op_types"] for g in groups] == [["Split", "Cast"]] and groups[0]["status"] == "compiled", groups
    assert groups[0]["float32_outputs"] == ["c"]
    got = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, e in zip(got, expected, strict=True):
        assert_bitwise_equal(g, e)
