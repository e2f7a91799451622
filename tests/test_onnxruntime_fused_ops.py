"""GELU and LayerNorm chains as exporters write them, compiled, against onnxruntime on the original
model bit for bit: where onnxruntime fuses the chain into its Gelu, BiasGelu or LayerNormalization
kernel (fusion/onnxruntime_fused_ops.py compiles what that kernel computes) and where it leaves
the ops alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx_builder import model, node
from test_ieee_order import assert_bitwise_equal, fused_session, original_session

from onnxfuse.fusion import onnxruntime_fused_ops as fused_ops_module
from onnxfuse.fusion.onnxruntime_fused_ops import FusedOp, as_onnxruntime_computes, onnxruntime_fused_ops

F32 = np.float32
WIDTH = 256
CONSTANTS = {"sqrt2": np.array(1.4142135, F32), "one": np.array(1.0, F32), "half": np.array(0.5, F32)}

# name → the nodes from x to y (x / sqrt(2) → Erf → + 1, then the two products in the order named)
CHAINS = {
    # PyTorch's TorchScript exporter: (x (erf + 1)) 0.5; onnxruntime fuses it
    "x_times_erf_then_half": [node("Mul", ["x", "erf1"], "xe"), node("Mul", ["xe", "half"], "y")],
    # (0.5 x) (erf + 1); onnxruntime fuses it
    "half_x_first": [node("Mul", ["x", "half"], "hx"), node("Mul", ["hx", "erf1"], "y")],
    # PyTorch's dynamo exporter: x (0.5 (erf + 1)); onnxruntime 1.32 leaves it as ops
    "half_erf_then_x": [node("Mul", ["half", "erf1"], "he"), node("Mul", ["x", "he"], "y")],
}
ERF_PLUS_ONE = [node("Div", ["x", "sqrt2"], "d"), node("Erf", ["d"], "e"), node("Add", ["e", "one"], "erf1")]


def gelu_model(chain: str, bias: bool) -> onnx.ModelProto:
    """y = GELU(x) with x the input, or with bias: x = input + a bias (onnxruntime's BiasGelu)."""
    inits = dict(CONSTANTS)
    nodes = ERF_PLUS_ONE + CHAINS[chain]
    if bias:
        inits["b"] = np.linspace(-1, 1, WIDTH, dtype=F32)
        nodes = [node("Add", ["input", "b"], "x"), *nodes]
    source = "input" if bias else "x"
    return model(nodes, {source: ("N", WIDTH)}, {"y": ("N", WIDTH)}, inits)


def inputs(rows: int) -> np.ndarray:
    """Dense over the erf's two pieces and its clamp (|x / sqrt(2)| = 0.921875 and 3.925), far
    out, tiny, subnormal, ±0, ±inf and NaN."""
    rng = np.random.default_rng(rows)
    values = np.concatenate([rng.standard_normal(rows * WIDTH - 14).astype(F32) * 3,
                             np.array([1.3037, -1.3037, 5.5508, -5.5508, 1e3, -1e3, 1e-30, -1e-42, 0.0, -0.0,
                                       np.inf, -np.inf, np.nan, 3e38], F32)])
    return values.reshape(rows, WIDTH)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chain", list(CHAINS))
def test_gelu_chains_give_onnxruntimes_bits(tmp_path, chain, bias):
    m = gelu_model(chain, bias)
    fused, original = fused_session(m, tmp_path), original_session(m)
    name = original.get_inputs()[0].name
    for rows in (1, 3, 64):
        x = inputs(rows)
        assert_bitwise_equal(fused.run(None, {name: x})[0], original.run(None, {name: x})[0])


def test_onnxruntime_reports_the_chains_it_fuses_by_their_values():
    gelus = onnxruntime_fused_ops(gelu_model("x_times_erf_then_half", bias=True))
    assert gelus == (FusedOp("BiasGelu", ("input", "b"), "y"),)
    assert onnxruntime_fused_ops(model([node("Relu", ["x"], "y")], {"x": ("N", 4)}, {"y": ("N", 4)})) == ()


@pytest.mark.parametrize("chain", list(CHAINS))
def test_only_the_chains_onnxruntime_fused_are_rewritten(chain):
    m = gelu_model(chain, bias=False)
    nodes, constants = as_onnxruntime_computes(list(m.graph.node), ["y"], onnxruntime_fused_ops(m), {}, {"x"})
    if chain == "half_erf_then_x":  # left as ops by onnxruntime 1.32: the oracle decides, not the pattern
        assert onnxruntime_fused_ops(m) == () and nodes == list(m.graph.node) and constants == []
    else:
        assert [n.op_type for n in nodes] == ["Mul", "Erf", "Add", "Mul", "Mul"]
        assert nodes[0].input[0] == "x" and nodes[-1].output[0] == "y" and len(constants) == 3


def test_a_chain_split_between_groups_is_left_as_it_is():
    """A group that returns one of the chain's inner values (its Erf) cannot drop that node."""
    m = gelu_model("x_times_erf_then_half", bias=False)
    nodes, _ = as_onnxruntime_computes(list(m.graph.node), ["y", "e"], onnxruntime_fused_ops(m), {}, {"x"})
    assert nodes == list(m.graph.node)


def test_a_chain_whose_inner_value_is_also_an_output_keeps_its_ops(tmp_path):
    """onnxruntime does not fuse a chain whose Erf result the model also returns; nor does the pass."""
    m = gelu_model("x_times_erf_then_half", bias=False)
    m.graph.output.append(onnx.helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, ["N", WIDTH]))
    assert onnxruntime_fused_ops(m) == ()
    fused, original = fused_session(m, tmp_path), original_session(m)
    x = inputs(3)
    for got, expected in zip(fused.run(None, {"x": x}), original.run(None, {"x": x})):
        assert_bitwise_equal(got, expected)


