"""The regression corpus: minimised failing cases, `regressions/<name>.onnx` + `<name>.npz` (inputs).

Cases come from the minimiser (a fuzzer finding) or from `HANDWRITTEN` (bugs reported before the
fuzzer existed, each confirmed by it or by hand: the smallest graph that onnxfuse fuses and
that shows the bug; `python -m fuzz.regressions` rewrites their files). known_bugs.py says
which bug each case shows; test_fuzz_regressions.py runs them all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graphs import OPSET

DIRECTORY = Path(__file__).with_name("regressions")
NAN, INF = np.nan, np.inf


def save(name: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]]) -> None:
    """One input set is stored by input name; several (run in order, in one session) as `<i>:<name>`."""
    DIRECTORY.mkdir(exist_ok=True)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, DIRECTORY / f"{name}.onnx")
    arrays = feeds if isinstance(feeds, dict) else {f"{i}:{k}": v for i, f in enumerate(feeds) for k, v in f.items()}
    np.savez(DIRECTORY / f"{name}.npz", **arrays)


def load(name: str) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """The model and its input sets."""
    sets: dict[str, dict] = {}
    with np.load(DIRECTORY / f"{name}.npz") as data:
        for key in data.files:
            number, _, input_name = key.rpartition(":")
            sets.setdefault(number, {})[input_name] = data[key]
    return onnx.load(DIRECTORY / f"{name}.onnx"), [sets[k] for k in sorted(sets, key=lambda k: int(k or 0))]


def names() -> list[str]:
    return sorted(p.stem for p in DIRECTORY.glob("*.onnx"))


def rename(model: onnx.ModelProto, feed_sets: list[dict], prefix: str) -> tuple[onnx.ModelProto, list[dict]]:
    """Every value, node and initializer name prefixed, so several cases fit in one model."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for n in g.node:
        n.name = prefix + n.name
        n.input[:] = [prefix + i if i else i for i in n.input]
        n.output[:] = [prefix + o for o in n.output]
    for v in list(g.input) + list(g.output) + list(g.value_info) + list(g.initializer):
        v.name = prefix + v.name
    return m, [{prefix + k: v for k, v in feeds.items()} for feeds in feed_sets]


# -- hand-written cases --------------------------------------------------------------------------

