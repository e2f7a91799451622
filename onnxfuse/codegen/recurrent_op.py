"""What one ONNX LSTM / GRU / RNN node computes, read into a plain description.

The sequence kernel (recurrent.py) is generated from a `RecurrentOp`: its gates, activations,
directions, layout, optional inputs and outputs, and its weights packed for the kernel's
register tile. Everything the kernel does not implement is refused here with a one-line
`CompileError`, so the group falls back to onnxruntime's own op: never a wrong number.

Gate order is ONNX's: LSTM i, o, f, c; GRU z, r, h; RNN one gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import tvm
from onnx import helper, numpy_helper

from ..errors import CompileError
from .fast_math import TANH_P, TANH_Q, cpp_multiply_add, fast_exp_value, logistic_ratio, tanh_value
from .rounded_products import rounded
from .sigmoid_clamp import clamp_as_kernel

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
INPUT_NAMES = {
    "LSTM": ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
    "GRU": ("X", "W", "R", "B", "sequence_lens", "initial_h"),
    "RNN": ("X", "W", "R", "B", "sequence_lens", "initial_h"),
}
OUTPUT_NAMES = ("Y", "Y_h", "Y_c")
WEIGHT_INPUTS = ("W", "R", "B", "P")  # folded into packed constants: they must be constants


# ---------------------------------------------------------------- activations

def _f32(value: float):
    return tvm.tirx.const(value, "float32")


def _unbound(value):
    return value


def fast_sigmoid(x, bind=_unbound):
    return _f32(1.0) / (_f32(1.0) + fast_exp_value(-x, bind))


_TANH_P = (1.0, 0.13381007313728333, 0.00349556771107018, 2.0608777049346827e-05, 1.3354291894529524e-08)
_TANH_Q = (1.0, 0.4671432375907898, 0.025876902043819427, 0.0003285602724645287, 7.776395705150208e-07)
_TANH_CLAMP = 9.0


def rational_tanh(x, bind=_unbound):
    """tanh x = x P(x^2) / Q(x^2) on |x| <= 9 (clamped beyond: tanh 9 rounds to 1 in float32).

    P and Q (degrees 4 and 4 in x^2) were fitted for minimal relative error on [0, 9] (0.2e-7 in
    exact arithmetic); evaluated in float32, 3.5e-7 at most, absolute and relative (test_recurrent_ops).
    It replaced 1 - 2 / (e^2|x| + 1) with a Taylor series near 0: the LSTM's cell activation is
    on the step's critical path, and this form is 13 instructions with two short independent
    Horner chains (LSTM batch 1: 1.028x the kernel with the exp form)."""
    clamped = bind(tvm.tirx.max(_f32(-_TANH_CLAMP), tvm.tirx.min(_f32(_TANH_CLAMP), x)))
    s = bind(clamped * clamped)
    p = _f32(_TANH_P[-1])
    for c in reversed(_TANH_P[:-1]):
        p = p * s + _f32(c)
    q = _f32(_TANH_Q[-1])
    for c in reversed(_TANH_Q[:-1]):
        q = q * s + _f32(c)
    return clamped * bind(p) / bind(q)


def _hard_sigmoid(x, alpha: float, beta: float, bind):
    """min(1, max(0, alpha x + beta)) as onnxruntime's recurrent ops compute it: a C++
    multiply-add, std::max and std::min (a NaN becomes 0)."""
    linear = bind(cpp_multiply_add(_f32(alpha), x, _f32(beta)))
    low = bind(tvm.tirx.Select(_f32(0.0) < linear, linear, _f32(0.0)))
    return tvm.tirx.Select(low < _f32(1.0), low, _f32(1.0))


# name → (alpha and beta it takes, their defaults, the function of x, alpha, beta, bind). The
# defaults are onnxruntime's: LeakyRelu's and HardSigmoid's own, 0 for the rest (an Affine or a
# ScaledTanh without activation_alpha / activation_beta computes 0 there; the fuzzing of these ops
# found ours at 1 and 1).
ACTIVATIONS = {
    "Sigmoid": (0, (), lambda x, a, b, bind: fast_sigmoid(x, bind)),
    "Tanh": (0, (), lambda x, a, b, bind: rational_tanh(x, bind)),
    "Relu": (0, (), lambda x, a, b, bind: tvm.tirx.Select(x > _f32(0.0), x, _f32(0.0))),
    "HardSigmoid": (2, (0.2, 0.5), lambda x, a, b, bind: _hard_sigmoid(x, a, b, bind)),
    "Affine": (2, (0.0, 0.0), lambda x, a, b, bind: cpp_multiply_add(_f32(a), x, _f32(b))),
    "LeakyRelu": (1, (0.01,), lambda x, a, b, bind: tvm.tirx.Select(x >= _f32(0.0), x, _f32(a) * x)),
    "ScaledTanh": (2, (0.0, 0.0), lambda x, a, b, bind: _f32(a) * rational_tanh(_f32(b) * x, bind)),
    "Softsign": (0, (), lambda x, a, b, bind: x / (_f32(1.0) + tvm.tirx.abs(x))),
}


@dataclass(frozen=True)
class Activation:
    name: str
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, x, bind=_unbound):
        """The activation of x; `bind` names intermediate values (the kernel passes T.Bind)."""
        return ACTIVATIONS[self.name][2](x, self.alpha, self.beta, bind)

    def as_onnxruntime(self, fma_sigmoid: bool):
        """The activation as onnxruntime's LSTM (and GRU's update gate) computes it: Sigmoid and
        Tanh are MLAS's (the functions of its Sigmoid and Tanh ops, which fast_math computes bit
        for bit; the Sigmoid's clamp as the level's CPUs run it: sigmoid_clamp), the others as
        above."""
        if self.name == "Sigmoid":
            return lambda x, bind=_unbound: clamp_as_kernel(bind(logistic_ratio(x, bind)), fma_sigmoid)
        if self.name == "Tanh":
            return lambda x, bind=_unbound: tanh_value(x, bind)
        return self


def _activations(op_type: str, attrs: dict, directions: int) -> tuple[tuple[Activation, ...], ...]:
    """Per direction, the op's activation functions with their alpha and beta: alphas and betas
    are handed out in order to the activations that take them, as onnxruntime reads them."""
    per_direction = len(DEFAULT_ACTIVATIONS[op_type])
    names = [n.decode() if isinstance(n, bytes) else n for n in attrs.get("activations", [])]
    if not names:
        names = list(DEFAULT_ACTIVATIONS[op_type]) * directions
    if len(names) == per_direction and directions == 2:
        names = names * 2  # onnxruntime repeats one direction's list for both
    if len(names) != per_direction * directions:
        raise CompileError(f"recurrent: {len(names)} activations for {directions} direction(s) of {op_type}")
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    chosen = []
    for name in names:
        known = next((k for k in ACTIVATIONS if k.lower() == name.lower()), None)
        if known is None:
            raise CompileError(f"recurrent: activation {name} is not implemented by the sequence kernel")
        takes, defaults, _ = ACTIVATIONS[known]
        alpha = alphas.pop(0) if takes >= 1 and alphas else (defaults[0] if takes >= 1 else 0.0)
        beta = betas.pop(0) if takes >= 2 and betas else (defaults[1] if takes >= 2 else 0.0)
        chosen.append(Activation(known, float(alpha), float(beta)))
    return tuple(tuple(chosen[d * per_direction:(d + 1) * per_direction]) for d in range(directions))


# ------------------------------------------- onnxruntime's GRU gates (its deepcpu helpers)
# onnxruntime's GRU computes its reset and output gates with a tanh of its own: MLAS's rational
# function with MLAS's coefficients, written in C++ (built without FMA on x86-64, so every
# product is rounded; contracted on aarch64: cpp_multiply_add) and clamped to [-10, 10]; its
# sigmoid is 0.5 (1 + tanh(x / 2)) on x clamped to [-20, 20]. Other activations are applied as
# written (`composed`).
GRU_TANH_BOUND, GRU_SIGMOID_BOUND = 10.0, 20.0


def _clamped(x, bound: float):
    """if x < -bound: -bound; elif x > bound: bound; else x (a NaN stays NaN)."""
    return tvm.tirx.Select(x < _f32(-bound), _f32(-bound), tvm.tirx.Select(_f32(bound) < x, _f32(bound), x))


def _gru_tanh_ratio(x, bind):
    """(p, q) of onnxruntime's inline tanh of an already clamped x: tanh x = p / q."""
    square = bind(rounded(x * x))
    p = _f32(TANH_P[0])
    for c in TANH_P[1:]:
        p = cpp_multiply_add(square, p, _f32(c))
    q = _f32(TANH_Q[0])
    for c in TANH_Q[1:]:
        q = cpp_multiply_add(square, q, _f32(c))
    return bind(rounded(x * bind(p))), bind(q)


