"""Small helpers the passes share: read a value's constant, add an initializer under a fresh name."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's content if it is a constant the model cannot override, else None.

    An initializer that is also a graph input is a default the caller may replace: not a constant.
    Tensors whose data lives in an external file are not read here either.
    """
    if value is None or value.const_value is None or value.is_graph_input():
        return None
    if isinstance(value.const_value, ir.ExternalTensor):
        return None
    try:
        return value.const_value.numpy()
    except Exception:  # a dtype numpy cannot hold, a tensor that fails to decode
        return None


def constant_ints(value: ir.Value | None, max_elements: int = 64) -> list[int] | None:
    """A small integer constant as a flat list (a scalar gives one element), else None."""
    array = constant_array(value)
    if array is None or array.dtype.kind not in "iu" or array.size > max_elements or array.ndim > 1:
        return None
    return [int(v) for v in array.reshape(-1)]


def used_names(graph: ir.Graph) -> set[str]:
    names = {v.name for v in graph.inputs} | set(graph.initializers)
    names |= {o.name for node in graph for o in node.outputs}
    return {n for n in names if n}


def used_names_everywhere(graph: ir.Graph) -> set[str]:
    """The names used in `graph` and every body inside it (names are unique model-wide)."""
    names = used_names(graph)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                names |= used_names(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for body in attr.value:
                    names |= used_names(body)
    return names


def add_initializer(graph: ir.Graph, base: str, array: np.ndarray, taken: set[str] | None = None) -> ir.Value:
    """Register `array` as a new initializer named after `base` (suffixed if the name is taken)."""
    name = fresh_name(base, used_names(graph) if taken is None else taken)
    tensor = ir.tensor(array, name=name)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value


def replace_with_initializer(graph: ir.Graph, old: ir.Value, array: np.ndarray, taken: set[str]) -> None:
    """Every use of `old` (a node output, not a graph output) reads a new initializer instead.

    The initializer takes `old`'s name, so the model's names stay recognisable; `old` is renamed
    and left to its producer, which is dead unless it has other outputs still read."""
    name = old.name
    old.name = fresh_name(f"{name}__replaced", taken)
    new = add_initializer(graph, name, array, taken - {name})
    taken.add(name)
    old.replace_all_uses_with(new)


def take_over(graph: ir.Graph, new: ir.Node, result: ir.Value, removed: list[ir.Node]) -> None:
    """`new`, inserted before the first of `removed`, writes `result` instead of them: its one
    output takes `result`'s type, shape, readers (graph outputs included) and name; `removed`
    go."""
    new.outputs[0].shape, new.outputs[0].type = result.shape, result.type
    graph.insert_before(removed[0], new)
    result.replace_all_uses_with(new.outputs[0], replace_graph_outputs=True)
    name = result.name
    graph.remove(removed, safe=True)
    new.outputs[0].name = name


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`, ...: the first not in `taken`, which then holds it."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name
