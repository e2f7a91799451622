"""What each small integer tensor of the graph holds, element by element: a number, the
run-time size of one axis of one tensor (`DimOf`), or such a size times a number (`ScaledDim`).

Exporters compute shapes in the graph: `Shape(x) → Gather → Unsqueeze → Concat`. Read this way,
`Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])` is `[DimOf(x, 0), -1]`, which a Reshape of `x`
can take as the constant `[0, -1]`. Only ops whose result is exactly known from their inputs
are followed; anything else leaves the value unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from .tensors import constant_array


@dataclass(frozen=True)
class DimOf:
    """The size of axis `axis` of `value` at run time; `symbol` is its dim_param, if it has one."""

    value: ir.Value
    axis: int
    symbol: str | None

    def is_dim(self, value: ir.Value, axis: int) -> bool:
        """Whether this is surely the same size as axis `axis` of `value`."""
        if self.value is value and self.axis == axis:
            return True
        if value.shape is None or axis >= len(value.shape):
            return False
        dim = value.shape[axis]
        return bool(self.symbol) and isinstance(dim, ir.SymbolicDim) and dim.value == self.symbol


@dataclass(frozen=True)
class ScaledDim:
    """`factor` (>= 2) times a run-time size: PyTorch's nn.MultiheadAttention computes its
    `batch * heads` rows as `Mul(Gather(Shape(x), 0), 4)`. Never negative, so never a Reshape's
    -1, and surely the size of no axis here (`is_dim`): Reshape's rule 2 may infer it as -1."""

    dim: DimOf
    factor: int

    symbol = None  # it names no dim_param

    def is_dim(self, value: ir.Value, axis: int) -> bool:
        return False


Element = int | DimOf | ScaledDim


@dataclass(frozen=True)
class ShapeValue:
    elements: tuple[Element, ...]
    scalar: bool = False  # a 0-D tensor (then one element)

    @property
    def is_constant(self) -> bool:
        return all(isinstance(e, int) for e in self.elements)


def constant_content(value: ir.Value) -> ShapeValue | None:
    """A small integer or boolean constant (a folded `Equal(shape, -1)` is boolean) as a ShapeValue."""
    array = constant_array(value)
    if array is None or value.shape is None or array.dtype.kind not in "iub" or array.ndim > 1 or array.size > 64:
        return None
    return ShapeValue(tuple(int(v) for v in array.reshape(-1)), scalar=array.ndim == 0)


def dim_element(value: ir.Value, axis: int) -> Element:
    dim = value.shape[axis]
    if isinstance(dim, int):
        return dim
    return DimOf(value, axis, dim.value or None)


def shape_values(graph: ir.Graph) -> dict[ir.Value, ShapeValue]:
    """Every value of the main graph whose content is known this way (nodes in order)."""
    known: dict[ir.Value, ShapeValue] = {}

    def lookup(value: ir.Value | None) -> ShapeValue | None:
        if value is None:
            return None
        if value in known:
            return known[value]
        return constant_content(value)

    for node in graph:
        if node.domain not in ("", "ai.onnx") or not node.outputs:
            continue
        result = _evaluate(node, lookup)
        if result is not None:
            known[node.outputs[0]] = result
    return known


def _evaluate(node: ir.Node, lookup) -> ShapeValue | None:
    op = node.op_type
    if op == "Shape":
        return _shape(node)
    first = lookup(node.inputs[0]) if node.inputs else None
    if op in ("Identity", "Cast") and first is not None:
        if op == "Cast" and _attr(node, "to") not in (ir.DataType.INT64.value, ir.DataType.INT32.value):
            return None
        return first
    if op == "Concat" and _attr(node, "axis", 0) in (0, -1):
        parts = [lookup(v) for v in node.inputs]
        if any(p is None or p.scalar for p in parts):
            return None
        return ShapeValue(tuple(e for p in parts for e in p.elements))
    if op == "Gather" and first is not None and not first.scalar and _attr(node, "axis", 0) in (0, -1):
        indices = lookup(node.inputs[1])
        if indices is None or not indices.is_constant:
            return None
        n = len(first.elements)
        if any(not -n <= i < n for i in indices.elements):
            return None
        return ShapeValue(tuple(first.elements[i] for i in indices.elements), scalar=indices.scalar)
    if op == "Unsqueeze" and first is not None and first.scalar:
        axes = _axes(node, lookup)
        return ShapeValue(first.elements) if axes in ([0], [-1]) else None
    if op == "Squeeze" and first is not None and len(first.elements) == 1 and not first.scalar:
        axes = _axes(node, lookup)
        return ShapeValue(first.elements, scalar=True) if axes in (None, [0], [-1]) else None
    if op == "Slice" and first is not None and not first.scalar:
        return _slice(node, first, lookup)
    if op == "Reshape" and first is not None:
        target = lookup(node.inputs[1])
        flattened_whole = target is not None and list(target.elements) in ([-1], [len(first.elements)])
        return ShapeValue(first.elements) if flattened_whole else None
    if op == "Mul":
        return _elementwise(lookup(node.inputs[0]), lookup(node.inputs[1]), _times)
    if op == "Equal":
        return _elementwise(lookup(node.inputs[0]), lookup(node.inputs[1]), _equal)
    if op == "Where":
        return _where(*(lookup(v) for v in node.inputs[:3]))
    return None


