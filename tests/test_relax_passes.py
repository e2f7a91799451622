"""Each of our Relax passes, before and after, on the module the ONNX importer makes of a tiny
model: the ops the pass removes are there before and gone after, its replacement is there, and
the module still computes what onnxruntime computes (the end-to-end tests live beside each
concern: test_nan_propagation, test_special_values, test_fast_math, test_scalar_operands)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper
from onnx_builder import model, node
from tvm import relax

from onnxfuse.codegen import relax_import
from onnxfuse.codegen.fast_math import EXP_ROUNDER_BITS, FastMath
from onnxfuse.codegen.fold_shape_take import FoldShapeTake
from onnxfuse.codegen.nan_safe_comparisons import NanSafeNegatedComparisons
from onnxfuse.codegen.unfold_stack_reductions import UnfoldStackReductions


def ops(mod: tvm.IRModule) -> list[str]:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            found.append(expr.op.name)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


def run_relax(mod: tvm.IRModule, feeds: dict) -> np.ndarray:
    """`mod` lowered with TVM's default legalization and run on the host."""
    lowered = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.FoldConstant()])(mod)
    ex = tvm.compile(lowered, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    return out.numpy()


def onnxruntime_result(onnx_model, feeds) -> np.ndarray:
    session = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


SPECIAL = np.array([[0.5, np.nan, -np.inf, 3.0], [np.nan, 1.0, 2.0, -0.0]], np.float32)


def test_unfold_stack_reductions_turns_variadic_max_into_elementwise_maximum():
    m = model([node("Max", ["a", "b", "c"], "y")], {"a": (2, 4), "b": (2, 4), "c": (2, 4)}, {"y": (2, 4)})
    before = relax_import._import(m)
    after = relax.transform.DeadCodeElimination()(UnfoldStackReductions()(before))
    assert "relax.stack" in ops(before) and "relax.max" in ops(before)
    assert "relax.stack" not in ops(after) and ops(after).count("relax.maximum") == 2
    rng = np.random.default_rng(0)  # NaN through maximum is nan_propagation's concern, on the TIR
    feeds = {k: rng.standard_normal((2, 4)).astype(np.float32) for k in "abc"}
    np.testing.assert_array_equal(run_relax(after, feeds), np.maximum(np.maximum(feeds["a"], feeds["b"]), feeds["c"]))


@pytest.mark.parametrize("comparison", ["Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_nan_safe_negated_comparisons_are_true_on_nan(comparison):
    bool_out = helper.make_tensor_value_info("y", TensorProto.BOOL, (2, 4))
    m = model([node(comparison, ["a", "b"], "c"), node("Not", ["c"], "y")], {"a": (2, 4), "b": (2, 4)}, {"y": (2, 4)})
    m.graph.output[0].CopyFrom(bool_out)
    before = relax_import._import(m)
    after = NanSafeNegatedComparisons()(before)
    assert "relax.logical_not" in ops(before) and "relax.isnan" not in ops(before)
    assert "relax.logical_not" not in ops(after) and ops(after).count("relax.isnan") == 2
    feeds = {"a": SPECIAL, "b": np.full((2, 4), 1.0, np.float32)}
    np.testing.assert_array_equal(run_relax(after, feeds), onnxruntime_result(m, feeds))


def test_fold_shape_take_reads_a_static_dimension_as_a_constant():
    """With a symbolic batch the shape tensor cannot fold, but its static axis 1 can."""
    indices = helper.make_tensor_value_info("i", TensorProto.INT64, ("N", 3))
    m = model([node("GatherElements", ["x", "i"], "y", axis=1)], {"x": ("N", 5)}, {"y": ("N", 3)})
    m.graph.input.append(indices)
    before = relax_import._import(m)
    after = relax.transform.DeadCodeElimination()(FoldShapeTake()(before))
    assert "relax.shape_to_tensor" in ops(before) and "relax.take" in ops(before)
    assert "relax.take" not in ops(after) and "relax.shape_to_tensor" not in ops(after)
    feeds = {"x": np.arange(10, dtype=np.float32).reshape(2, 5), "i": np.array([[0, -1, 2], [4, -5, 1]], np.int64)}
    np.testing.assert_array_equal(run_relax(after, feeds), onnxruntime_result(m, feeds))


def test_fast_math_replaces_sigmoid_and_keeps_nan_and_infinities():
    m = model([node("Sigmoid", ["x"], "y")], {"x": (2, 4)}, {"y": (2, 4)})
    before = relax_import._import(m)
    after = FastMath()(before)
    assert "relax.sigmoid" in ops(before) and "relax.sigmoid" not in ops(after)
    feeds = {"x": SPECIAL}
    got, want = run_relax(after, feeds), onnxruntime_result(m, feeds)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["softplus", "exported_softmax", "exp", "softmax"])
def test_every_exp_is_onnxruntimes(case):
    """An Exp (alone, in Softplus, in a softmax exported as ops) and the Softmax op's own exp are
    onnxruntime's exp (fast_math.exp_value): the Softmax op sums in onnxruntime's order too
    (fast_math._fast_softmax), so its exps must be onnxruntime's."""
    max_node = node("ReduceMax", ["x"], "m", axes=[1], keepdims=1)
    nodes = {"softplus": [node("Softplus", ["x"], "y")],
             "exported_softmax": [max_node, node("Sub", ["x", "m"], "d"), node("Exp", ["d"], "y")],
             "exp": [node("Exp", ["x"], "y")],
             "softmax": [node("Softmax", ["x"], "y", axis=1)]}[case]
    m = model(nodes, {"x": (2, 4)}, {"y": (2, 4)}, opset=17)
    script = relax_import.import_group(m, "k").prim_func.script()
    assert str(EXP_ROUNDER_BITS) in script
