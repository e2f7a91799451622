"""Chains of ops that onnxruntime fuses into one kernel are compiled the way that kernel computes.

onnxruntime's graph optimizer replaces some chains of ops with kernels of its own, and those
compute differently from the ops, so the original model's results under onnxruntime are the
kernel's bits wherever it fused, and the ops' where it did not:
- GELU, `x / sqrt(2) → Erf → + 1 → * x → * 0.5` (PyTorch's TorchScript export; the order of the
  products varies), becomes its Gelu kernel (BiasGelu when an Add of a bias comes first), which
  computes `(0.5 x) (erf(x * 0.70710677) + 1)`: a product by 1/sqrt(2) where the model divides.
  PyTorch's dynamo exporter writes `x * (0.5 (erf + 1))`, which onnxruntime 1.32 leaves as ops.
- The tanh approximation of GELU, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (Keras'
  `gelu(approximate=True)` through tf2onnx), becomes its FastGelu kernel where it follows a
  product: that computes the tanh's argument as `x ((C x) x + B)`, with B = sqrt(2/pi) and
  C = 0.044715 B, then `(0.5 x) (tanh + 1)`.
- LayerNorm written as ops (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) becomes
  LayerNormalization, whose kernel sums the mean in float64 and the squares in its own lanes
  (codegen/layer_norm.py computes it the same way), where the ops give other last bits.
- A LayerNorm after a residual Add (and the Add of a bias before it), as BERT's exports write it,
  becomes SkipLayerNormalization (com.microsoft): it adds `(input + skip) + bias`, in another
  order than the model's, and takes Welford's update over the whole row (read from onnxruntime
  1.32's machine code). Each such chain is a group of its own (`skip_layer_norm_chains`), whose
  group model holds onnxruntime's op (codegen/onnxruntime_contrib.py imports it as the kernel
  computes, codegen/layer_norm.py vectorizes it across rows).

- A MatMul by a constant weight and the Add of a bias after it become its Gemm where the product
  is 2-D (it keeps them apart over [batch, seq, K] with symbolic dims). Over more than 256 k's
  that is other bits: MLAS sums K in blocks of 256, and its Gemm starts the output from the bias,
  `((b + p0) + p1) + ...`, where the MatMul's output `(p0 + p1) + ...` gets the bias last
  (codegen/gemm_blocks.py). Such a pair is written as the Gemm in the group model.
- The same pair with a weight known only at run time (a graph input, a value computed, or a
  Loop's carried value, which onnxruntime does not prepack) becomes a Gemm
  too, and at one row that Gemm sums in MLAS's one-row order from the bias
  (codegen/one_row_products.py), so it is written as the Gemm whatever its K.

- A Mul by a one-element constant whose product a MatMul reads (PyTorch's dynamo export of
  scaled_dot_product_attention scales q and k by sqrt(scale) each) becomes FusedMatMul, which
  scales the product instead: `alpha (a @ b)` with alpha the scales' product, other bits than
  `(s a) @ (s b)`. The Muls and the MatMul stay with onnxruntime (`scaled_product_nodes`), which
  then fuses them as it does in the original.

Which chains onnxruntime fuses depends on its version and on each chain's surroundings, so
nothing here guesses: `onnxruntime_fused_ops` asks the installed onnxruntime (its optimized graph
of the original model, only for models with an Erf, a ReduceMean, a FastGelu's Tanh, a MatMul
over more than 256 k's or a MatMul by a run-time weight and an Add; about 0.1 s for a 24-layer
tiny BERT), and `as_onnxruntime_computes` rewrites exactly those chains, where a fused group
holds the whole chain, in the group model: what the kernel is compiled from, what the cache
hashes and what onnxruntime runs when the kernel is verified. The written model keeps the
model's own ops, so onnxruntime still fuses them where a group falls back. A model onnxruntime
cannot optimize or save keeps its ops as they are (correct, as before, only not bit for bit).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..frontend.validate import all_nodes

INVERSE_SQRT2 = np.float32(0.70710678118654752440)  # onnxruntime's float 1/sqrt(2)
GELUS = ("Gelu", "BiasGelu")  # com.microsoft
FAST_GELU = "FastGelu"  # com.microsoft; with a second input, the bias it adds first
FAST_GELU_B = np.float32(0.7978845608028654)  # sqrt(2 / pi), as onnxruntime's FastGelu rounds it
FAST_GELU_C = np.float32(0.035677408136300125)  # 0.044715 sqrt(2 / pi)
LAYER_NORM = "LayerNormalization"  # the ONNX op (opset 17), which onnxruntime's fusion writes
SKIP_LAYER_NORM = "SkipLayerNormalization"  # com.microsoft
CONTRIB_DOMAIN = "com.microsoft"
MIN_LAYER_NORM_OPSET = 17
WATCHED_OPS = {"Erf", "ReduceMean", LAYER_NORM}  # a model with none (and no FastGelu's Tanh) has no chain onnxruntime fuses here
MAX_CHAIN_NODES = 12  # GELU chains have 5 nodes, LayerNorm chains 9 (10 with a Cast), 11 with two Adds
FUSED_MATMUL = "FusedMatMul"  # com.microsoft: a MatMul with scales folded in as alpha
GEMM = "Gemm"
FUSED_GEMM = "FusedGemm"  # com.microsoft: a Gemm and the activation after it
MLAS_K_BLOCK = 256  # up to this many k's a Gemm and a MatMul + Add give the same bits


@dataclass(frozen=True)
class FusedOp:
    """One chain onnxruntime computes as its own kernel `op`: the values the kernel reads
    (BiasGelu: the input and the bias it adds first), the value it writes, its attributes."""

    op: str
    inputs: tuple[str, ...]
    output: str
    attributes: tuple[onnx.AttributeProto, ...] = field(default=(), compare=False)
    constants: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """(input name, content digest) of its inputs that are initializers in onnxruntime's graph:
    onnxruntime gives initializers of equal content one name, which may not be the model's name
    for the value a chain reads (`in_model_names`)."""


def onnxruntime_fused_ops(model: onnx.ModelProto, path: str | os.PathLike | None = None) -> tuple[FusedOp, ...]:
    """The Gelu, BiasGelu, LayerNormalization, SkipLayerNormalization, FusedMatMul nodes, and the
    Gemms over more than 256 k's that replace a MatMul and an Add, that onnxruntime's optimizer (CPU,
    default level) writes in place of the model's ops, in every scope; () when
    the model has nothing such a node could replace, or onnxruntime fails. `path`: the model's
    file, given to onnxruntime instead of `model` (its external data beside it)."""
    nodes = list(all_nodes(model.graph))
    if not _may_hold_fused_chain(nodes) and not _long_products(model, nodes) and not _scaled_products(model, nodes):
        return ()
    adds = {out for node in nodes if node.op_type == "Add" for out in node.output}  # a Gemm writing one was fused
    own_layer_norms = {out for node in nodes if node.op_type == LAYER_NORM for out in node.output}
    try:
        optimized = _optimized_by_onnxruntime(os.fspath(path) if path is not None else model.SerializeToString())
    except Exception:  # noqa: BLE001 - an oracle that cannot answer leaves the ops as they are
        return ()
    initializers = {tensor.name: tensor for tensor in optimized.graph.initializer if not tensor.external_data}
    fused = []
    for node, constants_here in _nodes_in_scope(optimized.graph):
        gelu = node.domain == CONTRIB_DOMAIN and node.op_type in (*GELUS, FAST_GELU)
        layer_norm = (node.domain in ("", "ai.onnx") and node.op_type == LAYER_NORM
                      and node.output[0] not in own_layer_norms)
        skip_layer_norm = node.domain == CONTRIB_DOMAIN and node.op_type == SKIP_LAYER_NORM
        gemm = ((node.domain in ("", "ai.onnx") and node.op_type == GEMM and node.output[0] in adds
                 or node.domain == CONTRIB_DOMAIN and node.op_type == FUSED_GEMM)
                and (_depth(node, initializers) > MLAS_K_BLOCK or node.input[1] not in constants_here))
        scaled = node.domain == CONTRIB_DOMAIN and node.op_type == FUSED_MATMUL
        if (gelu or layer_norm or skip_layer_norm or gemm or scaled) and node.input and len(node.output) >= 1:
            constants = tuple((name, content_digest(initializers[name])) for name in node.input if name in initializers)
            fused.append(FusedOp(node.op_type, tuple(node.input), node.output[0], tuple(node.attribute), constants))
    return tuple(fused)


def _may_hold_fused_chain(nodes: list[onnx.NodeProto]) -> bool:
    """Whether an op onnxruntime's GELU or LayerNorm fusions start from is here: a Tanh counts
    only where a Mul feeds it (FastGelu's scaled argument), so that the Tanh of every LSTM cell
    does not cost a session of onnxruntime's optimizer at load."""
    products = {out for node in nodes if node.op_type == "Mul" for out in node.output}
    return any(node.op_type in WATCHED_OPS or node.op_type == "Tanh" and node.input and node.input[0] in products
               for node in nodes)


def _long_products(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> bool:
    """Whether a MatMul multiplies by a constant weight of more than MLAS_K_BLOCK rows, or by a
    run-time weight before an Add (either may become a Gemm of other bits)."""
    rows = {tensor.name: tensor.dims[0] for tensor in model.graph.initializer if len(tensor.dims) == 2}
    if any(node.op_type == "MatMul" and rows.get(node.input[1], 0) > MLAS_K_BLOCK for node in nodes):
        return True
    added = {name for node in nodes if node.op_type == "Add" for name in node.input}
    constant_nodes = {out for node in nodes if node.op_type == "Constant" for out in node.output}
    return any(node.op_type == "MatMul" and len(node.input) == 2 and node.output[0] in added
               and node.input[1] not in constants | constant_nodes for node, constants in _nodes_in_scope(model.graph))


def _scaled_products(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> bool:
    """Whether a MatMul reads a Mul by a one-element constant (FusedMatMul's pattern)."""
    scalars = {t.name for t in model.graph.initializer if int(np.prod(t.dims)) == 1}
    scalars |= {out for node in nodes if node.op_type == "Constant" for out in node.output}
    scaled = {node.output[0] for node in nodes
              if node.op_type == "Mul" and len(node.input) == 2 and (set(node.input) & scalars)}
    return any(node.op_type == "MatMul" and set(node.input) & scaled for node in nodes)


def scaled_product_nodes(graph, fused_ops: tuple[FusedOp, ...]) -> dict[int, str]:
    """The MatMuls (by index in `graph`, a Graph of ir.py) that onnxruntime computes as a
    FusedMatMul, and the Muls it folds into them, each with why it stays with onnxruntime."""
    producer = {out: node for node in graph.nodes for out in node.outputs}
    why = ("onnxruntime computes this MatMul as FusedMatMul (scales or transposes folded into the product): "
           "left to onnxruntime, so the product keeps its bits")
    left = {}
    for fused in fused_ops:
        matmul = producer.get(fused.output) if fused.op == FUSED_MATMUL else None
        if matmul is None or matmul.op_type != "MatMul":
            continue
        left[matmul.index] = why
        for name in matmul.inputs:
            mul = producer.get(name)
            if mul is not None and mul.op_type == "Mul" and set(mul.inputs) & set(fused.inputs):
                left[mul.index] = why
    return left


def _nodes_in_scope(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()):
    """(node, the names of the constants it sees: its graph's and the enclosing graphs') for
    every node, in bodies too: onnxruntime prepacks those (a body's captured constant too), not a
    graph input or a Loop's carried value."""
    listed = {value.name for value in graph.input}  # an initializer listed as an input may be fed: not one
    constants = outer | {tensor.name for tensor in graph.initializer if tensor.name not in listed}
    for node in graph.node:
        yield node, constants
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield from _nodes_in_scope(sub, constants)


def _depth(gemm: onnx.NodeProto, initializers: dict) -> int:
    """K of a Gemm whose B is a constant (0 where it is not)."""
    weight = initializers.get(gemm.input[1]) if len(gemm.input) > 1 else None
    if weight is None or len(weight.dims) != 2:
        return 0
    transposed = any(a.name == "transB" and a.i for a in gemm.attribute)
    return weight.dims[1] if transposed else weight.dims[0]


def content_digest(tensor: onnx.TensorProto) -> str:
    """What identifies a constant's value: dtype, shape and elements."""
    array = numpy_helper.to_array(tensor)
    return hashlib.sha256(f"{array.dtype}{array.shape}".encode() + array.tobytes()).hexdigest()


def in_model_names(fused: FusedOp, known: set[str], constants: dict[str, str]) -> FusedOp:
    """`fused` reading the group's names: each input the group does not know (`known`: the
    values its nodes read and write) that is a constant of onnxruntime's graph becomes the
    group's constant of the same content (`constants`: digest → its name), if there is one."""
    renamed = {name: constants[digest] for name, digest in fused.constants
               if name not in known and digest in constants}
    if not renamed:
        return fused
    return replace(fused, inputs=tuple(renamed.get(name, name) for name in fused.inputs))


def _optimized_by_onnxruntime(model: str | bytes) -> onnx.ModelProto:
    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="onnxfuse-fusions-") as directory:
        path = Path(directory) / "optimized.onnx"
        options = onnxruntime.SessionOptions()
        options.optimized_model_filepath = os.fspath(path)
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        return onnx.load(os.fspath(path), load_external_data=False)


def as_onnxruntime_computes(nodes: list[onnx.NodeProto], outputs: list[str], fused_ops: tuple[FusedOp, ...],
                            biased: dict[tuple, str], float32: set[str],
                            opset: int = MIN_LAYER_NORM_OPSET) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`nodes` (a group's, in order; `outputs` the values it returns) with each whole chain of
    `fused_ops` among them replaced by what onnxruntime's kernel computes, and the constants
    that reads.

    `biased`: the model's Adds by their sorted input names, or by the one that is not a constant
    (a 1-tuple) → output name (a BiasGelu's x);
    `float32`: the names of float32 values (the kernels here are rewritten for float32 only);
    `opset`: the group model's (LayerNormalization is an op from 17 on)."""
    constants: list[onnx.TensorProto] = []
    for fused in fused_ops:
        if fused.op in (GEMM, FUSED_GEMM):
            nodes = _product_and_bias_as_gemm(nodes, fused.output, set(outputs))
            continue
        if fused.op in (*GELUS, FAST_GELU):
            x = fused.inputs[0] if len(fused.inputs) == 1 else (biased.get(tuple(sorted(fused.inputs[:2])))
                                                                 or biased.get((fused.inputs[0],)))
            sources = {x}
        elif fused.op == SKIP_LAYER_NORM or opset >= MIN_LAYER_NORM_OPSET:
            x, sources = fused.inputs[0], {name for name in fused.inputs if name}
        else:
            continue
        chain = _chain(nodes, x, sources, fused.output, set(outputs)) if x in float32 else None
        if chain is None:
            continue
        if fused.op in GELUS:
            replacement, scalars = gelu_nodes(x, fused.output)
        elif fused.op == FAST_GELU:
            replacement, scalars = fast_gelu_nodes(x, fused.output)
        else:
            replacement, scalars = [_layer_norm(fused)], []
        nodes = [n for i, n in enumerate(nodes) if i not in chain or i == max(chain)]
        at = next(i for i, n in enumerate(nodes) if fused.output in n.output)
        nodes[at:at + 1] = replacement
        constants += scalars
    return nodes, constants


def _product_and_bias_as_gemm(nodes: list[onnx.NodeProto], y: str, outputs: set[str]) -> list[onnx.NodeProto]:
    """`nodes` with the MatMul and the Add that writes `y` (onnxruntime's Gemm; its FusedGemm
    writes the output of an activation of the Add) as one Gemm, where both are here and nothing
    else reads the product."""
    producer = {out: i for i, n in enumerate(nodes) for out in n.output}
    add = producer.get(y)
    if add is not None and nodes[add].op_type != "Add" and len(nodes[add].input) == 1:
        add = producer.get(nodes[add].input[0])
    if add is None or nodes[add].op_type != "Add" or len(nodes[add].input) != 2:
        return nodes
    for side in (0, 1):
        product, bias = nodes[add].input[side], nodes[add].input[1 - side]
        matmul = producer.get(product)
        if matmul is None or nodes[matmul].op_type != "MatMul" or product in outputs:
            continue
        if any(product in n.input for i, n in enumerate(nodes) if i != add):
            continue
        gemm = helper.make_node(GEMM, [*nodes[matmul].input, bias], list(nodes[add].output), name=f"{y}__gemm")
        return [gemm if i == add else n for i, n in enumerate(nodes) if i != matmul]
    return nodes


def skip_layer_norm_chains(graph, fused_ops: tuple[FusedOp, ...]) -> list[list[int]]:
    """The nodes (by index in `graph`, a Graph of ir.py) of each chain onnxruntime fuses into its
    SkipLayerNormalization: the plan makes each a group of its own, whose kernel computes what
    onnxruntime's does (the Adds would otherwise go into a GEMM's epilogue and the LayerNorm stay
    alone, computed as onnxruntime's LayerNormalization)."""
    producer = {out: node.index for node in graph.nodes for out in node.outputs}
    chains = []
    for fused in fused_ops:
        if fused.op != SKIP_LAYER_NORM or fused.output not in producer:
            continue
        chain, pending, sources = set(), [producer[fused.output]], set(fused.inputs)
        while pending and len(chain) <= MAX_CHAIN_NODES:
            index = pending.pop()
            if index not in chain:
                chain.add(index)
                pending += [producer[name] for name in graph.nodes[index].inputs
                            if name and name not in sources and name in producer]
        if len(chain) <= MAX_CHAIN_NODES:
            chains.append(sorted(chain))
    return chains


def _chain(nodes: list[onnx.NodeProto], x: str, sources: set[str], y: str, outputs: set[str]) -> set[int] | None:
    """Indices of the nodes computing y from `sources` (and constants) alone, if they read x and
    nothing outside them (other nodes, the group's outputs) reads their values; else None."""
    producer = {out: i for i, n in enumerate(nodes) for out in n.output}
    if y not in producer:
        return None
    chain, pending = set(), [producer[y]]
    while pending:
        i = pending.pop()
        if i in chain:
            continue
        chain.add(i)
        pending += [producer[name] for name in nodes[i].input if name not in sources and name in producer]
    if len(chain) > MAX_CHAIN_NODES or not any(x in nodes[i].input for i in chain):
        return None
    inner = {out for i in chain for out in nodes[i].output} - {y}
    read_outside = bool(inner & outputs) or any(name in inner for j, n in enumerate(nodes) if j not in chain
                                                for name in n.input)
    return None if read_outside else chain


def gelu_nodes(x: str, y: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`(x * 0.5) * (Erf(x * 0.70710677) + 1)`: onnxruntime's Gelu and BiasGelu kernels."""
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


def fast_gelu_nodes(x: str, y: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`(x * 0.5) * (Tanh(x * ((C * x) * x + B)) + 1)`: onnxruntime's FastGelu kernel (its
    products and sums rounded one by one: that part is plain C++, built without FMA on x86-64;
    on aarch64 GCC fuses `(C x) x + B`, which codegen/contracted_gelu.py rewrites for import)."""
    def name(part: str) -> str:
        return f"{y}__fast_gelu_{part}"

    scalars = [numpy_helper.from_array(np.array(value, np.float32), name(part))
               for part, value in (("c", FAST_GELU_C), ("b", FAST_GELU_B), ("one", 1.0), ("half", 0.5))]
    steps = [("Mul", [name("c"), x], "cx"), ("Mul", [name("cx"), x], "cxx"), ("Add", [name("cxx"), name("b")], "inner"),
             ("Mul", [x, name("inner")], "argument"), ("Tanh", [name("argument")], "tanh"),
             ("Add", [name("tanh"), name("one")], "tanh_plus_one"), ("Mul", [x, name("half")], "half_x")]
    nodes = [helper.make_node(op, inputs, [name(out)], name=name(f"{op}_{out}")) for op, inputs, out in steps]
    nodes.append(helper.make_node("Mul", [name("half_x"), name("tanh_plus_one")], [y], name=name("Mul")))
    return nodes, scalars


def _layer_norm(fused: FusedOp) -> onnx.NodeProto:
    """The LayerNormalization or SkipLayerNormalization node onnxruntime wrote, on the same values."""
    domain = CONTRIB_DOMAIN if fused.op == SKIP_LAYER_NORM else ""
    node = helper.make_node(fused.op, list(fused.inputs), [fused.output], name=f"{fused.output}__{fused.op}",
                            domain=domain)
    node.attribute.extend(fused.attributes)
    return node