def _equal(a: Element, b: Element) -> int | None:
    """1 or 0 when surely equal or not (a size is never negative), None when it depends."""
    if isinstance(a, int) and isinstance(b, int):
        return int(a == b)
    if isinstance(a, DimOf) and isinstance(b, DimOf):
        return 1 if (a.value is b.value and a.axis == b.axis) or (a.symbol and a.symbol == b.symbol) else None
    if not isinstance(a, int) and not isinstance(b, int):
        return None
    number = a if isinstance(a, int) else b
    return 0 if number < 0 else None


def _times(a: Element, b: Element) -> Element | None:
    """a * b where a run-time size is multiplied by a positive number, else None."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    size, number = (a, b) if isinstance(b, int) else (b, a)
    if not isinstance(number, int) or number < 1 or isinstance(size, int):
        return None
    if number == 1:
        return size
    if isinstance(size, ScaledDim):
        return ScaledDim(size.dim, size.factor * number)
    return ScaledDim(size, number)


def _broadcast(*values: ShapeValue) -> int | None:
    """The common length of 1-D operands (a length-1 one broadcasts), None if they do not agree."""
    lengths = {len(v.elements) for v in values} - {1}
    return (lengths.pop() if lengths else 1) if len(lengths) <= 1 else None


def _at(value: ShapeValue, i: int) -> Element:
    return value.elements[0] if len(value.elements) == 1 else value.elements[i]


def _elementwise(a: ShapeValue | None, b: ShapeValue | None, f) -> ShapeValue | None:
    if a is None or b is None or (n := _broadcast(a, b)) is None:
        return None
    out = [f(_at(a, i), _at(b, i)) for i in range(n)]
    return None if None in out else ShapeValue(tuple(out), scalar=a.scalar and b.scalar)


def _where(cond: ShapeValue | None, x: ShapeValue | None, y: ShapeValue | None) -> ShapeValue | None:
    if cond is None or x is None or y is None or not cond.is_constant or (n := _broadcast(cond, x, y)) is None:
        return None
    picked = tuple(_at(x, i) if _at(cond, i) else _at(y, i) for i in range(n))
    return ShapeValue(picked, scalar=cond.scalar and x.scalar and y.scalar)


def _shape(node: ir.Node) -> ShapeValue | None:
    x = node.inputs[0]
    if x is None or x.shape is None:
        return None
    rank = len(x.shape)
    start, end = _attr(node, "start", 0), _attr(node, "end", rank)
    axes = range(rank)[slice(start, end)]  # the spec clamps start/end as Python slicing does
    return ShapeValue(tuple(dim_element(x, axis) for axis in axes))


def _slice(node: ir.Node, data: ShapeValue, lookup) -> ShapeValue | None:
    parts = [lookup(v) if v is not None else None for v in node.inputs[1:5]]
    starts, ends = parts[0], parts[1] if len(parts) > 1 else None
    if starts is None or ends is None or not (starts.is_constant and ends.is_constant):
        return None
    axes = parts[2] if len(parts) > 2 else None
    steps = parts[3] if len(parts) > 3 else None
    if len(node.inputs) > 3 and node.inputs[3] is not None and (axes is None or list(axes.elements) not in ([0], [-1])):
        return None
    if len(node.inputs) > 4 and node.inputs[4] is not None and (steps is None or not steps.is_constant):
        return None
    if len(starts.elements) != 1 or len(ends.elements) != 1:
        return None
    step = steps.elements[0] if steps is not None else 1
    if step == 0:
        return None
    # ONNX clamps starts/ends exactly as Python slicing does, for either sign of step.
    return ShapeValue(data.elements[slice(starts.elements[0], ends.elements[0], step)])


def _axes(node: ir.Node, lookup) -> list[int] | None:
    if "axes" in node.attributes:
        return list(node.attributes["axes"].as_ints())
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = lookup(node.inputs[1])
        return list(axes.elements) if axes is not None and axes.is_constant else []
    return None


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    return default if attr is None else attr.value