def _model(nodes, inputs: dict, outputs: dict, inits: dict | None = None) -> onnx.ModelProto:
    """inputs/outputs: name → (onnx elem type, shape)."""
    graph = helper.make_graph(
        [helper.make_node(op, ins, [out], name=out, **attrs) for op, ins, out, attrs in nodes], "regression",
        [helper.make_tensor_value_info(k, t, s) for k, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(k, t, s) for k, (t, s) in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


F16, F32, I32, I64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
ROW = ("N", 4)


def _row(*values, dtype=np.float32) -> np.ndarray:
    return np.array([values], dtype)


def _float16_cast_boundary():
    """Split (two outputs: _model makes one-output nodes) -> Cast to float16 -> Reciprocal, Sin."""
    m = _model([("Cast", ["b"], "c", {"to": F16}), ("Reciprocal", ["c"], "r", {}), ("Sin", ["c"], "s", {})],
               {"x": (F32, ("N", 4))}, {"r": (F16, ("N", 2)), "s": (F16, ("N", 2)), "a": (F32, ("N", 2))},
               {"halves": np.array([2, 2], np.int64)})
    m.graph.node.insert(0, helper.make_node("Split", ["x", "halves"], ["a", "b"], name="split", axis=-1))
    return m, {"x": np.array([[1, 2, 70000, -3.3333], [0, 0, 0.1234567, 1e-3]], np.float32)}


HANDWRITTEN = {
    # (a + b) - b with a=1, b=1e8: onnxruntime 0 (1e8 + 1 rounds to 1e8), reassociated 1.
    "reassociation-cancellation": lambda: (
        _model([("Add", ["a", "b"], "s", {}), ("Sub", ["s", "b"], "y", {})], {"a": (F32, ROW), "b": (F32, ROW)},
               {"y": (F32, ROW)}),
        {"a": _row(1, 1, -1, 3), "b": _row(1e8, -1e8, 1e8, 1e9)}),
    # a - (b + a) with a = b = 3e38: b + a overflows, so -inf; reassociated -b = -3e38.
    "reassociation-overflow": lambda: (
        _model([("Add", ["b", "a"], "s", {}), ("Sub", ["a", "s"], "y", {})], {"a": (F32, ROW), "b": (F32, ROW)},
               {"y": (F32, ROW)}),
        {"a": _row(3e38, -3e38, 3e38, 2e38), "b": _row(3e38, -3e38, 1e38, 3e38)}),
    # n - n for n = -x: NaN where x is NaN or ±inf.
    "sub-self-nan": lambda: (
        _model([("Neg", ["x"], "n", {}), ("Sub", ["n", "n"], "y", {})], {"x": (F32, ROW)}, {"y": (F32, ROW)}),
        {"x": _row(NAN, INF, -INF, 1)}),
    # a * 0 + b: NaN where a is NaN or ±inf, b elsewhere.
    "mul-zero-nan": lambda: (
        _model([("Mul", ["a", "zero"], "z", {}), ("Add", ["z", "b"], "y", {})], {"a": (F32, ROW), "b": (F32, ROW)},
               {"y": (F32, ROW)}, {"zero": np.array(0, np.float32)}),
        {"a": _row(NAN, INF, -INF, 1), "b": _row(5, 5, 5, 5)}),
    # -ReduceMin over a row of +inf is -inf, -ReduceMax over a row of -inf is +inf.
    "reduce-minmax-inf-row": lambda: (
        _model([("ReduceMin", ["x"], "lo", {"axes": [1], "keepdims": 1}), ("Neg", ["lo"], "y_min", {}),
                ("ReduceMax", ["x"], "hi", {"axes": [1], "keepdims": 1}), ("Neg", ["hi"], "y_max", {})],
               {"x": (F32, ROW)}, {"y_min": (F32, ("N", 1)), "y_max": (F32, ("N", 1))}),
        {"x": np.array([[INF] * 4, [-INF] * 4, [INF, 1, 2, 3]], np.float32)}),
    # (a * b) * a in float16: onnxruntime has no float16 Mul and computes the chain in float32,
    # rounding once; a kernel rounding after each Mul differs in the last bit, 72 of 256 here.
    "float16-excess-precision": lambda: (
        _model([("Mul", ["a", "b"], "m", {}), ("Mul", ["m", "a"], "y", {})], {"a": (F16, ROW), "b": (F16, ROW)},
               {"y": (F16, ROW)}),
        {k: np.random.default_rng(seed).standard_normal((64, 4)).astype(np.float16) for k, seed in (("a", 0), ("b", 1))}),
    # GatherElements along an axis of size 1 with index -2 (or 1): out of range, so onnxruntime raises;
    # along a wider axis the kernel's index check raises too, here it does not.
    "gatherelements-axis-of-one": lambda: (
        _model([("Tanh", ["x"], "t", {}), ("GatherElements", ["t", "i"], "y", {"axis": 1})],
               {"x": (F32, ("N", 1)), "i": (I64, ("N", 3))}, {"y": (F32, ("N", 3))}),
        {"x": np.ones((1, 1), np.float32), "i": np.array([[0, -2, 0]], np.int64)}),
    # x * y + z: ONNX rounds the product before the sum (onnxruntime does); a fused multiply-add
    # does not, and differs in the last bit (68 of 256 here).
    "fma-contraction": lambda: (
        _model([("Mul", ["x", "w"], "m", {}), ("Add", ["m", "z"], "y", {})],
               {"x": (F32, ROW), "w": (F32, ROW), "z": (F32, ROW)}, {"y": (F32, ROW)}),
        {k: (np.random.default_rng(seed).standard_normal((64, 4)) * 1000).astype(np.float32)
         for k, seed in (("x", 0), ("w", 1), ("z", 2))}),
    # A sum over the batch axis of an empty batch is 0; the kernel's row loop never runs and leaves
    # the output as it was: after a batch of 3 summing to 32.4, a batch of 0 gives 32.4 again.
    "reduce-empty-batch": lambda: (
        _model([("Gather", ["table", "i"], "g", {"axis": 0}), ("ReduceSum", ["g", "axes"], "r", {"keepdims": 1}),
                ("Neg", ["r"], "y", {})],
               {"i": (I64, ("N", 3))}, {"y": (F32, (1, 1))},
               {"table": np.array([-3.6, -8.36], np.float32), "axes": np.array([0, 1], np.int64)}),
        [{"i": np.zeros((3, 3), np.int64)}, {"i": np.zeros((0, 3), np.int64)}]),
    # 1 / Softplus(x) for x <= -20: Softplus is about exp(x) there (onnxruntime: 2.06e-9 at -20), but
    # log(1 + exp(x)) rounds 1 + exp(x) to 1 and gives 0, so the reciprocal is inf.
    "softplus-underflow": lambda: (
        _model([("Softplus", ["x"], "s", {}), ("Reciprocal", ["s"], "y", {})], {"x": (F32, ROW)}, {"y": (F32, ROW)}),
        {"x": _row(-20, -50, -84.85, 1)}),
    # Clip without max: the spec's default max is the type's largest value, so +inf becomes 3.4e38
    # (onnxruntime does; onnx's own reference evaluator leaves inf: test_fuzz_slice.py pins both).
    "clip-default-max-inf": lambda: (
        _model([("Clip", ["x", "lo"], "c", {}), ("Neg", ["c"], "y", {})], {"x": (F32, ROW)}, {"y": (F32, ROW)},
               {"lo": np.array(-1, np.float32)}),
        {"x": _row(INF, -INF, NAN, 3e38)}),
    # The same in float16 (the fuzzer: Clip(x, -1.5) → Reshape): onnxruntime clamps +inf to 65504.
    "clip-default-max-float16": lambda: (
        _model([("Clip", ["x", "lo"], "c", {}), ("Neg", ["c"], "y", {})], {"x": (F16, ROW)}, {"y": (F16, ROW)},
               {"lo": np.array(-1.5, np.float16)}),
        {"x": _row(INF, -INF, NAN, 65504, dtype=np.float16)}),
    # b - Min(a, b) in int32 (the fuzzer: in4 - Min(in1 + (in1 - in1), in4)): onnxruntime wraps only
    # where the model does, 0 here; TVM's simplifier rewrote it to max(b - a, 0), and b - a overflows.
    "int-min-identity-overflow": lambda: (
        _model([("Min", ["a", "b"], "m", {}), ("Sub", ["b", "m"], "y", {})], {"a": (I32, ROW), "b": (I32, ROW)},
               {"y": (I32, ROW)}),
        {"a": _row(2147483647, 5, 2000000000, -3, dtype=np.int32), "b": _row(-2, 7, -2000000000, -3, dtype=np.int32)}),
    # ReduceMax(Neg(x)) in int64 over a row holding INT64_MIN: onnxruntime wraps -INT64_MIN to INT64_MIN
    # and the max is 5; the kernel gives INT64_MIN (TVM marks signed arithmetic no-signed-wrap, so LLVM
    # may compute max(-a, -b) as -min(a, b)).
    "int-neg-max-wrap": lambda: (
        _model([("Neg", ["x"], "n", {}), ("ReduceMax", ["n"], "y", {"axes": [1], "keepdims": 1})],
               {"x": (I64, ROW)}, {"y": (I64, ("N", 1))}),
        {"x": np.array([[1, -5, np.iinfo(np.int64).min, 1], [2, 3, 4, 5]], np.int64)}),
    # Gather whose out-of-range index (7 into 5 rows) sits in a column the Slice drops: onnxruntime
    # gathers every index and raises; the kernel computes only what the Slice keeps, and returns.
    "gather-sliced-away-index": lambda: (
        _model([("Gather", ["table", "i"], "g", {"axis": 0}),
                ("Slice", ["g", "starts", "ends", "axes"], "s", {}), ("Neg", ["s"], "y", {})],
               {"i": (I64, ("N", 3))}, {"y": (F32, ("N", 1))},
               {"table": np.arange(5, dtype=np.float32), "starts": np.array([2], np.int64),
                "ends": np.array([3], np.int64), "axes": np.array([1], np.int64)}),
        {"i": np.array([[7, 0, 1], [0, 1, 2]], np.int64)}),
    # Log(Softmax(x)) with a logit 100 below the row's max: onnxruntime's softmax gives a denormal
    # (3.7e-44) and the log -100; the fast exp (fast_math.py) flushes results below 2.4e-38 to 0, -inf.
    "softmax-denormal-log": lambda: (
        _model([("Softmax", ["x"], "p", {"axis": -1}), ("Log", ["p"], "y", {})], {"x": (F32, ROW)}, {"y": (F32, ROW)}),
        {"x": _row(0, -100, -90, 1)}),
    # Max(in, x) with `in` an input of shape [1] holding NaN (the fuzzer: Max(in6, ReduceSum(MatMul))):
    # onnxruntime gives NaN; the kernel treated the one-element input as a Clip bound, NaN as no bound.
    "max-nan-scalar-input": lambda: (
        _model([("Neg", ["x"], "n", {}), ("Max", ["s", "n"], "y", {})], {"x": (F32, ROW), "s": (F32, (1,))},
               {"y": (F32, ROW)}),
        [{"x": _row(1, -2, 3, NAN), "s": np.array([NAN], np.float32)},
         {"x": _row(1, -2, 3, NAN), "s": np.array([0], np.float32)}]),
    # 1 / ReduceMean over a row of -0.0 (the fuzzer: Div(in, ReduceMean(Split(x)))): onnxruntime's sum
    # is -0.0 and the quotient -inf; a sum started from +0.0 is +0.0, and the quotient +inf.
    "reduce-sum-negative-zero": lambda: (
        _model([("ReduceMean", ["x"], "m", {"axes": [1], "keepdims": 1}), ("Reciprocal", ["m"], "y", {})],
               {"x": (F32, ROW)}, {"y": (F32, ("N", 1))}),
        {"x": np.array([[-0.0] * 4, [0.0, -0.0, -0.0, -0.0], [1, 2, 3, 4]], np.float32)}),
    # GatherElements over a Gather with constant indices (the fuzzer's int32 component, minimised by
    # hand): index 2^40 is out of range and onnxruntime raises; the kernel's check of it and of the
    # Gather's index read from it were one `and`, which TIR evaluates whole, so it loaded the Gather's
    # index 2^40 elements past its table first, and crashed (SIGSEGV).
    "gather-gatherelements-segfault": lambda: (
        _model([("Gather", ["x", "k"], "g", {"axis": 1}), ("GatherElements", ["g", "i"], "y", {"axis": 1})],
               {"x": (I32, ("N", 2)), "i": (I64, ("N", 3))}, {"y": (I32, ("N", 3))},
               {"k": np.array([-1, 0, -1], np.int64)}),
        {"x": np.array([[-1, 5]], np.int32), "i": np.array([[2, 1 << 40, 0]], np.int64)}),
    # Cast float → int64 of NaN, ±inf, 1e30: onnxruntime gives INT64_MIN (x86's "integer indefinite").
    "cast-nan-int64": lambda: (
        _model([("Neg", ["x"], "n", {}), ("Cast", ["n"], "i", {"to": I64}), ("Add", ["i", "one"], "y", {})],
               {"x": (F32, ROW)}, {"y": (I64, ROW)}, {"one": np.array(1, np.int64)}),
        {"x": _row(NAN, INF, -INF, -1e30)}),
    # Gather by Cast(Floor(x)) with x = NaN: the index is INT64_MIN, out of range; onnxruntime raises.
    "gather-nan-index": lambda: (
        _model([("Floor", ["x"], "f", {}), ("Cast", ["f"], "i", {"to": I64}), ("Gather", ["table", "i"], "g", {"axis": 0}),
                ("Neg", ["g"], "y", {})],
               {"x": (F32, ROW)}, {"y": (F32, ROW)}, {"table": np.arange(5, dtype=np.float32)}),
        {"x": _row(NAN, 1, 2, 3)}),
    # float16 across a group boundary (seed-21 findings, rebuilt by hand): Clip's output forks to Abs
    # and Neg, so the group {Mul, Clip} ends there and outputs float16. onnxruntime runs the Clip in
    # float32 (isolated between float32 nodes) and Abs/Neg read it unrounded: 350 * 200 = 70000 is
    # inf once rounded; the kernel rounds the product first and the default max clamps it to 65504.
    "float16-boundary-clip-overflow": lambda: (
        _model([("Mul", ["a", "b"], "p", {}), ("Clip", ["p", "lo"], "q", {}), ("Abs", ["q"], "y1", {}),
                ("Neg", ["q"], "y2", {})],
               {"a": (F16, ROW), "b": (F16, ROW)}, {"y1": (F16, ROW), "y2": (F16, ROW)},
               {"lo": np.array(-1, np.float16)}),
        {"a": _row(350, 2, -300, 256, dtype=np.float16), "b": _row(200, 3, 300, 256, dtype=np.float16)}),
    # The same with Pow: Abs(Pow(a, 2)) leaves its group as float16 (inf for 122500); onnxruntime's
    # Less reads it in float32, 122500 < inf is true and Where picks inf; the kernel's inf < inf is
    # false and it picks -0.0.
    "float16-boundary-pow-less": lambda: (
        _model([("Pow", ["a", "e"], "pw", {}), ("Abs", ["pw"], "q", {}), ("Less", ["q", "c"], "l", {}),
                ("Where", ["l", "c", "z"], "y1", {}), ("Neg", ["q"], "y2", {})],
               {"a": (F16, ROW), "e": (F16, ROW), "c": (F16, ROW), "z": (F16, ROW)},
               {"y1": (F16, ROW), "y2": (F16, ROW)}),
        {"a": _row(350, 2, -300, 1e-4, dtype=np.float16), "e": _row(2, 2, 2, 2, dtype=np.float16),
         "c": _row(INF, INF, INF, INF, dtype=np.float16), "z": _row(-0.0, -0.0, -0.0, -0.0, dtype=np.float16)}),
    # 1 / Tanh(x) in float64 near 0 (the seed-41 finding: Reciprocal(Tanh(MatMul)), MatMul -1.5e-5):
    # onnxruntime -66161.65964984, TVM's (1 - e^-2|x|) / (1 + e^-2|x|) -66161.65964974 (7,000 ulps);
    # at 1e-300 it gave tanh 0 and inf.
    "float64-tanh-near-zero": lambda: (
        _model([("Tanh", ["x"], "t", {}), ("Reciprocal", ["t"], "y", {})], {"x": (TensorProto.DOUBLE, ROW)},
               {"y": (TensorProto.DOUBLE, ROW)}),
        {"x": _row(-1.5114493883143076e-05, 1e-10, 1e-300, 0.3, dtype=np.float64)}),
    # LayerNormalization of rows near the float32 limit (Min(3e38, x) first; fuzzer, seed 81): onnxruntime's
    # row statistics stay finite and the output is beta, where a float32 row sum overflowed to NaN; a
    # row [3e38, -3e38, 0, 0] is NaN in onnxruntime (Welford's update overflows; layer_norm.py).
    "layernorm-huge-row": lambda: (
        _model([("Min", ["x", "big"], "m", {}), ("LayerNormalization", ["m", "scale", "bias"], "n", {"axis": -1}),
                ("Neg", ["n"], "y", {})], {"x": (F32, ROW)}, {"y": (F32, ROW)},
               {"big": np.array(3e38, np.float32), "scale": np.array([2, -1, 0.5, 3], np.float32),
                "bias": np.array([0.25, -2, 1, 0], np.float32)}),
        {"x": np.array([[INF] * 4, [3e38, 3e38, 3e38, 1], [3e38, -3e38, 0, 0], [1e18] * 4, [-3e38, 1, 2, 3]],
                       np.float32)}),
    # The same over rows of 16, onnxruntime's other algorithm (a float64 mean): sixteen copies of
    # 1e18 normalize to 0 (beta); a float32 mean is 1 ulp off and they normalized to ±1.
    "layernorm-huge-row-wide": lambda: (
        _model([("Min", ["x", "big"], "m", {}), ("LayerNormalization", ["m", "scale", "bias"], "n", {"axis": -1}),
                ("Neg", ["n"], "y", {})], {"x": (F32, ("N", 16))}, {"y": (F32, ("N", 16))},
               {"big": np.array(3e38, np.float32), "scale": np.linspace(-2, 2, 16, dtype=np.float32),
                "bias": np.linspace(1, 0, 16, dtype=np.float32)}),
        {"x": np.array([[INF] * 16, [3e38] * 15 + [1], [3e38, -3e38] + [0] * 14, [1e18] * 16, [40000.3] * 16],
                       np.float32)}),
    # 1e8 / (x @ w) over K = 1 with x = -0.0 (seed 92, minimised: Erf -> ReduceMin -> MatMul -> Div):
    # onnxruntime's GEMM sums from +0.0, so +inf for every w; the kernel's lone product kept -0.0.
    "single-product-negative-zero": lambda: (
        _model([("MatMul", ["x", "w"], "m", {}), ("Div", ["big", "m"], "y", {})], {"x": (F32, ("N", 1))},
               {"y": (F32, ("N", 4))}, {"w": np.array([[-1.5, -0.25, 0.5, 2]], np.float32),
                                        "big": np.array(1e8, np.float32)}),
        {"x": np.array([[-0.0], [0.0], [1e-45], [-1e-45], [2]], np.float32)}),
    # Split -> Cast(float32 -> float16) in one group, read by an unfused Reciprocal and Sin (seed 95,
    # minimised): onnxruntime drops the Cast pair, so Sin reads 70000 (finite), not the rounded inf.
    "float16-cast-boundary": lambda: _float16_cast_boundary(),
    # int64 Abs(x) < -3 with x = INT64_MIN (the final seed-41 campaign, minimised: Abs -> Less -> two
    # Slices): onnxruntime's Abs wraps INT64_MIN to itself, so True; the kernel gives False.
    "int64-abs-min-less": lambda: (
        _model([("Abs", ["x"], "a", {}), ("Less", ["a", "k"], "y", {})], {"x": (I64, ROW)},
               {"y": (TensorProto.BOOL, ROW)}, {"k": np.array(-3, np.int64)}),
        {"x": _row(4, np.iinfo(np.int64).min, -3, -1, dtype=np.int64)}),
}


def write_handwritten() -> None:
    for name, build in HANDWRITTEN.items():
        save(name, *build())


if __name__ == "__main__":
    write_handwritten()
    print("\n".join(names()))
