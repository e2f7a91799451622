"""The GELUs onnxruntime fuses are compiled the way its fused kernel computes them.

Exporters write the exact GELU as ops: `x / sqrt(2) → Erf → + 1 → * x → * 0.5` (PyTorch's
TorchScript exporter; the order of the products varies). onnxruntime's graph optimizer replaces
some of these chains with its Gelu kernel (BiasGelu when an Add of a bias comes first), which
computes `(0.5 x) (erf(x * 0.70710677) + 1)`: a product by 1/sqrt(2) where the model divides.
So the original model's results under onnxruntime are that formula's bits, not the ops' (up to
1 ulp apart in the Erf's input), wherever onnxruntime fused, and the ops' where it did not:
PyTorch's dynamo exporter writes `x * (0.5 (erf + 1))`, which onnxruntime 1.32 leaves as ops.

Which chains onnxruntime fuses depends on its version and on each chain's surroundings, so
nothing here guesses: `onnxruntime_gelus` asks the installed onnxruntime (its optimized graph of
the original model, only for models with an Erf; about 0.1 s for a 24-layer tiny BERT), and
`as_onnxruntime_computes` rewrites exactly those chains, where a fused group holds the whole
chain, in the group model: what the kernel is compiled from, what the cache hashes and what
onnxruntime runs when the kernel is verified. The written model keeps the model's own ops, so
onnxruntime still fuses them where a group falls back. The product also spares the kernel a
vector division per element. A model onnxruntime cannot optimize or save keeps its ops as they
are (correct, as before, only not bit for bit there).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

INVERSE_SQRT2 = np.float32(0.70710678118654752440)  # onnxruntime's float 1/sqrt(2)
FUSED_GELU_OPS = ("Gelu", "BiasGelu")
MAX_CHAIN_NODES = 6  # onnxruntime's patterns have 5 (the division or product, Erf, Add, two Mul)


@dataclass(frozen=True)
class FusedGelu:
    """One chain onnxruntime computes as its Gelu kernel: the values it reads (BiasGelu: the
    input and the bias it adds first) and the value it writes, by name."""

    inputs: tuple[str, ...]
    output: str


def onnxruntime_gelus(model: onnx.ModelProto, path: str | os.PathLike | None = None) -> tuple[FusedGelu, ...]:
    """The Gelu and BiasGelu nodes of onnxruntime's optimized graph of the model (CPU, default
    optimization level), in every scope; () when the model has no Erf or onnxruntime fails.
    `path`: the model's file, given to onnxruntime instead of `model` (its external data beside it)."""
    if not any(node.op_type == "Erf" for node in _all_nodes(model.graph)):
        return ()
    try:
        optimized = _optimized_by_onnxruntime(os.fspath(path) if path is not None else model.SerializeToString())
    except Exception:  # noqa: BLE001 - an oracle that cannot answer leaves the ops as they are
        return ()
    return tuple(FusedGelu(tuple(node.input), node.output[0]) for node in _all_nodes(optimized.graph)
                 if node.domain == "com.microsoft" and node.op_type in FUSED_GELU_OPS and node.input)


def _optimized_by_onnxruntime(model: str | bytes) -> onnx.ModelProto:
    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="onnxfuse-gelu-") as directory:
        path = Path(directory) / "optimized.onnx"
        options = onnxruntime.SessionOptions()
        options.optimized_model_filepath = os.fspath(path)
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        return onnx.load(os.fspath(path), load_external_data=False)


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for body in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
                yield from _all_nodes(body)


def as_onnxruntime_computes(nodes: list[onnx.NodeProto], outputs: list[str], gelus: tuple[FusedGelu, ...],
                            biased: dict[tuple, str], float32: set[str]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`nodes` (a group's, in order; `outputs` the values it returns) with each whole chain of
    `gelus` among them replaced by `(x * 0.5) * (Erf(x * 0.70710677) + 1)`, and the constants
    that reads.

    `biased`: the model's Adds by their sorted input names → output name (a BiasGelu's x);
    `float32`: the names of float32 values (onnxruntime's Gelu is float32 only)."""
    constants: list[onnx.TensorProto] = []
    for gelu in gelus:
        x = gelu.inputs[0] if len(gelu.inputs) == 1 else biased.get(tuple(sorted(gelu.inputs[:2])))
        chain = _chain(nodes, x, gelu.output, set(outputs)) if x in float32 else None
        if chain is None:
            continue
        formula, scalars = _formula(x, gelu.output)
        at = max(chain)
        nodes = [n for i, n in enumerate(nodes) if i not in chain or i == at]
        at = next(i for i, n in enumerate(nodes) if gelu.output in n.output)
        nodes[at:at + 1] = formula
        constants += scalars
    return nodes, constants


def _chain(nodes: list[onnx.NodeProto], x: str, y: str, outputs: set[str]) -> set[int] | None:
    """Indices of the nodes computing y from x (and constants) alone, if one Erf is among them
    and nothing outside them (other nodes, the group's outputs) reads their values; else None."""
    producer = {out: i for i, n in enumerate(nodes) for out in n.output}
    if y not in producer:
        return None
    chain, pending = set(), [producer[y]]
    while pending:
        i = pending.pop()
        if i in chain:
            continue
        chain.add(i)
        pending += [producer[name] for name in nodes[i].input if name != x and name in producer]
    if len(chain) > MAX_CHAIN_NODES or [nodes[i].op_type for i in chain].count("Erf") != 1:
        return None
    inner = {out for i in chain for out in nodes[i].output} - {y}
    read_outside = bool(inner & outputs) or any(name in inner for j, n in enumerate(nodes) if j not in chain
                                                for name in n.input)
    reads_x = any(x in nodes[i].input for i in chain)
    return chain if reads_x and not read_outside else None


def _formula(x: str, y: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    def name(part: str) -> str:
        return f"{y}__gelu_{part}"

    scalars = [numpy_helper.from_array(np.array(value, np.float32), name(part))
               for part, value in (("inverse_sqrt2", INVERSE_SQRT2), ("one", 1.0), ("half", 0.5))]
    nodes = [
        helper.make_node("Mul", [x, name("inverse_sqrt2")], [name("scaled")], name=name("Mul_scaled")),
        helper.make_node("Erf", [name("scaled")], [name("erf")], name=name("Erf")),
        helper.make_node("Add", [name("erf"), name("one")], [name("erf_plus_one")], name=name("Add")),
        helper.make_node("Mul", [x, name("half")], [name("half_x")], name=name("Mul_half")),
        helper.make_node("Mul", [name("half_x"), name("erf_plus_one")], [y], name=name("Mul")),
    ]
    return nodes, scalars
