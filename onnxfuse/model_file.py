"""Writing a model file: inline, or with its weights in one data file beside it when protobuf
cannot hold them (2 GB), streamed tensor by tensor so memory stays at the model's own size."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx import numpy_helper

from .frontend.validate import tensor_bytes

EXTERNAL_TENSOR_MIN_BYTES = 1024  # smaller tensors stay in the .onnx file, as onnx.save does
ALIGNMENT = 4096  # each tensor starts on a page boundary, so onnxruntime may map it instead of copying
_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")


def load_unchanged(path: Path) -> onnx.ModelProto:
    """The model file as it is, its external data read in. What `optimize` writes when it keeps no
    kernel: the front end's rewrites (folded constants, canonical shapes) only ever reach
    onnxruntime with kernels that the shipped check vouches for."""
    return onnx.load(str(path), load_external_data=True)


def weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the main graph's initializers, from their shapes (without serializing)."""
    return sum(tensor_bytes(t) or 0 for t in model.graph.initializer)


def stage_model(model: onnx.ModelProto, path: Path, data_path: Path, threshold: int) -> list[tuple[Path, Path]]:
    """Write `model` to temporary files beside `path` (its external data beside `data_path` when
    its weights exceed `threshold` bytes); returns (temporary, final) pairs for the caller to
    rename, data first. Moves large tensors out of `model` into the data file. On any failure
    the temporary files are gone and the OSError propagates."""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pairs: list[tuple[Path, Path]] = []
    try:
        if weight_bytes(model) > threshold:
            staged_data = data_path.with_name(f".{data_path.name}.{os.getpid()}.tmp")
            pairs.append((staged_data, data_path))
            move_weights_to_file(model, staged_data, data_path.name)
        staged.write_bytes(model.SerializeToString(deterministic=True))
        pairs.append((staged, path))
    except BaseException:
        for tmp in [p for p, _ in pairs] + [staged]:
            tmp.unlink(missing_ok=True)
        raise
    return pairs


def move_weights_to_file(model: onnx.ModelProto, file: Path, location: str) -> None:
    """Write each large initializer's bytes to `file` and leave in the model a reference to them
    under the name `location` (the file's final name, relative to the model)."""
    with open(file, "wb") as out:
        for tensor in model.graph.initializer:
            size = tensor_bytes(tensor)
            if size is None or size < EXTERNAL_TENSOR_MIN_BYTES or tensor.data_location == onnx.TensorProto.EXTERNAL:
                continue
            data = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
            offset = out.tell()
            padding = -offset % ALIGNMENT
            if padding:
                out.write(b"\0" * padding)
                offset += padding
            out.write(data)
            del data
            tensor.ClearField("raw_data")
            for name in _TYPED_FIELDS:
                tensor.ClearField(name)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(size))):
                tensor.external_data.add(key=key, value=value)
