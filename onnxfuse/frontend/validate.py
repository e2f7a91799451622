"""Checks a model must pass before anything is compiled: each failure is one line and exit 2.

Why here and not left to onnxruntime: a model onnxruntime cannot run (an opset newer than onnx
knows, a node in a domain the model never imports, external data cut short) used to load, every
group then failed verification, and optimize exited 0 with nothing fused. And a model that is
already onnxfuse's output would be fused a second time around custom nodes no one can compile.

The checks read the model without its external data, so they cost a parse of the .onnx file and
a stat of each data file, never the weights themselves.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx import external_data_helper

from ..errors import ModelLoadError, UsageError, first_line
from ..kernel_spec import DOMAIN, LIBRARY_METADATA_KEY

# Domains onnx itself defines operator sets for, with the newest version the installed onnx knows.
_ONNX_DOMAINS = {"": "the default ONNX domain", "ai.onnx": "the default ONNX domain", "ai.onnx.ml": "ai.onnx.ml"}


def read_model_header(path: str | os.PathLike) -> onnx.ModelProto:
    """The model file without its external data (weights stay on disk)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ModelLoadError(f"{path}: not a readable ONNX model ({first_line(exc)})") from None


def validate_model_file(path: str | os.PathLike, *, allow_onnxfuse_output: bool = False) -> onnx.ModelProto:
    """Raise ModelLoadError (or UsageError for our own output) unless `path` is a model onnxfuse
    can take; returns the model as read, without external data."""
    path = Path(path)
    model = read_model_header(path)
    if not allow_onnxfuse_output:
        refuse_onnxfuse_output(model, path)
    check_opsets(model, path)
    check_domains(model, path)
    check_external_data(model, path.parent, path)
    return model


def is_onnxfuse_output(model: onnx.ModelProto) -> bool:
    return any(op.domain == DOMAIN for op in model.opset_import) or any(
        p.key == LIBRARY_METADATA_KEY for p in model.metadata_props)


def refuse_onnxfuse_output(model: onnx.ModelProto, where) -> None:
    if is_onnxfuse_output(model):
        raise UsageError(f"{where}: already optimized by onnxfuse (it imports the {DOMAIN} domain); "
                         "optimize the original model instead")


def check_opsets(model: onnx.ModelProto, where) -> None:
    """Every opset the model imports for an ONNX domain exists in the installed onnx."""
    newest = {"": onnx.defs.onnx_opset_version(), "ai.onnx.ml": _newest_opset("ai.onnx.ml")}
    for op in model.opset_import:
        domain = "" if op.domain == "ai.onnx" else op.domain
        if domain not in newest:
            continue  # a vendor domain (com.microsoft, ...): onnxruntime decides
        if op.version < 1:
            raise ModelLoadError(f"{where}: opset {op.version} of {_ONNX_DOMAINS[domain]} does not exist")
        if newest[domain] and op.version > newest[domain]:
            raise ModelLoadError(f"{where}: opset {op.version} of {_ONNX_DOMAINS[domain]} is newer than the installed "
                                 f"onnx {onnx.__version__} knows (up to {newest[domain]})")


def _newest_opset(domain: str) -> int:
    versions = [s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.domain == domain]
    return max(versions, default=0)


def check_domains(model: onnx.ModelProto, where) -> None:
    """Every node's domain is one the model imports (subgraphs and functions included)."""
    imported = {"" if op.domain == "ai.onnx" else op.domain for op in model.opset_import}
    for function in model.functions:
        imported.add(function.domain)
    for node in all_nodes(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in imported:
            label = f"node {node.name!r} ({node.op_type})" if node.name else f"a {node.op_type} node"
            raise ModelLoadError(f"{where}: {label} is in domain {domain or 'ai.onnx'!r}, "
                                 "which the model does not import (no opset_import entry)")


def all_nodes(graph: onnx.GraphProto):
    """Every node of the graph and of every body inside it, depth first."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield from all_nodes(sub)


def _all_tensors(graph: onnx.GraphProto):
    """Initializers and tensor attributes, in subgraphs too."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            yield from attr.tensors
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield from _all_tensors(sub)


def check_external_data(model: onnx.ModelProto, base_dir: Path, where) -> None:
    """Each externally stored tensor's bytes are there: the file exists inside the model's
    directory and holds offset + length bytes (length from the shape when not given)."""
    for tensor in _all_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        data_path = (base_dir / info.location).resolve()
        if not info.location or os.path.isabs(info.location) or not data_path.is_relative_to(base_dir.resolve()):
            raise ModelLoadError(f"{where}: tensor {tensor.name!r} points outside the model's directory "
                                 f"({info.location!r})")
        if not data_path.is_file():
            raise ModelLoadError(f"{where}: tensor {tensor.name!r}: its external data file {info.location} is missing")
        needed = info.length if info.length else tensor_bytes(tensor)
        have = data_path.stat().st_size - (info.offset or 0)
        if needed is not None and have < needed:
            raise ModelLoadError(f"{where}: tensor {tensor.name!r}: {info.location} holds {max(have, 0)} bytes from "
                                 f"offset {info.offset or 0}, the tensor needs {needed} (truncated external data)")


def tensor_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes a tensor's shape and type take, or None for types without a fixed size (strings)."""
    if tensor.data_type == onnx.TensorProto.STRING:
        return None
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except Exception:
        return None
    if onnx.helper.tensor_dtype_to_string(tensor.data_type).endswith(("INT4", "FLOAT4E2M1", "INT2")):
        return None  # packed below one byte per element
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * itemsize


def external_data_files(model: onnx.ModelProto, model_path: Path) -> list[Path]:
    """The files a model's external data lives in (for never writing over them)."""
    names = {e.value for t in _all_tensors(model.graph) for e in t.external_data if e.key == "location"}
    return [Path(model_path).parent / name for name in sorted(names)]
