"""LayerNormalization as onnxruntime's CPU kernel computes it, so rows near the float limits and
rows of one repeated large value give its answers.

TVM's lowering sums a row in float32 and divides: a row of values near 3e38 overflows to inf and
the output is NaN where onnxruntime gives beta (fuzzer, `layernorm-huge-row`), and the mean of
sixteen copies of 1e18 is not 1e18, so a constant row normalized to ±1 instead of 0. onnxruntime
1.32 (measured bit for bit against numpy, tests/test_layer_norm.py) does two different things:
- rows of fewer than 8 values: Welford's update in float, one value after the other
  (`d = x - m; m += d / k; M2 += d * (x - m)`), then `(x - m) / sqrt(M2 / n + eps) * scale + bias`,
  every operation rounded on its own. A row [3e38, -3e38] has mean -inf there and gives NaN.
- rows of 8 or more: the mean summed in double; the variance the sum of (x - mean)^2 in float
  (in 8 lanes with fused multiply-adds on an AVX2 CPU, then a horizontal sum, then the rest of
  the row); `rstd = 1 / sqrt(var / n + eps)` and `fma(d * rstd, scale, bias)`.
This lowering writes both: Welford unrolled for a row of static length under 8 (each step a Let,
so the expression grows linearly), otherwise the mean in float64, the squares summed in
onnxruntime's lanes and order (_squares_in_onnxruntimes_order; a row whose length is not static
sums them in the schedule's order) and the products left to LLVM, which contracts the last
multiply-add where the level has FMA, as onnxruntime's kernel does.

onnxruntime's SkipLayerNormalization (com.microsoft, which its optimizer writes for a residual
Add + LayerNorm) computes otherwise: Welford's update over every row whatever its length
(skip_layer_norm_as_onnxruntime, a reduction of three values vectorized across rows).
"""

from __future__ import annotations

import functools
import operator

import tvm
from tvm import relax, te, topi

from . import sum_orders
from .fast_math import cpp_multiply_add, multiply_add
from .index_math import static_length, unflattened
from .rounded_products import multiply_added, rounded

LANES = 8  # ... which sums the squares in 8 lanes


def _trailing(axes, rank: int) -> int | None:
    """The first normalized axis if `axes` are the trailing ones (ONNX's are), else None."""
    axes = sorted(int(a) % rank for a in axes)
    return axes[0] if axes == list(range(axes[0], rank)) else None


def _welford_statistics(data: te.Tensor, first: int, n: int, epsilon: float):
    """(mean, std) per row by Welford's update, unrolled over the row's n (< 8) values."""
    dtype = data.dtype
    eps = tvm.tirx.const(epsilon, dtype)
    extents = [int(extent) for extent in data.shape[first:]]

    def coords(j: int):
        return [tvm.tirx.const(c, "int64") for c in unflattened(j, extents)]

    def chain(*row, final):
        """Let-bound Welford steps over the row, ending in `final(mean, M2)`."""
        def step(j, mean, m2):
            if j == n:
                return final(mean, m2)
            x = data(*row, *coords(j))
            d, new_mean, new_m2 = (tvm.tirx.Var(f"welford_{name}{j}", dtype) for name in ("d", "mean", "m2"))
            return tvm.tirx.Let(d, x - mean, tvm.tirx.Let(
                new_mean, mean + d / tvm.tirx.const(j + 1, dtype), tvm.tirx.Let(
                    new_m2, m2 + rounded(d * (x - new_mean)), step(j + 1, new_mean, new_m2))))
        zero = tvm.tirx.const(0.0, dtype)
        return step(0, zero, zero)

    rows = list(data.shape[:first])
    mean = te.compute(rows, lambda *r: chain(*r, final=lambda m, _: m), name="welford_mean")
    std = te.compute(rows, lambda *r: chain(*r, final=lambda _, m2: tvm.tirx.sqrt(
        m2 / tvm.tirx.const(n, dtype) + eps)), name="welford_std")
    return mean, std


