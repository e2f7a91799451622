"""Fast polynomial math for exp / tanh / erf / sigmoid / softmax, as a Relax rewrite before legalization.

Why our own pass: TVM's FastMathTransform leaves `sigmoid` alone, which then lowers to a scalar
libm `expf` call per element (no vectorization). Accuracy was measured against onnxruntime
(see tests/test_codegen.py): within rtol 1e-4 / atol 1e-5 for float32.

Why our own exp (not topi.fast_exp): topi's rounds with floor, converts, adds and shifts to build
2^n, then takes max(result, x) and, to keep NaN, a select on top: about 22 vector instructions
per 16 floats, against 14 here. In a 1000 x 256 softmax its loop was 63% of the kernel (perf),
and the kernel 0.84x as fast as onnxruntime. It also returned inf for x in [88.38, 88.72],
where exp is still finite; ours overflows where exp does.

The Exp op, Erf, Tanh and Sigmoid are onnxruntime's own functions (MLAS's algorithms and float32
coefficients), bit for bit. Softmax keeps an exp of its own (onnxruntime's Softmax sums in its
own lanes, so its bits are not reachable by the exp alone): results under 2^-126 (x below -87.3)
are subnormal, as onnxruntime's are (flushed to 0 they made `Log(Softmax(x))` -inf for a logit
100 below its row's max; fuzzer), at no cost since its argument is <= 0: the scale is offset by
2^64 and the polynomial by 2^-64. Log-softmax sums a row holding exp(0) = 1 and keeps the cheaper
flushing form.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, topi

from . import sum_orders
from .relax_rewrite import function_pass
from .rounded_products import rounded
from .sigmoid_clamp import CLAMP_BLOCK, clamp_to_unit

# exp(r) for |r| <= ln(2)/2 as a degree-6 polynomial, highest power first, with p(0) = 1 and
# p'(0) = 1 exact and the rest a least-squares fit of relative error: at most 8e-8 evaluated in
# float32 (1.3 ulp). Doubled, so the result is 2 exp(r) and the scale 2^(n-1) stays a normal
# float up to n = 128, the top of exp's float32 range.
_TWICE_EXP_POLY = tuple(2 * c for c in (0.00137514085508883, 0.008368918672204018, 0.04166953265666962,
                                        0.166665181517601, 0.49999988079071045, 1.0, 1.0))
_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # Cody-Waite: n * _LN2_HI is exact for |n| < 2^15
# Adding 1.5 * 2^23 rounds x*log2(e) to an integer n held in the low mantissa bits; with the
# exponent bias minus one added too, those bits shifted into the exponent field are 2^(n-1).
_ROUNDER = 1.5 * 2**23 + 126
# Below: n - 1 <= -127, the scale's bits are 0, and exp is 0 (it is under 2.4e-38 there).
# Above: the result overflows to inf in the last multiply; clamping keeps n + 126 < 256.
_LOW, _HIGH = -126 * 0.6931471805599453, 89.0


def fast_exp_value(x, bind=lambda value: value):
    """exp of one float32 PrimExpr. NaN stays NaN, +inf gives inf, -inf gives 0. Results under
    2^-126 (x below -87.3) are 0: where it is used (the RNN op's sigmoid, the sum of a
    log-softmax row, which holds exp(0)) 1 is added to it, so they make no difference. The Exp
    op and Softmax use onnxruntime's own (exp_value).

    `bind` names an intermediate value where the caller can (the IR builder's T.Bind): the
    expression reads x 18 times and its bits 2 times, and as a tree (not bound) LLVM's passes
    take seconds on a few hundred of them in one block (the recurrent kernels' gate math)."""
    f32 = "float32"
    # Bound first: nan_propagation keeps max(bound, x) as is, which lets a NaN x through.
    clamped = bind(tvm.tirx.max(tvm.tirx.const(_LOW, f32), tvm.tirx.min(tvm.tirx.const(_HIGH, f32), x)))
    bits = bind(tvm.tirx.reinterpret("int32", clamped * tvm.tirx.const(_LOG2E, f32) + tvm.tirx.const(_ROUNDER, f32)))
    # Through the bits, so no simplifier folds (a + K) - K back to a.
    n = bind(tvm.tirx.reinterpret(f32, bits) - tvm.tirx.const(_ROUNDER, f32))
    r = bind(clamped - n * tvm.tirx.const(_LN2_HI, f32) - n * tvm.tirx.const(_LN2_LO, f32))
    poly = tvm.tirx.const(_TWICE_EXP_POLY[0], f32)
    for c in _TWICE_EXP_POLY[1:]:
        poly = poly * r + tvm.tirx.const(c, f32)
    scale = tvm.tirx.reinterpret(f32, bits << tvm.tirx.const(23, "int32"))
    return poly * scale


def _fast_exp(x: te.Tensor) -> te.Tensor:
    return te.compute(x.shape, lambda *i: fast_exp_value(x(*i)),
                      name="fast_exp")


# onnxruntime's float32 Exp (MLAS's exp kernel, every x86 level and its generic one; XNNPACK's
# two-step scale): x clamped to [-103.97, 88.78], n the nearest integer to x log2(e) (by adding
# 1.5 * 2^23), a Cody-Waite reduction r, a degree-6 polynomial p(r) whose last step multiplies r
# by the first scale, and 2^n as two normal powers of two so results down to subnormal ones are
# rounded once: p = (q(r) (r 2^(n-n1)) + 2^(n-n1)) 2^n1 with n1 = n clamped to [-126, 127].
# Every step a Horner multiply-add, fused exactly where the level has FMA (as for Erf). It matched
# onnxruntime's Exp bit for bit on 4.2 million inputs from -110 to 95 (AVX-512 natively; AVX2
# and the no-FMA baseline under qemu), subnormal results and overflow to inf included.
EXP_LOW, EXP_HIGH = -103.9720840454, 88.7762626647950
EXP_ROUNDER = 12582912.0  # 1.5 * 2^23
EXP_ROUNDER_BITS = 0x4B400000
EXP_LN2_HI, EXP_LN2_LO = -6.93145752e-1, -1.42860677e-6
EXP_POLY = tuple(float.fromhex(c) for c in ("0x1.694000p-10", "0x1.125edcp-7", "0x1.555b5ap-5", "0x1.555450p-3",
                                              "0x1.fffff6p-2", "0x1.000000p+0"))


def multiply_add(a, b, c):
    """a * b + c as one fused multiply-add where the level has FMA and a rounded product and an
    add where not (llvm.fmuladd), as MLAS's kernels for those CPUs compute it. Written `a * b + c`,
    LLVM contracted it only where nothing else came first: in a scalar loop (a row's tail whose
    length is symbolic) its SLP vectorizer took two products into one vector multiply, and that
    add was not fused (an Exp was 1 ulp off onnxruntime's at 3 of 21,312 elements)."""
    return tvm.tirx.call_llvm_pure_intrin(str(a.ty.dtype), "llvm.fmuladd", a, b, c)


def cpp_multiply_add(a, b, c, fused: bool | None = None):
    """`a * b + c` as a line of onnxruntime's C++ computes it on the level's CPUs: the product
    rounded, then added, on x86-64 (built without FMA); one fused multiply-add on aarch64, where
    GCC contracts it (sum_orders.scalar_multiply_adds_fused, or `fused` where a caller must fix
    it, as a reducer built once does). Where a line adds two products, GCC fuses the first:
    `a * b + c * d` is fma(a, b, c * d)."""
    if fused is None:
        fused = sum_orders.current().scalar_multiply_adds_fused
    return multiply_add(a, b, c) if fused else rounded(a * b) + c


def _nearest_exponent(x):
    """round(x log2(e)) as an int32, as MLAS finds it: adding 1.5 * 2^23 (one multiply-add) leaves
    the integer in the low bits. Read from the bits, so no simplifier folds (t + K) - K back to t,
    and small (|n| < 2^22), so no integer step after it can overflow."""
    biased = multiply_add(x, tvm.tirx.const(_LOG2E, "float32"), tvm.tirx.const(EXP_ROUNDER, "float32"))
    return tvm.tirx.reinterpret("int32", biased) - tvm.tirx.const(EXP_ROUNDER_BITS, "int32")


def _power_of_two(exponent):
    """2^exponent for an int32 exponent in [-126, 128] (128 gives 2.0: MLAS's own wrap)."""
    return tvm.tirx.reinterpret("float32", (exponent + tvm.tirx.const(127, "int32")) << tvm.tirx.const(23, "int32"))


def _reduced(x, n):
    """x - n ln(2), Cody-Waite: two multiply-adds with ln(2) split high and low."""
    whole = tvm.tirx.Cast("float32", n)
    high = multiply_add(whole, tvm.tirx.const(EXP_LN2_HI, "float32"), x)
    return multiply_add(whole, tvm.tirx.const(EXP_LN2_LO, "float32"), high)


def exp_value(x):
    """onnxruntime's float32 exp of one PrimExpr (above). NaN stays NaN (the clamp's selects pass
    it); the scales' exponents are small integers taken from the rounded bits, so no integer
    operation here can overflow (MLAS shifts the whole bit pattern and lets it wrap)."""
    f32, i32 = "float32", "int32"
    const = tvm.tirx.const
    low, high = const(EXP_LOW, f32), const(EXP_HIGH, f32)
    clamped = clamped_to(x, low, high)
    n = _nearest_exponent(clamped)  # in [-150, 128]
    reduced = _reduced(clamped, n)
    n_normal = tvm.tirx.max(tvm.tirx.min(n, const(127, i32)), const(-126, i32))
    first = _power_of_two(n - n_normal)
    poly = _horner(reduced, EXP_POLY, f32)
    return multiply_add(poly, reduced * first, first) * _power_of_two(n_normal)


def _onnxruntime_exp(x: te.Tensor) -> te.Tensor:
    return te.compute(x.shape, lambda *i: exp_value(x(*i)), name="onnxruntime_exp")


# onnxruntime's float32 Sigmoid (MLAS's logistic kernel) is a rational function of the input
# clamped to [-18, 18]: x p(x^2) / q(x^2) + 0.5, with p of degree 4 and q of degree 5 in x^2
# evaluated by Horner's rule (fused multiply-adds on CPUs with FMA), the result then clamped as
# sigmoid_clamp.py says (per CPU: max(., 0) on x86 with FMA, [0, 1] elsewhere). It rounds to
# exactly 0 at scattered inputs from -15.8 down and everywhere from -18 down, so Sigmoid * inf
# is NaN there (fuzzer: 1 / (1 + exp(-x)) gave inf). The same form here, with the same float32
# coefficients, matched it bit for bit on 2.2 million inputs in [-30, 30] (AVX-512 and AVX2
# builds; LLVM contracts each Horner step into an FMA).
SIGMOID_CLAMP = 18.0
SIGMOID_P = (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
             2.48287947061529e-01)  # x^8 .. x^0 coefficients of p(x^2)
SIGMOID_Q = (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
             1.16817656904453e-01, 9.93151921023180e-01)  # x^10 .. x^0 coefficients of q(x^2)


def clamped_to(v, low, high):
    """v clamped to [low, high], a NaN passed through, as MLAS clamps: min(high, v), then the max
    of low and that. Each select returns its second operand when the compare is false, as x86's
    minps and maxps do for a NaN, so LLVM emits one vminps and one vmaxps. Comparing v itself in
    the second select (the same values) cost a compare and a masked move instead of the max: 5
    clamps in every LSTM cell element."""
    below_high = tvm.tirx.Select(high < v, high, v)
    return tvm.tirx.Select(below_high < low, low, below_high)


def _horner(square, coefficients, dtype):
    value = tvm.tirx.const(coefficients[0], dtype)
    for c in coefficients[1:]:
        value = multiply_add(value, square, tvm.tirx.const(c, dtype))
    return value


def _unbound(value):
    return value


def _odd_rational(v, bound: float, p, q, bind=_unbound):
    """MLAS's x p(x^2) / q(x^2) on x clamped to [-bound, bound] (Sigmoid's and Tanh's common form;
    a NaN x passes the clamp: both compares on it are false). `bind` names the clamped x and its
    square where a caller must keep expression trees small (the recurrent kernel)."""
    dtype = v.ty.dtype
    low, high = tvm.tirx.const(-bound, dtype), tvm.tirx.const(bound, dtype)
    clamped = bind(clamped_to(v, low, high))
    square = bind(clamped * clamped)
    return _horner(square, p, dtype) * clamped / _horner(square, q, dtype)


def logistic_ratio(v, bind=_unbound):
    """onnxruntime's float32 Sigmoid of one PrimExpr before its clamp (sigmoid_clamp.py)."""
    return _odd_rational(v, SIGMOID_CLAMP, SIGMOID_P, SIGMOID_Q, bind) + tvm.tirx.const(0.5, v.ty.dtype)


def tanh_value(v, bind=_unbound):
    """onnxruntime's float32 Tanh of one PrimExpr (below)."""
    return _odd_rational(v, TANH_CLAMP, TANH_P, TANH_Q, bind)


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """onnxruntime's rational sigmoid (above), then its clamp as a block of its own
    (sigmoid_clamp.py); NaN stays NaN (every compare on it is false)."""
    rational = te.compute(x.shape, lambda *i: logistic_ratio(x(*i)), name="fast_sigmoid")
    return te.compute(x.shape, lambda *i: clamp_to_unit(rational(*i)), name=CLAMP_BLOCK)


# onnxruntime's float32 Tanh (MLAS's tanh kernel, from Eigen) is x p(x^2) / q(x^2) on x clamped to
# [-9, 9], p of degree 6 and q of degree 3 in x^2 by Horner's rule, and nothing after the division,
# in its FMA kernel and its generic one alike (only the FMAs differ, which LLVM contracts exactly
# where the level has FMA). topi's fast_tanh has the same coefficients but returns x itself below
# |x| = 0.0004 and was up to 7 ulps from onnxruntime; this form is bit for bit onnxruntime's
# (test_ieee_fast_math.py). A tiny x gives 0 as onnxruntime's does (alpha_1 * x underflows).
TANH_CLAMP = 9.0
TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
          1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)  # x^12 .. x^0 of p(x^2)
TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)  # x^6 .. x^0