def _gru_sigmoid_half_ratio(pre, bind):
    """(p, q) with sigmoid(pre) = 0.5 (1 + p / q), as onnxruntime's GRU computes it."""
    return _gru_tanh_ratio(bind(rounded(_f32(0.5) * bind(_clamped(pre, GRU_SIGMOID_BOUND)))), bind)


def gru_reset_gate(activation: Activation, value, pre, bind=_unbound):
    """r (.) value, r = f(pre): onnxruntime's gru_reset_gate_* (value: h or the linear output)."""
    if activation.name == "Sigmoid":
        p, q = _gru_sigmoid_half_ratio(pre, bind)
        return rounded(value * bind(rounded(_f32(0.5) * (_f32(1.0) + p / q))))
    if activation.name == "Tanh":
        p, q = _gru_tanh_ratio(bind(_clamped(pre, GRU_TANH_BOUND)), bind)
        return rounded(value * bind(p / q))
    return rounded(value * bind(activation(pre, bind)))


def gru_output_gate(activation: Activation, pre, z, h_prev, bind=_unbound):
    """(1 - z) (.) g(pre) + z (.) h_prev: onnxruntime's gru_output_gate_*."""
    keep = bind(_f32(1.0) - z)
    if activation.name == "Tanh":
        p, q = _gru_tanh_ratio(bind(_clamped(pre, GRU_TANH_BOUND)), bind)
        factor, value = keep, p / q
    elif activation.name == "Sigmoid":
        p, q = _gru_sigmoid_half_ratio(pre, bind)
        factor, value = rounded(keep * _f32(0.5)), _f32(1.0) + p / q
    else:
        factor, value = keep, bind(activation(pre, bind))
    return cpp_multiply_add(factor, value, rounded(z * h_prev))