LN_CONSTANTS = {"two": np.array(2.0, F32), "eps": np.array(1e-5, F32)}


def layer_norm_chain_model(width: int, output_too: str | None = None) -> onnx.ModelProto:
    """LayerNorm over the last axis as PyTorch's TorchScript exporter writes it, then a Relu."""
    rng = np.random.default_rng(width)
    inits = {**LN_CONSTANTS, "gamma": rng.standard_normal(width).astype(F32), "beta": rng.standard_normal(width).astype(F32)}
    nodes = [node("ReduceMean", ["x"], "mean", axes=[-1]), node("Sub", ["x", "mean"], "d"),
             node("Pow", ["d", "two"], "sq"), node("ReduceMean", ["sq"], "var", axes=[-1]),
             node("Add", ["var", "eps"], "var_eps"), node("Sqrt", ["var_eps"], "std"), node("Div", ["d", "std"], "n"),
             node("Mul", ["n", "gamma"], "scaled"), node("Add", ["scaled", "beta"], "ln"), node("Relu", ["ln"], "y")]
    outputs = {"y": ("N", width), **({output_too: ("N", width)} if output_too else {})}
    return model(nodes, {"x": ("N", width)}, outputs, inits)


@pytest.mark.parametrize("width", [8, 13, 64, 256])
def test_layer_norm_chains_give_onnxruntimes_bits(tmp_path, width):
    m = layer_norm_chain_model(width)
    assert [f.op for f in onnxruntime_fused_ops(m)] == ["LayerNormalization"]
    fused, original = fused_session(m, tmp_path), original_session(m)
    rng = np.random.default_rng(0)
    for rows in (1, 3, 64):
        x = (rng.standard_normal((rows, width)) * rng.uniform(0.1, 50, (rows, 1))).astype(F32)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


