"""Random inputs for a model, so two models can be compared without user data.

Integers are drawn small and non-negative: integer inputs are usually indices or counts, and a
comparison is only useful if the reference model accepts the input.
"""

from __future__ import annotations

import numpy as np

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


def random_feeds_for_session(session, dims: dict[str, int] | None = None, default_dim: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs matching an onnxruntime session's declared inputs."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        if arg.type not in ORT_TYPES:
            raise ValueError(f"input {arg.name!r} has type {arg.type}, which random inputs cannot make")
        shape = concrete_shape(arg.shape or [], dims or {}, default_dim)
        feeds[arg.name] = random_array(ORT_TYPES[arg.type], shape, rng)
    return feeds