# ---------------------------------------------------------------- the op

@dataclass(frozen=True)
class RecurrentOp:
    op_type: str
    hidden: int
    input_size: int
    directions: tuple[str, ...]  # "forward" / "reverse", in the order of the D axis
    layout: int
    clip: float | None
    activations: tuple[tuple[Activation, ...], ...]  # per direction
    linear_before_reset: bool
    input_forget: bool
    x_dims: tuple  # X's dims as in the model: ints or None for unknown
    inputs: dict[str, str]  # ONNX input name (X, sequence_lens, initial_h, initial_c) → model value
    outputs: tuple[str, ...]  # the ONNX outputs (Y, Y_h, Y_c) the group hands back, in order
    output_values: tuple[str, ...]  # their value names
    weights: dict[str, np.ndarray] = field(repr=False, default_factory=dict)  # W, R, B, P (absent: not present)

    @property
    def gates(self) -> int:
        return GATES[self.op_type]

    @property
    def has_bias(self) -> bool:
        return "B" in self.weights

    @property
    def has_peepholes(self) -> bool:
        return "P" in self.weights


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def read_recurrent_op(model: onnx.ModelProto) -> RecurrentOp:
    """The description of the group's single recurrent node, or a CompileError saying which
    part of it the sequence kernel does not implement."""
    nodes = list(model.graph.node)
    if len(nodes) != 1 or nodes[0].op_type not in GATES or nodes[0].domain not in ("", "ai.onnx"):
        raise CompileError("recurrent: a sequence kernel takes exactly one LSTM, GRU or RNN node")
    node = nodes[0]
    op_type, attrs = node.op_type, _attributes(node)
    names = INPUT_NAMES[op_type]
    given = {names[i]: name for i, name in enumerate(node.input) if name and i < len(names)}
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    types = {v.name: v.type.tensor_type for v in list(model.graph.input) + list(model.graph.output)}

    for name in list(given.values()) + [o for o in node.output if o]:
        dtype = initializers[name].dtype if name in initializers else (
            helper.tensor_dtype_to_np_dtype(types[name].elem_type) if name in types else None)
        expected = np.int32 if name == given.get("sequence_lens") else np.float32
        if dtype is not None and np.dtype(dtype) != np.dtype(expected):
            raise CompileError(f"recurrent: {name} is {np.dtype(dtype)}; the sequence kernel takes float32 "
                               "(sequence_lens int32)")
    weights = {}
    for key in WEIGHT_INPUTS:
        if key in given:
            if given[key] not in initializers:
                raise CompileError(f"recurrent: input {key} is computed at run time; the sequence kernel packs "
                                   "W, R, B and P at compile time, so they must be constants")
            weights[key] = initializers[given[key]].astype(np.float32)
    if "W" not in weights or "R" not in weights:
        raise CompileError("recurrent: W and R are required")

    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    directions = {"forward": ("forward",), "reverse": ("reverse",), "bidirectional": ("forward", "reverse")}.get(direction)
    if directions is None:
        raise CompileError(f"recurrent: unknown direction {direction!r}")
    gates = GATES[op_type]
    num_dirs, gh, input_size = weights["W"].shape
    hidden = int(attrs.get("hidden_size", weights["R"].shape[-1]))
    if num_dirs != len(directions) or gh != gates * hidden or weights["R"].shape != (num_dirs, gates * hidden, hidden):
        raise CompileError(f"recurrent: W {weights['W'].shape} / R {weights['R'].shape} do not match "
                           f"hidden_size {hidden} and direction {direction}")
    if "B" in weights and weights["B"].shape != (num_dirs, 2 * gates * hidden):
        raise CompileError(f"recurrent: B has shape {weights['B'].shape}")
    if "P" in weights and weights["P"].shape != (num_dirs, 3 * hidden):
        raise CompileError(f"recurrent: P has shape {weights['P'].shape}")

    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise CompileError(f"recurrent: layout {layout}")
    x_type = types.get(given["X"])
    if x_type is None or len(x_type.shape.dim) != 3:
        raise CompileError("recurrent: X must be a rank-3 input of the group")
    x_dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in x_type.shape.dim)
    if x_dims[2] != input_size:
        raise CompileError(f"recurrent: X's last dim {x_dims[2]} is not W's input size {input_size}")

    present = [(OUTPUT_NAMES[i], name) for i, name in enumerate(node.output) if name]
    returned = {o.name for o in model.graph.output}
    outputs = [(key, name) for key, name in present if name in returned]
    clip = attrs.get("clip")
    return RecurrentOp(
        op_type=op_type, hidden=hidden, input_size=int(input_size), directions=directions, layout=layout,
        clip=float(clip) if clip is not None else None,
        activations=_activations(op_type, attrs, len(directions)),
        linear_before_reset=bool(attrs.get("linear_before_reset", 0)),
        input_forget=bool(attrs.get("input_forget", 0)),
        x_dims=x_dims,
        inputs={k: v for k, v in given.items() if k not in WEIGHT_INPUTS},
        outputs=tuple(k for k, _ in outputs), output_values=tuple(v for _, v in outputs),
        weights=weights,
    )


