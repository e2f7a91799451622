"""Inputs for a model: its declared inputs, the user's own (an .npz), and random ones so two
models can be compared without user data.

Sizes. A symbolic dimension named in `dims` (`--dim NAME=N`) takes that value; every other
symbolic or unnamed dimension takes the batch (`--batch N`). The user's inputs keep their own
sizes, except along the axes those two options resize: there the file's entries are repeated
(or cut) to the new size, so a batch of 64 made from 2 recorded rows still holds real values.

Integers. An integer input that the graph uses as Gather or GatherElements indices (directly,
or through Cast, Reshape, Unsqueeze, ...) is drawn from the whole gathered axis, where the graph
gives its size: token ids then cover the vocabulary. Any other integer input is 0 or 1 (masks
and flags, the usual other integer inputs, accept those and nothing larger).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..dim_products import parse_product
from ..errors import UsageError

ORT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int16)": "int16", "tensor(int8)": "int8",
    "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(uint32)": "uint32", "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}
FLAG_VALUES = 2  # integers not known to be indices: drawn from [0, FLAG_VALUES)


def random_array(dtype: str, shape: tuple[int, ...], rng: np.random.Generator, high: int = FLAG_VALUES) -> np.ndarray:
    """Always an ndarray: for shape () numpy's draws are scalars, which onnxruntime refuses.
    Integers are drawn from [0, high)."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dt, np.integer):
        return np.asarray(rng.integers(0, max(1, high), size=shape), dtype=dt)
    return np.asarray(rng.standard_normal(shape), dtype=dt)


def concrete_shape(shape, dims: Mapping[str, int], default: int) -> tuple[int, ...]:
    """Symbolic or unknown dimensions take the value the user gave for that name, else `default`;
    a product of names (`10*s1`, a kernel's group model) the product of their values."""
    def value(d) -> int:
        if isinstance(d, int) and d >= 0:
            return d
        if not isinstance(d, str):
            return default
        product = parse_product(d) if d not in dims else None
        if product is not None:
            return product.value({s: dims.get(s, default) for s in product.symbols})
        return dims.get(d, default)
    return tuple(value(d) for d in shape)


def random_feeds_for_session(session, dims: Mapping[str, int] | None = None, default_dim: int = 3,
                             seed: int = 0, index_limits: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs matching an onnxruntime session's declared inputs (index_limits: see index_limits())."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        if arg.type not in ORT_TYPES:
            raise ValueError(f"input {arg.name!r} has type {arg.type}, which random inputs cannot make")
        shape = concrete_shape(arg.shape or [], dims or {}, default_dim)
        feeds[arg.name] = random_array(ORT_TYPES[arg.type], shape, rng, (index_limits or {}).get(arg.name, FLAG_VALUES))
    return feeds


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple  # ints, or strings/None for symbolic dimensions

    def concrete(self, batch: int | None, dims: Mapping[str, int] | None = None) -> tuple[int, ...]:
        """Named dimensions in `dims` take that value; every other symbolic one takes `batch`."""
        out = []
        for d in self.shape:
            if isinstance(d, int) and d > 0:
                out.append(d)
            elif isinstance(d, str) and dims and d in dims:
                out.append(dims[d])
            elif batch is None:
                raise UsageError(f"input {self.name!r}: dimension {d or '(unnamed)'} needs a batch or a --dim value")
            else:
                out.append(batch)
        return tuple(out)


def load_model_skeleton(model_path) -> onnx.ModelProto:
    return onnx.load(str(model_path), load_external_data=False)


def model_inputs(model_path) -> list[InputSpec]:
    """The model's real inputs (initializers listed as inputs by old IR versions excluded)."""
    return declared_inputs(load_model_skeleton(model_path))


def declared_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    weights = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name, dims))
    return specs


def symbolic_dim_names(specs: Sequence[InputSpec]) -> list[str]:
    """The named symbolic dimensions of the inputs, in order of first appearance."""
    return list(dict.fromkeys(d for s in specs for d in s.shape if isinstance(d, str) and d))


def check_dim_names(specs: Sequence[InputSpec], dims: Mapping[str, int]) -> None:
    """A --dim naming no input dimension is a typo: say which names exist."""
    names = symbolic_dim_names(specs)
    unknown = [d for d in dims if d not in names]
    if unknown:
        have = ", ".join(names) if names else "none"
        raise UsageError(f"--dim {unknown[0]}: the model's inputs have no dimension of that name (named: {have})")


def has_free_dims(specs: Sequence[InputSpec], dims: Mapping[str, int] | None = None) -> bool:
    """Whether some symbolic or unnamed dimension is left for the batch to set."""
    return any(not (isinstance(d, int) and d > 0) and not (isinstance(d, str) and d in (dims or {}))
               for s in specs for d in s.shape)


def has_symbolic_batch(specs: Sequence[InputSpec]) -> bool:
    return has_free_dims(specs)


# -- integer ranges from the graph ----------------------------------------------------------------

VALUE_PRESERVING = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Transpose"}
"""Ops whose first input's values reach the output unchanged (re-shaped or re-typed only)."""
INDEX_INPUT = {"Gather": 1, "GatherElements": 1}


