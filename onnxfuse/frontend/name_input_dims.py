"""Pass: unknown dims of graph inputs become named symbols (`unk_0`, `unk_1`, ...).

Converters mark a dim they do not know in several ways: `dim_value: -1`, a dim with neither a
value nor a name, an empty `dim_param`, and (some) `dim_value: 0` for the batch. The code
generator needs every dim to be a number or a name it can bind at run time; a -1 taken as a size
made every kernel allocate ~2^64 bytes. Decided here:

- negative, missing or empty-named dims are unknown, whatever the axis;
- 0 is unknown on the first axis only (no one declares an input of zero rows); elsewhere it is
  kept, since a zero-length axis can be real (an empty cache, an empty selection);
- each unknown dim gets a symbol of its own: nothing says two of them are equal.

Graph outputs and intermediate values with negative dims have those dims made unknown (not
named: shape inference fills them in from the inputs).
"""

from __future__ import annotations

import onnx_ir as ir

SYMBOL_PREFIX = "unk_"


class NameUnknownInputDimsPass(ir.passes.InPlacePass):
    """Guarantee: every dim of every graph input with a known rank is an int ≥ 0 (≥ 1 on axis 0)
    or a non-empty symbol; new symbols are distinct from each other and from the model's own."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        symbols = _Symbols(_symbols_in_use(graph))
        modified = False
        for value in graph.inputs:
            if value.shape is None or value.is_initializer():
                continue
            dims = [symbols.fresh() if _unknown(d, axis) else d for axis, d in enumerate(value.shape)]
            if dims != list(value.shape):
                value.shape = ir.Shape(dims)
                modified = True
        for value in _other_declared_values(graph):
            if value.shape is not None and any(isinstance(d, int) and d < 0 for d in value.shape):
                value.shape = ir.Shape([None if isinstance(d, int) and d < 0 else d for d in value.shape])
                modified = True
        return ir.passes.PassResult(model, modified=modified)


def _unknown(dim, axis: int) -> bool:
    if isinstance(dim, int):
        return dim < 0 or (dim == 0 and axis == 0)
    return not dim.value


class _Symbols:
    def __init__(self, taken: set[str]):
        self.taken, self.next = taken, 0

    def fresh(self) -> ir.SymbolicDim:
        while f"{SYMBOL_PREFIX}{self.next}" in self.taken:
            self.next += 1
        name = f"{SYMBOL_PREFIX}{self.next}"
        self.taken.add(name)
        return ir.SymbolicDim(name)


def _symbols_in_use(graph: ir.Graph) -> set[str]:
    values = list(graph.inputs) + list(graph.outputs) + [o for node in graph for o in node.outputs]
    return {d.value for v in values if v.shape is not None for d in v.shape
            if isinstance(d, ir.SymbolicDim) and d.value}


def _other_declared_values(graph: ir.Graph):
    yield from graph.outputs
    for node in graph:
        yield from node.outputs