# ---------------------------------------------------------------- packed weights

@dataclass(frozen=True)
class PackedWeights:
    """The weights in the order the kernel streams them, hidden columns padded to whole vectors
    (`lanes` wide) with zeros, so padded columns stay 0 and never reach a real one:

    w_in   [D, CT, I, TV, V] input projection, per tile of TV column vectors (the NB*G vectors
                             of every gate's columns, block-major, cut in CT tiles): one tile's
                             rows are contiguous, so its slice stays in L1 while it is used
    w_rec  [D, NB, H, G, V]  recurrent weights: one column block's stream is contiguous
                             (GRU without linear_before_reset: G = 2, z and r, and
    w_rec_h [D, NB, H, 1, V]  the h gate's, read in a phase of their own)
    b_in   [D, NB*G, V]      bias added to the input projection (Wb + Rb, except GRU's Rbh
                             under linear_before_reset, which r multiplies)
    b_rec  [D, NB, V]        GRU's Rbh when linear_before_reset (else absent)
    peep   [D, 3, NB, V]     LSTM peepholes i, o, f (else absent)
    """

    arrays: dict[str, np.ndarray]
    blocks: int  # NB: column blocks of `lanes` hidden units
    lanes: int
    tile_vectors: int  # TV: column vectors per projection tile (the register tile's width)

    @property
    def column_tiles(self) -> int:
        return self.arrays["w_in"].shape[1]


