"""Generate the bundled test and benchmark models of onnxfuse.

Every model is built with ``onnx.helper`` and numpy from a fixed seed, so running this
script twice writes byte-identical files. Run it from the repository root:

    .venv/bin/python models/make_models.py [--out-dir DIR]

The models are small on purpose (< 300 KB each): they are committed to the repository.
The 100-tree benchmark forest is built on demand with ``make_forest(100, 8, 28)`` and the
three tree builders below; it is not written by ``main()``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
ML_OPSET = 3  # ai.onnx.ml version that has TreeEnsembleClassifier with float attributes
IR_VERSION = 9  # onnx 1.23 would default to a newer IR than onnxruntime 1.31 needs
BATCH = "N"  # symbolic batch dimension of every model input
PRODUCER = "onnxfuse/models/make_models.py"

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------
# Small building helpers
# ---------------------------------------------------------------------------


class GraphBuilder:
    """Collects nodes and initializers and names intermediate values uniquely.

    Keeping names deterministic (a counter, not ids) is what makes the files reproducible.
    """

    def __init__(self, name: str):
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._counter = 0

    def fresh(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}_{self._counter}"

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], hint: str | None = None, n_out: int = 1,
           outputs: Sequence[str] | None = None, domain: str = "", **attrs) -> str | list[str]:
        """Append one node; return its output name (or names when n_out > 1)."""
        if outputs is None:
            base = hint or op_type.lower()
            outputs = [self.fresh(base) for _ in range(n_out)]
        node_name = self.fresh(f"{op_type}")
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=node_name,
                                           domain=domain, **attrs))
        return outputs[0] if len(outputs) == 1 else list(outputs)

    def add_input(self, name: str, elem_type: int, shape: Sequence) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def add_output(self, name: str, elem_type: int, shape: Sequence) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    def model(self, extra_opsets: dict[str, int] | None = None, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs,
                                  initializer=self.initializers, doc_string=doc)
        opsets = [helper.make_opsetid("", OPSET)]
        for domain, version in (extra_opsets or {}).items():
            opsets.append(helper.make_opsetid(domain, version))
        model = helper.make_model(graph, opset_imports=opsets, producer_name=PRODUCER,
                                  producer_version="1")
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model


def _weights(rng: np.random.Generator, shape: Sequence[int], fan_in: int) -> np.ndarray:
    """Scaled normal weights so activations stay in a range where Sigmoid/Tanh/Exp are finite."""
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


# ---------------------------------------------------------------------------
# Recurrent cells
# ---------------------------------------------------------------------------


def lstm_gate_model(input_size: int = 64, hidden: int = 64, seed: int = 0) -> onnx.ModelProto:
    """The seed pattern: MatMul -> Split(3) -> Sigmoid/Tanh/Exp -> Mul -> Add.

    A post-dominator fuser should put all seven ops in one group, MatMul included
    (TVM's own split fusion leaves the MatMul outside).
    """
    rng = np.random.default_rng(seed)
    g = GraphBuilder("lstm_gate")
    x = g.add_input("X", TensorProto.FLOAT, [BATCH, input_size])
    w = g.const("W", _weights(rng, [input_size, 3 * hidden], input_size))
    split = g.const("split_sizes", np.array([hidden] * 3, dtype=np.int64))
    gates = g.op("MatMul", [x, w], "gates")
    a, b, c = g.op("Split", [gates, split], "part", n_out=3, axis=1)
    sig = g.op("Sigmoid", [a], "sig")
    tnh = g.op("Tanh", [b], "tanh")
    ex = g.op("Exp", [c], "exp")
    prod = g.op("Mul", [sig, tnh], "prod")
    g.op("Add", [prod, ex], outputs=["Y"])
    g.add_output("Y", TensorProto.FLOAT, [BATCH, hidden])
    return g.model(doc="LSTM gate seed pattern")


def lstm_cell_params(input_size: int, hidden: int, seed: int) -> dict[str, np.ndarray]:
    """W [I,4H], R [H,4H], b [4H]; gate order i, f, g, o (same as the graph's Split)."""
    rng = np.random.default_rng(seed)
    return {
        "W": _weights(rng, [input_size, 4 * hidden], input_size),
        "R": _weights(rng, [hidden, 4 * hidden], hidden),
        "b": (0.1 * rng.standard_normal(4 * hidden)).astype(np.float32),
    }


def lstm_cell_model(input_size: int = 64, hidden: int = 64, seed: int = 1) -> onnx.ModelProto:
    """A full LSTM cell in plain ops, so the fuser sees the gate math, not an opaque LSTM op."""
    p = lstm_cell_params(input_size, hidden, seed)
    g = GraphBuilder("lstm_cell")
    x = g.add_input("X", TensorProto.FLOAT, [BATCH, input_size])
    h = g.add_input("H", TensorProto.FLOAT, [BATCH, hidden])
    c = g.add_input("C", TensorProto.FLOAT, [BATCH, hidden])
    w, r, b = (g.const(k, p[k]) for k in ("W", "R", "b"))
    split = g.const("split_sizes", np.array([hidden] * 4, dtype=np.int64))

    xw = g.op("MatMul", [x, w], "xw")
    hr = g.op("MatMul", [h, r], "hr")
    gates = g.op("Add", [g.op("Add", [xw, hr], "xw_hr"), b], "gates")
    gi, gf, gg, go = g.op("Split", [gates, split], "gate", n_out=4, axis=1)
    i = g.op("Sigmoid", [gi], "i")
    f = g.op("Sigmoid", [gf], "f")
    cand = g.op("Tanh", [gg], "g")
    o = g.op("Sigmoid", [go], "o")
    keep = g.op("Mul", [f, c], "f_c")
    write = g.op("Mul", [i, cand], "i_g")
    g.op("Add", [keep, write], outputs=["C_out"])
    tanh_c = g.op("Tanh", ["C_out"], "tanh_c")
    g.op("Mul", [o, tanh_c], outputs=["H_out"])
    g.add_output("H_out", TensorProto.FLOAT, [BATCH, hidden])
    g.add_output("C_out", TensorProto.FLOAT, [BATCH, hidden])
    return g.model(doc="LSTM cell: gates = X@W + H@R + b; i,f,g,o")


def gru_cell_params(input_size: int, hidden: int, seed: int) -> dict[str, np.ndarray]:
    """W [I,3H], R [H,3H], bw [3H], br [3H]; gate order z, r, n."""
    rng = np.random.default_rng(seed)
    return {
        "W": _weights(rng, [input_size, 3 * hidden], input_size),
        "R": _weights(rng, [hidden, 3 * hidden], hidden),
        "bw": (0.1 * rng.standard_normal(3 * hidden)).astype(np.float32),
        "br": (0.1 * rng.standard_normal(3 * hidden)).astype(np.float32),
    }


def gru_cell_model(input_size: int = 64, hidden: int = 64, seed: int = 2) -> onnx.ModelProto:
    """A GRU cell in plain ops: two MatMul+Split(3) producers feed one gate-math region."""
    p = gru_cell_params(input_size, hidden, seed)
    g = GraphBuilder("gru_cell")
    x = g.add_input("X", TensorProto.FLOAT, [BATCH, input_size])
    h = g.add_input("H", TensorProto.FLOAT, [BATCH, hidden])
    w, r, bw, br = (g.const(k, p[k]) for k in ("W", "R", "bw", "br"))
    split = g.const("split_sizes", np.array([hidden] * 3, dtype=np.int64))
    one = g.const("one", np.array(1.0, dtype=np.float32))

    gx = g.op("Add", [g.op("MatMul", [x, w], "xw"), bw], "gx")
    gh = g.op("Add", [g.op("MatMul", [h, r], "hr"), br], "gh")
    xz, xr, xn = g.op("Split", [gx, split], "x_part", n_out=3, axis=1)
    hz, hr_, hn = g.op("Split", [gh, split], "h_part", n_out=3, axis=1)
    z = g.op("Sigmoid", [g.op("Add", [xz, hz], "z_in")], "z")
    rr = g.op("Sigmoid", [g.op("Add", [xr, hr_], "r_in")], "r")
    n = g.op("Tanh", [g.op("Add", [xn, g.op("Mul", [rr, hn], "r_hn")], "n_in")], "n")
    one_minus_z = g.op("Sub", [one, z], "one_minus_z")
    new_part = g.op("Mul", [one_minus_z, n], "new_part")
    old_part = g.op("Mul", [z, h], "old_part")
    g.op("Add", [new_part, old_part], outputs=["H_out"])
    g.add_output("H_out", TensorProto.FLOAT, [BATCH, hidden])
    return g.model(doc="GRU cell (linear_before_reset=1 style): n = tanh(xn + r*hn)")


def recurrent_op_model(op_type: str, seq: int = 32, input_size: int = 64, hidden: int = 128,
                       linear_before_reset: int = 1, seed: int = 3) -> onnx.ModelProto:
    """One ONNX LSTM or GRU node over a static sequence, symbolic batch, outputs Y and Y_h (and Y_c):
    the op as PyTorch exports nn.LSTM / nn.GRU (GRU with linear_before_reset=1, as PyTorch does).
    Not written by main(): the benchmark builds it on demand."""
    gates = {"LSTM": 4, "GRU": 3}[op_type]
    rng = np.random.default_rng(seed)
    g = GraphBuilder(f"{op_type.lower()}_seq")
    x = g.add_input("X", TensorProto.FLOAT, [seq, BATCH, input_size])
    w = g.const("W", _weights(rng, [1, gates * hidden, input_size], input_size))
    r = g.const("R", _weights(rng, [1, gates * hidden, hidden], hidden))
    b = g.const("B", (0.1 * rng.standard_normal([1, 2 * gates * hidden])).astype(np.float32))
    outputs = ["Y", "Y_h", "Y_c"] if op_type == "LSTM" else ["Y", "Y_h"]
    attrs = {"linear_before_reset": linear_before_reset} if op_type == "GRU" else {}
    g.op(op_type, [x, w, r, b], outputs=outputs, hidden_size=hidden, **attrs)
    g.add_output("Y", TensorProto.FLOAT, [seq, 1, BATCH, hidden])
    for state in outputs[1:]:
        g.add_output(state, TensorProto.FLOAT, [1, BATCH, hidden])
    return g.model(doc=f"one {op_type} op: sequence {seq}, input {input_size}, hidden {hidden}")


# ---------------------------------------------------------------------------
# Tree ensembles (Hummingbird-style tensor programs and ONNX-ML)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Forest:
    """Complete binary trees stored in heap order (children of node k are 2k+1 and 2k+2).

    A sample goes LEFT when x[feature] <= threshold, as in scikit-learn. Leaf values are
    class probabilities; the forest predicts their mean over trees, as a scikit-learn
    RandomForestClassifier does.
    """

    features: np.ndarray  # [T, 2^d - 1] int64, internal nodes
    thresholds: np.ndarray  # [T, 2^d - 1] float32
    leaf_values: np.ndarray  # [T, 2^d, C] float32, each row sums to 1
    n_features: int  # width of the input (a tree need not use every feature)

    @property
    def n_trees(self) -> int:
        return self.features.shape[0]

    @property
    def depth(self) -> int:
        return int(self.features.shape[1] + 1).bit_length() - 1

    @property
    def n_classes(self) -> int:
        return self.leaf_values.shape[2]


def make_forest(n_trees: int, depth: int, n_features: int, n_classes: int = 2,
                seed: int = 0) -> Forest:
    """Random complete binary trees of exactly `depth` levels (deterministic for a seed).

    Thresholds are drawn from N(0, 1) so that standard-normal inputs go both ways.
    """
    rng = np.random.default_rng(seed)
    n_internal = 2 ** depth - 1
    features = rng.integers(0, n_features, size=(n_trees, n_internal), dtype=np.int64)
    thresholds = rng.standard_normal((n_trees, n_internal)).astype(np.float32)
    raw = rng.random((n_trees, 2 ** depth, n_classes)) + 0.05
    leaf_values = (raw / raw.sum(axis=2, keepdims=True)).astype(np.float32)
    return Forest(features, thresholds, leaf_values, n_features)


def forest_predict_proba(forest: Forest, x: np.ndarray) -> np.ndarray:
    """Pure-numpy reference: walk every tree in heap order, average the leaf values."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[0]
    n_internal = 2 ** forest.depth - 1
    rows = np.arange(n)
    proba = np.zeros((n, forest.n_classes), dtype=np.float64)
    for t in range(forest.n_trees):
        node = np.zeros(n, dtype=np.int64)
        for _ in range(forest.depth):
            go_left = x[rows, forest.features[t, node]] <= forest.thresholds[t, node]
            node = np.where(go_left, 2 * node + 1, 2 * node + 2)
        proba += forest.leaf_values[t, node - n_internal]
    return (proba / forest.n_trees).astype(np.float32)


def _tree_input(g: GraphBuilder, forest: Forest | _ForestShape) -> str:
    return g.add_input("X", TensorProto.FLOAT, [BATCH, forest.n_features])


def _classifier_head(g: GraphBuilder, leaf_rows: str, forest: Forest | _ForestShape) -> None:
    """Leaf values [N*T, C] -> probabilities [N, C] (mean over trees) and label [N].

    Hummingbird's RandomForest aggregation sums over the tree axis and divides by the
    number of trees; ReduceMean is the same thing in one op.
    """
    shape = g.const("leaf_shape", np.array([-1, forest.n_trees, forest.n_classes], dtype=np.int64))
    per_tree = g.op("Reshape", [leaf_rows, shape], "per_tree")
    g.op("ReduceMean", [per_tree], outputs=["probabilities"], axes=[1], keepdims=0)
    g.op("ArgMax", ["probabilities"], outputs=["label"], axis=1, keepdims=0)
    g.add_output("label", TensorProto.INT64, [BATCH])
    g.add_output("probabilities", TensorProto.FLOAT, [BATCH, forest.n_classes])


def _tree_trav_tables(forest: Forest) -> dict[str, np.ndarray]:
    """Per-node tables over all 2^(d+1)-1 heap nodes of every tree, flattened over trees.

    Leaves point to themselves and carry the class values; internal nodes carry zeros.
    """
    t, d, c = forest.n_trees, forest.depth, forest.n_classes
    n_internal, n_nodes = 2 ** d - 1, 2 ** (d + 1) - 1
    node_ids = np.arange(n_nodes, dtype=np.int64)
    is_leaf = node_ids >= n_internal
    lefts = np.where(is_leaf, node_ids, 2 * node_ids + 1)
    rights = np.where(is_leaf, node_ids, 2 * node_ids + 2)
    features = np.zeros((t, n_nodes), dtype=np.int64)
    thresholds = np.zeros((t, n_nodes), dtype=np.float32)
    values = np.zeros((t, n_nodes, c), dtype=np.float32)
    features[:, :n_internal] = forest.features
    thresholds[:, :n_internal] = forest.thresholds
    values[:, n_internal:] = forest.leaf_values
    return _flat_tables(features, thresholds, np.tile(lefts, (t, 1)), np.tile(rights, (t, 1)), values)


def _flat_tables(features, thresholds, lefts, rights, values) -> dict[str, np.ndarray]:
    """[T, nodes] tables → the flattened node tables and per-tree offsets tree_trav reads."""
    t, n_nodes = features.shape
    return {
        "nodes_features": features.reshape(-1),
        "nodes_thresholds": thresholds.reshape(-1),
        "nodes_lefts": lefts.reshape(-1),
        "nodes_rights": rights.reshape(-1),
        "nodes_values": values.reshape(-1, values.shape[-1]),
        "nodes_offset": (np.arange(t, dtype=np.int64) * n_nodes).reshape(1, t),
    }


@dataclass(frozen=True)
class SpineForest:
    """Deep, sparse trees: node k < depth is internal; one child is the next internal node, the
    other a leaf (node depth + 1 + k); node `depth` is the last leaf. 2·depth + 1 nodes per tree.

    Why: a complete tree of depth 32 has 2^33 nodes, but the tree_trav *program* for any tree of
    depth d is the same 14 ops per level. Spines give that program at any depth with small tables,
    so compile time can be measured against depth alone. Gradient-boosted trees grown without a
    depth limit look like this too.
    """

    features: np.ndarray  # [T, nodes] int64
    thresholds: np.ndarray  # [T, nodes] float32
    lefts: np.ndarray  # [T, nodes] int64, tree-local
    rights: np.ndarray  # [T, nodes] int64, tree-local
    values: np.ndarray  # [T, nodes, C] float32 (zero on internal nodes)
    n_features: int
    depth: int

    @property
    def n_trees(self) -> int:
        return self.features.shape[0]

    @property
    def n_classes(self) -> int:
        return self.values.shape[2]


def make_spine_forest(n_trees: int, depth: int, n_features: int, n_classes: int = 2, seed: int = 0) -> SpineForest:
    rng = np.random.default_rng(seed)
    n_nodes = 2 * depth + 1
    features = np.zeros((n_trees, n_nodes), dtype=np.int64)
    thresholds = np.zeros((n_trees, n_nodes), dtype=np.float32)
    node_ids = np.arange(n_nodes, dtype=np.int64)
    lefts = np.tile(node_ids, (n_trees, 1))  # leaves point to themselves
    rights = lefts.copy()
    internal = np.arange(depth)
    features[:, :depth] = rng.integers(0, n_features, size=(n_trees, depth))
    thresholds[:, :depth] = rng.normal(size=(n_trees, depth)).astype(np.float32)
    leaf_of = depth + 1 + internal  # the side leaf of internal node k
    next_node = internal + 1  # the next internal node (node `depth` is the final leaf)
    spine_left = rng.random((n_trees, depth)) < 0.5
    lefts[:, :depth] = np.where(spine_left, next_node, leaf_of)
    rights[:, :depth] = np.where(spine_left, leaf_of, next_node)
    values = np.zeros((n_trees, n_nodes, n_classes), dtype=np.float32)
    leaves = rng.dirichlet(np.ones(n_classes), size=(n_trees, depth + 1)).astype(np.float32)
    values[:, depth:, :] = leaves
    return SpineForest(features, thresholds, lefts, rights, values, n_features, depth)


def spine_forest_predict_proba(forest: SpineForest, x: np.ndarray) -> np.ndarray:
    """Numpy reference: walk every tree `depth` steps (leaves point to themselves), average."""
    rows = np.arange(x.shape[0])
    total = np.zeros((x.shape[0], forest.n_classes), dtype=np.float64)
    for t in range(forest.n_trees):
        node = np.zeros(x.shape[0], dtype=np.int64)
        for _ in range(forest.depth):
            go_left = x[rows, forest.features[t, node]] <= forest.thresholds[t, node]
            node = np.where(go_left, forest.lefts[t, node], forest.rights[t, node])
        total += forest.values[t, node]
    return (total / forest.n_trees).astype(np.float32)


def spine_tree_trav_model(forest: SpineForest) -> onnx.ModelProto:
    """The same Hummingbird `tree_trav` program as `tree_trav_model`, over a spine forest."""
    tables = _flat_tables(forest.features, forest.thresholds, forest.lefts, forest.rights, forest.values)
    return _tree_trav_program(f"spine_tree_trav_d{forest.depth}", tables, forest.n_trees, forest.depth,
                              forest.n_features, forest.n_classes,
                              doc=f"Hummingbird tree_trav, {forest.n_trees} spine trees, depth {forest.depth}")


def _initial_indexes(g: GraphBuilder, x: str, n_trees: int) -> str:
    """nodes_offset [1,T] expanded to [N,T] and flattened, as `expand(x.size(0), T).reshape(-1)`."""
    shape = g.op("Shape", [x], "x_shape")
    batch = g.op("Slice", [shape, g.const("zero_1d", np.array([0], dtype=np.int64)),
                           g.const("one_1d", np.array([1], dtype=np.int64))], "batch")
    target = g.op("Concat", [batch, g.const("n_trees_1d", np.array([n_trees], dtype=np.int64))],
                  "expand_shape", axis=0)
    expanded = g.op("Expand", ["nodes_offset", target], "offsets")
    return g.op("Reshape", [expanded, "flat_shape"], "indexes")


def _tree_trav_level(g: GraphBuilder, x: str, indexes: str) -> str:
    """One TreeTraversal step, 14 ops: 4 Gather, GatherElements, LessOrEqual, Where,
    Cast, Add, 5 Reshape. Every table lookup re-reads the same flattened index."""
    feature_ids = g.op("Reshape", [g.op("Gather", ["nodes_features", indexes], "feat_ids"),
                                   "per_tree_shape"], "feat_ids_2d")
    feature_values = g.op("GatherElements", [x, feature_ids], "feat_vals", axis=1)
    thresholds = g.op("Reshape", [g.op("Gather", ["nodes_thresholds", indexes], "thr"),
                                  "per_tree_shape"], "thr_2d")
    lefts = g.op("Reshape", [g.op("Gather", ["nodes_lefts", indexes], "lefts"),
                             "per_tree_shape"], "lefts_2d")
    rights = g.op("Reshape", [g.op("Gather", ["nodes_rights", indexes], "rights"),
                              "per_tree_shape"], "rights_2d")
    go_left = g.op("LessOrEqual", [feature_values, thresholds], "go_left")
    child = g.op("Cast", [g.op("Where", [go_left, lefts, rights], "child")], "child_i64",
                 to=TensorProto.INT64)
    global_child = g.op("Add", [child, "nodes_offset"], "child_global")
    return g.op("Reshape", [global_child, "flat_shape"], "indexes")


def tree_trav_model(forest: Forest) -> onnx.ModelProto:
    """Hummingbird's TreeTraversal (`tree_trav`) program for a RandomForest classifier.

    Per level the flattened node index [N*T] is looked up in four node tables; the fuser
    has to decide whether to recompute or materialise that index for its four readers.
    """
    return _tree_trav_program(f"tree_trav_d{forest.depth}", _tree_trav_tables(forest), forest.n_trees,
                              forest.depth, forest.n_features, forest.n_classes,
                              doc=f"Hummingbird tree_trav, {forest.n_trees} trees, depth {forest.depth}")


def _tree_trav_program(name: str, tables: dict[str, np.ndarray], n_trees: int, depth: int, n_features: int,
                       n_classes: int, doc: str) -> onnx.ModelProto:
    shape = _ForestShape(n_trees, n_features, n_classes)
    g = GraphBuilder(name)
    x = _tree_input(g, shape)
    for table_name, table in tables.items():
        g.const(table_name, table)
    g.const("flat_shape", np.array([-1], dtype=np.int64))
    g.const("per_tree_shape", np.array([-1, n_trees], dtype=np.int64))
    indexes = _initial_indexes(g, x, n_trees)
    for _ in range(depth):
        indexes = _tree_trav_level(g, x, indexes)
    leaf_rows = g.op("Gather", ["nodes_values", indexes], "leaf_rows")
    _classifier_head(g, leaf_rows, shape)
    return g.model(doc=doc)


@dataclass(frozen=True)
class _ForestShape:
    """What the input and head of a tree program need to know about a forest."""

    n_trees: int
    n_features: int
    n_classes: int


def _perfect_level_order(depth_level: int) -> np.ndarray:
    """Heap positions of one level in the order perf_tree_trav numbers them.

    perf_tree_trav computes child = 2*index + (x <= threshold), so the true (left) branch
    must be the odd one: that is the heap order of the level reversed.
    """
    first = 2 ** depth_level - 1
    return first + np.arange(2 ** depth_level - 1, -1, -1, dtype=np.int64)


def _perf_tree_trav_tables(forest: Forest) -> dict[str, np.ndarray]:
    """Per-level feature/threshold tables [T * 2^level] and leaves [T * 2^d, C]."""
    d = forest.depth
    tables = {
        "root_nodes": forest.features[:, 0].copy(),
        "root_biases": forest.thresholds[:, 0].copy(),
        "tree_indices": np.arange(0, 2 * forest.n_trees, 2, dtype=np.int64),
    }
    for level in range(1, d):
        order = _perfect_level_order(level)
        tables[f"nodes_{level}"] = forest.features[:, order].reshape(-1)
        tables[f"biases_{level}"] = forest.thresholds[:, order].reshape(-1)
    leaf_order = _perfect_level_order(d) - (2 ** d - 1)
    tables["leaf_nodes"] = forest.leaf_values[:, leaf_order].reshape(-1, forest.n_classes)
    return tables


def _perf_root(g: GraphBuilder, x: str) -> str:
    """Root step, 5 ops: Gather(X, root features), LessOrEqual, Cast, Add tree offsets, Reshape."""
    root_values = g.op("Gather", [x, "root_nodes"], "root_vals", axis=1)
    bit = g.op("Cast", [g.op("LessOrEqual", [root_values, "root_biases"], "root_le")],
               "root_bit", to=TensorProto.INT64)
    indexes = g.op("Add", [bit, "tree_indices"], "root_idx")
    return g.op("Reshape", [indexes, "flat_shape"], "prev_indices")


def _perf_level(g: GraphBuilder, x: str, prev: str, level: int) -> str:
    """One PerfectTreeTraversal step, 9 ops: Gather, Reshape, GatherElements, Reshape,
    Mul, Gather, LessOrEqual, Cast, Add. The index is read by two lookups and the Mul."""
    gather_ids = g.op("Reshape", [g.op("Gather", [f"nodes_{level}", prev], "gather_ids"),
                                  "per_tree_shape"], "gather_ids_2d")
    feature_values = g.op("Reshape", [g.op("GatherElements", [x, gather_ids], "feat_vals", axis=1),
                                      "flat_shape"], "feat_vals_flat")
    doubled = g.op("Mul", [prev, "two"], "doubled")
    biases = g.op("Gather", [f"biases_{level}", prev], "biases")
    bit = g.op("Cast", [g.op("LessOrEqual", [feature_values, biases], "le")], "bit",
               to=TensorProto.INT64)
    return g.op("Add", [doubled, bit], "prev_indices")


def perf_tree_trav_model(forest: Forest) -> onnx.ModelProto:
    """Hummingbird's PerfectTreeTraversal (`perf_tree_trav`) program for a RandomForest.

    Valid because make_forest builds complete trees; Hummingbird pads shallower leaves.
    """
    g = GraphBuilder(f"perf_tree_trav_d{forest.depth}")
    x = _tree_input(g, forest)
    for name, table in _perf_tree_trav_tables(forest).items():
        g.const(name, table)
    g.const("flat_shape", np.array([-1], dtype=np.int64))
    g.const("per_tree_shape", np.array([-1, forest.n_trees], dtype=np.int64))
    g.const("two", np.array(2, dtype=np.int64))
    prev = _perf_root(g, x)
    for level in range(1, forest.depth):
        prev = _perf_level(g, x, prev, level)
    leaf_rows = g.op("Gather", ["leaf_nodes", prev], "leaf_rows")
    _classifier_head(g, leaf_rows, forest)
    return g.model(doc=f"Hummingbird perf_tree_trav, {forest.n_trees} trees, depth {forest.depth}")


def _tree_ensemble_attributes(forest: Forest) -> dict:
    """ONNX-ML node and leaf attribute lists in heap order (node id == heap index).

    Leaf weights are the class probabilities divided by the number of trees, so the
    summing TreeEnsembleClassifier returns the forest mean (what skl2onnx emits for a
    RandomForestClassifier).
    """
    t, d, c = forest.n_trees, forest.depth, forest.n_classes
    n_internal, n_nodes = 2 ** d - 1, 2 ** (d + 1) - 1
    ids = np.arange(n_nodes, dtype=np.int64)
    is_leaf = ids >= n_internal
    tree_ids = np.repeat(np.arange(t, dtype=np.int64), n_nodes)
    node_ids = np.tile(ids, t)
    feature_ids = np.zeros((t, n_nodes), dtype=np.int64)
    feature_ids[:, :n_internal] = forest.features
    values = np.zeros((t, n_nodes), dtype=np.float32)
    values[:, :n_internal] = forest.thresholds
    leaf_node_ids = np.tile(ids[is_leaf], t)
    leaf_tree_ids = np.repeat(np.arange(t, dtype=np.int64), 2 ** d)
    weights = forest.leaf_values / np.float32(t)  # [T, 2^d, C]
    voted_classes = np.arange(c, dtype=np.int64)
    if c == 2:
        # Binary forests cast one vote per leaf: p(class 1) under class id 0. onnxruntime's
        # binary path then returns [1 - p, p] and label p > 0.5. With votes for both
        # classes it takes the label from the sign of p(class 1), i.e. always class 1.
        voted_classes = voted_classes[:1]
        weights = weights[:, :, 1:]
    n_votes = len(voted_classes)
    return dict(
        nodes_treeids=tree_ids.tolist(),
        nodes_nodeids=node_ids.tolist(),
        nodes_featureids=feature_ids.reshape(-1).tolist(),
        nodes_values=values.reshape(-1).tolist(),
        nodes_modes=[b"LEAF" if leaf else b"BRANCH_LEQ" for leaf in np.tile(is_leaf, t)],
        nodes_truenodeids=np.tile(np.where(is_leaf, 0, 2 * ids + 1), t).tolist(),
        nodes_falsenodeids=np.tile(np.where(is_leaf, 0, 2 * ids + 2), t).tolist(),
        class_treeids=np.repeat(leaf_tree_ids, n_votes).tolist(),
        class_nodeids=np.repeat(leaf_node_ids, n_votes).tolist(),
        class_ids=np.tile(voted_classes, t * 2 ** d).tolist(),
        class_weights=weights.reshape(-1).tolist(),
        classlabels_int64s=list(range(c)),
        post_transform="NONE",
    )


def tree_ensemble_model(forest: Forest) -> onnx.ModelProto:
    """The same forest as one ONNX-ML TreeEnsembleClassifier: the opaque-op baseline."""
    g = GraphBuilder(f"tree_ensemble_d{forest.depth}")
    x = _tree_input(g, forest)
    g.op("TreeEnsembleClassifier", [x], outputs=["label", "probabilities"], domain="ai.onnx.ml",
         **_tree_ensemble_attributes(forest))
    g.add_output("label", TensorProto.INT64, [BATCH])
    g.add_output("probabilities", TensorProto.FLOAT, [BATCH, forest.n_classes])
    return g.model(extra_opsets={"ai.onnx.ml": ML_OPSET},
                   doc=f"ONNX-ML TreeEnsembleClassifier, {forest.n_trees} trees, depth {forest.depth}")


# ---------------------------------------------------------------------------
# Convolution and transformer blocks
# ---------------------------------------------------------------------------


def _batch_norm_params(g: GraphBuilder, rng: np.random.Generator, prefix: str, channels: int) -> list[str]:
    scale = (1.0 + 0.1 * rng.standard_normal(channels)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(channels)).astype(np.float32)
    mean = (0.1 * rng.standard_normal(channels)).astype(np.float32)
    var = (0.5 + rng.random(channels)).astype(np.float32)
    return [g.const(f"{prefix}_{k}", v) for k, v in
            (("scale", scale), ("bias", bias), ("mean", mean), ("var", var))]


def conv_block_model(channels: int = 16, size: int = 16, seed: int = 3) -> onnx.ModelProto:
    """ResNet basic block: Conv-BN-Relu-Conv-BN-Add(input)-Relu.

    Conv is the anchor; BN, Relu, Add and Relu are the elementwise epilogue to fuse into it.
    """
    rng = np.random.default_rng(seed)
    g = GraphBuilder("conv_block")
    x = g.add_input("X", TensorProto.FLOAT, [BATCH, channels, size, size])
    fan_in = channels * 9
    conv_attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    w1 = g.const("conv1_W", _weights(rng, [channels, channels, 3, 3], fan_in))
    w2 = g.const("conv2_W", _weights(rng, [channels, channels, 3, 3], fan_in))
    bn1 = _batch_norm_params(g, rng, "bn1", channels)
    bn2 = _batch_norm_params(g, rng, "bn2", channels)
    y = g.op("Conv", [x, w1], "conv1", **conv_attrs)
    y = g.op("BatchNormalization", [y, *bn1], "bn1", epsilon=1e-5)
    y = g.op("Relu", [y], "relu1")
    y = g.op("Conv", [y, w2], "conv2", **conv_attrs)
    y = g.op("BatchNormalization", [y, *bn2], "bn2", epsilon=1e-5)
    y = g.op("Add", [y, x], "residual")
    g.op("Relu", [y], outputs=["Y"])
    g.add_output("Y", TensorProto.FLOAT, [BATCH, channels, size, size])
    return g.model(doc="Residual conv block")


def _layer_norm(g: GraphBuilder, x: str, gamma: str, beta: str, two: str = "two", eps: str = "eps") -> str:
    """LayerNorm over the last axis as the 9 plain ops exporters emit before opset 17's
    LayerNormalization became common: a reduction, elementwise, reduction, elementwise chain."""
    mean = g.op("ReduceMean", [x], "ln_mean", axes=[-1], keepdims=1)
    centered = g.op("Sub", [x, mean], "ln_centered")
    squared = g.op("Pow", [centered, two], "ln_sq")
    var = g.op("ReduceMean", [squared], "ln_var", axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, eps], "ln_var_eps")], "ln_std")
    normed = g.op("Div", [centered, std], "ln_normed")
    return g.op("Add", [g.op("Mul", [normed, gamma], "ln_scaled"), beta], "ln_out")


def _gelu_erf(g: GraphBuilder, x: str, sqrt2: str = "sqrt2", one: str = "one", half: str = "half") -> str:
    """Exact GELU as 5 ops: 0.5 * x * (1 + erf(x / sqrt(2)))."""
    erf = g.op("Erf", [g.op("Div", [x, sqrt2], "gelu_div")], "gelu_erf")
    one_plus = g.op("Add", [erf, one], "gelu_1p")
    return g.op("Mul", [g.op("Mul", [x, one_plus], "gelu_x"), half], "gelu")


def transformer_mlp_model(seq: int = 8, dim: int = 64, seed: int = 4) -> onnx.ModelProto:
    """Pre-norm transformer MLP: x + W2(gelu(W1(LayerNorm(x)) + b1)) + b2."""
    rng = np.random.default_rng(seed)
    g = GraphBuilder("transformer_mlp")
    x = g.add_input("X", TensorProto.FLOAT, [BATCH, seq, dim])
    for name, value in (("two", 2.0), ("eps", 1e-5), ("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)):
        g.const(name, np.array(value, dtype=np.float32))
    gamma = g.const("ln_gamma", (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
    beta = g.const("ln_beta", (0.1 * rng.standard_normal(dim)).astype(np.float32))
    w1 = g.const("W1", _weights(rng, [dim, 4 * dim], dim))
    b1 = g.const("b1", (0.1 * rng.standard_normal(4 * dim)).astype(np.float32))
    w2 = g.const("W2", _weights(rng, [4 * dim, dim], 4 * dim))
    b2 = g.const("b2", (0.1 * rng.standard_normal(dim)).astype(np.float32))
    normed = _layer_norm(g, x, gamma, beta)
    hidden = g.op("Add", [g.op("MatMul", [normed, w1], "fc1"), b1], "fc1_b")
    activated = _gelu_erf(g, hidden)
    out = g.op("Add", [g.op("MatMul", [activated, w2], "fc2"), b2], "fc2_b")
    g.op("Add", [out, x], outputs=["Y"])
    g.add_output("Y", TensorProto.FLOAT, [BATCH, seq, dim])
    return g.model(doc="Transformer MLP block with LayerNorm and erf-GELU in plain ops")


def repeated_block_model(layers: int, seq: int = 8, dim: int = 64, seed: int = 5) -> onnx.ModelProto:
    """`layers` post-norm transformer MLP blocks in a row, each with weights and constants of its
    own (as exporters write them): LayerNorm(x + W2(gelu(W1 x + b1)) + b2), in plain ops.
    Identical but for weights and names: onnxfuse should compile each distinct kernel once."""
    rng = np.random.default_rng(seed)
    g = GraphBuilder(f"repeated_block_{layers}")
    x = g.add_input("X", TensorProto.FLOAT, [BATCH, seq, dim])
    for layer in range(layers):
        p = f"layer{layer}."
        scalars = {name: g.const(p + name, np.array(value, dtype=np.float32))
                   for name, value in (("two", 2.0), ("eps", 1e-5), ("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5))}
        w1 = g.const(p + "W1", _weights(rng, [dim, 4 * dim], dim))
        b1 = g.const(p + "b1", (0.1 * rng.standard_normal(4 * dim)).astype(np.float32))
        w2 = g.const(p + "W2", _weights(rng, [4 * dim, dim], 4 * dim))
        b2 = g.const(p + "b2", (0.1 * rng.standard_normal(dim)).astype(np.float32))
        gamma = g.const(p + "ln_gamma", (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        beta = g.const(p + "ln_beta", (0.1 * rng.standard_normal(dim)).astype(np.float32))
        hidden = g.op("Add", [g.op("MatMul", [x, w1], "fc1"), b1], "fc1_b")
        activated = _gelu_erf(g, hidden, scalars["sqrt2"], scalars["one"], scalars["half"])
        out = g.op("Add", [g.op("MatMul", [activated, w2], "fc2"), b2], "fc2_b")
        x = _layer_norm(g, g.op("Add", [out, x], "residual"), gamma, beta, scalars["two"], scalars["eps"])
    g.add_output(x, TensorProto.FLOAT, [BATCH, seq, dim])
    return g.model(doc=f"{layers} transformer MLP blocks with weights of their own")


# ---------------------------------------------------------------------------
# Tiny demo graphs
# ---------------------------------------------------------------------------


def diamond_model(width: int = 32) -> onnx.ModelProto:
    """Relu feeds Sigmoid and Tanh which rejoin in Add, then Mul: Add post-dominates Relu,
    so the whole diamond is one group."""
    g = GraphBuilder("diamond")
    x = g.add_input("X", TensorProto.FLOAT, [BATCH, width])
    g.const("half", np.array(0.5, dtype=np.float32))
    top = g.op("Relu", [x], "top")
    left = g.op("Sigmoid", [top], "left")
    right = g.op("Tanh", [top], "right")
    join = g.op("Add", [left, right], "join")
    g.op("Mul", [join, "half"], outputs=["Y"])
    g.add_output("Y", TensorProto.FLOAT, [BATCH, width])
    return g.model(doc="Diamond of elementwise ops")


def concat_exit_model(width: int = 32) -> onnx.ModelProto:
    """Two elementwise branches joined by Concat that is itself the graph output.

    The fuser may fuse the branches into the Concat, but the Concat's result must stay
    visible as the model output."""
    g = GraphBuilder("concat_exit")
    x = g.add_input("X", TensorProto.FLOAT, [BATCH, width])
    g.const("two", np.array(2.0, dtype=np.float32))
    left = g.op("Mul", [g.op("Relu", [x], "relu"), "two"], "left")
    right = g.op("Neg", [g.op("Sigmoid", [x], "sigmoid")], "right")
    g.op("Concat", [left, right], outputs=["Y"], axis=1)
    g.add_output("Y", TensorProto.FLOAT, [BATCH, 2 * width])
    return g.model(doc="Elementwise branches joined by Concat at the graph exit")


# ---------------------------------------------------------------------------
# Bundle
# ---------------------------------------------------------------------------

BUNDLED_FOREST = dict(n_trees=10, n_features=28, n_classes=2, seed=7)
BENCHMARK_FOREST = dict(n_trees=100, depth=8, n_features=28, n_classes=2, seed=7)


def bundled_forest(depth: int) -> Forest:
    """The small forest of the committed tree models (10 trees, 28 features)."""
    return make_forest(depth=depth, **BUNDLED_FOREST)


def benchmark_forest() -> Forest:
    """The 100-tree, depth-8 forest of the benchmarks (not committed: ~1.8 MB as tree_trav)."""
    return make_forest(**BENCHMARK_FOREST)


def bundled_models() -> dict[str, Callable[[], onnx.ModelProto]]:
    """File name -> zero-argument builder, for everything main() writes."""
    return {
        "lstm_gate.onnx": lstm_gate_model,
        "lstm_cell.onnx": lstm_cell_model,
        "gru_cell.onnx": gru_cell_model,
        "tree_trav_d3.onnx": lambda: tree_trav_model(bundled_forest(3)),
        "tree_trav_d8.onnx": lambda: tree_trav_model(bundled_forest(8)),
        "perf_tree_trav_d3.onnx": lambda: perf_tree_trav_model(bundled_forest(3)),
        "perf_tree_trav_d8.onnx": lambda: perf_tree_trav_model(bundled_forest(8)),
        "tree_ensemble_d8.onnx": lambda: tree_ensemble_model(bundled_forest(8)),
        "conv_block.onnx": conv_block_model,
        "transformer_mlp.onnx": transformer_mlp_model,
        "diamond.onnx": diamond_model,
        "concat_exit.onnx": concat_exit_model,
    }


def write_models(out_dir: str) -> list[str]:
    """Build and save every bundled model into out_dir; return the written paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for file_name, build in bundled_models().items():
        path = os.path.join(out_dir, file_name)
        onnx.save_model(build(), path)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=HERE, help="where to write the .onnx files (default: models/)")
    args = parser.parse_args(argv)
    for path in write_models(args.out_dir):
        print(f"{os.path.getsize(path):>8} {path}")


if __name__ == "__main__":
    main()