def test_a_layer_norm_chain_is_replaced_by_the_op_with_onnxruntimes_attributes():
    m = layer_norm_chain_model(16)
    (fused,) = onnxruntime_fused_ops(m)
    nodes, constants = as_onnxruntime_computes(list(m.graph.node), ["y"], (fused,), {}, {"x"})
    assert [n.op_type for n in nodes] == ["LayerNormalization", "Relu"] and constants == []
    assert list(nodes[0].input) == ["x", "gamma", "beta"] and list(nodes[0].output) == ["ln"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes["axis"] == -1 and attributes["epsilon"] == pytest.approx(1e-5)
    assert as_onnxruntime_computes(list(m.graph.node), ["y"], (fused,), {}, {"x"}, opset=13)[0] == list(m.graph.node)


def test_when_onnxruntime_cannot_answer_the_chains_stay_ops(tmp_path, monkeypatch):
    """A failing query (here a full disk while onnxruntime writes its optimized copy) leaves every
    chain as the model's ops: the result is then within tolerance, not an error."""
    def full_disk(model):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fused_ops_module, "_optimized_by_onnxruntime", full_disk)
    m = gelu_model("x_times_erf_then_half", bias=True)
    assert onnxruntime_fused_ops(m) == ()
    fused, original = fused_session(m, tmp_path), original_session(m)
    # Ordinary values: at 3e38 the ops' x (erf + 1) overflows where the kernel's 0.5 x does not.
    x = (np.random.default_rng(3).standard_normal((3, WIDTH)) * 3).astype(F32)
    got, expected = fused.run(None, {"input": x})[0], original.run(None, {"input": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    assert (got != expected).any()  # the ops' bits, not the fused kernel's: the query's answer mattered


def residual_layer_norm_model(hidden: int = 64, bias: bool = True, beta: bool = True) -> onnx.ModelProto:
    """MatMul (+ Tanh) [+ bias], + residual, LayerNormalization on [batch, seq, hidden], as BERT's
    exports write the attention output (then Relu and Neg, a group of their own): onnxruntime
    fuses the Adds and the LayerNorm into its SkipLayerNormalization, which adds
    `(x W + residual) + bias` and takes Welford's update over the row."""
    rng = np.random.default_rng(3)
    inits = {"w": (rng.standard_normal((hidden, hidden)) * 0.2).astype(F32), "bias": rng.standard_normal(hidden).astype(F32),
             "gamma": rng.standard_normal(hidden).astype(F32), "beta": rng.standard_normal(hidden).astype(F32)}
    nodes = [node("MatMul", ["x", "w"], "mm"), node("Tanh", ["mm"], "m")]
    if bias:
        nodes.append(node("Add", ["m", "bias"], "linear"))
    nodes += [node("Add", ["linear" if bias else "m", "r"], "s"),
              node("LayerNormalization", ["s", "gamma", "beta"] if beta else ["s", "gamma"], "ln", epsilon=1e-12),
              node("Relu", ["ln"], "relu"), node("Neg", ["relu"], "y")]
    shape = ("batch", "seq", hidden)
    return model(nodes, {"x": shape, "r": shape}, {"y": shape}, inits)


def test_onnxruntime_reports_its_skip_layer_normalization():
    fused = onnxruntime_fused_ops(residual_layer_norm_model())
    assert [(op.op, op.inputs[:2], op.output) for op in fused] == [("SkipLayerNormalization", ("m", "r"), "ln")]


@pytest.mark.parametrize("bias, beta", [(True, True), (False, True), (True, False)])
def test_a_skip_layer_normalization_chain_is_a_group_with_onnxruntimes_bits(tmp_path, bias, beta):
    """The Adds and the LayerNorm form a group of their own, compiled as onnxruntime's kernel
    computes. Before, the Adds went into the MatMul's kernel (in the model's order) and the
    LayerNorm stayed in onnxruntime as its LayerNormalization: other bits in 30% of the elements.
    Rows of 1, 14 (not a multiple of the 16 rows a vector holds) and 128."""
    from onnxfuse.pipeline import optimize
    from onnxfuse.session import InferenceSession

    hidden = 64
    m = residual_layer_norm_model(hidden, bias, beta)
    source = tmp_path / "m.onnx"
    onnx.save(m, str(source))
    result = optimize(source, tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert sorted(group["op_types"] for group in result.report["groups"]) == sorted(
        [["MatMul", "Tanh"], [*["Add"] * (1 + bias), "LayerNormalization"], ["Relu", "Neg"]])
    assert result.report["groups_fallback"] == 0
    fused = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    original = original_session(m)
    rng = np.random.default_rng(4)
    for batch, seq in ((1, 1), (2, 7), (8, 16)):
        feeds = {name: rng.standard_normal((batch, seq, hidden)).astype(F32) for name in ("x", "r")}
        feeds["r"][0, 0, :3] = (1e30, -1e30, np.inf) if batch > 1 else (0.0, -0.0, 3e38)
        assert_bitwise_equal(fused.run(None, feeds)[0], original.run(None, feeds)[0])


@pytest.mark.parametrize("hidden", [1, 40, 64, 768])
def test_the_skip_layer_normalization_kernel_is_onnxruntimes(tmp_path, hidden):
    """The group model's SkipLayerNormalization compiled (codegen/onnxruntime_contrib.py, the
    Welford kernel of codegen/layer_norm.py) against onnxruntime's own kernel, bit for bit: rows
    of 1 to 768 values, 1 to 1,024 rows, huge, infinite and zero values."""
    from onnxfuse.codegen.compile import compile_group
    from onnxfuse.target import resolve_target

    rng = np.random.default_rng(hidden)
    shape = ("batch", "seq", hidden)
    inits = {name: rng.standard_normal(hidden).astype(F32) for name in ("gamma", "beta", "bias")}
    m = model([node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], "y", domain="com.microsoft",
                    epsilon=1e-5)], {"x": shape, "skip": shape}, {"y": shape}, inits)
    compiled = compile_group(m, "k", resolve_target("native"), tmp_path)
    original = original_session(m)
    for batch, seq in ((1, 1), (3, 5), (64, 16)):
        feeds = {name: (rng.standard_normal((batch, seq, hidden)) * 3).astype(F32) for name in ("x", "skip")}
        feeds["x"][0, 0, :2] = (3e38, 3e38)[:hidden]
        if batch > 1:
            feeds["x"][1, 0] = 0.0
            feeds["skip"][2, 0, -1] = np.inf
        assert_bitwise_equal(compiled.run(feeds)[0], original.run(None, feeds)[0])


def two_gelu_layers_model() -> onnx.ModelProto:
    """Two bias + GELU layers (TorchScript's form) whose biases are one parameter: PyTorch's
    exporter writes the second as an Identity of the first (equal parameters shared)."""
    nodes = [node("Add", ["x", "b1"], "a1"), node("Div", ["a1", "sqrt2"], "d1"), node("Erf", ["d1"], "e1"),
             node("Add", ["e1", "one"], "p1"), node("Mul", ["a1", "p1"], "q1"), node("Mul", ["q1", "half"], "g1"),
             node("Identity", ["b1"], "b2"),
             node("Add", ["b2", "g1"], "a2"), node("Div", ["a2", "sqrt2"], "d2"), node("Erf", ["d2"], "e2"),
             node("Add", ["e2", "one"], "p2"), node("Mul", ["a2", "p2"], "q2"), node("Mul", ["q2", "half"], "y")]
    bias = np.linspace(-1, 1, WIDTH, dtype=F32)
    return model(nodes, {"x": ("N", WIDTH)}, {"y": ("N", WIDTH)}, {**CONSTANTS, "b1": bias})


def test_a_bias_gelu_naming_another_layers_bias_is_onnxruntimes(tmp_path):
    """onnxruntime drops the Identity, so the second layer's BiasGelu names the first layer's
    bias, which our graph holds as a constant of its own name: the rewrite finds the Add by its
    other input (the second layer's GELU stayed ops: 65 of 2,176 elements of bert_tiny_2l_ts
    differed from onnxruntime)."""
    from onnxfuse.pipeline import optimize
    from onnxfuse.session import InferenceSession

    m = two_gelu_layers_model()
    assert [op.inputs[1] for op in onnxruntime_fused_ops(m)] == ["b1", "b1"]
    onnx.save(m, str(tmp_path / "m.onnx"))
    result = optimize(tmp_path / "m.onnx", tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    assert result.report["groups_fallback"] == 0 and result.report["fused_node_count"] == 12  # the Identity folded
    fused = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    original = original_session(m)
    for rows in (1, 64):
        x = inputs(rows)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


def test_a_skip_layer_normalization_on_shared_parameters_is_compiled(tmp_path):
    """Two residual + LayerNorm layers whose second reads Identity copies of the first's gamma and
    bias (PyTorch's exporter shares equal parameters so): onnxruntime's SkipLayerNormalization
    names the first layer's constants, which the second layer's group does not hold; found by
    content (`in_model_names`), it compiles (it fell back: "canonical form: 'gamma'")."""
    from onnxfuse.pipeline import optimize
    from onnxfuse.session import InferenceSession

    hidden, rng = 64, np.random.default_rng(5)
    inits = {"w": (rng.standard_normal((hidden, hidden)) * 0.2).astype(F32), "bias": rng.standard_normal(hidden).astype(F32),
             "gamma": rng.standard_normal(hidden).astype(F32), "beta": rng.standard_normal(hidden).astype(F32)}
    nodes = [node("MatMul", ["x", "w"], "m"), node("Add", ["m", "bias"], "l"), node("Add", ["l", "r"], "s"),
             node("LayerNormalization", ["s", "gamma", "beta"], "ln", epsilon=1e-12),
             node("Identity", ["gamma"], "gamma2"), node("Identity", ["bias"], "bias2"),
             node("MatMul", ["ln", "w"], "m2"), node("Add", ["m2", "bias2"], "l2"), node("Add", ["l2", "ln"], "s2"),
             node("LayerNormalization", ["s2", "gamma2", "beta"], "y", epsilon=1e-12)]
    shape = ("batch", "seq", hidden)
    m = model(nodes, {"x": shape, "r": shape}, {"y": shape}, inits)
    onnx.save(m, str(tmp_path / "m.onnx"))
    result = optimize(tmp_path / "m.onnx", tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    chains = [g for g in result.report["groups"] if g["op_types"] == ["Add", "Add", "LayerNormalization"]]
    assert [g["status"] for g in chains] == ["compiled", "compiled"], chains
    fused = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"])
    feeds = {name: rng.standard_normal((2, 7, hidden)).astype(F32) for name in ("x", "r")}
    assert_bitwise_equal(fused.run(None, feeds)[0], original_session(m).run(None, feeds)[0])


def tanh_gelu_after_dense_model(width: int = 32) -> onnx.ModelProto:
    """A dense layer and the tanh approximation of GELU as tf2onnx writes Keras'
    `gelu(approximate=True)`: 0.5 x, Pow(x, 3), times 0.044715, + x, times sqrt(2/pi), Tanh, + 1,
    and the product; then the next layer's product. Between the MatMul + Add (its Gemm) and that
    product onnxruntime fuses the GELU into FastGelu (not where the GELU writes a model output)."""
    rng = np.random.default_rng(5)
    inits = {"w": (rng.standard_normal((16, width)) / 4).astype(F32), "b": rng.standard_normal(width).astype(F32),
             "half": np.array(0.5, F32), "three": np.array(3.0, F32), "cubic": np.array(0.044715, F32),
             "scale": np.array(0.7978846, F32), "one": np.array(1.0, F32),
             "w2": (rng.standard_normal((width, 4)) / 4).astype(F32)}
    nodes = [node("MatMul", ["input", "w"], "p"), node("Add", ["p", "b"], "x"),
             node("Mul", ["half", "x"], "hx"), node("Pow", ["x", "three"], "x3"), node("Mul", ["cubic", "x3"], "cx3"),
             node("Add", ["x", "cx3"], "inner"), node("Mul", ["scale", "inner"], "argument"),
             node("Tanh", ["argument"], "t"), node("Add", ["one", "t"], "t1"), node("Mul", ["hx", "t1"], "y"),
             node("MatMul", ["y", "w2"], "z")]
    return model(nodes, {"input": ("N", 16)}, {"z": ("N", 4)}, inits)


def test_onnxruntime_reports_its_fast_gelu():
    fused = onnxruntime_fused_ops(tanh_gelu_after_dense_model())
    assert [op.op for op in fused] == ["FastGelu"] and fused[0].output == "y"


def test_a_tanh_gelu_after_a_product_gives_onnxruntimes_fast_gelu_bits(tmp_path):
    """As ops the GELU's last bits differed from onnxruntime's FastGelu in 1-2 of 10 outputs."""
    m = tanh_gelu_after_dense_model()
    fused, original = fused_session(m, tmp_path), original_session(m)
    for rows, scale in ((1, 1.0), (5, 3.0), (64, 1.0), (1000, 30.0)):
        x = (np.random.default_rng(rows).standard_normal((rows, 16)) * scale).astype(F32)
        assert_bitwise_equal(fused.run(None, {"input": x})[0], original.run(None, {"input": x})[0])


def test_only_a_tanh_of_a_product_asks_onnxruntimes_optimizer(monkeypatch):
    """An LSTM cell's Tanh (of a sum) cannot start a FastGelu: no optimizer session is paid for
    it at load; FastGelu's Tanh (of the scaled argument, a Mul) still asks."""
    asked = []
    real = fused_ops_module._optimized_by_onnxruntime
    monkeypatch.setattr(fused_ops_module, "_optimized_by_onnxruntime", lambda m: asked.append(1) or real(m))
    cell = model([node("Add", ["x", "h"], "s"), node("Tanh", ["s"], "t"), node("Mul", ["t", "h"], "y")],
                 {"x": ("N", 4), "h": ("N", 4)}, {"y": ("N", 4)})
    assert onnxruntime_fused_ops(cell) == () and asked == []
    assert [op.op for op in onnxruntime_fused_ops(tanh_gelu_after_dense_model())] == ["FastGelu"] and asked == [1]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_the_gelu_op_gives_onnxruntimes_bits(tmp_path, approximate):
    """The Gelu op (opset 20, as PyTorch's dynamo exporter writes nn.GELU) between two products:
    onnxruntime computes it as its Gelu kernel does (MLAS's erf or tanh, the argument scaled by
    a product), TVM's importer as 0.5 x (1 + erf(x / sqrt 2)); a third of the outputs differed."""
    rng = np.random.default_rng(7)
    w1, w2 = (rng.standard_normal((32, 64)) * 0.2).astype(F32), (rng.standard_normal((64, 32)) * 0.2).astype(F32)
    m = model([node("MatMul", ["x", "w1"], "a"), node("Add", ["a", "b1"], "b"), node("Gelu", ["b"], "g", approximate=approximate),
               node("MatMul", ["g", "w2"], "y")], {"x": ("N", 32)}, {"y": ("N", 32)},
              {"w1": w1, "b1": np.linspace(-1, 1, 64, dtype=F32), "w2": w2}, opset=20)
    fused, original = fused_session(m, tmp_path), original_session(m)
    for rows in (1, 5, 64):
        x = (rng.standard_normal((rows, 32)) * 3).astype(F32)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


def scaled_attention_scores() -> onnx.ModelProto:
    """q and k each scaled by sqrt(1 / sqrt(d)) before their product, as PyTorch's dynamo
    exporter writes scaled_dot_product_attention; the views and a Relu around them fuse."""
    scale = np.array([8 ** -0.25], F32)
    return model([node("Transpose", ["q_in"], "q", perm=[0, 2, 1, 3]), node("Mul", ["q", "s"], "qs"),
                  node("Transpose", ["k_in"], "kt", perm=[0, 2, 3, 1]), node("Mul", ["kt", "s"], "ks"),
                  node("MatMul", ["qs", "ks"], "scores"), node("Relu", ["scores"], "y")],
                 {"q_in": ("N", 10, 4, 8), "k_in": ("N", 10, 4, 8)}, {"y": ("N", 4, 10, 10)}, {"s": scale})


def test_onnxruntime_reports_the_scales_it_folds_into_a_product():
    fused = onnxruntime_fused_ops(scaled_attention_scores())
    assert [f.op for f in fused] == ["FusedMatMul"] and fused[0].output == "scores"


def test_scales_folded_into_a_product_stay_with_onnxruntime_and_keep_its_bits(tmp_path):
    """onnxruntime computes alpha (q @ k) where the model says (s q) @ (s k): the Muls and the
    MatMul stay with it, and the optimized model gives its bits."""
    from onnxfuse import optimize, plan
    from onnxfuse.session import InferenceSession

    m = scaled_attention_scores()
    left = {u.op_type: u.reason for u in plan(m).unfused}
    assert "FusedMatMul" in left.get("Mul", "") and "FusedMatMul" in left.get("MatMul", "")
    onnx.save(m, str(tmp_path / "m.onnx"))
    result = optimize(tmp_path / "m.onnx", tmp_path / "m.fused.onnx", cache_dir=False, jobs=1, select="all")
    fused, original = InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"]), original_session(m)
    rng = np.random.default_rng(3)
    for rows in (1, 7):
        feeds = {name: rng.standard_normal((rows, 10, 4, 8)).astype(F32) for name in ("q_in", "k_in")}
        assert_bitwise_equal(fused.run(None, feeds)[0], original.run(None, feeds)[0])