def index_limits(model: onnx.ModelProto) -> dict[str, int]:
    """Integer input name → exclusive upper bound, for inputs used as Gather/GatherElements indices
    into an axis whose size the graph gives (an initializer, a Constant, or an inferred static shape).
    An input indexing several axes gets the smallest size."""
    graph = model.graph
    shapes = _static_shapes(model)
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, position))
    limits = {}
    for spec in declared_inputs(model):
        if not np.issubdtype(np.dtype(spec.dtype), np.integer):
            continue
        sizes, frontier, seen = [], [spec.name], set()
        while frontier:
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            for node, position in consumers.get(name, []):
                if node.op_type in VALUE_PRESERVING and position == 0:
                    frontier.extend(node.output)
                elif INDEX_INPUT.get(node.op_type) == position:
                    size = _axis_size(node, shapes)
                    if size:
                        sizes.append(size)
        if sizes:
            limits[spec.name] = min(sizes)
    return limits


def _axis_size(node: onnx.NodeProto, shapes: dict[str, tuple]) -> int | None:
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    shape = shapes.get(node.input[0])
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    size = shape[axis]
    return size if isinstance(size, int) and size > 0 else None


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    """Shapes the file states: initializers, Constant nodes, and onnx's shape inference where it runs."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                shapes[node.output[0]] = tuple(value.dims)
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    except Exception:  # an op onnx does not know, or a malformed file: the stated shapes must do
        inferred = []
    for info in inferred:
        dims = info.type.tensor_type.shape.dim
        if info.name not in shapes and dims and all(d.HasField("dim_value") for d in dims):
            shapes[info.name] = tuple(d.dim_value for d in dims)
    return shapes


# -- feeds ----------------------------------------------------------------------------------------

def random_inputs(specs: Sequence[InputSpec], batch: int | None, seed: int = 0, dims: Mapping[str, int] | None = None,
                  limits: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded per batch size: floats standard normal, integers in [0, limits[name]) or 0/1."""
    rng = np.random.default_rng([seed, batch or 0])
    return {s.name: random_array(s.dtype, s.concrete(batch, dims), rng, (limits or {}).get(s.name, FLAG_VALUES))
            for s in specs}


def load_inputs(path, specs: Sequence[InputSpec]) -> dict[str, np.ndarray]:
    """The arrays of an .npz, checked against the model's inputs (names, dtypes, ranks, static
    dims), in the model's input order; a mismatch is a usage error that says which."""
    if not Path(path).is_file():
        raise UsageError(f"--inputs {path}: no such file")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    missing = [s.name for s in specs if s.name not in arrays]
    extra = [k for k in arrays if k not in {s.name for s in specs}]
    if missing or extra:
        raise UsageError(f"--inputs {path}: its arrays {sorted(arrays)} do not match the model's inputs "
                         f"{[s.name for s in specs]}" + (f" (missing {missing})" if missing else ""))
    feeds = {}
    for s in specs:
        a = arrays[s.name]
        if a.dtype != np.dtype(s.dtype) or a.ndim != len(s.shape) or any(
                isinstance(d, int) and d > 0 and d != n for d, n in zip(s.shape, a.shape)):
            raise UsageError(f"--inputs {path}: {s.name} is {a.dtype}{list(a.shape)}, the model declares "
                             f"{s.dtype}{[d if d else '?' for d in s.shape]}")
        feeds[s.name] = a
    return feeds


def resize_inputs(feeds: Mapping[str, np.ndarray], specs: Sequence[InputSpec], batch: int | None = None,
                  dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """The user's inputs at new sizes: along an axis declared as a name in `dims`, or (if `batch` is
    given) any other symbolic axis, the entries are repeated cyclically or cut to the new size."""
    out = {}
    for s in specs:
        a = feeds[s.name]
        for axis, d in enumerate(s.shape):
            if isinstance(d, int) and d > 0:
                continue
            size = dims[d] if isinstance(d, str) and dims and d in dims else batch
            if size is not None and size != a.shape[axis]:
                if a.shape[axis] == 0:
                    raise UsageError(f"input {s.name!r} is empty along axis {axis}: nothing to repeat")
                a = np.take(a, np.arange(size) % a.shape[axis], axis=axis)
        out[s.name] = np.ascontiguousarray(a)
    return out


def dim_values(specs: Sequence[InputSpec], feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The size of every symbolic dimension in `feeds`: by name, or `input[axis]` where unnamed."""
    values: dict[str, int] = {}
    for s in specs:
        for axis, d in enumerate(s.shape):
            if not (isinstance(d, int) and d > 0):
                values.setdefault(d if isinstance(d, str) and d else f"{s.name}[{axis}]", int(feeds[s.name].shape[axis]))
    return values


def make_feeds(specs: Sequence[InputSpec], batch: int | None, dims: Mapping[str, int] | None = None,
               inputs=None, seed: int = 0, limits: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """One run's feeds: the user's inputs resized where `batch`/`dims` say, else random ones."""
    if inputs is not None:
        return resize_inputs(load_inputs(inputs, specs), specs, batch, dims)
    return random_inputs(specs, batch, seed, dims, limits)
