"""Adversarial inputs for a component: where compiled float code and onnxruntime part ways.

Each component runs on several input sets, each a (batch, regime) pair: batch 0, 1, a small and a
larger batch (17 runs both a full 8-row tile and a tail); regimes:

- `normal`: standard normals at scales from 1e-3 to 1e3.
- `special`: about 40% of elements NaN, ±inf, ±0.0, denormals, ±1, halves (round-half cases).
- `extreme`: huge and tiny magnitudes (3e38, 1e30, 1e8, 1e-38, 1e-45, float16's 65504 and past it)
  beside exact 1.0s, so a + 1e8 - 1e8 cancels; integers at their type's limits.

Integer index inputs (and the floats a graph casts to indices) are drawn in range for their axis,
negative ones included; in `special` sets one element in two sets is out of range, where
onnxruntime raises and the fused model must raise too.

A component with a reassociating op (MatMul, Gemm, sums, Softmax, LayerNormalization) gets no
`extreme` set and no huge finite values: the order of a sum decides there whether partial sums
overflow, and neither order is wrong (see compare.py).
"""

from __future__ import annotations

import numpy as np

from .graphs import BATCH, Component, Value

REASSOCIATING = frozenset("MatMul Gemm ReduceSum ReduceMean Softmax LayerNormalization".split())
SPECIAL = (np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-42, 5e-324, 6e-8, 1.0, -1.0, 0.5, 2.5, -2.5, -1.5)
EXTREME = (3e38, -3e38, 1e38, 1e30, -1e30, 1e8, -1e8, 1e-30, 1e-38, 1e-45, 65504.0, -70000.0, 1e300, 1.0, 1.0)
SETS = ((0, "special"), (1, "special"), (3, "extreme"), (17, "special"), (17, "normal"), (5, "extreme"))


def input_sets(component: Component, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """The input sets one component runs on (see the module docstring)."""
    reassociating = bool(REASSOCIATING & set(component.op_types))
    sets = []
    for number, (batch, regime) in enumerate(SETS):
        if reassociating and regime == "extreme":
            regime = "special"
        out_of_range = regime == "special" and number % 2 == 1
        sets.append({v.name: _array(v, batch, regime, out_of_range, rng) for v in component.inputs})
    return sets


def _array(v: Value, batch: int, regime: str, out_of_range: bool, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(batch if d == BATCH else d for d in v.shape)
    dtype = np.dtype(v.dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if v.index_bound is not None:
        return _indices(v, shape, regime, out_of_range, rng)
    if dtype.kind == "i":
        info = np.iinfo(dtype)
        values = rng.integers(-5, 6, shape)
        if regime == "extreme":
            limits = rng.choice([info.min, info.max, 0, -1, 1], shape)
            values = np.where(rng.random(shape) < 0.3, limits, values)
        return values.astype(dtype)
    scale = 10.0 ** rng.uniform(-3, 3, shape)
    values = rng.standard_normal(shape) * scale
    if regime != "normal":
        pool = np.array(SPECIAL if regime == "special" else EXTREME + SPECIAL[:5])
        values = np.where(rng.random(shape) < 0.4, rng.choice(pool, shape), values)
    with np.errstate(over="ignore"):
        return values.astype(dtype)


def _indices(v: Value, shape: tuple, regime: str, out_of_range: bool, rng: np.random.Generator) -> np.ndarray:
    bound = v.index_bound
    values = rng.integers(-bound, bound, shape).astype(np.float64)
    if np.dtype(v.dtype).kind == "f":
        values += rng.uniform(0, 1, shape)  # the graph floors them
        if regime != "normal":
            values = np.where(rng.random(shape) < 0.15, rng.choice([np.nan, np.inf, -np.inf, -0.0], shape), values)
    if out_of_range and values.size:
        values.flat[rng.integers(values.size)] = rng.choice([bound, -bound - 1, 2**40])
    with np.errstate(invalid="ignore"):
        return values.astype(v.dtype)