def _fast_tanh(x: te.Tensor) -> te.Tensor:
    """onnxruntime's rational tanh (above); NaN stays NaN."""
    return te.compute(x.shape, lambda *i: tanh_value(x(*i)), name="fast_tanh")


# onnxruntime's float32 Erf (MLAS's erf kernel, every x86 level and its generic one) is
# piecewise on a = min(|x|, 3.925), with the sign put back at the end:
#   a <= 0.921875: a + a s(a^2), s a degree-5 polynomial;
#   above:         1 - exp(-(a + a b(a))), b of degree 6, and exp as MLAS computes it: n the
#                  nearest integer to -(...) log2(e), a Cody-Waite reduction (the Exp op's
#                  constants), a degree-6 polynomial of its own, times 2^n.
# Every step is a Horner multiply-add, fused where the CPU has FMA (LLVM contracts them exactly
# where the level has FMA, as onnxruntime's FMA kernels fuse them and its generic kernel does not).
# The same form with the same float32 coefficients matched onnxruntime's Erf bit for bit on 2.1
# million inputs (AVX-512 natively; AVX2 and the no-FMA baseline under qemu), tiny and subnormal
# ones included. topi's fast_erf (a rational function) was up to 7 ulp from it, and faster: one
# vector division against two polynomials and an exp per element (docs/numerics.md).
ERF_CLAMP = 3.925
ERF_SPLIT = 0.921875
ERF_SMALL = (-5.99104969e-4, 4.99339588e-3, -2.67667342e-2, 1.12818025e-1, -3.76124859e-1,
             1.28379151e-1)  # s(a^2), a^10 .. a^0
