"""LSTM and GRU cells in the forms real exporters write them, as small ONNX graphs.

Each builder returns (model, expected group): the node names (each node is named after its first
output) that must form the cell's single fused group. The variations are the ones torch.onnx
writes (both exporters) and hand-written or other-framework cells use:

- the GEMM: `Gemm(x, W, b, transB=1)` (PyTorch), `Gemm` with transB=0, or `MatMul` + bias `Add`;
- the two GEMMs summed before the Split (LSTMCell) or each split and summed per gate (GRUCell);
- the gates cut by `Split` (sizes as an input, or `num_outputs` at opset 18) or by `Slice`s;
- the state: separate `h`/`c` inputs and outputs, or one stacked `state` [2, N, H] read through
  `Gather` or `Slice → Squeeze` and written back through `Unsqueeze → Concat`;
- GRU with linear_before_reset=1 (PyTorch: r * (W_hn h + b_hn)) and =0 (W_hn (r * h) + b_hn).
"""

from __future__ import annotations

import numpy as np
from onnx_builder import const_i64, model, node, weights

INPUT, HIDDEN = 16, 32
N = "N"  # the symbolic batch


def _gemm(out: str, a: str, w: str, b: str | None, trans_b: int) -> list:
    if b is None:
        return [node("MatMul", [a, w], out)]
    return [node("Gemm", [a, w, b], out, transB=trans_b)]


def _params(gates: int, trans_b: int, seed: int) -> dict[str, np.ndarray]:
    """W_ih, W_hh ([out, in] when trans_b, as PyTorch stores them) and the two biases."""
    shape = (lambda i: (gates * HIDDEN, i)) if trans_b else (lambda i: (i, gates * HIDDEN))
    return {
        "w_ih": 0.3 * weights(*shape(INPUT), seed=seed), "w_hh": 0.3 * weights(*shape(HIDDEN), seed=seed + 1),
        "b_ih": 0.1 * weights(gates * HIDDEN, seed=seed + 2), "b_hh": 0.1 * weights(gates * HIDDEN, seed=seed + 3),
    }


def _read_state(form: str) -> tuple[list, dict, dict]:
    """Nodes giving `h` and `c` from the graph inputs, the inputs, and initializers."""
    if form == "separate":
        return [], {"x": (N, INPUT), "h": (N, HIDDEN), "c": (N, HIDDEN)}, {}
    inputs = {"x": (N, INPUT), "state": (2, N, HIDDEN)}
    if form == "gather":
        nodes = [node("Gather", ["state", "zero"], "h", axis=0), node("Gather", ["state", "one"], "c", axis=0)]
        return nodes, inputs, {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)}
    if form == "slice":
        nodes = [
            node("Slice", ["state", "s0", "s1", "ax0"], "h_slice"), node("Squeeze", ["h_slice", "ax0"], "h"),
            node("Slice", ["state", "s1", "s2", "ax0"], "c_slice"), node("Squeeze", ["c_slice", "ax0"], "c"),
        ]
        return nodes, inputs, {"s0": const_i64(0), "s1": const_i64(1), "s2": const_i64(2), "ax0": const_i64(0)}
    raise ValueError(form)


def _write_state(form: str, h_out: str, c_out: str) -> tuple[list, dict, list[str]]:
    """Nodes stacking the new state, the graph outputs, and the node names they add."""
    if form == "separate":
        return [], {h_out: (N, HIDDEN), c_out: (N, HIDDEN)}, []
    nodes = [
        node("Unsqueeze", [h_out, "ax0"], "h_stacked"), node("Unsqueeze", [c_out, "ax0"], "c_stacked"),
        node("Concat", ["h_stacked", "c_stacked"], "state_out", axis=0),
    ]
    outputs = {"state_out": (2, N, HIDDEN)}
    if form == "stacked_and_c":
        outputs[c_out] = (N, HIDDEN)  # c' read inside the cell, stacked, and returned on its own too
    return nodes, outputs, ["h_stacked", "c_stacked", "state_out"]


