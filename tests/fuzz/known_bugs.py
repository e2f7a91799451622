"""Bugs the fuzzer has found and that are pinned by a regression (tests/fuzz/regressions/).

Each bug names:
- `exclusions`: the generator patterns (graphs.GeneratorConfig.exclude) that avoid it, so the
  fixed-seed slice in `make test` stays green without dropping whole op families;
- `matches`: whether a finding is an instance of it: the failing output's upstream graph holds
  the bug's structural pattern and the finding has the bug's symptom. A campaign counts those as
  known; anything else is new and fails `make fuzz`;
- `regressions`: the minimised cases (file stems) that show it, run by test_fuzz_regressions.py,
  xfail(strict) until the compiler is fixed (`fixed=True` then makes them plain tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx
from onnx import numpy_helper

from onnxfuse.codegen.float16_as_onnxruntime import FLOAT32_OPS, ISOLATABLE_OPS

from .execute import upstream_nodes

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}
INT_TYPES = {onnx.TensorProto.INT32, onnx.TensorProto.INT64}


class Cone:
    """The nodes upstream of one output of a component, with what a pattern needs to ask."""

    def __init__(self, model: onnx.ModelProto, output: str):
        producers = {o: n for n in model.graph.node for o in n.output}
        self.nodes = list(upstream_nodes(producers, output))
        self.producers = producers
        self.readers: dict[str, int] = {}  # value -> how many nodes of the whole component read it
        for n in model.graph.node:
            for i in set(n.input):
                self.readers[i] = self.readers.get(i, 0) + 1
        self.constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        inferred = onnx.shape_inference.infer_shapes(model)
        values = list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)
        self.types = {v.name: v.type.tensor_type.elem_type for v in values}
        self.shapes = {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param
                                for d in v.type.tensor_type.shape.dim] for v in values}

    def ops(self, *op_types: str) -> list[onnx.NodeProto]:
        return [n for n in self.nodes if n.op_type in op_types]

    def float_to_int_casts(self) -> list[onnx.NodeProto]:
        return [n for n in self.ops("Cast") if self.types.get(n.input[0]) in FLOAT_TYPES
                and n.attribute[0].i in INT_TYPES]

    def add_sub_operands(self, name: str) -> set[str]:
        n = self.producers.get(name)
        return set(n.input) if n is not None and n.op_type in ("Add", "Sub") else set()


@dataclass(frozen=True)
class KnownBug:
    name: str
    summary: str
    exclusions: tuple[str, ...]
    regressions: tuple[str, ...]
    matches: Callable[[Cone, str, str], bool]  # (cone, finding kind, finding detail)
    fixed: bool = False


def _reassociates(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("exact", "inf", "value", "nan") and any(
        (cone.add_sub_operands(n.input[0]) | {n.input[0]}) & (cone.add_sub_operands(n.input[1]) | {n.input[1]})
        for n in cone.ops("Add", "Sub"))


def _folds_nan(cone: Cone, kind: str, detail: str) -> bool:
    self_sub = any(n.input[0] == n.input[1] for n in cone.ops("Sub"))
    times_zero = any(any(i in cone.constants and (cone.constants[i] == 0).any() for i in n.input) for n in cone.ops("Mul"))
    return kind in ("nan", "exact", "value", "inf") and (self_sub or times_zero)


def _reduces_infinite_row(cone: Cone, kind: str, detail: str) -> bool:
    infinite = "inf" in detail or "nan" in detail  # the row's ±inf, or what follows from it, on one side
    return kind in ("exact", "inf", "value", "nan") and infinite and bool(cone.ops("ReduceMin", "ReduceMax"))


def _casts_nan(cone: Cone, kind: str, detail: str) -> bool:
    return kind != "crash" and bool(cone.float_to_int_casts())


def _clips_inf(cone: Cone, kind: str, detail: str) -> bool:
    missing_bound = any(len(n.input) < 3 or not n.input[1] or not n.input[2] for n in cone.ops("Clip"))
    return kind in ("exact", "inf", "value", "nan") and missing_bound


def _erf_minus_input(cone: Cone, kind: str, detail: str) -> bool:
    erf_of = {n.output[0]: n.input[0] for n in cone.ops("Erf")}
    return kind in ("nan", "exact", "value", "inf") and any(
        erf_of.get(a) == b or erf_of.get(b) == a for n in cone.ops("Add", "Sub") for a, b in [n.input[:2]])


def _float16_unrounded(cone: Cone, kind: str, detail: str) -> bool:
    float16_ops = [n for n in cone.nodes if cone.types.get(n.output[0]) == onnx.TensorProto.FLOAT16]
    return kind in ("exact", "value") and "float16" in detail and len(float16_ops) >= 2


def _float16_forks(cone: Cone, kind: str, detail: str) -> bool:
    """A float16 value onnxruntime computes in float32 and that several nodes read, or a Cast reads
    (a Cast producing only a graph output stays out of the group): where the fusion plan cuts
    groups, so the value leaves its group rounded."""
    computed = FLOAT32_OPS | ISOLATABLE_OPS
    cast_read = {i for n in cone.ops("Cast") for i in n.input}
    return kind in ("exact", "inf", "value", "nan") and any(
        n.op_type in computed and cone.types.get(o) == onnx.TensorProto.FLOAT16
        and (cone.readers.get(o, 0) >= 2 or o in cast_read)
        for n in cone.nodes for o in n.output)


def _sigmoid_tail(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("nan", "inf", "value", "exact") and bool(cone.ops("Sigmoid"))


def _float64_tanh(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("nan", "inf", "value", "exact") and any(
        cone.types.get(n.output[0]) == onnx.TensorProto.DOUBLE for n in cone.ops("Tanh"))


def _integer_abs_compared(cone: Cone, kind: str, detail: str) -> bool:
    return kind == "value" and any(cone.types.get(n.output[0]) in INT_TYPES for n in cone.ops("Abs")) and bool(
        cone.ops("Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal", "Max", "Min"))


def _gather_elements_unchecked(cone: Cone, kind: str, detail: str) -> bool:
    def along_axis_of_one(n):
        shape, axis = cone.shapes.get(n.input[0], []), next((a.i for a in n.attribute if a.name == "axis"), 0)
        return bool(shape) and shape[axis] == 1
    return kind == "missed-error" and "running GatherElements node" in detail and any(
        along_axis_of_one(n) for n in cone.ops("GatherElements"))


def _contracts_mul_add(cone: Cone, kind: str, detail: str) -> bool:
    products = {n.output[0] for n in cone.ops("Mul")}
    return kind in ("exact", "value") and any(set(n.input) & products for n in cone.ops("Add", "Sub"))


def _reduces_empty_batch(cone: Cone, kind: str, detail: str) -> bool:
    def over_batch(n):
        axes = cone.constants.get(n.input[1]) if len(n.input) > 1 else None
        axes = axes if axes is not None else next((a.ints for a in n.attribute if a.name == "axes"), None)
        return axes is None or 0 in list(axes)
    return kind != "crash" and any(over_batch(n) for n in cone.ops(*REDUCTIONS))


def _softplus_underflows(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("inf", "nan", "value", "exact") and bool(cone.ops("Softplus"))


def _float16_cast_boundary(cone: Cone, kind: str, detail: str) -> bool:
    """A Cast to float16 whose float16 result float32-computed nodes read (onnxruntime drops the
    rounding with the Cast pair it inserts)."""
    casts = {n.output[0] for n in cone.ops("Cast") if cone.types.get(n.output[0]) == onnx.TensorProto.FLOAT16}
    return kind in ("exact", "value", "nan", "inf") and any(
        n.op_type in FLOAT32_OPS and set(n.input) & casts for n in cone.nodes)


def _float16_isolated_reader(cone: Cone, kind: str, detail: str) -> bool:
    """A float16 node onnxruntime isolates (runs in float32) because it reads a float32-computed
    node's result: cut at a group boundary, the group model sees a graph input there instead."""
    producers = {o: n for n in cone.nodes for o in n.output}
    return kind in ("nan", "value", "exact", "inf") and any(
        n.op_type in ISOLATABLE_OPS and cone.types.get(n.output[0]) == onnx.TensorProto.FLOAT16
        and any(producers.get(i) is not None and producers[i].op_type in FLOAT32_OPS for i in n.input)
        for n in cone.nodes)


