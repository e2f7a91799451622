"""A fixed-seed slice of the fuzzer (`make fuzz` runs the long campaign): one batch of random
components compiled by onnxfuse and checked against onnxruntime on adversarial inputs.

The generator leaves out exactly the patterns of known, unfixed bugs (fuzz/known_bugs.py; each
names its xfail regression in fuzz/regressions/), so this slice is green on today's compiler and
still runs every op family, dtype and input regime. The two onnxruntime behaviours the fuzzer
works around are pinned here, so a change in onnxruntime shows up.
"""

from __future__ import annotations

import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fuzz import regressions
from fuzz.campaign import Tally, fuzz_batch
from fuzz.execute import Case, Job, run_cases
from fuzz.graphs import OPSET, GeneratorConfig
from fuzz.known_bugs import all_exclusions
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

SEED, COMPONENTS = 20261123, 14


def test_fixed_seed_slice_matches_onnxruntime(tmp_path):
    tally = Tally()
    fuzz_batch(SEED, COMPONENTS, GeneratorConfig(exclude=all_exclusions()), tmp_path, tally)
    assert tally.graphs == COMPONENTS
    assert tally.groups_compiled >= COMPONENTS // 2, "too little was fused for the slice to mean anything"
    details = [f"{f.case} {f.kind} {f.output}: {f.detail}" for failure in tally.failures for f in failure.findings]
    assert not details, "\n".join(details)


def _one_node(op, inputs, attrs=None, inits=None, shape=("N", 4)):
    graph = helper.make_graph([helper.make_node(op, list(inputs) + list(inits or {}), ["y"], **(attrs or {}))], "pin",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


def test_onnxruntime_cannot_reshape_an_empty_batch_to_0_minus_1():
    """Why graphs.op_reshape never emits the target (0, -1): on a batch of 0 onnxruntime raises
    (the -1 would be 0 / 0), where a kernel knows the row size and returns [0, 12]."""
    model = _one_node("Reshape", ["x"], inits={"shape": np.array([0, -1], np.int64)}, shape=("N", 3, 4))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((2, 3, 4), np.float32)})[0].shape == (2, 12)
    with pytest.raises(Exception, match="cannot be reshaped|Reshape"):
        session.run(None, {"x": np.ones((0, 3, 4), np.float32)})


def test_clip_without_max_clamps_inf_to_the_largest_float_in_onnxruntime():
    """The spec's default max is numeric_limits::max(); onnxruntime follows it, onnx's reference
    evaluator does not. The fuzzer's reference is onnxruntime, so the kernels' +inf is a bug
    (known_bugs.py: clip-default-max)."""
    model = _one_node("Clip", ["x"], inits={"lo": np.array(-1, np.float32)})
    x = np.array([[np.inf, -np.inf, np.nan, 3e38]], np.float32)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got[0, 0] == np.finfo(np.float32).max and got[0, 1] == -1 and np.isnan(got[0, 2])
    assert ReferenceEvaluator(model).run(None, {"x": x})[0][0, 0] == np.inf


def test_a_crashing_kernel_library_costs_one_case_not_the_run(tmp_path):
    """A fused model that takes its process down (here: a library that aborts when onnxruntime
    registers it) is recorded as a crash of that case; the other cases still run."""
    source = tmp_path / "abort.c"
    source.write_text("#include <stdlib.h>\nvoid *RegisterCustomOps(void *options, const void *api) { abort(); }\n")
    library = tmp_path / "libabort.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    model, feed_sets = regressions.load("sub-self-nan")
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    cases = [Case(name, ["y"], feed_sets) for name in ("first", "second")]
    findings = run_cases(Job(str(path), str(path), str(library), cases))
    assert [(f.case, f.kind, f.detail) for f in findings] == [("first", "crash", "signal SIGABRT"),
                                                              ("second", "crash", "signal SIGABRT")]