def pack_weights(op: RecurrentOp, lanes: int) -> PackedWeights:
    d, h, g, i = len(op.directions), op.hidden, op.gates, op.input_size
    nb = -(-h // lanes)
    hp = nb * lanes

    def gate_columns(matrix: np.ndarray) -> np.ndarray:
        """[D, G*H, K] → [D, K, NB, G, V] with zero padding of the hidden columns."""
        k = matrix.shape[-1]
        padded = np.zeros((d, g, hp, k), np.float32)
        padded[:, :, :h, :] = matrix.reshape(d, g, h, k)
        return padded.reshape(d, g, nb, lanes, k).transpose(0, 4, 2, 1, 3)

    tile = projection_tile_vectors(nb * g)
    w_in = gate_columns(op.weights["W"]).reshape(d, i, nb * g // tile, tile, lanes).transpose(0, 2, 1, 3, 4)
    w_rec = np.ascontiguousarray(gate_columns(op.weights["R"]).transpose(0, 2, 1, 3, 4))
    bias = op.weights.get("B", np.zeros((d, 2 * g * h), np.float32))
    wb, rb = bias[:, : g * h].reshape(d, g, h), bias[:, g * h:].reshape(d, g, h)
    b_in = wb + rb
    arrays = {"w_in": w_in, "w_rec": w_rec}
    if op.op_type == "GRU" and not op.linear_before_reset:
        arrays["w_rec"], arrays["w_rec_h"] = w_rec[:, :, :, :2], w_rec[:, :, :, 2:]
    if op.op_type == "GRU" and op.linear_before_reset:
        b_in = b_in.copy()
        b_in[:, 2] = wb[:, 2]
        arrays["b_rec"] = _blocked(rb[:, 2:3], nb, lanes).reshape(d, nb, lanes)
    arrays["b_in"] = _blocked(b_in, nb, lanes).transpose(0, 2, 1, 3).reshape(d, nb * g, lanes).copy()
    if op.has_peepholes:
        arrays["peep"] = _blocked(op.weights["P"].reshape(d, 3, h), nb, lanes)
    return PackedWeights({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}, nb, lanes, tile)


def projection_tile_vectors(columns: int) -> int:
    """Vectors per projection register tile: 4 (4 (step, row) pairs x 4 = 16 accumulators), or
    the largest smaller divisor of the column vectors."""
    return next(n for n in (4, 3, 2, 1) if columns % n == 0)


def _blocked(per_gate: np.ndarray, nb: int, lanes: int) -> np.ndarray:
    """[D, G, H] → [D, G, NB, V], zero-padded."""
    d, g, h = per_gate.shape
    out = np.zeros((d, g, nb * lanes), np.float32)
    out[:, :, :h] = per_gate
    return out.reshape(d, g, nb, lanes)