ERF_BIG = (1.72948930e-5, -3.83208680e-4, 3.88393435e-3, -2.42545605e-2, 1.06777847e-1, 6.34846687e-1,
           1.28717512e-1)  # b(a), a^6 .. a^0
ERF_EXP_POLY = (1.38319808e-3, 8.37550033e-3, 4.16689515e-2, 1.66664466e-1, 4.99999851e-1, 1.0, 1.0)
_SIGN_BIT = -0x80000000


def erf_value(x):
    """onnxruntime's float32 erf of one PrimExpr (above). A NaN x stays NaN: the clamp is a select
    that passes it (no compare on it is true), as onnxruntime's min does. On the big side
    -(a + a b(a)) >= -18.4, so 2^n is a normal float and no clamp is needed there."""
    f32, i32 = "float32", "int32"
    const = tvm.tirx.const
    absolute = tvm.tirx.abs(x)
    magnitude = tvm.tirx.Select(absolute > const(ERF_CLAMP, f32), const(ERF_CLAMP, f32), absolute)
    small = multiply_add(_horner(magnitude * magnitude, ERF_SMALL, f32), magnitude, magnitude)
    big = -multiply_add(_horner(magnitude, ERF_BIG, f32), magnitude, magnitude)
    n = _nearest_exponent(big)  # the exp's own reduction, with the Exp op's constants
    above = const(1.0, f32) - _horner(_reduced(big, n), ERF_EXP_POLY, f32) * _power_of_two(n)
    result = tvm.tirx.Select(magnitude > const(ERF_SPLIT, f32), above, small)
    sign = tvm.tirx.reinterpret(i32, x) & const(_SIGN_BIT, i32)
    return tvm.tirx.reinterpret(f32, tvm.tirx.reinterpret(i32, result) | sign)