def _squares_in_onnxruntimes_order(data: te.Tensor, first: int, n: int, mean: te.Tensor) -> te.Tensor:
    """The sum of (x - mean)^2 over each row of static length n (>= 8) in onnxruntime's order:
    8 lanes, lane j summing elements j, j + 8, ... with multiply-adds; the lanes added as an AVX2
    horizontal sum, ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)); then, if 4 or more
    elements are left, 4 rounded squares added one by one; the rest multiply-added one by one.
    (Matched onnxruntime 1.32's LayerNormalization bit for bit for every n from 9 to 40 and at
    64, 100, 129, 383, 768, 770, 1001.)"""
    lanes, full = LANES, n // LANES * LANES
    extents = [int(extent) for extent in data.shape[first:]]

    def deviation(row, flat):
        return data(*row, *unflattened(flat, extents)) - mean(*row)

    rows = list(data.shape[:first])
    k = te.reduce_axis((0, full // lanes), name="k_lane")
    per_lane = te.compute(rows + [lanes], lambda *rj: multiply_added(
        deviation(rj[:-1], k * lanes + rj[-1]) * deviation(rj[:-1], k * lanes + rj[-1]), axis=k), name="x_var_lanes")

    def total(*row):
        lane = [per_lane(*row, j) for j in range(lanes)]
        value = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]))
        position = full
        if n - position >= 4:
            for flat in range(position, position + 4):
                d = deviation(row, flat)
                value = value + rounded(d * d)
            position += 4
        for flat in range(position, n):
            d = deviation(row, flat)
            # llvm.fmuladd (multiply_add): written `d * d + value`, the SLP vectorizer took two or
            # three such squares into one vector multiply first, and no add was fused.
            value = multiply_add(d, d, value)
        return value

    return te.compute(rows, total, name="x_var_sum")


def layer_norm_as_onnxruntime(data: te.Tensor, gamma: te.Tensor, beta: te.Tensor, axes, epsilon: float):
    first = _trailing(axes, len(data.shape))
    if first is None or data.dtype not in ("float32", "float64"):
        return topi.nn.layer_norm(data, gamma, beta, axis=axes, epsilon=epsilon)
    dtype = data.dtype
    n = static_length(data.shape[first:])
    split = lambda i: (i[:first], i[first:])  # noqa: E731 - row coordinates, normalized coordinates

    welford_below = sum_orders.current().layer_norm_welford_below
    if dtype == "float32" and welford_below is None:
        return _welford_layer_norm(data, gamma, beta, first, epsilon)
    if n is not None and n < welford_below:
        mean, std = _welford_statistics(data, first, n, epsilon)

        def normalized(*i):
            row, col = split(i)
            return rounded((data(*i) - mean(*row)) / std(*row) * gamma(*col)) + beta(*col)

        return te.compute(data.shape, normalized, name="T_layer_norm")

    inner = [te.reduce_axis((0, extent), name=f"k{k}") for k, extent in enumerate(data.shape[first:])]
    rows = list(data.shape[:first])
    length = functools.reduce(operator.mul, [tvm.tirx.Cast("float64", extent) for extent in data.shape[first:]])
    length_here = functools.reduce(operator.mul, [tvm.tirx.Cast(dtype, extent) for extent in data.shape[first:]])
    total = te.compute(rows, lambda *r: te.sum(data(*r, *inner).astype("float64"), axis=inner), name="x_sum")
    mean = te.compute(rows, lambda *r: (total(*r) / length).astype(dtype), name="x_mean")
    if n is not None and dtype == "float32":
        squares = _squares_in_onnxruntimes_order(data, first, n, mean)
    else:
        squares = te.compute(rows, lambda *r: te.sum((data(*r, *inner) - mean(*r)) * (data(*r, *inner) - mean(*r)),
                                                     axis=inner), name="x_var_sum")
    one, eps = tvm.tirx.const(1.0, dtype), tvm.tirx.const(epsilon, dtype)
    rstd = te.compute(rows, lambda *r: one / tvm.tirx.sqrt(squares(*r) / length_here + eps), name="x_rstd")

    def normalized(*i):
        row, col = split(i)
        return (data(*i) - mean(*row)) * rstd(*row) * gamma(*col) + beta(*col)

    return te.compute(data.shape, normalized, name="T_layer_norm")


