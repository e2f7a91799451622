"""onnxfuse's own DAG of an ONNX graph: nodes, values, producers and consumers.

The ONNX protobuf is awkward to analyse (values are strings, consumers are implicit, subgraphs
capture outer values invisibly). This IR makes the dataflow explicit once, so every pass after it
reads plain Python objects. Node indices are indices into the original `graph.node`, so a plan
can always be reported in terms of the user's model.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

Dim = int | str | None
"""int: static; str: symbolic (dim_param); None: unknown."""


@dataclass
class Value:
    name: str
    dtype: str | None = None  # numpy dtype name, None when unknown
    shape: tuple[Dim, ...] | None = None  # None when even the rank is unknown
    producer: int | None = None  # index of the producing node
    consumers: list[int] = field(default_factory=list)  # node indices, one entry per use
    is_graph_input: bool = False
    is_graph_output: bool = False
    initializer: onnx.TensorProto | None = None
    overridable: bool = False  # an initializer the graph also lists as an input (IR 3 exports)

    @property
    def is_constant(self) -> bool:
        return self.initializer is not None

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int | None:
        if not self.is_static:
            return None
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Node:
    index: int
    op_type: str
    domain: str
    name: str
    inputs: list[str]  # "" marks an omitted optional input
    outputs: list[str]
    attributes: dict[str, Any]
    implicit_inputs: list[str] = field(default_factory=list)  # outer values its subgraphs read
    has_subgraph: bool = False
    bodies: dict[str, Graph] = field(default_factory=dict)
    """Its graph attributes (If branches, Loop/Scan bodies) as graphs of their own, by attribute
    name: fusion plans each like a model (see Graph.scopes)."""

    @property
    def label(self) -> str:
        return f"{self.op_type}#{self.index}"


@dataclass
class Graph:
    model: onnx.ModelProto
    nodes: list[Node]
    values: dict[str, Value]
    inputs: list[str]  # graph inputs that are not initializers
    outputs: list[str]
    opsets: dict[str, int]
    captures: list[str] = field(default_factory=list)
    """In a subgraph body: the enclosing scopes' values it reads by name. They appear in `values`
    like graph inputs (or initializers, when the outer value is one) but not in `inputs`."""
    onnxruntime_fused_ops: tuple = ()
    """The model's chains of ops onnxruntime computes as one kernel of its own
    (fusion/onnxruntime_fused_ops.py: FusedOp each); set on the model's graph by the loader."""

    def scopes(self, path: str = "") -> Iterator[tuple[str, Graph]]:
        """This graph and every body below it, depth first, each with its path: "" for the model,
        `If_3/then_branch` for a body, `If_3/then_branch/Loop_0/body` for a body inside it."""
        yield path, self
        for node in self.nodes:
            for attribute, body in node.bodies.items():
                yield from body.scopes(body_path(path, node, attribute))

    def scope(self, path: str) -> Graph:
        """The graph at `path` (see scopes)."""
        return self.scopes_by_path[path]

    @cached_property
    def scopes_by_path(self) -> dict[str, Graph]:
        return dict(self.scopes())

    def value(self, name: str) -> Value:
        return self.values[name]

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer, or None if `name` is computed at run time."""
        value = self.values.get(name)
        if value is None or value.initializer is None:
            return None
        return numpy_helper.to_array(value.initializer)

    def data_inputs(self, node: Node) -> list[str]:
        """Every value the node reads, explicit and captured by subgraphs, without omitted ones."""
        return [n for n in node.inputs if n] + node.implicit_inputs

    def successors(self, index: int) -> list[int]:
        """Consumer nodes of any output of node `index`, each once, in index order."""
        return self._successors[index]

    def predecessors(self, index: int) -> list[int]:
        return self._predecessors[index]

    @cached_property
    def _successors(self) -> list[list[int]]:
        succ: list[set[int]] = [set() for _ in self.nodes]
        for node in self.nodes:
            for name in self.data_inputs(node):
                producer = self.values[name].producer
                if producer is not None:
                    succ[producer].add(node.index)
        return [sorted(s) for s in succ]

    @cached_property
    def _predecessors(self) -> list[list[int]]:
        pred: list[set[int]] = [set() for _ in self.nodes]
        for src, dsts in enumerate(self._successors):
            for dst in dsts:
                pred[dst].add(src)
        return [sorted(p) for p in pred]

    @cached_property
    def topological_order(self) -> list[int]:
        """Node indices, producers first; ties keep the file's order (stable Kahn)."""
        indegree = [len(p) for p in self._predecessors]
        ready = [i for i, d in enumerate(indegree) if d == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in self._successors[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != len(self.nodes):
            stuck = next(n for n in self.nodes if indegree[n.index] > 0)
            raise ValueError(f"the graph has a cycle through {stuck.label}")
        return order


def body_path(parent: str, node: Node, attribute: str) -> str:
    """The path of one body of `node` (a node of the graph at `parent`)."""
    own = f"{node.op_type}_{node.index}/{attribute}"
    return f"{parent}/{own}" if parent else own