def _fast_erf(x: te.Tensor) -> te.Tensor:
    return te.compute(x.shape, lambda *i: erf_value(x(*i)), name="fast_erf")


def _row_of(index, axis: int):
    """The index into a keepdims reduction over `axis`."""
    return [0 if k == axis else i for k, i in enumerate(index)]


# onnxruntime's float32 Softmax (MLAS) per row: the maximum, then exp(x - max) with its exp
# kernel (exp_value's algorithm) summed in the lanes of one accumulator (lane l adds elements l,
# l + L, l + 2L, ... in order), the lanes reduced in the kernel's own order, and every exp times
# 1 / sum. The lanes follow the CPU (sum_orders.softmax_lanes): AVX-512's kernel takes 16, a
# ragged last vector adding only its own lanes, and reduces them as upper half plus lower half,
# then in pairs ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)); AVX2's (FMA3) takes 8, ragged
# the same way, reduced in those pairs (two vhaddps and the halves' sum); the SSE baseline's
# generic kernel takes 4 over the row's whole vectors only, reduces them as (a0 + a2) + (a1 + a3)
# and then adds the remaining elements one by one; aarch64's the same but for NEON's reduction,
# (a0 + a1) + (a2 + a3).


def _lane_sums(e: te.Tensor, axis: int, lanes: int, whole_vectors_only: bool) -> te.Tensor:
    """Per row, the `lanes` lane sums of `e` along `axis` (that axis becomes the lane): each a
    chain from 0 in order; lanes past the row's end add +0 (e >= 0, so the sums are unchanged),
    or, with whole_vectors_only, only the row's whole vectors are summed."""
    length = e.shape[axis]
    vectors = tvm.tirx.indexdiv(length if whole_vectors_only else length + (lanes - 1), lanes)
    j = te.reduce_axis((0, vectors), name="vector")

    def lane_sum(*index):
        k = j * lanes + index[axis]
        at = list(index)
        at[axis] = k
        # if_then_else reads only where k is inside the row (a Select reads both sides, and the
        # schedule's bounds reasoning dropped a clamp of k: one row read past its end).
        return te.sum(tvm.tirx.if_then_else(k < length, e(*at), tvm.tirx.const(0.0, e.dtype)), axis=j)

    shape = list(e.shape)
    shape[axis] = lanes
    return te.compute(shape, lane_sum, name="softmax_lane_sums")