def test_onnxruntime_matmul_transpose_fusion_raises_on_an_empty_batch():
    """Why execute.py falls back to an unoptimized reference session when onnxruntime's error names
    one of its own fusions: Transpose → MatMul on a batch of 0 is a [0, 5, 3] tensor, but the
    FusedMatMul onnxruntime rewrites it into raises."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Transpose", ["n"], ["t"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["t", "w"], ["y"])], "pin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ("N", 1, 5)),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, (1, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("N", 5, 3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9).SerializeToString()
    feeds = {"x": np.ones((0, 1, 5), np.float32), "w": np.ones((1, 3), np.float32)}
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert ort.InferenceSession(model, plain, providers=["CPUExecutionProvider"]).run(None, feeds)[0].shape == (0, 5, 3)
    try:
        optimized = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    except Exception as exc:  # onnxruntime 1.31: the fused node raises, and the fallback is needed
        assert "MatmulTransposeFusion" in str(exc)
    else:  # a release that fixed it: the optimized graph then agrees with the unoptimized reference
        assert optimized.shape == (0, 5, 3), f"onnxruntime {ort.__version__}"


def _integer_sum(dtype, proto_type):
    graph = helper.make_graph([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], "g",
                              [helper.make_tensor_value_info("x", proto_type, ["N", 2])],
                              [helper.make_tensor_value_info("y", proto_type, None)],
                              [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_onnxruntime_sums_integers_in_double_and_saturates():
    """Why compare.py (rule 6) does not compare integer sums at the type's limits: onnxruntime's
    int32 sum of [2^30, 2^30] is 2^31 - 1 (two's complement, as numpy and the kernels: -2^31),
    and its int64 sum of [2^53 + 1, 0] is 2^53 (a double's rounding)."""
    int32 = _integer_sum(np.int32, TensorProto.INT32).run(None, {"x": np.array([[2**30, 2**30]], np.int32)})[0]
    assert int32[0] == np.iinfo(np.int32).max
    assert np.array([[2**30, 2**30]], np.int32).sum(axis=1, dtype=np.int32)[0] == np.iinfo(np.int32).min
    int64 = _integer_sum(np.int64, TensorProto.INT64).run(None, {"x": np.array([[2**53 + 1, 0]], np.int64)})[0]
    assert int64[0] == 2**53


def test_out_of_range_float_to_int_casts_are_not_compared():
    """ONNX leaves them undefined; the fuzzer's probe rule skips exactly those input sets."""
    from fuzz.execute import _rule_applies

    rule = ("cast-range", np.int32)
    assert _rule_applies(rule, np.array([3e9, 1.0]))
    assert _rule_applies(rule, np.array([-2147483649.0]))
    assert not _rule_applies(rule, np.array([2147483647.9, -2147483648.5, np.nan, np.inf]))
    assert _rule_applies(("integer-sum", np.int32), np.array([5, np.iinfo(np.int32).max], np.int32))
    assert not _rule_applies(("integer-sum", np.int64), np.array([2**52, -5], np.int64))
    assert _rule_applies(("integer-sum", np.int64), np.array([2**53], np.int64))


def test_comparisons_the_approximation_decides_are_not_compared():
    """compare.py, rule 7: Equal(Erf(x), HardSigmoid(x)) at x = 3.87 is decided by Erf's last ulp
    (onnxruntime 0.99999994, the kernel 1.0); operands further apart than the budget still count."""
    from fuzz.execute import _rule_applies, _uncompared_probes
    from onnx_builder import model, node

    m = model([node("Erf", ["x"], "e"), node("HardSigmoid", ["x"], "h"), node("Equal", ["e", "h"], "y")],
              {"x": ("N", 1)}, {"y": ("N", 1)})
    (rule, outputs), = _uncompared_probes(m)["e"]
    assert rule == ("approximate-compare", "h", "float32") and outputs == {"y"}
    rows = {"h": np.array([[1.0], [0.5]], np.float32)}
    assert _rule_applies(rule, np.array([[0.99999994], [0.9]], np.float32), rows)
    assert not _rule_applies(rule, np.array([[0.999], [0.9]], np.float32), rows)
    exact = model([node("Abs", ["x"], "a"), node("Less", ["a", "x"], "y")], {"x": ("N", 1)}, {"y": ("N", 1)})
    assert "a" not in _uncompared_probes(exact)  # no approximation upstream: compared bit for bit


def test_a_comparison_with_a_constant_operand_is_checked_without_error(tmp_path):
    """Rule 7 reads both operands of the comparison; a weight (initializer) operand is read from the
    model itself (the first seed-94 batches counted the runner's KeyError on one as crashes)."""
    from fuzz.campaign import optimize as fuzz_optimize
    from fuzz.execute import Case, Job, run_cases
    from onnx_builder import model, node

    m = model([node("Erf", ["x"], "e"), node("Equal", ["e", "one"], "y")], {"x": ("N", 1)}, {"y": ("N", 1)},
              {"one": np.array(1.0, np.float32)})
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.BOOL
    onnx.save(m, tmp_path / "m.onnx")
    fused, library, _ = fuzz_optimize(tmp_path / "m.onnx", tmp_path, jobs=1)
    feeds = [{"x": np.array([[3.87], [0.5], [5.0]], np.float32)}]
    assert run_cases(Job(str(tmp_path / "m.onnx"), str(fused), str(library) if library else None,
                         [Case("c", ["y"], feeds)])) == []
