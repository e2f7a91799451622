"""Ops whose edge cases TVM defines otherwise than onnxruntime, on finite ordinary inputs and on the
NaN/±inf a real model produces (a fully masked attention row, a degenerate weight):
ReduceMin/ReduceMax start from ±inf and dot products from +0.0 (codegen/reduction_identities.py), Clip's missing bounds and
float→int Cast are what onnxruntime computes (codegen/onnx_semantics.py), and a NaN that becomes a
Gather index is an error, as in onnxruntime. Fused model through onnxruntime against onnxruntime on
the original, bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx_builder import model, node
from test_ieee_order import assert_bitwise_equal, check_fused_matches_onnxruntime, fused_session, original_session

F32 = np.float32
ROW = np.array([np.inf, 1.0, -2.0, np.nan, -np.inf, 3e38, -0.0, 0.0], F32)


def _row_model(op: str, width: int) -> onnx.ModelProto:
    reduce = node(op, ["x", "axes"], "r", keepdims=1)
    return model([reduce, node("Neg", ["r"], "y")], {"x": ("N", width)}, {"y": ("N", 1)},
                 {"axes": np.array([1], np.int64)}, opset=18)


@pytest.mark.parametrize("width", [4, 64], ids=["narrow", "lanes"])  # 64: split in vector lanes (rfactor)
@pytest.mark.parametrize("op", ["ReduceMin", "ReduceMax"])
def test_min_max_reductions_of_infinite_rows(tmp_path, op, width):
    rng = np.random.default_rng(0)
    rows = [np.full(width, np.inf, F32), np.full(width, -np.inf, F32),
            rng.standard_normal(width).astype(F32), np.resize(ROW[[0, 1, 2, 4, 5]], width)]
    check_fused_matches_onnxruntime(_row_model(op, width), {"x": np.stack(rows)}, tmp_path)


CLIPS = {  # case: (nodes, opset); onnxruntime clamps to the type's limits where a bound is missing
    "min_only": ([node("Clip", ["x", "lo"], "c")], 13),
    "max_only": ([node("Clip", ["x", "", "hi"], "c")], 13),
    "no_bounds": ([node("Clip", ["x"], "c")], 13),
    "infinite_bounds": ([node("Clip", ["x", "ninf", "inf"], "c")], 13),
    "attributes_none": ([node("Clip", ["x"], "c")], 10),
    "attribute_min_only": ([node("Clip", ["x"], "c", min=-1.0)], 10),
}


@pytest.mark.parametrize("case", list(CLIPS))
def test_clip_default_bounds(tmp_path, case):
    nodes, opset = CLIPS[case]
    inits = {"lo": np.array(-1.0, F32), "hi": np.array(1.0, F32), "inf": np.array(np.inf, F32),
             "ninf": np.array(-np.inf, F32)}
    nodes = nodes + [node("Neg", ["c"], "y")]
    used = {i for n in nodes for i in n.input}
    m = model(nodes, {"x": ("N", 8)}, {"y": ("N", 8)}, {k: v for k, v in inits.items() if k in used}, opset=opset)
    check_fused_matches_onnxruntime(m, {"x": np.stack([ROW, ROW[::-1] * 0.5])}, tmp_path)


INTEGER_TYPES = [TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                 TensorProto.UINT64, TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8]
CAST_VALUES = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 2.7, -2.7, -1.5, 255.9, 300.7, -300.7,
               70000.5, -70000.5, 2147483520.0, 2147483648.0, -2147483648.0, -2147483904.0, 3e9, -3e9, 4294967040.0,
               4294967296.0, 1e10, -1e10, 9.2e18, 9223372036854775808.0, -9223372036854775808.0, -9.3e18,
               1.8e19, 18446744073709551616.0, 1e19, -1e19, 2e19, 3e38, -3e38, 1e-40]


def _cast_feed(dtype, n_random: int = 4000) -> np.ndarray:
    """The edges above, then random magnitudes from 1e-3 to 1e20 of both signs."""
    rng = np.random.default_rng(1)
    random = rng.choice([-1.0, 1.0], n_random) * 10.0 ** rng.uniform(-3, 20, n_random)
    return np.concatenate([np.array(CAST_VALUES), random]).astype(dtype).reshape(-1, 2)


@pytest.mark.parametrize("source", [TensorProto.FLOAT, TensorProto.DOUBLE], ids=["float32", "float64"])
def test_float_to_integer_cast_matches_onnxruntime(tmp_path, source):
    """NaN, ±inf and out-of-range values convert as onnxruntime's x86-64 conversion does (INT64_MIN,
    INT32_MIN, the low bits of INT32_MIN, ...), for every integer type, in one model. Each Cast
    feeds an `Add 0` of its type: a lone Cast producing a graph output is not a group."""
    nodes, outputs, inits = [], [], {}
    for to in INTEGER_TYPES:
        name, dtype = TensorProto.DataType.Name(to).lower(), onnx.helper.tensor_dtype_to_np_dtype(to)
        inits[f"zero_{name}"] = np.array(0, dtype)
        nodes += [node("Cast", ["x"], f"c_{name}", to=to), node("Add", [f"c_{name}", f"zero_{name}"], f"y_{name}")]
        outputs.append(onnx.helper.make_tensor_value_info(f"y_{name}", to, ["N", 2]))
    m = model(nodes, {"x": ("N", 2)}, [], inits, dtype=source, opset=19)
    m.graph.output.extend(outputs)
    check_fused_matches_onnxruntime(m, {"x": _cast_feed(onnx.helper.tensor_dtype_to_np_dtype(source))}, tmp_path)


def test_nan_derived_gather_index_is_an_error(tmp_path):
    """Cast(NaN) is INT64_MIN, out of any axis: onnxruntime refuses the Gather, and so must the
    kernel (bounds.py), instead of returning a table value."""
    table = np.linspace(-1, 1, 10).astype(F32)
    nodes = [node("Mul", ["x", "scale"], "s"), node("Cast", ["s"], "i", to=TensorProto.INT64),
             node("Gather", ["table", "i"], "g", axis=0), node("Add", ["g", "x"], "y")]
    m = model(nodes, {"x": ("N", 4)}, {"y": ("N", 4)}, {"scale": np.array(3.0, F32), "table": table}, opset=18)
    fused, original = fused_session(m, tmp_path), original_session(m)
    good = {"x": np.array([[0.0, 1.0, 2.9, -1.0], [-3.0, 0.5, 1.5, 3.0]], F32)}
    for got, expected in zip(fused.run(None, good), original.run(None, good)):
        assert_bitwise_equal(got, expected)
    for bad in (np.nan, -np.inf, np.inf, 1e30):
        feeds = {"x": np.array([[0.0, 1.0, bad, 2.0]], F32)}
        with pytest.raises(Exception, match="out of data bounds"):
            original.run(None, feeds)
        with pytest.raises(Exception, match="index out of range"):
            fused.run(None, feeds)


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16],
                         ids=["float32", "float64", "float16"])
def test_sigmoid_is_zero_where_onnxruntimes_is(tmp_path, dtype):
    """Sigmoid(x) * inf: NaN where onnxruntime's sigmoid is exactly 0 (float32 from -18 down, float64
    from -36.7368 down), inf where it is not; the fuzzer's Sigmoid -> Cast -> MatMul with an inf
    weight gave inf for NaN. Between -18 and -15.8 onnxruntime's float32 sigmoid is 0 at scattered
    inputs: test_sigmoid_levels.py checks those bit for bit."""
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    edge64 = float.fromhex("-0x1.25e4f7b2737fbp+5")
    with np.errstate(over="ignore"):
        x = np.concatenate([np.linspace(-120, -18, 4001), np.linspace(-15.79, 20, 1001), -np.logspace(2, 30, 29),
                            [edge64, np.nextafter(edge64, 0), np.nan, -np.inf, np.inf, -0.0]]).astype(np_type)
    m = model([node("Sigmoid", ["x"], "s"), node("Mul", ["s", "big"], "y")], {"x": ("N", 1), "big": ("N", 1)},
              {"y": ("N", 1)}, dtype=dtype)
    feeds = {"x": x.reshape(-1, 1), "big": np.full((x.size, 1), np.inf, np_type)}
    expected = original_session(m).run(None, feeds)[0]
    assert np.isnan(expected).sum() > 1000 and np.isinf(expected).sum() > 500  # both sides of the edge
    assert_bitwise_equal(fused_session(m, tmp_path).run(None, feeds)[0], expected)


def test_float64_tanh_near_zero(tmp_path):
    """1 / Tanh(x) in float64 within 8 ulps of onnxruntime (std::tanh), ±0, NaN and ±inf exact: TVM's
    (1 - e^-2|x|) / (1 + e^-2|x|) was 7,000 ulps off at x = 1.5e-5 and 0 below 1e-16 (onnx_semantics.py)."""
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-3, 3, 6001), rng.standard_normal(2000) * 1e-3, -np.logspace(-320, 0, 200),
                        np.logspace(-320, 0, 200), [0.125, -0.125, np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324]])
    m = model([node("Tanh", ["x"], "t"), node("Reciprocal", ["t"], "y")], {"x": ("N", 1)}, {"y": ("N", 1)},
              dtype=TensorProto.DOUBLE)
    feeds = {"x": x.reshape(-1, 1)}
    expected = original_session(m).run(None, feeds)[0].ravel()
    got = fused_session(m, tmp_path).run(None, feeds)[0].ravel()
    finite = np.isfinite(expected)
    exact = ~finite | (expected == 0)
    assert_bitwise_equal(got[exact], expected[exact])
    ulps = np.abs(got[~exact] - expected[~exact]) / np.spacing(np.abs(expected[~exact]))
    assert ulps.max() <= 8, f"{ulps.max()} ulps at x = {x[~exact][np.argmax(ulps)]}"


GEMMS = {  # case: (Gemm attributes, whether C is given)
    "alpha_half_bias": ({"alpha": 0.5, "beta": 2.0, "transB": 1}, True),
    "alpha_half": ({"alpha": 0.5}, False),
    "alpha_four_bias": ({"alpha": 4.0, "transB": 1}, True),
}


@pytest.mark.parametrize("case", list(GEMMS))
def test_gemm_scales_the_product(tmp_path, case):
    """alpha * (A @ B) as onnxruntime computes it: a product that overflows is inf even when alpha
    would bring it back into range (TVM's importer scaled A first: 0.5 * 3e38 * 2 was finite)."""
    attrs, with_bias = GEMMS[case]
    w = np.array([[2.0, 0.5], [-1.0, 4.0]], F32)
    inits = {"w": w.T.copy() if not attrs.get("transB") else w, **({"c": np.array([1.0, -1.0], F32)} if with_bias else {})}
    gemm = node("Gemm", ["x", "w", "c"] if with_bias else ["x", "w"], "g", **attrs)
    m = model([gemm, node("Neg", ["g"], "y")], {"x": ("N", 2)}, {"y": ("N", 2)}, inits, opset=17)
    x = np.array([[3e38, 0.0], [1.0, 2.0], [np.inf, 1.0], [-3e38, 1e-40], [1e38, 0.0], [-0.0, 0.0]], F32)
    check_fused_matches_onnxruntime(m, {"x": x}, tmp_path)


WHERE_TYPES = {"float32": (TensorProto.FLOAT, np.float32), "float64": (TensorProto.DOUBLE, np.float64),
               "float16": (TensorProto.FLOAT16, np.float16)}


def _where_model(onnx_type) -> onnx.ModelProto:
    nodes = [node("Where", ["c", "x", "y"], "w"), node("Reciprocal", ["w"], "z")]
    m = model(nodes, {"x": ("N", 4), "y": ("N", 4)}, {"z": ("N", 4)}, dtype=onnx_type, opset=17)
    m.graph.input.insert(0, onnx.helper.make_tensor_value_info("c", TensorProto.BOOL, ["N", 4]))
    return m


def _where_feeds(np_type) -> dict:
    c = np.array([[True, False, True, False], [False, True, True, False]])
    x = np.array([[-0.0, 1.0, np.inf, 2.0], [-0.0, -0.0, np.nan, 0.0]], np_type)
    y = np.array([[5.0, -0.0, np.nan, -np.inf], [-0.0, 3.0, 1.0, -0.0]], np_type)
    return {"c": c, "x": x, "y": y}


@pytest.mark.parametrize("type_name", list(WHERE_TYPES))
def test_onnxruntime_where_turns_a_first_branch_negative_zero_positive(type_name):
    """Pins onnxruntime's off-spec Where that onnx_semantics rule 8 reproduces: -0.0 taken from x
    comes out +0.0, from y it stays -0.0 (the spec's select keeps both)."""
    onnx_type, np_type = WHERE_TYPES[type_name]
    m = _where_model(onnx_type)
    m.graph.output[0].name = "w"
    del m.graph.node[1]
    (w,) = original_session(m).run(None, _where_feeds(np_type))
    assert not np.signbit(w[0, 0]) and not np.signbit(w[1, 1]), "from x: +0.0"
    assert np.signbit(w[0, 1]) and np.signbit(w[1, 0]) and np.signbit(w[1, 3]), "from y: -0.0"


@pytest.mark.parametrize("type_name", list(WHERE_TYPES))
def test_where_negative_zero_as_onnxruntime(tmp_path, type_name):
    onnx_type, np_type = WHERE_TYPES[type_name]
    check_fused_matches_onnxruntime(_where_model(onnx_type), _where_feeds(np_type), tmp_path)


def _dense_model(depth: int, columns: int, bias: bool) -> onnx.ModelProto:
    """MatMul by a constant positive weight (+ a bias), then Neg, which shows a zero's sign."""
    rng = np.random.default_rng(depth)
    inits = {"w": (np.abs(rng.standard_normal((depth, columns))) + 0.1).astype(F32)}
    nodes = [node("MatMul", ["x", "w"], "p")]
    if bias:
        inits["b"] = rng.standard_normal(columns).astype(F32)
        nodes.append(node("Add", ["p", "b"], "q"))
    nodes.append(node("Neg", [nodes[-1].output[0]], "y"))
    return model(nodes, {"x": ("N", depth)}, {"y": ("N", columns)}, inits)


@pytest.mark.parametrize("depth, columns", [(32, 10), (64, 64), (4, 16)])
def test_a_product_of_negative_zeros_is_positive_zero_as_in_mlas(tmp_path, depth, columns):
    """MLAS zeroes its accumulators and fuses the first product into that +0.0, so a row of -0.0
    products sums to +0.0 (the kernel started from -0.0 and kept it, and Neg showed the sign)."""
    m = _dense_model(depth, columns, bias=False)
    fused, original = fused_session(m, tmp_path), original_session(m)
    for rows in (1, 3, 64):
        x = np.full((rows, depth), -0.0, F32)
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])


def test_the_one_row_kernel_fuses_each_product_into_the_running_sum(tmp_path):
    """The one-row kernel of a short product unrolls its k loop. From a -0.0 start LLVM dropped the
    first add and fused the first product into the second step instead of the second product:
    1 to 4 of `[N, 32] @ [32, 10] + b`'s outputs differed in the last bit at 2 to 8 rows."""
    m = _dense_model(32, 10, bias=True)
    fused, original = fused_session(m, tmp_path), original_session(m)
    for rows in (1, 2, 3, 4, 5, 8):
        x = np.random.default_rng(rows).standard_normal((rows, 32)).astype(F32) * 3
        assert_bitwise_equal(fused.run(None, {"x": x})[0], original.run(None, {"x": x})[0])