def _lanes_reduced(a: list, lanes: int):
    """MLAS's horizontal sum of an accumulator of `lanes` lanes (above)."""
    if lanes == 16:
        a = [a[k + 8] + a[k] for k in range(8)]
    if lanes in (16, 8):
        return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
    if lanes == 4:  # SSE's halves, NEON's adjacent pairs
        return sum_orders.add_four_lanes(a)
    raise ValueError(f"no MLAS Softmax sums in {lanes} lanes")


def _row_sum(e: te.Tensor, axis: int, lanes: int, tail_one_by_one: bool) -> te.Tensor:
    """A row's sum of exps in MLAS's order (above), keepdims along `axis`. Written as a reduction
    (over one element) so the schedule keeps it a block of its own: inlined into the row's
    products it was recomputed for every element (16 loads and 15 adds each)."""
    sums = _lane_sums(e, axis, lanes, whole_vectors_only=tail_one_by_one)
    length = e.shape[axis]
    once = te.reduce_axis((0, 1), name="once")

    def at(index, axis_index):
        point = list(index)
        point[axis] = axis_index + once
        return point

    def total(*index):
        value = _lanes_reduced([sums(*at(index, k)) for k in range(lanes)], lanes)
        if tail_one_by_one:  # the elements past the whole vectors, in order (+0 past the row's end)
            whole = tvm.tirx.indexdiv(length, lanes) * lanes
            for r in range(lanes - 1):
                k = whole + r
                value = value + tvm.tirx.if_then_else(k < length, e(*at(index, k)), tvm.tirx.const(0.0, e.dtype))
        return te.sum(value, axis=once)

    shape = list(e.shape)
    shape[axis] = 1
    return te.compute(shape, total, name="softmax_sum")


