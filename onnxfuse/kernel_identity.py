"""A group's kernel identity: what its kernel computes, apart from value names and weights.

Models repeat themselves (a dozen transformer layers, a stack of CNN blocks) with other weights.
Cut out as they are, their groups differ in the names of the values they read and in the
contents of their weights, so each would compile to a kernel of its own. `canonical_group`
rewrites a group model into the form that is hashed (cache key) and compiled:

1. The operand-layout rewrites code generation would apply anyway run first
   (codegen/operand_layout.py): a `Gemm(transB=1)` weight is transposed here, as this group's
   own argument, rather than baked into the kernel.
2. Every float initializer of more than one element that no op needs at compile time becomes a
   graph input after the group's runtime inputs: a *weight*, passed to the kernel by each node.
   What stays an initializer is *baked in* and part of the identity: one-element constants
   (immediates), the inputs an op needs at compile time (shapes, axes, pads: ops.py's
   `static_inputs`), and integer or bool tensors (indices and tables). docs/kernel-identity.md
   says why.
3. Values, nodes and symbolic dims get positional names: inputs `x0..`, weights `w0..`, baked
   constants `c0..`, outputs `y0..`, intermediates `t0..`, nodes `n0..`, dims `s0..` (a product
   of dims the inputs bind by theirs: `10*batch` becomes `10*s1`).

Groups with the same canonical model compile once. `CanonicalGroup.bind` turns the one kernel
back into each group's own: its arguments named after the group's values, its derived weights
(a transposed copy) carried along.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .codegen.operand_layout import operands_in_place
from .dim_products import parse_product
from .errors import CompileError, short_reason
from .kernel_spec import GroupKernel
from .ops import group_op_info

FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                         onnx.TensorProto.BFLOAT16})


@dataclass(frozen=True)
class CanonicalGroup:
    """A group model in canonical form, and what ties it back to the group it came from."""

    model: onnx.ModelProto
    """Positional names; weights are graph inputs after the runtime inputs. Hashed and compiled."""
    weights: dict[str, np.ndarray]
    """This group's weights by canonical name: the values the kernel is verified with."""
    sources: dict[str, str]
    """Canonical name → the group model's own name, for every input and initializer."""

    def bind(self, kernel: GroupKernel, model_values: Container[str]) -> GroupKernel:
        """`kernel` (compiled from the canonical model) as this group calls it: each argument the
        model value it reads (`model_values`: the group's inputs), or, for one the model does not
        hold (a transposed weight), that tensor among the kernel's extra weights."""
        sources, extra = [], dict(kernel.extra_weights)
        for canonical in kernel.arg_sources:
            own = self.sources.get(canonical)
            if own is None:  # one of the kernel's own extra weights: the same for every group
                sources.append(canonical)
            elif own in model_values:
                sources.append(own)
            else:
                extra[canonical] = self._tensor(canonical)
                sources.append(canonical)
        return replace(kernel, arg_sources=tuple(sources), extra_weights=extra)

    def slim(self, model_values: Container[str]) -> CanonicalGroup:
        """This group without copies of the weights the model holds: all `bind` needs, so groups
        waiting for their kernel do not hold a second copy of the model's weights."""
        kept = {name: array for name, array in self.weights.items() if self.sources[name] not in model_values}
        return replace(self, weights=kept)

    def _tensor(self, canonical: str) -> np.ndarray:
        if canonical in self.weights:
            return self.weights[canonical]
        tensor = next((t for t in self.model.graph.initializer if t.name == canonical), None)
        if tensor is None:
            raise ValueError(f"kernel argument {canonical} ({self.sources[canonical]}) is neither a value the "
                             "group reads nor one of its constants")
        return numpy_helper.to_array(tensor)


def canonical_group(group_model: onnx.ModelProto) -> CanonicalGroup:
    """The canonical form of `group_model` (see the module docstring). Raises CompileError: a
    group that cannot be put in canonical form falls back, like one that cannot compile."""
    try:
        return _canonical(group_model)
    except Exception as exc:
        raise CompileError(f"canonical form: {short_reason(exc)}") from exc