def _welford_layer_norm(data: te.Tensor, gamma: te.Tensor, beta: te.Tensor, first: int, epsilon: float) -> te.Tensor:
    """Welford's update over each whole row, whatever its length, then `(x - mean) / sqrt(M2 / n
    + eps) * gamma + beta`, every operation rounded: onnxruntime 1.32's LayerNormalization on
    x86-64 CPUs without AVX2 (under `qemu-x86_64 -cpu Nehalem`, bit for bit on 1,024 of 1,024 rows
    of 8 to 768; the vectorized path's order on 57). On aarch64 the same with its two
    multiply-adds fused (sum_orders.scalar_multiply_adds_fused; under `qemu-aarch64 -cpu
    neoverse-n1`, rows of 5 to 333)."""
    fused = sum_orders.current().scalar_multiply_adds_fused
    mean, std = _welford_mean_std(data, first, epsilon, fused)

    def normalized(*i):
        row, col = i[:first], i[first:]
        scaled = (data(*i) - mean(*row)) / std(*row)
        return cpp_multiply_add(scaled, gamma(*col), beta(*col), fused)

    return te.compute(data.shape, normalized, name="T_layer_norm")


def legalize_layer_norm(bb: relax.BlockBuilder, call):
    return bb.call_te(layer_norm_as_onnxruntime, call.args[0], call.args[1], call.args[2], list(call.attrs.axes),
                      float(call.attrs.epsilon), primfunc_name_hint="layer_norm")


def _welford_step(fused: bool):
    """One step of onnxruntime's Welford update, state (count, mean, M2) taking the element's value
    (the element's own count and M2 are unused): every operation rounded on its own, or M2's
    multiply-add fused."""
    def step(state, element):
        count, mean, m2 = state
        _, value, _ = element
        k = count + 1.0
        d = value - mean
        new_mean = mean + d / k
        return k, new_mean, cpp_multiply_add(value - new_mean, d, m2, fused)
    return step


# Serial reductions (their steps depend on their order): one loop over the row, never split.
_WELFORD = {fused: te.comm_reducer(_welford_step(fused), lambda *dtypes: tuple(tvm.tirx.const(0.0, t) for t in dtypes),
                                   name="welford_fused" if fused else "welford")
            for fused in (False, True)}


def _welford_mean_std(values: te.Tensor, first: int, epsilon: float,
                      fused: bool = False) -> tuple[te.Tensor, te.Tensor]:
    """(mean, sqrt(M2 / n + eps)) over the axes from `first` on, by Welford's update over the whole
    row in order (a loop, whatever the row's length), every operation rounded (or M2's
    multiply-add fused)."""
    dtype = values.dtype
    inner = [te.reduce_axis((0, extent), name=f"k_welford{k}") for k, extent in enumerate(values.shape[first:])]
    rows = list(values.shape[:first])
    zero = tvm.tirx.const(0.0, dtype)
    _, mean, m2 = te.compute(rows, lambda *r: _WELFORD[fused]((zero, values(*r, *inner), zero), axis=inner), name="welford")
    length = functools.reduce(operator.mul, [tvm.tirx.Cast(dtype, extent) for extent in values.shape[first:]])
    eps = tvm.tirx.const(epsilon, dtype)
    return mean, te.compute(rows, lambda *r: tvm.tirx.sqrt(m2(*r) / length + eps), name="welford_std")


def skip_layer_norm_as_onnxruntime(data: te.Tensor, skip: te.Tensor, gamma: te.Tensor, beta: te.Tensor | None,
                                   bias: te.Tensor | None, epsilon: float):
    """onnxruntime's SkipLayerNormalization (com.microsoft; its CPU kernel in 1.32, read from the
    machine code): `v = (data + skip) + bias` over the last axis, Welford's update over the
    whole row whatever its length (unlike LayerNormalization), `(v - mean) / sqrt(M2 / n + eps)
    * gamma + beta`, each operation rounded (on aarch64 its two multiply-adds fused, as in
    _welford_layer_norm)."""
    fused = sum_orders.current().scalar_multiply_adds_fused
    summed = topi.add(data, skip)
    if bias is not None:
        summed = topi.add(summed, bias)
    mean, std = _welford_mean_std(summed, len(summed.shape) - 1, epsilon, fused)

    def normalized(*i):
        row, column = i[:-1], i[-1]
        quotient = (summed(*i) - mean(*row)) / std(*row)
        if beta is None:
            return rounded(quotient * gamma(column))
        return cpp_multiply_add(quotient, gamma(column), beta(column), fused)

    return te.compute(summed.shape, normalized, name="T_skip_layer_norm")