def lstm_cell(gemm: str = "gemm_t", gates: str = "sum_then_split", state_in: str = "separate",
              state_out: str = "separate", opset: int = 17, seed: int = 0):
    """One LSTM step; gate order i, f, g, o as PyTorch writes it."""
    trans_b = 1 if gemm == "gemm_t" else 0
    params = _params(4, trans_b, seed)
    read, inputs, inits = _read_state(state_in)
    inits.update(params)
    nodes = list(read)
    if gemm == "matmul":
        nodes += [node("MatMul", ["x", "w_ih"], "xw"), node("MatMul", ["h", "w_hh"], "hw")]
        bias = {"bias": params["b_ih"] + params["b_hh"]}
        inits = {k: v for k, v in inits.items() if k not in ("b_ih", "b_hh")} | bias
    else:
        nodes += _gemm("hw", "h", "w_hh", "b_hh", trans_b) + _gemm("xw", "x", "w_ih", "b_ih", trans_b)
    pieces = ["i_in", "f_in", "g_in", "o_in"]
    if gates == "sum_then_split":
        nodes.append(node("Add", ["hw", "xw"], "gates"))
        if gemm == "matmul":
            nodes[-1] = node("Add", ["hw", "xw"], "gates_nb")
            nodes.append(node("Add", ["gates_nb", "bias"], "gates"))
        nodes += _split("gates", pieces, opset, inits)
    elif gates == "split_then_sum":
        nodes += _split("xw", [f"x_{p}" for p in pieces], opset, inits, sizes_name="x_sizes")
        nodes += _split("hw", [f"h_{p}" for p in pieces], opset, inits, sizes_name="h_sizes")
        nodes += [node("Add", [f"x_{p}", f"h_{p}"], p) for p in pieces]
    elif gates == "slices":
        nodes.append(node("Add", ["hw", "xw"], "gates"))
        nodes += _slices("gates", pieces, inits)
    else:
        raise ValueError(gates)
    nodes += [
        node("Sigmoid", ["i_in"], "i"), node("Sigmoid", ["f_in"], "f"), node("Tanh", ["g_in"], "g"),
        node("Sigmoid", ["o_in"], "o"),
        node("Mul", ["f", "c"], "fc"), node("Mul", ["i", "g"], "ig"), node("Add", ["fc", "ig"], "c_new"),
        node("Tanh", ["c_new"], "tc"), node("Mul", ["o", "tc"], "h_new"),
    ]
    write, outputs, _ = _write_state(state_out, "h_new", "c_new")
    if write:
        inits.setdefault("ax0", const_i64(0))
    nodes += write
    m = model(nodes, inputs, outputs, inits, opset=opset)
    return m, _computing(nodes)


def gru_cell(linear_before_reset: int = 1, gemm: str = "gemm_t", blend: str = "torch", opset: int = 17, seed: int = 0):
    """One GRU step; gate order r, z, n as PyTorch writes it.

    linear_before_reset=1 is nn.GRUCell: n = tanh(W_in x + b_in + r * (W_hn h + b_hn)).
    linear_before_reset=0 (ONNX's default): n = tanh(W_in x + b_in + W_hn (r * h) + b_hn), so the
    hidden GEMM is cut in two: W_hr|W_hz on h before the gates, W_hn on r * h after them.
    blend "torch" writes h' = (h - n) * z + n (what torch.onnx exports), "onnx" (1 - z) * n + z * h."""
    trans_b = 1 if gemm == "gemm_t" else 0
    params = _params(3, trans_b, seed)
    inputs = {"x": (N, INPUT), "h": (N, HIDDEN)}
    inits: dict[str, np.ndarray] = {}
    nodes = _gemm("xw", "x", "w_ih", "b_ih", trans_b)
    inits.update({"w_ih": params["w_ih"], "b_ih": params["b_ih"]})
    nodes += _split("xw", ["x_r", "x_z", "x_n"], opset, inits, sizes_name="x_sizes")
    if linear_before_reset:
        inits.update({"w_hh": params["w_hh"], "b_hh": params["b_hh"]})
        nodes += _gemm("hw", "h", "w_hh", "b_hh", trans_b)
        nodes += _split("hw", ["h_r", "h_z", "h_n"], opset, inits, sizes_name="h_sizes")
        nodes += [node("Add", ["x_r", "h_r"], "r_in"), node("Sigmoid", ["r_in"], "r"),
                  node("Add", ["x_z", "h_z"], "z_in"), node("Sigmoid", ["z_in"], "z"),
                  node("Mul", ["r", "h_n"], "rh_n"), node("Add", ["x_n", "rh_n"], "n_in")]
    else:
        w_hh, b_hh = params["w_hh"], params["b_hh"]
        rz, n_rows = (slice(0, 2 * HIDDEN), slice(2 * HIDDEN, 3 * HIDDEN))
        w_rz, w_n = (w_hh[rz], w_hh[n_rows]) if trans_b else (w_hh[:, rz], w_hh[:, n_rows])
        inits.update({"w_hrz": np.ascontiguousarray(w_rz), "b_hrz": b_hh[rz],
                      "w_hn": np.ascontiguousarray(w_n), "b_hn": b_hh[n_rows]})
        nodes += _gemm("hw", "h", "w_hrz", "b_hrz", trans_b)
        nodes += _split("hw", ["h_r", "h_z"], opset, inits, sizes_name="h_sizes")
        nodes += [node("Add", ["x_r", "h_r"], "r_in"), node("Sigmoid", ["r_in"], "r"),
                  node("Add", ["x_z", "h_z"], "z_in"), node("Sigmoid", ["z_in"], "z"),
                  node("Mul", ["r", "h"], "rh")]
        nodes += _gemm("rh_n", "rh", "w_hn", "b_hn", trans_b)
        nodes += [node("Add", ["x_n", "rh_n"], "n_in")]
    nodes.append(node("Tanh", ["n_in"], "n"))
    if blend == "torch":
        nodes += [node("Sub", ["h", "n"], "h_minus_n"), node("Mul", ["h_minus_n", "z"], "zd"),
                  node("Add", ["zd", "n"], "h_new")]
    else:
        inits["one"] = np.array([1.0], np.float32)
        nodes += [node("Sub", ["one", "z"], "one_minus_z"), node("Mul", ["one_minus_z", "n"], "zn"),
                  node("Mul", ["z", "h"], "zh"), node("Add", ["zn", "zh"], "h_new")]
    m = model(nodes, inputs, {"h_new": (N, HIDDEN)}, inits, opset=opset)
    return m, _computing(nodes)


