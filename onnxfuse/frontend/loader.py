"""Load an ONNX file (or ModelProto) into onnxfuse's DAG, canonicalized, with inferred shapes where possible.

Every failure to read the input becomes a one-line `ModelLoadError`; a model whose shapes cannot be
inferred still loads, with unknown shapes, because fusion needs only the dataflow.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import onnx
from onnx import external_data_helper, helper

from ..errors import ModelLoadError, first_line
from ..fusion.onnxruntime_fused_ops import onnxruntime_fused_ops
from ..ir import Dim, Graph, Node, Value
from .canonicalize import canonicalize
from .declared_shapes import declared_value_names, keep_declared_value_info
from .validate import external_data_files, read_model_header


def load_model(source: str | os.PathLike | onnx.ModelProto, canonical: bool = True,
               batch_first_trees: bool = True) -> Graph:
    """Read a model from a path (external data resolved beside it) or take a ModelProto.

    `canonical`: run the front-end passes first (`canonicalize.py`); off only to test fusion
    rules on patterns the passes would rewrite away; `batch_first_trees` off skips only that
    pass (`batch_first_trees.py`). The Graph's values carry every shape the
    passes inferred; its `model` only the value_info the source declared (declared_shapes.py)."""
    if isinstance(source, onnx.ModelProto):
        _check_is_model(source, "model")
        model = canonicalize(source, batch_first_trees) if canonical else source  # a copy: `source` stays as it was
        graph = build_graph(model, _infer_shapes(model))
        keep_declared_value_info(graph.model, declared_value_names(source))
        graph.onnxruntime_fused_ops = onnxruntime_fused_ops(source) if canonical else ()
        return graph
    path = Path(source)
    model = read_model_header(path)
    _check_is_model(model, path)
    declared = declared_value_names(model)
    fused_ops = onnxruntime_fused_ops(model, path) if canonical else ()
    if _has_external_data(model) and _external_bytes(model, path) <= INLINE_EXTERNAL_DATA_BYTES:
        _read_external_data(model, path)
    model = canonicalize(model, batch_first_trees) if canonical else model
    # Infer before the rest of the external data comes in: a >2 GB proto cannot be serialized.
    inferred = _infer_shapes(model)
    if _has_external_data(model):
        _read_external_data(model, path)
    graph = build_graph(model, inferred)
    keep_declared_value_info(graph.model, declared)
    graph.onnxruntime_fused_ops = fused_ops
    return graph


INLINE_EXTERNAL_DATA_BYTES = 256 << 20
"""External data up to this size is read before the front-end passes, so that they see the
weights of a small model saved with its weights beside it (PyTorch's dynamo exporter does so by
default): a Hummingbird forest is rewritten, a BatchNormalization folds into its Conv. Larger
data comes in after them, as before: a model near 2 GB, plus what folding adds, must stay one
serializable protobuf for shape inference."""


def _external_bytes(model: onnx.ModelProto, path: Path) -> int:
    return sum(f.stat().st_size for f in external_data_files(model, path) if f.is_file())


def _read_external_data(model: onnx.ModelProto, path: Path) -> None:
    try:
        external_data_helper.load_external_data_for_model(model, str(path.parent))
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot read its external data ({first_line(exc)})") from None


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _check_is_model(model: onnx.ModelProto, source) -> None:
    """Protobuf happily parses many non-ONNX byte strings into an empty message; reject those."""
    where = source if not isinstance(source, onnx.ModelProto) else "model"
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model (no IR version or graph)")
    if not model.opset_import:
        raise ModelLoadError(f"{where}: not an ONNX model (no opset import)")


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """Shapes from ONNX inference, with data propagation when it works; None if nothing works."""
    for data_prop in (True, False):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return onnx.shape_inference.infer_shapes(model, data_prop=data_prop)
        except Exception:
            continue
    return None


def build_graph(model: onnx.ModelProto, inferred: onnx.ModelProto | None = None,
                outer: dict[str, Value] | None = None) -> Graph:
    """Make the DAG: values with producers/consumers, types from `inferred` where known.

    `outer`: for a subgraph body, the values of its enclosing scopes (see `_build_bodies`)."""
    g = model.graph
    values: dict[str, Value] = {}
    captures = sorted(_captured_names([g])) if outer is not None else []
    for name in captures:
        values[name] = _captured(name, outer)

    def value(name: str) -> Value:
        if name not in values:
            values[name] = Value(name)
        return values[name]

    for init in g.initializer:
        v = value(init.name)
        v.initializer = init
        v.dtype = _np_dtype(init.data_type)
        v.shape = tuple(int(d) for d in init.dims)
    for vi in g.input:
        v = value(vi.name)
        if v.initializer is None:
            v.is_graph_input = True
        else:
            v.overridable = True
        _set_type(v, vi)
    for vi in list(g.value_info) + list(g.output):
        _set_type(value(vi.name), vi)
    if inferred is not None:
        ig = inferred.graph
        for vi in list(ig.value_info) + list(ig.output) + list(ig.input):
            _set_type(value(vi.name), vi, only_if_missing=True)

    nodes: list[Node] = []
    for index, proto in enumerate(g.node):
        node = Node(
            index=index,
            op_type=proto.op_type,
            domain=proto.domain if proto.domain != "ai.onnx" else "",
            name=proto.name,
            inputs=list(proto.input),
            outputs=list(proto.output),
            attributes=_attributes(proto),
        )
        subgraphs = _subgraphs(proto)
        if subgraphs:
            node.has_subgraph = True
            node.implicit_inputs = sorted(_captured_names(subgraphs))
        for out in node.outputs:
            if not out:
                continue
            v = value(out)
            if v.producer is not None or v.is_graph_input or v.initializer is not None or out in captures:
                raise ModelLoadError(f"value {out!r} is defined twice (second time by {node.label})")
            v.producer = index
        nodes.append(node)

    for node in nodes:
        for name in [n for n in node.inputs if n] + node.implicit_inputs:
            v = values.get(name)
            if v is None or (v.producer is None and not v.is_graph_input and v.initializer is None):
                if node.has_subgraph and name in node.implicit_inputs:
                    # A subgraph may read a name defined later in an enclosing scope we don't see.
                    node.implicit_inputs.remove(name)
                    continue
                raise ModelLoadError(f"{node.label} reads {name!r}, which nothing defines")
            v.consumers.append(node.index)

    outputs = [o.name for o in g.output]
    for name in outputs:
        if name not in values:
            raise ModelLoadError(f"graph output {name!r} is not defined")
        values[name].is_graph_output = True

    inputs = [vi.name for vi in g.input if values[vi.name].initializer is None]
    opsets = {(op.domain if op.domain != "ai.onnx" else ""): op.version for op in model.opset_import}
    graph = Graph(model=model, nodes=nodes, values=values, inputs=inputs, outputs=outputs, opsets=opsets,
                  captures=captures)
    try:
        graph.topological_order  # noqa: B018 - validates acyclicity once, here
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    _build_bodies(graph, inferred, {**(outer or {}), **values})
    return graph


def _captured(name: str, outer: dict[str, Value]) -> Value:
    """A body's view of an enclosing scope's value: typed as outside, a constant if it is one,
    else read like a graph input. Unknown outside (an enclosing scope not shown to us): untyped."""
    seen = outer.get(name)
    if seen is None:
        return Value(name, is_graph_input=True)
    return Value(name, seen.dtype, seen.shape, is_graph_input=seen.initializer is None,
                 initializer=seen.initializer)


def _build_bodies(graph: Graph, inferred: onnx.ModelProto | None, scope: dict[str, Value]) -> None:
    """Each graph attribute of each node becomes a Graph of its own (`Node.bodies`), with the
    types onnx's inference gave inside it. A body that cannot be read is left out: its owner
    runs as it is, unplanned."""
    inferred_nodes = list(inferred.graph.node) if inferred is not None else []
    for node, proto in zip(graph.nodes, graph.model.graph.node):
        if not node.has_subgraph:
            continue
        twin = inferred_nodes[node.index] if node.index < len(inferred_nodes) else None
        if twin is not None and twin.op_type != proto.op_type:
            twin = None
        inferred_bodies = {a.name: a.g for a in twin.attribute if a.type == onnx.AttributeProto.GRAPH} if twin else {}
        for attr in proto.attribute:
            if attr.type != onnx.AttributeProto.GRAPH:
                continue
            body = _as_model(attr.g, graph.model)
            body_inferred = _as_model(inferred_bodies[attr.name], graph.model) if attr.name in inferred_bodies else None
            try:
                node.bodies[attr.name] = build_graph(body, body_inferred, scope)
            except ModelLoadError:
                continue


def _as_model(body: onnx.GraphProto, owner: onnx.ModelProto) -> onnx.ModelProto:
    """A body wrapped as a model of its owner's IR version and opsets, so that every pass after
    the loader reads a body exactly as it reads a model."""
    model = onnx.ModelProto(ir_version=owner.ir_version)
    model.opset_import.extend(owner.opset_import)
    model.graph.CopyFrom(body)
    return model


def _set_type(v: Value, vi: onnx.ValueInfoProto, only_if_missing: bool = False) -> None:
    if not vi.type.HasField("tensor_type"):
        return
    tt = vi.type.tensor_type
    if tt.elem_type and not (only_if_missing and v.dtype):
        v.dtype = _np_dtype(tt.elem_type)
    if tt.HasField("shape") and not (only_if_missing and v.shape is not None):
        v.shape = tuple(_dim(d) for d in tt.shape.dim)


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    if d.HasField("dim_value"):
        return int(d.dim_value)
    if d.HasField("dim_param") and d.dim_param:
        return d.dim_param
    return None


def _np_dtype(code: int) -> str | None:
    try:
        return helper.tensor_dtype_to_np_dtype(code).name
    except Exception:
        return None  # strings, bfloat16 and friends: not a numpy-native dtype


def _attributes(proto: onnx.NodeProto) -> dict:
    out = {}
    for attr in proto.attribute:
        if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            continue
        try:
            out[attr.name] = helper.get_attribute_value(attr)
        except Exception:
            out[attr.name] = None
    return out


def _subgraphs(proto: onnx.NodeProto) -> list[onnx.GraphProto]:
    found = []
    for attr in proto.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found.extend(attr.graphs)
    return found


def _captured_names(subgraphs: list[onnx.GraphProto]) -> set[str]:
    """Names a subgraph (recursively) reads but does not define: its outer-scope inputs."""
    captured: set[str] = set()
    for sub in subgraphs:
        defined = {i.name for i in sub.input} | {i.name for i in sub.initializer}
        defined |= {o for n in sub.node for o in n.output}
        for n in sub.node:
            captured |= {i for i in n.input if i and i not in defined}
            captured |= _captured_names(_subgraphs(n)) - defined
        captured |= {o.name for o in sub.output if o.name not in defined}
    return captured