def _float16_sign_of_nan(cone: Cone, kind: str, detail: str) -> bool:
    return kind == "nan" and any(cone.types.get(n.output[0]) == onnx.TensorProto.FLOAT16 for n in cone.ops("Sign"))


def _cast_int_to_float16(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("nan", "inf", "value") and any(
        cone.types.get(n.output[0]) == onnx.TensorProto.FLOAT16 and cone.types.get(n.input[0]) in INT_TYPES
        for n in cone.ops("Cast"))


def _erf_of_tiny(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("nan", "inf", "value") and bool(cone.ops("Erf"))


def _gemm_scaled(cone: Cone, kind: str, detail: str) -> bool:
    def scaled(n):
        return any(a.name == "alpha" and a.f != 1.0 for a in n.attribute)
    return kind in ("nan", "inf", "value") and any(scaled(n) for n in cone.ops("Gemm"))


def _where_negative_zero(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("inf", "value", "exact") and bool(cone.ops("Where"))


def _single_product_zero(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("inf", "value", "exact") and bool(cone.ops("MatMul", "Gemm")) and bool(cone.ops("Div", "Reciprocal", "Pow"))


def _layernorm_of_huge_row(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("nan", "inf", "value") and bool(cone.ops("LayerNormalization"))


def _integer_minmax_identity(cone: Cone, kind: str, detail: str) -> bool:
    return kind == "value" and any(cone.types.get(n.output[0]) in INT_TYPES for n in cone.ops("Min", "Max"))


def _integer_wraps(cone: Cone, kind: str, detail: str) -> bool:
    ints = [n for n in cone.nodes if cone.types.get(n.output[0]) in INT_TYPES]
    return kind == "value" and any(n.op_type in ("Neg", "Sub", "Add", "Mul", "Abs") for n in ints) and any(
        n.op_type in ("ReduceMax", "ReduceMin", "Max", "Min") for n in ints)


def _gather_cut_away(cone: Cone, kind: str, detail: str) -> bool:
    return kind == "missed-error" and "Gather" in detail and bool(cone.ops("Slice", "Split"))


def _exp_flushes(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("inf", "nan", "value") and bool(cone.ops("Softmax", "LogSoftmax", "Exp", "Sigmoid")) and bool(
        cone.ops("Log", "Div", "Reciprocal"))


def _max_of_one_element(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("nan", "exact", "value") and any(
        cone.shapes.get(i) == [1] for n in cone.ops("Max", "Min") for i in n.input)


def _sums_zero_row(cone: Cone, kind: str, detail: str) -> bool:
    return kind in ("inf", "exact", "value") and bool(cone.ops("ReduceSum", "ReduceMean"))


def _crashes_in_gathers(cone: Cone, kind: str, detail: str) -> bool:
    return kind == "crash" and bool(cone.ops("GatherElements")) and bool(cone.ops("Gather"))


REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")

KNOWN_BUGS = (
    KnownBug("nan-unsafe-folding",
             "x - x folds to 0 and a * 0 to 0, wrong where x or a is NaN or ±inf (ONNX: NaN)",
             ("self-cancel-folded", "mul-by-zero-folded"), ("sub-self-nan", "mul-zero-nan"), _folds_nan, fixed=True),
    KnownBug("float-reassociation",
             "TVM's simplifier reassociates float adds: (a + b) - b becomes a (1 instead of 0 for a=1, b=1e8), "
             "a - (b + a) becomes -b (-3e38 instead of -inf)",
             ("float-reassociation",), ("reassociation-cancellation", "reassociation-overflow"), _reassociates, fixed=True),
    KnownBug("reduce-minmax-infinite-row",
             "ReduceMin over a row of +inf gives 3.4e38 and ReduceMax over -inf -3.4e38: the reduction starts "
             "from the type's largest finite value, not from ±inf",
             ("reduce-minmax-infinite-row",), ("reduce-minmax-inf-row",), _reduces_infinite_row, fixed=True),
    KnownBug("clip-default-max",
             "Clip without max leaves +inf (and without min -inf) where the spec's default bound is the type's "
             "largest (lowest) finite value, as onnxruntime clamps",
             ("clip-without-max",), ("clip-default-max-inf", "clip-default-max-float16"), _clips_inf, fixed=True),
    KnownBug("erf-nan-select-folded",
             "Erf(x) - x is 0 for NaN x: the NaN-keeping select around the fast erf, select(isnan(x), x, erf(x)), "
             "meets the subtraction and x - x folds to 0",
             ("erf-minus-input",), ("erf-minus-input-nan",), _erf_minus_input, fixed=True),
    KnownBug("float16-excess-precision",
             "float16 arithmetic rounded to float16 after every op, where onnxruntime's CPU provider (no float16 "
             "kernel for most ops) computes a chain of them in float32 and rounds once: chains differ in the last bit",
             ("float16-arithmetic",), ("float16-excess-precision",), _float16_unrounded, fixed=True),
    KnownBug("gatherelements-axis-of-one",
             "GatherElements along an axis of size 1 returns a value for an out-of-range index (-2, 1) where "
             "onnxruntime raises; along wider axes the kernel's index check raises",
             ("gatherelements-axis-of-one",), ("gatherelements-axis-of-one",), _gather_elements_unchecked, fixed=True),
    KnownBug("fma-contraction",
             "x * y + z becomes a fused multiply-add: no rounding of the product, unlike ONNX and onnxruntime, "
             "so Mul → Add/Sub chains differ in the last bit",
             ("mul-feeds-add",), ("fma-contraction",), _contracts_mul_add, fixed=True),
    KnownBug("reduce-empty-batch",
             "a reduction over the batch axis of an empty batch leaves its output unwritten (stale values of an "
             "earlier call) where the sum of nothing is 0 and the max -inf",
             ("reduce-over-batch",), ("reduce-empty-batch",), _reduces_empty_batch, fixed=True),
    KnownBug("float16-sign-nan",
             "Sign of a float16 NaN was NaN where onnxruntime's float16 Sign gives 0 (its float32 and float64 Sign "
             "give NaN)",
             (), ("float16-sign-nan",), _float16_sign_of_nan, fixed=True),
    KnownBug("cast-int64-float16-add",
             "Cast int64 -> float16 of INT64_MAX, then Add of -inf: the kernel rounded the cast to float16 (+inf) "
             "and gave NaN; onnxruntime gives -inf: its float16 Add runs in float32 and its Cast(int64 -> float16) "
             "read only by such nodes becomes Cast(int64 -> float32), 9.2e18 (float16_as_onnxruntime models it)",
             (), ("cast-int64-float16-add",), _cast_int_to_float16, fixed=True),
    KnownBug("float16-group-boundary",
             "a float16 value computed in float32 by onnxruntime (a float32 node's result, or an isolated Clip/Max) "
             "left its group as a float16 tensor, rounded, where onnxruntime's next float32 nodes read it unrounded: "
             "at overflow the shipped check's random inputs did not see it (65504 or -0.0 where onnxruntime gives inf), nor a "
             "Cast to int of a float16 sum that rounds across an integer (77 where onnxruntime casts 76.99 to 76); such "
             "values now cross as float32 (codegen/float16_boundaries.py)",
             (), ("float16-boundary-clip-overflow", "float16-boundary-pow-less", "float16-boundary-reducesum-cast"),
             _float16_forks, fixed=True),
    KnownBug("float16-cast-boundary",
             "a group ending in Cast(float32 -> float16) whose result onnxruntime's float32-computed nodes read "
             "(Reciprocal, Sin): onnxruntime removes the Cast with the one back to float32 it inserts, so they read the "
             "float32 value unrounded; the group's output is rounded float16 (one float16 ulp off, and inf -> Sin NaN "
             "where onnxruntime's value stays finite). Fuzzer, November 26, seed 95; float16_boundaries.py now "
             "carries the Cast's source out as float32",
             (), ("float16-cast-boundary",), _float16_cast_boundary, fixed=True),
    KnownBug("float16-isolated-across-boundary",
             "a float16 Sign (an op with a float16 kernel) reading a float16 Sigmoid's result: onnxruntime runs the "
             "Sign in float32 (isolated between float32 nodes), so Sign(NaN) is NaN; with the Sigmoid in one group "
             "and the Sign in another, the Sign's group model reads a graph input, the isolation is not seen, and "
             "its float16 Sign gives 0 (fuzzer, November 26, seed 95). Needs the group model to know which inputs "
             "a float32-computed node produces outside it",
             (), (), _float16_isolated_reader),
    KnownBug("sigmoid-tail-zero",
             "Sigmoid(-78.5) was 8.6e-35 where onnxruntime's is exactly 0 (its float32 sigmoid clamps the input "
             "to -18, its float64 one is 0 below -36.74), so Sigmoid -> Cast -> MatMul with an inf weight gave inf "
             "where onnxruntime gives NaN",
             (), ("sigmoid-tail-zero",), _sigmoid_tail, fixed=True),
    KnownBug("float64-tanh-near-zero",
             "float64 Tanh near 0 lost its relative precision (TVM's (1 - e^-2|x|) / (1 + e^-2|x|): 7,000 ulps at "
             "1.5e-5, 0 below 1e-16), so Reciprocal(Tanh(MatMul)) was -66161.65964974 for -66161.65964984",
             (), ("float64-tanh-near-zero",), _float64_tanh, fixed=True),
    KnownBug("integer-abs-wrap",
             "int64 Abs(x) < -3 is False for x = INT64_MIN where onnxruntime's Abs wraps INT64_MIN to itself and "
             "gives True: the kernel's Abs, select(0 <= x, x, 0 - x), became a branch in the scalar tail, and under "
             "x < 0 LLVM took the nsw 0 - x as positive through the fence (legalize.py now writes max(x, 0 - x))",
             (), ("int64-abs-min-less",), _integer_abs_compared, fixed=True),
    KnownBug("sigmoid-scattered-zero",
             "float32 Sigmoid between -18 and -15.8: onnxruntime's (MLAS, FMA kernel) is max(x p(x^2) / q(x^2) + 0.5, 0) "
             "with x clamped to [-18, 18], which rounds to exactly 0 at scattered inputs there (43,065 of 300,001 "
             "evenly spaced); ours was 1 / (1 + exp(-x)), 0 only from -18 down, so Sigmoid * inf was inf where "
             "onnxruntime gives NaN (fuzzer, November 26, seed 81). fast_math now computes onnxruntime's rational "
             "form, clamped per ISA level as onnxruntime's kernel for those CPUs does (sigmoid_clamp.py)",
             (), ("sigmoid-scattered-zero",), _sigmoid_tail, fixed=True),
    KnownBug("layernorm-huge-row",
             "LayerNormalization of a row of values near 3e38 (Min(3e38, x) first): onnxruntime's row mean stays finite "
             "and the output is beta; ours summed in float32 and gave NaN (fuzzer, November 26, seed 81). "
             "layer_norm.py now computes onnxruntime's statistics: Welford's update for rows under 8, a float64 "
             "mean from 8 on",
             (), ("layernorm-huge-row", "layernorm-huge-row-wide"), _layernorm_of_huge_row, fixed=True),
    KnownBug("gemm-alpha-overflow",
             "Gemm with alpha 0.5 of a row holding -3.4e38 (a Clip of -inf): TVM's importer scaled A by alpha before "
             "the product, so the product stayed finite where onnxruntime's overflows to inf (Cos: 0.80 for NaN; "
             "onnx_semantics.py rule 7 now scales the product)",
             (), ("gemm-alpha-overflow",), _gemm_scaled, fixed=True),
    KnownBug("single-product-negative-zero",
             "MatMul over K = 1 of x = -0.0 then 1e8 / it: onnxruntime's GEMM sums from +0.0, so +inf; the kernel's "
             "single product kept -0.0 and gave -inf (fuzzer, November 26, seed 92; onnx_semantics.py rule 9 adds "
             "+0.0)",
             (), ("single-product-negative-zero",), _single_product_zero, fixed=True),
    KnownBug("where-negative-zero",
             "Where(c, x, y) picking x = -0.0, then Pow(-1): -inf where onnxruntime gives +inf; onnxruntime's "
             "float Where returns +0.0 for a -0.0 of its first branch (off-spec; onnx_semantics.py rule 8 "
             "reproduces it)",
             (), ("where-negative-zero",), _where_negative_zero, fixed=True),
    KnownBug("erf-tiny-input",
             "Erf(Erf(x)) * y with x = 1e-45, y = inf: the fast erf gave 0 for a subnormal x (its polynomial "
             "multiplies x by a coefficient near 1e-4 first) where onnxruntime gives 1e-45, so NaN instead of inf",
             (), ("erf-denormal-times-inf",), _erf_of_tiny, fixed=True),
    KnownBug("softplus-underflow",
             "Softplus(x) is 0 for x below about -17 (log(1 + exp(x)) with 1 + exp(x) rounded to 1) where "
             "onnxruntime gives about exp(x); a reciprocal of it is then inf instead of up to 1e37",
             ("softplus",), ("softplus-underflow",), _softplus_underflows, fixed=True),
    KnownBug("integer-minmax-identity",
             "TVM's simplifier rewrote int32 b - Min(a, b) to max(b - a, 0), whose b - a overflows where the model's "
             "arithmetic does not (2147483647 where onnxruntime gives 0)",
             (), ("int-min-identity-overflow",), _integer_minmax_identity, fixed=True),
    KnownBug("integer-wrap-assumed-away",
             "int64 ReduceMax(Neg(x)) over a row with INT64_MIN gave INT64_MIN where onnxruntime wraps and gives "
             "the row's true max: TVM emits signed arithmetic as no-signed-wrap, so LLVM rewrote through it",
             (), ("int-neg-max-wrap", "int-add-compare-wrap", "int-neg-through-memory"), _integer_wraps, fixed=True),
    KnownBug("gather-sliced-away-index",
             "an out-of-range Gather index in elements a Slice drops was never checked: the kernel computed only the "
             "kept elements and returned where onnxruntime gathers all and raises",
             (), ("gather-sliced-away-index",), _gather_cut_away, fixed=True),
    KnownBug("fast-exp-flush",
             "the fast exp (softmax, exp, sigmoid) flushed results below 2.4e-38 to 0, where onnxruntime returns "
             "denormals: Log(Softmax) of a logit 100 below the max was -inf instead of -100",
             (), ("softmax-denormal-log",), _exp_flushes, fixed=True),
    KnownBug("max-nan-scalar-input",
             "Max(in, x) with `in` a one-element input holding NaN gave x (the input was taken for a Clip bound, "
             "NaN meaning no bound) where onnxruntime gives NaN",
             (), ("max-nan-scalar-input",), _max_of_one_element, fixed=True),
    KnownBug("sum-positive-zero-start",
             "a float sum started from +0.0, so a row of -0.0 summed to +0.0 where onnxruntime gives -0.0 "
             "(1 / ReduceMean of it +inf instead of -inf)",
             (), ("reduce-sum-negative-zero",), _sums_zero_row, fixed=True),
    KnownBug("gather-gatherelements-segfault",
             "GatherElements over a Gather (int32, indices from an input): an index of 2^40 crashed the kernel "
             "(SIGSEGV) where onnxruntime raises; the check of the GatherElements index and of the Gather index "
             "read through it were one non-short-circuit condition, so the read came before its own check",
             (), ("gather-gatherelements-segfault", "gatherelements-nested-segfault"), _crashes_in_gathers, fixed=True),
    KnownBug("cast-nan-to-int",
             "Cast float→int64 of NaN/±inf/out of range gives 0 or saturates where onnxruntime gives INT64_MIN "
             "(x86's cvttsd2si); a NaN-derived Gather index then reads a table value where onnxruntime raises",
             ("cast-nan-to-int",), ("cast-nan-int64", "gather-nan-index"), _casts_nan, fixed=True),
    KnownBug("computed-index-missed-error",
             "The fixed-seed slice (component c16: Reciprocal → Split → GatherElements over indices computed by "
             "Floor → Cast) once returned values on one input where onnxruntime raises 'Out of range value in index "
             "tensor'. Not reproduced on the code of November 26: the same component (the slice's seed with the "
             "exclusions of then) matches onnxruntime on 3,000 adversarial input sets, with and without the index "
             "fixes of that day; pinned as a plain regression, and computed indices are back in the slice",
             ("nan-index-gather",), ("computed-index-gatherelements",), _casts_nan, fixed=True),
)


def known_bug_of(model: onnx.ModelProto, output: str, kind: str, detail: str) -> KnownBug | None:
    """The open known bug a finding on `output` of the component `model` is an instance of, if any.
    A finding without an output (an error) is matched against each output's cone. A fixed bug
    matches nothing: a finding that looks like it is a regression, and new."""
    cones = [Cone(model, o) for o in ([output] if output else [o.name for o in model.graph.output])]
    return next((bug for bug in KNOWN_BUGS if not bug.fixed for cone in cones if bug.matches(cone, kind, detail)), None)


def all_exclusions() -> frozenset[str]:
    return frozenset(e for bug in KNOWN_BUGS if not bug.fixed for e in bug.exclusions)


def expected_failure(regression: str) -> KnownBug | None:
    """The unfixed bug a regression file shows, or None if it should pass."""
    return next((b for b in KNOWN_BUGS if regression in b.regressions and not b.fixed), None)
