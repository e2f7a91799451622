"""Pass: Hummingbird's GEMM strategy for trees, rewritten batch first, a few trees per product.

Hummingbird's `gemm` strategy (its default for shallow trees) computes a forest as three matrix
products over the batch held in the *last* axis:

    Gemm(W1 [M, K], X [N, K], transB=1)      -> [M, N]      each internal node's feature
    Less / LessOrEqual / ... (b1 [M, 1])                    its decision
    Reshape [T, J, -1], Cast to float                       per tree
    MatMul(W2 [T, L, J], .)                  -> [T, L, N]   each leaf's count of decisions on its path
    Reshape [T*L, -1], Equal(b2 [T*L, 1]), Reshape [T, L, -1], Cast   the leaf reached (one-hot)
    MatMul(W3 [T, C, L], .)                  -> [T, C, N]   its value

Batch-last, every access of our schedule strides by the batch (select/auto leaves such nodes to
onnxruntime). The same numbers batch first are products whose columns are the trees' internal
nodes and leaves, static and small. `g` trees share a product (a pack, trees_per_pack), their
columns side by side and padded to whole vectors; P = ceil(T / g) packs:

    MatMul(X, W1' [P, K, J'])                -> [P, N, J']  J' = g J padded to whole vectors
    compare(b1' [P, 1, J']), Cast
    MatMul(., W2' [P, J', L'])               -> [P, N, L']  block diagonal: tree i's rows meet its columns
    Equal(b2' [P, 1, L']), Cast
    Mul(Unsqueeze(., [2, 3]), W3' [P, 1, g, C, L']), ReduceSum over L' -> [P, N, g, C]
    Transpose, Reshape [P g, C, -1] (and Slice to T)        the original's [T, C, N], for the rest

The last product becomes a Mul and a sum: its C columns (1 or 2) fill no vector, and the sum
ends the second product's kernel (partition: reduction epilogues). A padded column or an empty
place computes from zero weights and meets zero weights in the next step, and a padded leaf is
never reached; every other number is computed from the same operands, each product summing its
k's in order as onnxruntime's does, and the one-hot sum of the leaf values is exact in any order
(the kernels are checked bit for bit all the same).

Under onnxruntime the rewritten form runs slower than the original (0.5-0.7x at batch 64: its
batched MatMul over T small products costs more than one Gemm), so the rewrite only pays as
kernels. The pipeline therefore keeps it only when every product it wrote ends in a kernel and
otherwise optimizes the original (`pipeline.run_pipeline`); the nodes it writes carry names
starting with `NODE_PREFIX` for that check.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .tensors import add_initializer, constant_array, constant_ints, fresh_name, take_over, used_names

NODE_PREFIX = "batch_first_trees/"
COMPARISONS = ("Less", "LessOrEqual", "Greater", "GreaterOrEqual")
VECTOR = 16  # columns are padded to a multiple of this many floats (one AVX-512 vector)
MAX_PADDED_COLUMNS = 64
MAX_PADDING = 2.0
"""A pack's padded internal nodes or leaves stay within MAX_PADDED_COLUMNS, and a forest whose
products, packed as well as they can be, do more than MAX_PADDING times the unpadded
multiply-adds stays as it is. Measured at batch 64 (1 thread, against the original under
onnxruntime): GradientBoosting depth 4 (50 trees, J = 15, L = 16: one a pack, 1.07 times the
work) 1.78x; LightGBM 31 leaves (J = 30, L = 31: 1.08) 1.69x; XGBoost depth 6 (J = 51, L = 52,
padded to 64: 1.44) 1.13x; scikit-learn's default GradientBoosting (100 trees of depth 3, J = 7,
L = 8: two a pack, 1.40) 1.6x, where one a pack (2.8) ran 0.97x. A random forest of depth 8
(J = 146, L = 147) pads past 64 and stays: at 160 columns its per-tree products ran 0.66x, the
weights no longer in cache across row tiles."""


class BatchFirstTreesPass(ir.passes.InPlacePass):
    """Guarantee: every chain of the shape above in the main graph, whose packed products stay
    within MAX_PADDED_COLUMNS and MAX_PADDING, whose trees hold one value a leaf
    (_one_value_a_leaf) and whose Reshapes keep the batch as `-1`, is
    computed batch first in packs of trees; its final product's value is the same tensor,
    computed by the rewrite's last node."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.op_type == "Gemm" and node.domain in ("", "ai.onnx") and node.graph is model.graph:
                chain = _match(node)
                if chain is not None:
                    _rewrite(model.graph, chain)
                    modified = True
        return ir.passes.PassResult(model, modified=modified)


