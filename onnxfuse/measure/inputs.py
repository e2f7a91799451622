"""Inputs for a model: its declared inputs, and random ones so two models can be compared without user data.

Integers are drawn small and non-negative: integer inputs are usually indices or counts, and a
comparison is only useful if the reference model accepts the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

ORT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int16)": "int16", "tensor(int8)": "int8",
    "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(uint32)": "uint32", "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}


def random_array(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Always an ndarray: for shape () numpy's draws are scalars, which onnxruntime refuses."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dt, np.integer):
        return np.asarray(rng.integers(0, 2, size=shape), dtype=dt)
    return np.asarray(rng.standard_normal(shape), dtype=dt)


def concrete_shape(shape, dims: dict[str, int], default: int) -> tuple[int, ...]:
    """Symbolic or unknown dimensions take the value the user gave for that name, else `default`."""
    return tuple(d if isinstance(d, int) and d >= 0 else dims.get(d, default) if isinstance(d, str) else default
                 for d in shape)


def random_feeds_for_session(session, dims: dict[str, int] | None = None, default_dim: int = 3,
                             seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs matching an onnxruntime session's declared inputs."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        if arg.type not in ORT_TYPES:
            raise ValueError(f"input {arg.name!r} has type {arg.type}, which random inputs cannot make")
        shape = concrete_shape(arg.shape or [], dims or {}, default_dim)
        feeds[arg.name] = random_array(ORT_TYPES[arg.type], shape, rng)
    return feeds


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple  # ints, or strings/None for symbolic dimensions

    def concrete(self, batch: int) -> tuple[int, ...]:
        """Symbolic (batch) dimensions take `batch`."""
        return tuple(d if isinstance(d, int) and d > 0 else batch for d in self.shape)


def model_inputs(model_path) -> list[InputSpec]:
    """The model's real inputs (initializers listed as inputs by old IR versions excluded)."""
    model = onnx.load(str(model_path), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name, dims))
    return specs


def random_inputs(specs: Sequence[InputSpec], batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded per batch size: floats standard normal, integers small and non-negative."""
    rng = np.random.default_rng([seed, batch])
    return {s.name: random_array(s.dtype, s.concrete(batch), rng) for s in specs}


def has_symbolic_batch(specs: Sequence[InputSpec]) -> bool:
    return any(not (isinstance(d, int) and d > 0) for s in specs for d in s.shape)
