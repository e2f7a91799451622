"""When does a fused output match onnxruntime's? The fuzzer's rule, output by output.

1. Shape and dtype must be equal. Integer and bool outputs must be equal element for element.
2. **Exact outputs** (every op upstream of the output is in EXACT_OPS: IEEE's correctly rounded
   add/sub/mul/div/sqrt, comparisons, min/max, casts, data movement, min/max reductions) must be
   bitwise equal, with two allowances: any NaN equals any NaN (payloads and signs are not ONNX
   semantics), and -0.0 equals +0.0 (ONNX does not specify the sign of a zero from Max/Min/Relu,
   and the kernels may pick either operand on ties).
3. **Approximate outputs** (some op upstream is an approximated transcendental function, which
   onnxfuse replaces with polynomials (codegen/fast_math.py: exp, tanh, erf, sigmoid, softmax;
   about 1-3 ulp each) or calls another libm for (log, sin, cos, pow), or reassociates a sum
   (MatMul, Gemm, ReduceSum/Mean, Softmax, LayerNormalization): NaN exactly where onnxruntime
   has NaN, the same infinities, and finite elements within ULP_BUDGET ulps of onnxruntime's
   value, or within ULP_BUDGET ulps of the largest magnitude among the component's inputs and
   outputs (cancellation: the difference of two large values carries their rounding error). At
   the overflow boundary an infinity matches a finite value of the same sign within that budget
   of the type's largest value. Downstream of a Sin or Cos whose argument comes from such an op,
   the largest magnitude counts that argument too: an argument off by an ulp moves sin/cos by up
   to its magnitude times float's epsilon (seed 41: a MatMul 1 ulp off, squared to 3e5, gave a
   Cos 0.05 off), so past about 8e3 (float32) the result carries nothing to compare.
   The budget (1024 ulps: 1.2e-4 relative for float32) is far above
   the error of any one approximation, so sums and chains of them pass, and far below what the
   bugs it exists to catch produce (a wrong special value, a term folded away). The ulps are
   those of the narrowest float type upstream: Softplus in float32 cast to float64 keeps
   float32's error, which is 2^29 float64 ulps per float32 ulp.
4. Errors: where onnxruntime raises on the original, the fused model must raise too; where it
   does not, the fused model must not.
5. Not compared: outputs downstream of a ReduceMax/ReduceMin whose input holds a NaN, for that
   input set (execute.py checks the reduction's input). onnxruntime's answer there depends on
   where in the row the NaN is, and onnxfuse documents that its kernels may differ (README,
   "Status and limits").
6. Not compared either, where onnxruntime's answer is off-spec or ONNX defines none, for that
   input set: outputs downstream of a float → integer Cast whose input holds a finite value
   outside the integer type's range (undefined in ONNX; onnxruntime gives INT_MIN, or, after its
   graph rewrites drop a Cast pair, the low bits); and outputs downstream of an integer
   ReduceSum/Mean/Prod/SumSquare/L1 whose onnxruntime result is the type's minimum or maximum, or
   2^53 or more in magnitude for 64-bit types: onnxruntime accumulates those in double and
   saturates (an int32 row [2^30, 2^30] sums to 2^31 - 1, an int64 [2^53 + 1, 0] to 2^53;
   test_fuzz_slice.py pins both), where the kernels wrap as two's complement does.
7. Not compared either: outputs downstream of a comparison (Equal, Less, ...) one of whose float
   operands has an approximation upstream, for an input set where the two operands lie within
   ULP_BUDGET ulps of each other somewhere: there the approximation's allowed error (rule 3)
   decides the comparison (seed 93: `Equal(Erf(x), HardSigmoid(x))` at x = 3.87, onnxruntime's
   Erf 0.99999994, the kernel's 1.0, one ulp apart, HardSigmoid 1.0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EXACT_OPS = frozenset(
    "Abs Neg Relu Floor Ceil Round Sign Add Sub Mul Div Max Min Where Equal Less Greater LessOrEqual "
    "GreaterOrEqual And Or Xor Not Cast IsNaN IsInf Clip Identity Reshape Transpose Split Concat Slice "
    "Gather GatherElements ReduceMax ReduceMin Sqrt Reciprocal LeakyRelu".split()
)
ULP_BUDGET = {"float16": 8, "float32": 1024, "float64": 1024}


@dataclass
class Verdict:
    ok: bool
    kind: str = ""  # "shape", "nan", "inf", "value", "exact"
    detail: str = ""


def compare_output(expected: np.ndarray, actual: np.ndarray, exact: bool, magnitude: float = 0.0,
                   precision: str | None = None) -> Verdict:
    """Rule 1-3 of the module docstring. `magnitude`: the largest finite |value| among the inputs;
    `precision`: the float type whose ulps the budget counts (default: the output's)."""
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return Verdict(False, "shape", f"expected {expected.dtype}{list(expected.shape)}, got {actual.dtype}{list(actual.shape)}")
    if expected.size == 0:
        return Verdict(True)
    if expected.dtype.kind in "biu":
        bad = expected != actual
        return _verdict(bad, expected, actual, "value")
    e_nan, a_nan = np.isnan(expected), np.isnan(actual)
    if (e_nan != a_nan).any():
        return _verdict(e_nan != a_nan, expected, actual, "nan")
    if exact:
        bad = ~e_nan & (expected != actual)  # -0.0 == 0.0 in IEEE comparison
        return _verdict(bad, expected, actual, "exact")
    dtype = expected.dtype
    narrow = np.dtype(precision) if precision and np.finfo(precision).bits < np.finfo(dtype).bits else dtype
    budget = ULP_BUDGET[narrow.name]
    top = np.finfo(dtype).max
    e_inf, a_inf = np.isinf(expected), np.isinf(actual)
    near_top = top * (1 - budget * np.finfo(dtype).eps)
    overflow_edge = (np.sign(expected) == np.sign(actual)) & (np.abs(np.where(e_inf, actual, expected)) >= near_top)
    bad_inf = ((e_inf | a_inf) & (expected != actual)) & ~overflow_edge
    if bad_inf.any():
        return _verdict(bad_inf, expected, actual, "inf")
    finite = ~(e_nan | e_inf | a_inf)
    e64, a64 = expected.astype(np.float64), actual.astype(np.float64)
    scale = max(magnitude, float(np.abs(np.where(finite, e64, 0)).max()))
    in_range = np.minimum(np.abs(np.where(finite, e64, 0)), float(np.finfo(narrow).max)).astype(narrow)
    spacing = np.spacing(in_range).astype(np.float64)
    allowed = budget * (spacing + float(np.finfo(narrow).eps) * scale)
    bad = finite & (np.abs(np.where(finite, e64 - a64, 0)) > allowed)
    return _verdict(bad, expected, actual, "value")


def largest_magnitude(arrays) -> float:
    out = 0.0
    for a in arrays:
        if a.dtype.kind == "f" and a.size:
            finite = np.abs(a[np.isfinite(a)].astype(np.float64))
            out = max(out, float(finite.max()) if finite.size else 0.0)
    return out


def _verdict(bad: np.ndarray, expected: np.ndarray, actual: np.ndarray, kind: str) -> Verdict:
    if not bad.any():
        return Verdict(True)
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return Verdict(False, kind, f"{int(bad.sum())} of {bad.size} differ; at {list(where)} expected "
                                f"{expected[where]!r}, got {actual[where]!r}")