def _fast_softmax(x: te.Tensor, axis: int) -> te.Tensor:
    """onnxruntime's Softmax (above) on the CPUs of the level being lowered: one reciprocal per
    row, each exp times it."""
    axis = axis % len(x.shape)
    lanes = sum_orders.current().softmax_lanes
    peak = topi.max(x, axis=axis, keepdims=True)
    e = te.compute(x.shape, lambda *i: exp_value(x(*i) - peak(*_row_of(i, axis))), name="softmax_exp")
    total = _row_sum(e, axis, lanes, tail_one_by_one=lanes == 4)
    inverse = te.compute(total.shape, lambda *i: tvm.tirx.const(1.0, x.dtype) / total(*i), name="softmax_inverse")
    return te.compute(x.shape, lambda *i: e(*i) * inverse(*_row_of(i, axis)), name="softmax")


def _fast_log_softmax(x: te.Tensor, axis: int) -> te.Tensor:
    """x - max - log(sum(exp(x - max))): a fast exp per element, libm's log once per row. The
    sum holds exp(0) = 1, so subnormal terms cannot change it."""
    shifted = topi.subtract(x, topi.max(x, axis=axis, keepdims=True))
    return topi.subtract(shifted, topi.log(topi.sum(_fast_exp(shifted), axis=axis, keepdims=True)))


_REWRITES = {
    "relax.exp": lambda x, attrs: _onnxruntime_exp(x),
    "relax.tanh": lambda x, attrs: _fast_tanh(x),
    "relax.erf": lambda x, attrs: _fast_erf(x),
    "relax.sigmoid": lambda x, attrs: _fast_sigmoid(x),
    "relax.nn.softmax": lambda x, attrs: _fast_softmax(x, int(attrs.axis)),
    "relax.nn.log_softmax": lambda x, attrs: _fast_log_softmax(x, int(attrs.axis)),
}


@relax.expr_functor.mutator
class _FastMathRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        rewrite = _REWRITES.get(op)
        if rewrite is None or call.args[0].ty.dtype != "float32":
            return call
        return self.builder_.call_te(rewrite, call.args[0], call.attrs)


FastMath = function_pass(
    "OnnxfuseFastMath", _FastMathRewriter,
    "Rewrites float32 exp/tanh/erf/sigmoid/softmax/log_softmax in every Relax function to onnxruntime's functions "
    "(exp, tanh, erf, sigmoid) or vectorized approximations (softmax, log_softmax).")
