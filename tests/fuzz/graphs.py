"""Random valid ONNX graphs from the ops onnxfuse fuses, one small connected component at a time.

A component is a few ops over a symbolic batch dimension `N`: elementwise unary/binary ops with
broadcasting, MatMul/Gemm, Split/Concat/Slice/Reshape/Transpose, Gather/GatherElements with
index inputs (graph inputs or computed by Cast of floats), Where/Cast/comparisons, reductions,
Softmax/LayerNormalization, over float32/float64/float16/int32/int64/bool. Values are read
several times and some intermediates are graph outputs too. Every node is named and prefixed
with its component (`c3_...`), so many components batch into one model (`assemble`) that
onnxfuse compiles in one call, and each can be cut out again (`component_model`).

`GeneratorConfig.exclude` names known-bug patterns (`known_bugs.py`) the generator must not
produce: a clean slice stays meaningful without tripping over bugs already pinned elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
BATCH = "N"

ONNX_TYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
              "int32": TensorProto.INT32, "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
FLOATS = ("float32", "float64", "float16")
INTS = ("int32", "int64")

UNARY_FLOAT = ("Abs Neg Exp Log Sqrt Tanh Sigmoid Erf Relu Floor Ceil Round Reciprocal Sign Sin Cos Softplus "
               "LeakyRelu Elu HardSigmoid").split()
UNARY_INT = "Abs Neg Sign Relu".split()
BINARY_FLOAT = "Add Sub Mul Div Pow Max Min".split()
BINARY_INT = "Add Sub Mul Max Min".split()
COMPARISONS = "Equal Less Greater LessOrEqual GreaterOrEqual".split()
REDUCTIONS = "ReduceSum ReduceMean ReduceMax ReduceMin".split()

# Constants a binary op may take: the values where float identities (x*0, x-x, x+1e8-1e8) break.
SPECIAL_CONSTANTS = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 1e8, -1e8, 3e38, np.inf, -np.inf, np.nan, 1e-40)


@dataclass(frozen=True)
class Value:
    name: str
    dtype: str
    shape: tuple  # ints, or BATCH
    index_bound: int | None = None  # for int values meant as indices: they index an axis of this size


@dataclass
class Component:
    """One connected random graph: its nodes, graph inputs, initializers and graph outputs."""
    index: int
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    initializers: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def op_types(self) -> list[str]:
        return [n.op_type for n in self.nodes]


@dataclass(frozen=True)
class GeneratorConfig:
    min_ops: int = 2
    max_ops: int = 7
    dtypes: tuple[str, ...] = ("float32",) * 6 + ("float64", "float16", "int32", "int64", "bool")
    exclude: frozenset[str] = frozenset()  # known-bug pattern names (known_bugs.py) not to generate


def value_info(v: Value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(v.name, ONNX_TYPES[v.dtype], list(v.shape))


def broadcast(a: tuple, b: tuple) -> tuple | None:
    """numpy/ONNX broadcasting of two shapes with symbolic dims; None if they do not broadcast."""
    out = []
    for x, y in zip((1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


class _Builder:
    """Grows one component node by node; every `op_*` method returns the new Value or None when
    the op does not apply to what the component holds."""

    def __init__(self, rng: np.random.Generator, index: int, config: GeneratorConfig):
        self.rng, self.config = rng, config
        self.c = Component(index)
        self.values: list[Value] = []
        self.producer: dict[str, onnx.NodeProto] = {}
        self.counter = 0

    # -- names, inputs, constants ----------------------------------------------------------------

    def name(self, stem: str) -> str:
        self.counter += 1
        return f"c{self.c.index}_{stem}{self.counter}"

    def new_input(self, dtype: str, shape: tuple, index_bound: int | None = None) -> Value:
        v = Value(self.name("in"), dtype, shape, index_bound)
        self.c.inputs.append(v)
        self.values.append(v)
        return v

    def constant(self, array: np.ndarray, stem: str = "k") -> str:
        name = self.name(stem)
        self.c.initializers[name] = array
        return name

    def const_i64(self, *values: int) -> str:
        return self.constant(np.array(values, np.int64), "axes")

    def emit(self, op: str, inputs: list[str], dtype: str, shape: tuple, index_bound=None, **attrs) -> Value:
        out = Value(self.name(op.lower()), dtype, tuple(shape), index_bound)
        n = helper.make_node(op, inputs, [out.name], name=out.name, **attrs)
        self.c.nodes.append(n)
        self.producer[out.name] = n
        self.values.append(out)
        return out

    def pick(self, predicate=lambda v: True) -> Value | None:
        """An existing value, later ones likelier (chains), each possibly read again (reuse)."""
        found = [v for v in self.values if predicate(v)]
        if not found:
            return None
        weights = np.arange(1, len(found) + 1, dtype=float)
        return found[self.rng.choice(len(found), p=weights / weights.sum())]

    def excluded(self, pattern: str) -> bool:
        return pattern in self.config.exclude

    def operand_like(self, v: Value, allow_special: bool = True) -> str:
        """A second operand for `v` that broadcasts with it: another value, a new input or a constant."""
        r = self.rng.random()
        if r < 0.35:
            other = self.pick(lambda w: w.dtype == v.dtype and w.name != v.name and broadcast(v.shape, w.shape) == v.shape)
            if other is not None:
                return other.name
        if r < 0.7:
            return self.new_input(v.dtype, self.broadcast_shape(v.shape)).name
        shape = self.broadcast_shape(v.shape, allow_batch=False)
        if v.dtype in FLOATS and allow_special and self.rng.random() < 0.5:
            fill = SPECIAL_CONSTANTS[self.rng.integers(len(SPECIAL_CONSTANTS))]
            if fill == 0.0 and self.excluded("mul-by-zero-folded"):
                fill = 2.0
            array = np.full(shape, fill)
        elif v.dtype in FLOATS:
            array = self.rng.standard_normal(shape)
        elif v.dtype == "bool":
            array = self.rng.random(shape) < 0.5
        else:
            array = self.rng.integers(-3, 4, shape)
        with np.errstate(over="ignore"):  # 3e38 is inf in float16
            return self.constant(np.asarray(array, dtype=v.dtype))

    def broadcast_shape(self, shape: tuple, allow_batch: bool = True) -> tuple:
        """A shape that broadcasts to `shape`: itself, trailing dims, or some dims set to 1."""
        choice = self.rng.integers(4)
        if choice == 0 and allow_batch:
            return shape
        if choice == 1:
            return ()
        if choice == 2 and len(shape) > 1:
            tail = shape[self.rng.integers(1, len(shape)):]
            return tuple(1 if d == BATCH else d for d in tail)
        out = tuple(1 if (d == BATCH and not allow_batch) or self.rng.random() < 0.4 else d for d in shape)
        return out

    # -- ops -------------------------------------------------------------------------------------

    def op_unary(self):
        v = self.pick(lambda w: w.dtype in FLOATS + INTS)
        if v is None:
            return None
        ops = UNARY_FLOAT if v.dtype in FLOATS else UNARY_INT
        op = ops[self.rng.integers(len(ops))]
        if op == "Softplus" and self.excluded("softplus"):
            op = "Sigmoid"
        attrs = {"LeakyRelu": {"alpha": 0.1}, "Elu": {"alpha": 0.7}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}}
        return self.emit(op, [v.name], v.dtype, v.shape, **attrs.get(op, {}))

    def op_binary(self):
        v = self.pick(lambda w: w.dtype in FLOATS + INTS)
        if v is None:
            return None
        ops = BINARY_FLOAT if v.dtype in FLOATS else BINARY_INT
        op = ops[self.rng.integers(len(ops))]
        if op == "Pow":
            exponent = self.constant(np.array(self.rng.choice([2.0, 3.0, 0.5, -1.0, 1.5]), v.dtype), "exp")
            return self.emit("Pow", [v.name, exponent], v.dtype, v.shape)
        if op == "Sub" and self.rng.random() < 0.15 and not self.excluded("self-cancel-folded"):
            return self.emit("Sub", [v.name, v.name], v.dtype, v.shape)  # x - x: NaN - NaN is NaN
        other = self.operand_like(v)
        if op in ("Add", "Sub") and self.excluded("float-reassociation") and v.dtype in FLOATS:
            if self.shares_add_operand(v.name, other):
                return None
        if op in ("Add", "Sub") and self.excluded("mul-feeds-add") and self.made_by("Mul", v.name, other):
            return None
        if op in ("Add", "Sub") and self.excluded("erf-minus-input") and self.erf_meets_its_input(v.name, other):
            return None
        operands = [v.name, other] if self.rng.random() < 0.5 else [other, v.name]
        shape = broadcast(v.shape, self.shape_of(other))
        if op == "Mul" and self.excluded("mul-by-zero-folded") and any(self.is_zero_const(o) for o in operands):
            return None
        return self.emit(op, operands, v.dtype, shape)

    def op_cancellation(self):
        """(a + b) - b, a - (b + a) and friends: the identities a float simplifier must not use."""
        if self.excluded("float-reassociation"):
            return None
        a = self.pick(lambda w: w.dtype in FLOATS)
        if a is not None and self.excluded("mul-feeds-add") and self.made_by("Mul", a.name):
            return None
        if a is None:
            return None
        b = self.operand_like(a, allow_special=False)
        if self.excluded("mul-feeds-add") and self.made_by("Mul", b):
            return None
        s = self.emit("Add", [a.name, b], a.dtype, broadcast(a.shape, self.shape_of(b)))
        pair = [[s.name, b], [b, s.name], [s.name, a.name], [a.name, s.name]][self.rng.integers(4)]
        return self.emit("Sub", pair, a.dtype, s.shape)

    def op_compare_where(self):
        v = self.pick(lambda w: w.dtype in FLOATS + INTS)
        if v is None:
            return None
        op = COMPARISONS[self.rng.integers(len(COMPARISONS))]
        cond = self.emit(op, [v.name, self.operand_like(v)], "bool", v.shape)
        if self.rng.random() < 0.3:
            return cond
        other = self.operand_like(v)
        shape = broadcast(v.shape, self.shape_of(other))
        return self.emit("Where", [cond.name, v.name, other], v.dtype, shape)

    def op_logic(self):
        v = self.pick(lambda w: w.dtype == "bool")
        if v is None:
            return None
        if self.rng.random() < 0.3:
            return self.emit("Not", [v.name], "bool", v.shape)
        op = ("And", "Or", "Xor")[self.rng.integers(3)]
        other = self.operand_like(v)
        return self.emit(op, [v.name, other], "bool", broadcast(v.shape, self.shape_of(other)))

    def op_is_special(self):
        v = self.pick(lambda w: w.dtype in ("float32", "float64"))
        if v is None:
            return None
        return self.emit(("IsNaN", "IsInf")[self.rng.integers(2)], [v.name], "bool", v.shape)

    def op_cast(self):
        v = self.pick()
        to = self.config.dtypes[self.rng.integers(len(self.config.dtypes))]
        if v is None or to == v.dtype:
            return None
        if v.dtype in FLOATS and to in INTS and self.excluded("cast-nan-to-int"):
            return None
        return self.emit("Cast", [v.name], to, v.shape, to=ONNX_TYPES[to])

    def op_clip(self):
        v = self.pick(lambda w: w.dtype in FLOATS)
        if v is None:
            return None
        lo = self.constant(np.array(-1.5, v.dtype), "lo")
        hi = self.constant(np.array(2.5, v.dtype), "hi")
        inputs = [[v.name, lo, hi], [v.name, lo], [v.name, "", hi]][self.rng.integers(3)]
        if self.excluded("clip-without-max"):
            inputs = [v.name, lo, hi]
        return self.emit("Clip", inputs, v.dtype, v.shape)

    def op_matmul(self):
        v = self.pick(lambda w: w.dtype in ("float32", "float64") and len(w.shape) in (2, 3) and isinstance(w.shape[-1], int))
        if v is None:
            return None
        k, m = v.shape[-1], int(self.rng.integers(1, 9))
        if self.rng.random() < 0.6 or len(v.shape) == 3:
            w = self.constant(self.rng.standard_normal((k, m)).astype(v.dtype), "w") if self.rng.random() < 0.7 \
                else self.new_input(v.dtype, (k, m)).name
            return self.emit("MatMul", [v.name, w], v.dtype, v.shape[:-1] + (m,))
        trans_b = int(self.rng.integers(2))
        w = self.constant(self.rng.standard_normal((m, k) if trans_b else (k, m)).astype(v.dtype), "w")
        inputs = [v.name, w]
        if self.rng.random() < 0.7:
            bias_shape = [(m,), (1, m), ()][self.rng.integers(3)]
            inputs.append(self.constant(self.rng.standard_normal(bias_shape).astype(v.dtype), "bias"))
        return self.emit("Gemm", inputs, v.dtype, (v.shape[0], m), transB=trans_b, alpha=float(self.rng.choice([1.0, 0.5])),
                         beta=float(self.rng.choice([1.0, 2.0])))

    def op_gemm_trans_a(self):
        """Gemm with transA: A is [K, N]^T, so the batch dim is A's second axis."""
        v = self.pick(lambda w: w.dtype in ("float32", "float64") and len(w.shape) == 2 and w.shape[0] == BATCH
                      and isinstance(w.shape[1], int))
        if v is None:
            return None
        at = self.emit("Transpose", [v.name], v.dtype, (v.shape[1], BATCH), perm=[1, 0])
        m = int(self.rng.integers(1, 6))
        w = self.constant(self.rng.standard_normal((v.shape[1], m)).astype(v.dtype), "w")
        return self.emit("Gemm", [at.name, w], v.dtype, (BATCH, m), transA=1)

    def op_split_concat(self):
        v = self.pick(lambda w: len(w.shape) >= 2 and isinstance(w.shape[-1], int) and w.shape[-1] >= 2)
        if v is None:
            return None
        d = v.shape[-1]
        first = int(self.rng.integers(1, d))
        parts = [self.name("split"), self.name("split")]
        n = helper.make_node("Split", [v.name, self.const_i64(first, d - first)], parts, name=parts[0], axis=-1)
        self.c.nodes.append(n)
        a = Value(parts[0], v.dtype, v.shape[:-1] + (first,))
        b = Value(parts[1], v.dtype, v.shape[:-1] + (d - first,))
        self.values += [a, b]
        self.producer[a.name] = self.producer[b.name] = n
        if self.rng.random() < 0.5:
            return self.emit("Concat", [b.name, a.name, b.name], v.dtype, v.shape[:-1] + (2 * (d - first) + first,), axis=-1)
        return b

    def op_slice(self):
        v = self.pick(lambda w: len(w.shape) >= 2 and isinstance(w.shape[-1], int) and w.shape[-1] >= 2)
        if v is None:
            return None
        d = v.shape[-1]
        if self.rng.random() < 0.5:
            start, end, step = int(self.rng.integers(0, d)), d, 1
            length = d - start
        else:
            start, end, step = -1, -d - 1, -int(self.rng.integers(1, 3))
            length = len(range(d - 1, -1, step))
        inputs = [v.name, self.const_i64(start), self.const_i64(end), self.const_i64(len(v.shape) - 1), self.const_i64(step)]
        return self.emit("Slice", inputs, v.dtype, v.shape[:-1] + (length,))

    def op_reshape(self):
        v = self.pick(lambda w: w.shape[:1] == (BATCH,) and all(isinstance(d, int) for d in w.shape[1:]) and len(w.shape) >= 2)
        if v is None:
            return None
        inner = int(np.prod(v.shape[1:]))
        if len(v.shape) == 3 or inner < 4 or inner % 2:
            # Not (0, -1): on an empty batch onnxruntime cannot infer the -1 (0 / 0) and raises
            # (test_fuzz_slice.py pins it), where a kernel knows the row size and returns [0, inner].
            target, shape = (0, inner) if self.rng.random() < 0.5 else (-1, inner), (BATCH, inner)
        else:
            target, shape = (-1, 2, inner // 2), (BATCH, 2, inner // 2)
        return self.emit("Reshape", [v.name, self.const_i64(*target)], v.dtype, shape)

    def op_transpose(self):
        v = self.pick(lambda w: len(w.shape) == 3)
        if v is None:
            return None
        perm = [[0, 2, 1], [1, 0, 2], [2, 0, 1]][self.rng.integers(3)]
        if perm[0] != 0 and self.rng.random() < 0.7:
            perm = [0, 2, 1]
        return self.emit("Transpose", [v.name], v.dtype, tuple(v.shape[p] for p in perm), perm=perm)

    def index_value(self, bound: int, shape: tuple) -> Value:
        """Indices for an axis of size `bound`: a graph input, or computed from floats by Cast."""
        if self.rng.random() < 0.5 or self.excluded("nan-index-gather"):
            return self.new_input("int64", shape, index_bound=bound)
        f = self.new_input("float32", shape, index_bound=bound)
        floor = self.emit("Floor", [f.name], "float32", shape)
        return self.emit("Cast", [floor.name], "int64", shape, index_bound=bound, to=TensorProto.INT64)

    def op_gather(self):
        if self.rng.random() < 0.5:  # a constant table looked up by computed or input indices
            rows = int(self.rng.integers(2, 9))
            dtype = ("float32", "float64", "int64")[self.rng.integers(3)]
            width = () if self.rng.random() < 0.5 else (int(self.rng.integers(1, 4)),)
            table = self.constant((self.rng.standard_normal((rows,) + width) * 10).astype(dtype), "table")
            k = int(self.rng.integers(1, 4))
            idx = self.index_value(rows, (BATCH, k))
            return self.emit("Gather", [table, idx.name], dtype, (BATCH, k) + width, axis=0)
        v = self.pick(lambda w: len(w.shape) == 2 and w.shape[0] == BATCH and isinstance(w.shape[1], int))
        if v is None:
            return None
        d = v.shape[1]
        k = int(self.rng.integers(1, 5))
        if self.rng.random() < 0.5:
            idx = self.const_i64(*self.rng.integers(-d, d, k))
            return self.emit("Gather", [v.name, idx], v.dtype, (BATCH, k), axis=1)
        if d == 1 and self.excluded("gatherelements-axis-of-one"):
            return None
        idx = self.index_value(d, (BATCH, k))
        return self.emit("GatherElements", [v.name, idx.name], v.dtype, (BATCH, k), axis=1)

    def op_reduce(self):
        v = self.pick(lambda w: w.dtype in FLOATS + INTS and len(w.shape) >= 2)
        if v is None:
            return None
        op = REDUCTIONS[self.rng.integers(len(REDUCTIONS))]
        if op in ("ReduceMin", "ReduceMax") and self.excluded("reduce-minmax-infinite-row"):
            return None
        rank = len(v.shape)
        axes = sorted({int(a) for a in self.rng.choice(np.arange(1, rank), size=self.rng.integers(1, rank), replace=False)})
        if self.rng.random() < 0.15 and op != "ReduceMean" and not self.excluded("reduce-over-batch"):
            axes = [0] + axes  # over the batch too (not a mean: over an empty batch, ONNX leaves it undefined)
        keep = int(self.rng.integers(2))
        shape = tuple((1 if keep else None) if i in axes else d for i, d in enumerate(v.shape))
        shape = tuple(d for d in shape if d is not None)
        if op == "ReduceSum":
            return self.emit(op, [v.name, self.const_i64(*axes)], v.dtype, shape, keepdims=keep)
        return self.emit(op, [v.name], v.dtype, shape, axes=axes, keepdims=keep)

    def op_normalize(self):
        v = self.pick(lambda w: w.dtype in ("float32", "float64") and len(w.shape) >= 2 and isinstance(w.shape[-1], int))
        if v is None:
            return None
        if self.rng.random() < 0.5:
            return self.emit("Softmax", [v.name], v.dtype, v.shape, axis=-1)
        d = v.shape[-1]
        scale = self.constant(self.rng.standard_normal(d).astype(v.dtype), "gamma")
        bias = self.constant(self.rng.standard_normal(d).astype(v.dtype), "beta")
        return self.emit("LayerNormalization", [v.name, scale, bias], v.dtype, v.shape, axis=-1, epsilon=1e-5)

    def shape_of(self, name: str) -> tuple:
        for v in self.values:
            if v.name == name:
                return v.shape
        return tuple(self.c.initializers[name].shape)

    def is_zero_const(self, name: str) -> bool:
        array = self.c.initializers.get(name)
        return array is not None and array.dtype.kind == "f" and bool((array == 0).any())

    def made_by(self, op: str, *names: str) -> bool:
        return any(self.producer[n].op_type == op for n in names if n in self.producer)

    def erf_meets_its_input(self, a: str, b: str) -> bool:
        def erf_input(name):
            n = self.producer.get(name)
            return n.input[0] if n is not None and n.op_type == "Erf" else None
        return erf_input(a) == b or erf_input(b) == a

    def shares_add_operand(self, left: str, right: str) -> bool:
        """Whether Add/Sub(left, right) could cancel through an Add/Sub one of them was made of."""
        def operands(name):
            n = self.producer.get(name)
            return set(n.input) if n is not None and n.op_type in ("Add", "Sub") else set()
        return bool(({left} | operands(left)) & ({right} | operands(right)))


OPS = {  # op family → weight
    "unary": 6, "binary": 8, "cancellation": 1, "compare_where": 3, "logic": 1, "is_special": 1, "cast": 3,
    "clip": 1, "matmul": 3, "gemm_trans_a": 1, "split_concat": 2, "slice": 2, "reshape": 2, "transpose": 1,
    "gather": 3, "reduce": 3, "normalize": 2,
}


def generate_component(rng: np.random.Generator, index: int, config: GeneratorConfig = GeneratorConfig()) -> Component:
    """One random component with `min_ops`..`max_ops` nodes and one to three graph outputs."""
    if "float16-arithmetic" in config.exclude:
        config = replace(config, dtypes=tuple(d for d in config.dtypes if d != "float16"))
    b = _Builder(rng, index, config)
    dtype = config.dtypes[rng.integers(len(config.dtypes))]
    shapes = [(BATCH, int(rng.integers(1, 9))), (BATCH, int(rng.integers(1, 4)), int(rng.integers(1, 6)))]
    shape = shapes[rng.integers(2) if rng.random() < 0.3 else 0]
    b.new_input(dtype, shape)
    families, weights = list(OPS), np.array(list(OPS.values()), float)
    target = int(rng.integers(config.min_ops, config.max_ops + 1))
    for _ in range(target * 8):
        if len(b.c.nodes) >= target:
            break
        family = families[rng.choice(len(families), p=weights / weights.sum())]
        getattr(b, f"op_{family}")()
    computed = [v for v in b.values if v.name in b.producer]
    last = computed[-1] if computed else None
    if last is None:
        return b.c
    read = {i for n in b.c.nodes for i in n.input}
    leaves = [v for v in computed[:-1] if v.name not in read]
    extra = [v for v in computed[:-1] if v.name in read and rng.random() < 0.2]  # outputs that are read too
    b.c.outputs = [last] + leaves[-2:] + extra[:1]
    return _without_dead_nodes(b.c)


def _without_dead_nodes(c: Component) -> Component:
    """Only what the outputs need: onnxruntime drops dead nodes, and onnxfuse's groups of them
    have no outputs to compile."""
    producers = {o: n for n in c.nodes for o in n.output}
    needed, stack = set(), [v.name for v in c.outputs]
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            if name in producers:
                stack.extend(i for i in producers[name].input if i)
    c.nodes = [n for n in c.nodes if any(o in needed for o in n.output)]
    c.inputs = [v for v in c.inputs if v.name in needed]
    c.initializers = {k: a for k, a in c.initializers.items() if k in needed}
    return c


# -- whole models ---------------------------------------------------------------------------------

def assemble(components: list[Component], name: str = "fuzz") -> onnx.ModelProto:
    """One model holding every component, disconnected: one onnxfuse call compiles them all."""
    nodes = [n for c in components for n in c.nodes]
    inputs = [value_info(v) for c in components for v in c.inputs]
    outputs = [value_info(v) for c in components for v in c.outputs]
    inits = [numpy_helper.from_array(a, k) for c in components for k, a in c.initializers.items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


def assemble_models(models: list[onnx.ModelProto], name: str = "fuzz") -> onnx.ModelProto:
    """Disconnected models with distinct names (see regressions.rename) as one model."""
    g = helper.make_graph([n for m in models for n in m.graph.node], name,
                          [v for m in models for v in m.graph.input], [v for m in models for v in m.graph.output],
                          [t for m in models for t in m.graph.initializer])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


def check(model: onnx.ModelProto) -> None:
    """onnx's checker with full shape inference: the declared output shapes must be what ONNX infers."""
    onnx.checker.check_model(model, full_check=True)


def prune(model: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """The part of `model` that computes `outputs`: nodes they depend on, the inputs and
    initializers those read. Works on fused models too (custom-op nodes are nodes)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    needed, keep, stack = set(), set(), list(outputs)
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        n = producers.get(name)
        if n is not None and id(n) not in keep:
            keep.add(id(n))
            stack.extend(i for i in n.input if i)
    g = model.graph
    declared = {v.name: v for v in list(g.output) + list(g.value_info)}
    if any(name not in declared for name in outputs):  # an intermediate: its type from shape inference
        declared.update({v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info})
    graph = helper.make_graph(
        [n for n in g.node if id(n) in keep], g.name,
        [i for i in g.input if i.name in needed],
        [declared[name] for name in outputs],
        [t for t in g.initializer if t.name in needed])
    pruned = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    pruned.metadata_props.extend(model.metadata_props)
    return pruned