def _canonical(group_model: onnx.ModelProto) -> CanonicalGroup:
    model = operands_in_place(group_model)
    g = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in g.node for a in n.attribute):
        # Subgraphs read outer values by name: renaming would have to reach into them. Such a
        # group keeps its names, and so an identity of its own.
        return CanonicalGroup(group_model, {}, {})
    initializers = {t.name: t for t in g.initializer}
    baked = _baked_initializers(g, initializers)
    names = {v.name: f"x{position}" for position, v in enumerate(g.input)}
    weights_seen, constants_seen = [], []
    for node in g.node:  # initializers in order of first use
        for name in node.input:
            if name in initializers and name not in names:
                seen, prefix = (constants_seen, "c") if name in baked else (weights_seen, "w")
                names[name] = f"{prefix}{len(seen)}"
                seen.append(name)
    sources = {canonical_name: own for own, canonical_name in names.items()}
    names.update({v.name: f"y{position}" for position, v in enumerate(g.output)})
    intermediates = [o for node in g.node for o in node.output if o and o not in names]
    names.update({name: f"t{position}" for position, name in enumerate(intermediates)})
    names[""] = ""  # an omitted optional input

    symbols = _plain_symbols(g.input)
    inputs = [_renamed_info(v, names[v.name], symbols) for v in g.input]
    weight_inputs = [helper.make_tensor_value_info(names[n], initializers[n].data_type, list(initializers[n].dims))
                     for n in weights_seen]
    outputs = [_renamed_info(v, names[v.name], symbols) for v in g.output]
    nodes = []
    for position, node in enumerate(g.node):
        clone = onnx.NodeProto()
        clone.CopyFrom(node)
        clone.name = f"n{position}"
        _drop_notes(clone)
        clone.input[:] = [names[i] for i in node.input]
        clone.output[:] = [names[o] for o in node.output]
        nodes.append(clone)
    constants = [_renamed_tensor(initializers[n], names[n]) for n in constants_seen]
    canonical = helper.make_model(helper.make_graph(nodes, "group", inputs + weight_inputs, outputs, constants),
                                  opset_imports=list(model.opset_import), ir_version=model.ir_version)
    weights = {names[n]: numpy_helper.to_array(initializers[n]) for n in weights_seen}
    return CanonicalGroup(canonical, weights, sources)


def _baked_initializers(g: onnx.GraphProto, initializers: dict[str, onnx.TensorProto]) -> set[str]:
    """The initializers the kernel bakes in (see the module docstring); the rest are weights."""
    baked = set()
    for node in g.node:
        info = group_op_info(node.op_type, node.domain)
        static = range(len(node.input)) if info is None else info.static_inputs
        baked.update(node.input[i] for i in static if i < len(node.input) and node.input[i] in initializers)
    for name, tensor in initializers.items():
        if tensor.data_type not in FLOAT_TYPES or int(np.prod(tensor.dims, dtype=np.int64)) <= 1:
            baked.add(name)
    return baked


def _renamed_tensor(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    clone = onnx.TensorProto()
    clone.CopyFrom(tensor)
    clone.name = name
    _drop_notes(clone)
    return clone


def _dims(value: onnx.ValueInfoProto):
    if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
        yield from value.type.tensor_type.shape.dim


def _plain_symbols(inputs) -> dict[str, str]:
    """The inputs' symbolic dims that bind a value, named `s<k>` in order of first appearance: all
    but products of other dims (`10*batch`), which the kernel computes and checks instead."""
    symbols: dict[str, str] = {}
    for value in inputs:
        for dim in _dims(value):
            if dim.HasField("dim_param") and parse_product(dim.dim_param) is None:
                symbols.setdefault(dim.dim_param, f"s{len(symbols)}")
    return symbols


def _renamed_info(value: onnx.ValueInfoProto, name: str, symbols: dict[str, str]) -> onnx.ValueInfoProto:
    """`value` under `name`, its symbolic dims named `s<k>` in order of first appearance; a product
    of symbols that inputs bind is named by their names (`10*s1`, dim_products.py)."""
    clone = onnx.ValueInfoProto()
    clone.CopyFrom(value)
    clone.name = name
    _drop_notes(clone)
    for dim in _dims(clone):
        if dim.HasField("dim_param"):
            product = parse_product(dim.dim_param)
            if product is not None and all(s in symbols for s in product.symbols):
                dim.dim_param = product.named(symbols)
            else:
                dim.dim_param = symbols.setdefault(dim.dim_param, f"s{len(symbols)}")
        dim.denotation = ""
    return clone


def _drop_notes(proto) -> None:
    """Clears what exporters write for people (doc strings, source locations, module paths in
    metadata_props): it differs from layer to layer and means nothing to the kernel."""
    proto.doc_string = ""
    for attribute in getattr(proto, "attribute", ()):
        attribute.doc_string = ""
    if hasattr(proto, "metadata_props"):
        del proto.metadata_props[:]