def _only_reader(node: ir.Node, op_types: tuple[str, ...]) -> ir.Node | None:
    """The one node reading `node`'s one output, if it is of `op_types` and the output is no
    graph output."""
    if len(node.outputs) != 1 or node.outputs[0].is_graph_output():
        return None
    uses = list(node.outputs[0].uses())
    if len(uses) != 1 or uses[0].node.op_type not in op_types or uses[0].node.domain not in ("", "ai.onnx"):
        return None
    return uses[0].node


def _other_operand(node: ir.Node, value: ir.Value) -> tuple[np.ndarray | None, int]:
    """The constant beside `value` among a binary node's two inputs, and `value`'s position."""
    if len(node.inputs) != 2:
        return None, -1
    position = 0 if node.inputs[0] is value else 1
    return constant_array(node.inputs[1 - position]), position


def _reshape_target(node: ir.Node) -> list[int] | None:
    """A Reshape's constant target if its last entry is -1 (the batch, left for the data to
    size) and no other entry is 0 or -1, else None."""
    if len(node.inputs) != 2 or node.attributes.get_int("allowzero", 0):
        return None
    target = constant_ints(node.inputs[1])
    if target is None or not target or target[-1] != -1 or any(d <= 0 for d in target[:-1]):
        return None
    return target[:-1]


def _is_float_cast(node: ir.Node | None) -> bool:
    return node is not None and node.attributes.get_int("to", 0) == ir.DataType.FLOAT.value


def _padded(count: int) -> int:
    return -(-count // VECTOR) * VECTOR


def _match(gemm: ir.Node) -> dict | None:
    """The chain starting at `gemm`, with its constants, or None if any link differs."""
    attributes = gemm.attributes
    if (len(gemm.inputs) != 2 or attributes.get_int("transA", 0) or not attributes.get_int("transB", 0)
            or attributes.get_float("alpha", 1.0) != 1.0):
        return None
    w1, x = constant_array(gemm.inputs[0]), gemm.inputs[1]
    if w1 is None or w1.ndim != 2 or w1.dtype != np.float32 or constant_array(x) is not None \
            or x.shape is None or len(x.shape) != 2:
        return None
    compare = _only_reader(gemm, COMPARISONS)
    b1, compare_position = _other_operand(compare, gemm.outputs[0]) if compare else (None, -1)
    split = _only_reader(compare, ("Reshape",)) if compare else None
    trees = _reshape_target(split) if split else None
    decisions = _only_reader(split, ("Cast",)) if split else None
    counts = _only_reader(decisions, ("MatMul",)) if _is_float_cast(decisions) else None
    if b1 is None or b1.shape != (w1.shape[0], 1) or trees is None or len(trees) != 2 or counts is None \
            or counts.inputs[1] is not decisions.outputs[0]:
        return None
    (t, j), m = trees, w1.shape[0]
    w2 = constant_array(counts.inputs[0])
    flat = _only_reader(counts, ("Reshape",))
    equal = _only_reader(flat, ("Equal",)) if flat else None
    unflat = _only_reader(equal, ("Reshape",)) if equal else None
    reached = _only_reader(unflat, ("Cast",)) if unflat else None
    values = _only_reader(reached, ("MatMul",)) if _is_float_cast(reached) else None
    if t * j != m or w2 is None or w2.ndim != 3 or w2.shape[0] != t or w2.shape[2] != j or values is None \
            or values.inputs[1] is not reached.outputs[0]:
        return None
    leaves = w2.shape[1]
    b2, equal_position = _other_operand(equal, flat.outputs[0])
    w3 = constant_array(values.inputs[0])
    if (_reshape_target(flat) != [t * leaves] or _reshape_target(unflat) != [t, leaves] or b2 is None
            or b2.shape != (t * leaves, 1) or w3 is None or w3.ndim != 3 or w3.shape[0] != t
            or w3.shape[2] != leaves or w2.dtype != np.float32 or w3.dtype != np.float32):
        return None
    pack = trees_per_pack(t, w1.shape[1], j, leaves)
    if pack is None or not _one_value_a_leaf(w3):
        return None
    return {"x": x, "w1": w1, "compare": compare, "compare_position": compare_position, "b1": b1,
            "trees": t, "internal": j, "pack": pack, "w2": w2, "equal": equal, "equal_position": equal_position, "b2": b2,
            "w3": w3, "removed": [gemm, compare, split, decisions, counts, flat, equal, unflat, reached, values]}


def _one_value_a_leaf(w3: np.ndarray) -> bool:
    """Whether each leaf holds one value (C = 1: boosted trees, which Hummingbird writes one tree
    per class, and regressors); only such forests are rewritten. A random forest's leaves hold a
    value per class, and its leaf-value kernel (a Mul broadcast to g C values a leaf, then sums
    of 16 elements in onnxruntime's order, not vectorized across rows) took 1.0 of 1.4 ms at
    1,000 rows: 50 trees of depth 3 with two classes ran 0.79x onnxruntime at batch 64 and 0.50x
    at 1,000."""
    return w3.shape[1] == 1


def _packed_work(trees: int, features: int, internal: int, leaves: int, pack: int) -> int:
    """Multiply-adds per row of the two products with `pack` trees side by side: ceil(T / pack)
    packs, each a [features, pad(pack J)] and a block-diagonal [pad(pack J), pad(pack L)] product."""
    columns, leaf_columns = _padded(pack * internal), _padded(pack * leaves)
    return -(-trees // pack) * (features * columns + columns * leaf_columns)


def trees_per_pack(trees: int, features: int, internal: int, leaves: int) -> int | None:
    """How many trees share one product (their columns side by side, whole vectors between
    them), the one with the least padded work; None where even that exceeds MAX_PADDING times the
    unpadded work or a pack's columns exceed MAX_PADDED_COLUMNS."""
    useful = trees * (features * internal + internal * leaves)
    fitting = [p for p in range(1, trees + 1) if _padded(p * max(internal, leaves)) <= MAX_PADDED_COLUMNS]
    if not fitting:
        return None
    best = min(fitting, key=lambda p: (_packed_work(trees, features, internal, leaves, p), p))
    return best if _packed_work(trees, features, internal, leaves, best) <= MAX_PADDING * useful else None


def _packed_weights(chain: dict) -> dict[str, np.ndarray]:
    """The chain's constants laid out per pack (module doc): tree i of pack p takes columns
    [i J, (i + 1) J) of the decisions and [i L, (i + 1) L) of the leaves; the rest is padding."""
    t, j, g = chain["trees"], chain["internal"], chain["pack"]
    w1, w2, w3 = chain["w1"], chain["w2"], chain["w3"]
    k, leaves, classes = w1.shape[1], w2.shape[1], w3.shape[1]
    packs, pj, pl = -(-t // g), _padded(g * j), _padded(g * leaves)
    tree_w1 = w1.reshape(t, j, k).transpose(0, 2, 1)  # [T, K, J]
    tree_b1 = chain["b1"].reshape(t, j)
    tree_w2 = w2.transpose(0, 2, 1)  # [T, J, L]
    tree_b2 = chain["b2"].reshape(t, leaves)
    packed = {
        "w1": np.zeros((packs, k, pj), np.float32),
        "b1": np.zeros((packs, 1, pj), np.float32),
        "w2": np.zeros((packs, pj, pl), np.float32),  # block diagonal: tree i's J rows meet its L columns
        "b2": np.full((packs, 1, pl), -1, np.float32),  # a padded leaf is never reached (its count is 0)
        "w3": np.zeros((packs, 1, g, classes, pl), np.float32),  # tree i's values over its own leaves
    }
    for tree in range(t):
        p, i = divmod(tree, g)
        nodes_at, leaves_at = slice(i * j, (i + 1) * j), slice(i * leaves, (i + 1) * leaves)
        packed["w1"][p, :, nodes_at] = tree_w1[tree]
        packed["b1"][p, 0, nodes_at] = tree_b1[tree]
        packed["w2"][p, nodes_at, leaves_at] = tree_w2[tree]
        packed["b2"][p, 0, leaves_at] = tree_b2[tree]
        packed["w3"][p, 0, i, :, leaves_at] = w3[tree]
    return packed


def _rewrite(graph: ir.Graph, chain: dict) -> None:
    t, g, classes = chain["trees"], chain["pack"], chain["w3"].shape[1]
    packs = -(-t // g)
    taken = used_names(graph)
    removed = chain["removed"]
    result = removed[-1].outputs[0]
    base = result.name or "trees"
    packed = _packed_weights(chain)

    def constant(part: str, array: np.ndarray) -> ir.Value:
        return add_initializer(graph, f"{base}__{part}", array, taken)

    nodes: list[ir.Node] = []

    def add(op_type: str, inputs: list, **attributes) -> ir.Value:
        name = f"{NODE_PREFIX}{base}/{op_type}_{len(nodes)}"
        node = ir.Node("", op_type, inputs, attributes=ir.convenience.convert_attributes(attributes),
                       name=name, num_outputs=1)
        node.outputs[0].name = fresh_name(name.replace("/", "_"), taken)
        nodes.append(node)
        return node.outputs[0]

    def binary(op_type: str, computed: ir.Value, operand: ir.Value, position: int) -> ir.Value:
        return add(op_type, [computed, operand] if position == 0 else [operand, computed])

    products = add("MatMul", [chain["x"], constant("w1", packed["w1"])])  # [P, N, J']
    decided = binary(chain["compare"].op_type, products, constant("b1", packed["b1"]), chain["compare_position"])
    decisions = add("Cast", [decided], to=ir.DataType.FLOAT.value)
    counts = add("MatMul", [decisions, constant("w2", packed["w2"])])  # [P, N, L']
    reached = binary("Equal", counts, constant("b2", packed["b2"]), chain["equal_position"])
    one_hot = add("Cast", [reached], to=ir.DataType.FLOAT.value)
    spread = add("Unsqueeze", [one_hot, constant("at", np.array([2, 3], np.int64))])  # [P, N, 1, 1, L']
    weighted = add("Mul", [spread, constant("w3", packed["w3"])])  # [P, N, g, C, L']
    values = add("ReduceSum", [weighted, constant("over", np.array([-1], np.int64))], keepdims=0)  # [P, N, g, C]
    by_tree = add("Transpose", [values], perm=[0, 2, 3, 1])  # [P, g, C, N]
    back = add("Reshape", [by_tree, constant("trees", np.array([packs * g, classes, -1], np.int64))])
    if packs * g != t:  # the last pack's empty places
        back = add("Slice", [back, constant("first", np.array([0], np.int64)), constant("count", np.array([t], np.int64)),
                             constant("axis", np.array([0], np.int64))])

    graph.insert_before(removed[0], nodes[:-1])
    take_over(graph, nodes[-1], result, removed)