LSTM_FORMS = {
    # torch.onnx of nn.LSTMCell with h and c stacked in one state [2, N, H], both exporters
    "torchscript_stacked_state": dict(state_in="gather", state_out="stacked"),
    "dynamo_stacked_state": dict(state_in="gather", state_out="stacked", opset=18),
    "slice_squeeze_state_and_c_returned": dict(state_in="slice", state_out="stacked_and_c"),
    "gemm_without_transpose": dict(gemm="gemm"),
    "matmul_and_bias_add": dict(gemm="matmul"),
    "split_then_sum": dict(gates="split_then_sum"),
    "chunk_as_slices": dict(gates="slices"),
}


GRU_FORMS = {
    "torch_grucell": dict(linear_before_reset=1),  # r * (W_hn h + b_hn): GEMMs split, then summed
    "torch_grucell_opset18": dict(linear_before_reset=1, opset=18),
    "onnx_blend": dict(linear_before_reset=1, blend="onnx"),
    "reset_before_linear": dict(linear_before_reset=0),  # W_hn (r * h): a GEMM inside the cell
    "reset_before_linear_no_transpose": dict(linear_before_reset=0, gemm="gemm"),
}


def _split(src: str, outs: list[str], opset: int, inits: dict, sizes_name: str = "sizes") -> list:
    """Split into equal pieces: sizes as an initializer (TorchScript exporter, opset 13-17) or
    num_outputs (dynamo exporter, opset 18)."""
    if opset >= 18:
        return [node("Split", [src], outs, axis=1, num_outputs=len(outs))]
    inits[sizes_name] = const_i64(*[HIDDEN] * len(outs))
    return [node("Split", [src, sizes_name], outs, axis=1)]


def _slices(src: str, outs: list[str], inits: dict) -> list:
    """`chunk` written as one Slice per piece (start, end along axis 1)."""
    inits["axis1"] = const_i64(1)
    nodes = []
    for k, out in enumerate(outs):
        inits[f"{out}_start"], inits[f"{out}_end"] = const_i64(k * HIDDEN), const_i64((k + 1) * HIDDEN)
        nodes.append(node("Slice", [src, f"{out}_start", f"{out}_end", "axis1"], out))
    return nodes


def _computing(nodes) -> set[str]:
    """Every node's name: in these cells each node computes part of the cell's outputs."""
    return {n.name for n in nodes}


def constants_as_initializers(m):
    """The model with every `Constant` node replaced by an initializer of its value.

    torch.onnx's TorchScript exporter writes Split sizes, Gather indices and Unsqueeze axes as
    Constant nodes; the front end turns them into initializers at load. Tests convert them first
    so that the model's node count is the count the plan's groups must cover."""
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(m)
    kept = []
    for n in out.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            value = next(a for a in n.attribute if a.name == "value")
            out.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(value.t), n.output[0]))
        else:
            kept.append(n)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


def random_feeds(m, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal float inputs for `m`, every symbolic dim set to `batch`."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in m.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds
