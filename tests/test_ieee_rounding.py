"""Where a value is rounded, and what a kernel writes when it has nothing to read, as onnxruntime:
an ONNX Mul's product before an add (codegen/rounded_products.py), float16 arithmetic in float32
(codegen/float16_as_onnxruntime.py), a reduction over an empty batch (codegen/empty_reductions.py),
Softplus far below 0 (codegen/onnx_semantics.py) and a gather along an axis of one
(schedule.inline_cheap_producers). The fused model in onnxruntime against onnxruntime on the original."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto
from onnx_builder import model, node
from test_ieee_order import assert_bitwise_equal, check_fused_matches_onnxruntime, fused_session, original_session

from onnxfuse.codegen import compile as codegen_compile
from onnxfuse.codegen import empty_reductions, host_kernel, register_file, relax_import
from onnxfuse.codegen.float16_as_onnxruntime import computed_as_onnxruntime

F32, F16 = np.float32, np.float16


def _random(shape, dtype, seed, scale=1000.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


MUL_ADD = {  # case: nodes computing y from x, w, z
    "mul_add": [node("Mul", ["x", "w"], "m"), node("Add", ["m", "z"], "y")],
    "add_mul": [node("Mul", ["x", "w"], "m"), node("Add", ["z", "m"], "y")],
    "mul_sub": [node("Mul", ["x", "w"], "m"), node("Sub", ["m", "z"], "y")],
    "sub_mul": [node("Mul", ["x", "w"], "m"), node("Sub", ["z", "m"], "y")],
    "neg_mul_add": [node("Mul", ["x", "w"], "m"), node("Neg", ["m"], "n"), node("Add", ["n", "z"], "y")],
    "broadcast_scale_add": [node("Mul", ["x", "s"], "m"), node("Add", ["m", "z"], "y")],
}


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE], ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(MUL_ADD))
def test_product_is_rounded_before_the_add(tmp_path, case, dtype):
    """A fused multiply-add differed from onnxruntime in the last bit for about a quarter of these."""
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    inits = {"s": np.array([1.1, -3.3, 7.7, 0.3] * 8, np_type)} if case.startswith("broadcast") else {}
    inputs = {k: ("N", 32) for k in ("x", "w", "z") if any(k in n.input for n in MUL_ADD[case])}
    m = model(MUL_ADD[case], inputs, {"y": ("N", 32)}, inits, dtype=dtype)
    feeds = {k: _random((64, 32), np_type, seed) for seed, k in enumerate(inputs)}
    check_fused_matches_onnxruntime(m, feeds, tmp_path)


X86_AVX512 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v4"}
AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}


def _assembly(onnx_model: onnx.ModelProto, target: dict = X86_AVX512, kind: str = "asm") -> str:
    """The kernel's machine code, or its LLVM IR (kind="ll"); no run: the object may be for another CPU."""
    tvm_target = tvm.target.Target(target)
    group = relax_import.import_group(onnx_model, "k")
    funcs, _, _ = codegen_compile._variants(group.prim_func, "k", 2, False, register_file.for_target(tvm_target),
                                            serial_variant=False)
    return codegen_compile.build_module(host_kernel.host_functions(funcs, "k", "k"), tvm_target).mod.inspect_source(kind)


def test_only_the_onnx_products_lose_their_fma():
    """The elementwise Mul -> Add is a multiply and an add; the GEMM's inner products (onnxruntime's
    MLAS uses FMA there too) and the exp polynomial keep their fused multiply-adds."""
    elementwise = _assembly(model(MUL_ADD["mul_add"], {"x": ("N", 32), "w": ("N", 32), "z": ("N", 32)}, {"y": ("N", 32)}))
    assert "vfmadd" not in elementwise and "vmulps" in elementwise
    gemm = model([node("MatMul", ["x", "w"], "y")], {"x": ("N", 32)}, {"y": ("N", 32)},
                 {"w": _random((32, 32), F32, 0)})
    assert "vfmadd" in _assembly(gemm)
    exp = model([node("Exp", ["x"], "y")], {"x": ("N", 32)}, {"y": ("N", 32)})
    assert "vfmadd" in _assembly(exp)


# -- float16 -------------------------------------------------------------------------------------

FLOAT16_CHAINS = {  # onnxruntime computes these in float32 and rounds where a float16 kernel reads
    "mul_mul": [node("Mul", ["a", "b"], "m"), node("Mul", ["m", "a"], "y")],
    "add_div": [node("Add", ["a", "b"], "s"), node("Div", ["s", "a"], "y")],
    "mul_max_mul": [node("Mul", ["a", "b"], "m"), node("Max", ["m", "a"], "x"), node("Mul", ["x", "b"], "y")],
    "mul_where_sub": [node("Mul", ["a", "b"], "m"), node("Less", ["a", "b"], "c"), node("Where", ["c", "m", "b"], "w"),
                      node("Sub", ["w", "a"], "y")],
    "mul_transpose_add": [node("Mul", ["a", "b"], "m"), node("Transpose", ["m"], "t", perm=[0, 1]),
                          node("Add", ["t", "b"], "y")],
    "mul_max_max_mul": [node("Mul", ["a", "b"], "m"), node("Max", ["m", "a"], "x"), node("Max", ["x", "b"], "x2"),
                        node("Mul", ["x2", "b"], "y")],
    "round_max_mul": [node("Round", ["a"], "r"), node("Max", ["r", "b"], "x"), node("Mul", ["x", "b"], "y")],
    "mul_round_mul": [node("Mul", ["a", "b"], "m"), node("Round", ["m"], "x"), node("Mul", ["x", "b"], "y")],
}


@pytest.mark.parametrize("case", list(FLOAT16_CHAINS))
def test_float16_chains_round_where_onnxruntime_does(tmp_path, case):
    m = model(FLOAT16_CHAINS[case], {"a": ("N", 16), "b": ("N", 16)}, {"y": ("N", 16)}, dtype=TensorProto.FLOAT16)
    feeds = {"a": _random((64, 16), F16, 0, 3.0), "b": _random((64, 16), F16, 1, 3.0)}
    per_op = (feeds["a"] * feeds["b"]) * feeds["a"]  # what rounding after every op gives
    expected = original_session(m).run(None, feeds)[0]
    if case == "mul_mul":
        assert (expected != per_op).sum() > 10  # onnxruntime does not round between the two
    assert_bitwise_equal(fused_session(m, tmp_path).run(None, feeds)[0], expected)


CASTS = {  # (nodes, input type, output type): the fuzzer's Cast -> Softplus -> LeakyRelu first
    "cast_softplus_leakyrelu": ([node("Cast", ["a"], "c", to=TensorProto.FLOAT16), node("Softplus", ["c"], "s"),
                                 node("LeakyRelu", ["s"], "y", alpha=0.1)], TensorProto.FLOAT, TensorProto.FLOAT16),
    "cast_exp_and_max": ([node("Cast", ["a"], "c", to=TensorProto.FLOAT16), node("Exp", ["c"], "e"),
                          node("Max", ["c", "e"], "y")], TensorProto.FLOAT, TensorProto.FLOAT16),
    "mul_cast_to_float32": ([node("Mul", ["a", "a"], "m"), node("Cast", ["m"], "y", to=TensorProto.FLOAT)],
                            TensorProto.FLOAT16, TensorProto.FLOAT),
    "mul_cast_to_float64": ([node("Mul", ["a", "a"], "m"), node("Cast", ["m"], "y", to=TensorProto.DOUBLE)],
                            TensorProto.FLOAT16, TensorProto.DOUBLE),
}


@pytest.mark.parametrize("case", list(CASTS))
def test_float16_casts_that_onnxruntime_removes(tmp_path, case):
    """onnxruntime drops a model's Cast to float16 next to the Cast it inserts back to float32."""
    nodes, source, result = CASTS[case]
    m = model(nodes, {"a": ("N", 16)}, ["y"], dtype=source)
    m.graph.output[0].type.tensor_type.elem_type = result
    feeds = {"a": _random((64, 16), onnx.helper.tensor_dtype_to_np_dtype(source), 0, 3.0)}
    check_fused_matches_onnxruntime(m, feeds, tmp_path)


I64, I32, BOOL, F16_T = TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL, TensorProto.FLOAT16
ROUNDING_CASTS = {  # case: (nodes computing y, type of x); a, b are float16. onnxruntime 1.32, module doc "Casts"
    # read only by float32 nodes: Cast(x -> float16) becomes Cast(x -> float32) (INT64_MAX + -inf is -inf)
    "int64_cast_add": ([node("Cast", ["x"], "c", to=F16_T), node("Add", ["c", "b"], "y")], I64),
    "int32_cast_add_mul": ([node("Cast", ["x"], "c", to=F16_T), node("Add", ["c", "b"], "s"),
                            node("Mul", ["c", "b"], "m"), node("Sub", ["s", "m"], "y")], I32),
    "float64_cast_add": ([node("Cast", ["x"], "c", to=F16_T), node("Add", ["c", "b"], "y")], TensorProto.DOUBLE),
    # also read by a float16 kernel: the Add reads the rounded cast
    "int64_cast_add_and_max": ([node("Cast", ["x"], "c", to=F16_T), node("Add", ["c", "b"], "s"),
                                node("Max", ["c", "b"], "m"), node("Sub", ["s", "m"], "y")], I64),
    # a Cast back to float64 keeps every Cast; one to int8 does not, and reads x itself
    "cast_add_and_cast_to_float64": ([node("Cast", ["x"], "c", to=F16_T), node("Add", ["c", "b"], "s"),
                                      node("Cast", ["c"], "w", to=TensorProto.DOUBLE), node("Cast", ["w"], "h", to=F16_T),
                                      node("Sub", ["s", "h"], "y")], TensorProto.FLOAT),
    "cast_add_and_cast_to_int8": ([node("Cast", ["x"], "c", to=F16_T), node("Add", ["c", "b"], "s"),
                                   node("Cast", ["c"], "w", to=TensorProto.INT8), node("Cast", ["w"], "h", to=F16_T),
                                   node("Sub", ["s", "h"], "y")], TensorProto.FLOAT),
    # a Cast of a float32-computed product reads it unrounded when only Casts and float32 nodes read it
    "mul_cast_to_int32": ([node("Mul", ["a", "b"], "v"), node("Cast", ["v"], "y", to=I32)], None),
    "mul_cast_to_bool": ([node("Mul", ["a", "a"], "v"), node("Cast", ["v"], "y", to=BOOL)], None),  # 1e-4 * 1e-4
    "mul_add_and_cast_to_int64": ([node("Mul", ["a", "b"], "v"), node("Add", ["v", "a"], "s"),
                                   node("Cast", ["v"], "w", to=I64), node("Cast", ["w"], "h", to=F16_T),
                                   node("Sub", ["s", "h"], "y")], None),
    # isolated Max: only its first operand is checked
    "max_of_product_and_int_cast": ([node("Cast", ["x"], "c", to=F16_T), node("Mul", ["a", "b"], "p"),
                                     node("Max", ["p", "c"], "m"), node("Add", ["m", "b"], "y")], I64),
    "max_of_int_cast_and_product": ([node("Cast", ["x"], "c", to=F16_T), node("Mul", ["a", "b"], "p"),
                                     node("Max", ["c", "p"], "m"), node("Add", ["m", "b"], "y")], I64),
}


def _adversarial(dtype: int, seed: int, n: int = 32) -> np.ndarray:
    """Values whose float16 rounding shows: overflowing, vanishing, crossing an integer; shuffled."""
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(seed)
    if np_type.kind == "f":
        big = {2: 65504, 4: 3e38, 8: 1e300}[np_type.itemsize]
        special = [70000, 65519, 65520, 1e-8, 1e-4, 2.9997, -1e30, big, np.inf, -np.inf, np.nan, 0.0, -0.0, 350, 2049]
        with np.errstate(over="ignore"):  # 70000 is inf in float16
            return rng.permutation(np.concatenate([special, rng.standard_normal(n - len(special)) * 300]).astype(np_type))
    info = np.iinfo(np_type)
    special = [info.max, info.min, 0, 1, 2049, 65520, 70000]
    return rng.permutation(np.concatenate([special, rng.integers(-100000, 100000, n - len(special))]).astype(np_type))


@pytest.mark.parametrize("case", list(ROUNDING_CASTS))
def test_float16_rounding_casts_as_onnxruntime(tmp_path, case):
    nodes, source = ROUNDING_CASTS[case]
    used = {i for n in nodes for i in n.input}
    inputs = {k: ("N",) for k in ("x", "a", "b") if k in used}
    m = model(nodes, inputs, ["y"], dtype=F16_T)
    for i in m.graph.input:
        if i.name == "x":
            i.type.tensor_type.elem_type = source
    m = onnx.shape_inference.infer_shapes(m)  # the output's type
    feeds = {k: _adversarial(source if k == "x" else F16_T, seed) for seed, k in enumerate(inputs)}
    check_fused_matches_onnxruntime(m, feeds, tmp_path)


def _rewritten(nodes, source=I64, outputs=("y",)):
    used = {i for n in nodes for i in n.input}
    m = model(nodes, {k: ("N", 4) for k in ("x", "a", "b") if k in used}, {o: ("N", 4) for o in outputs}, dtype=F16_T)
    for i in m.graph.input:
        if i.name == "x":
            i.type.tensor_type.elem_type = source
    return {n.name: n for n in computed_as_onnxruntime(m).graph.node}


def test_float16_rewrite_casts_an_integer_straight_to_float32():
    only_add = _rewritten(ROUNDING_CASTS["int64_cast_add"][0])
    assert "c" not in only_add  # the Cast to float16 is gone: the Add reads x cast to float32
    assert list(only_add["y"].input) == ["x__onnxfuse_f32", "b__onnxfuse_f32"]
    assert only_add["x__onnxfuse_f32"].input[0] == "x"
    with_max = _rewritten(ROUNDING_CASTS["int64_cast_add_and_max"][0])
    assert list(with_max["s"].input) == ["c__onnxfuse_f32", "b__onnxfuse_f32"] and with_max["c__onnxfuse_f32"].input[0] == "c"
    output = _rewritten(ROUNDING_CASTS["int64_cast_add"][0], outputs=("y", "c"))
    assert list(output["y"].input) == ["c__onnxfuse_f32", "b__onnxfuse_f32"]
    to_int = _rewritten(ROUNDING_CASTS["mul_cast_to_int32"][0], outputs=())
    assert list(to_int["y"].input) == ["v__onnxfuse_unrounded"]


def test_float16_rewrite_checks_only_the_first_operand_of_a_variadic_op():
    first_product = _rewritten(ROUNDING_CASTS["max_of_product_and_int_cast"][0])
    assert list(first_product["m"].input) == ["p__onnxfuse_unrounded", "x__onnxfuse_f32"]
    first_cast = _rewritten(ROUNDING_CASTS["max_of_int_cast_and_product"][0])
    assert list(first_cast["m"].input) == ["c", "p"]


def test_float16_rewrite_reads_unrounded_values_only_between_float32_ops():
    def rewritten(nodes, outputs=("y",)):
        m = model(nodes, {"a": ("N", 4), "b": ("N", 4)}, {o: ("N", 4) for o in outputs}, dtype=TensorProto.FLOAT16)
        return {n.name: n for n in computed_as_onnxruntime(m).graph.node}

    between = rewritten(FLOAT16_CHAINS["mul_max_mul"])  # the Max reads the unrounded product
    assert list(between["x"].input) == ["m__onnxfuse_unrounded", "a__onnxfuse_f32"]
    assert list(between["y"].input) == ["x__onnxfuse_unrounded", "b__onnxfuse_f32"]
    assert between["y__onnxfuse_round"].output[0] == "y"
    read_by_float16 = rewritten(FLOAT16_CHAINS["mul_max_max_mul"])  # the first Max reads the rounded one
    assert list(read_by_float16["x"].input) == ["m", "a"] and list(read_by_float16["x2"].input) == ["x", "b"]
    output = rewritten(FLOAT16_CHAINS["mul_max_mul"], ("y", "x"))  # a group output: rounded
    assert list(output["x"].input) == ["m", "a"]
    untouched = model([node("Max", ["a", "b"], "y")], {"a": ("N", 4), "b": ("N", 4)}, {"y": ("N", 4)},
                      dtype=TensorProto.FLOAT16)
    assert computed_as_onnxruntime(untouched) is untouched


# -- empty batch, Softplus, gather along an axis of one -------------------------------------------

@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin"])
def test_reduction_over_an_empty_batch_writes_its_start(tmp_path, op):
    """A call with batch 3, then batch 0 in the same session: the second must not return the first's."""
    m = model([node("Abs", ["x"], "a"), node(op, ["a", "axes"], "y", keepdims=1)],
              {"x": ("N", 4)}, {"y": (1, 4)}, {"axes": np.array([0], np.int64)}, opset=18)
    original, fused = original_session(m), fused_session(m, tmp_path)
    for batch in (3, 0):
        feeds = {"x": _random((batch, 4), F32, batch)}
        assert_bitwise_equal(fused.run(None, feeds)[0], original.run(None, feeds)[0])


def test_reductions_lose_their_init_inside_the_loop():
    m = model([node("ReduceSum", ["x", "axes"], "y", keepdims=1)], {"x": ("N", 4)}, {"y": (1, 4)},
              {"axes": np.array([0], np.int64)}, opset=18)
    func = relax_import.import_group(m, "k").prim_func
    assert "T.init()" in str(func)
    written = str(empty_reductions.write_starts_first(func))
    assert "T.init()" not in written and "_init" in written


def test_softplus_far_below_zero(tmp_path):
    """About exp(x) down to where our exp flushes to 0 (-86.9, docs/numerics.md); 1 / Softplus was
    inf below -17."""
    x = np.concatenate([np.linspace(-86.5, 30, 400), [-20, -50, 0, 1e-8, -1e-8, 40, 88, 100, np.inf, -np.inf, np.nan]])
    m = model([node("Softplus", ["x"], "s"), node("Reciprocal", ["s"], "y")], {"x": ("N", 1)}, {"y": ("N", 1)})
    feeds = {"x": x.astype(F32).reshape(-1, 1)}
    expected = original_session(m).run(None, feeds)[0]
    got = fused_session(m, tmp_path).run(None, feeds)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=2e-6)


@pytest.mark.parametrize("index,raises", [(0, False), (-1, False), (1, True), (-2, True)])
def test_gather_elements_along_an_axis_of_one(tmp_path, index, raises):
    m = model([node("Tanh", ["x"], "t"), node("GatherElements", ["t", "i"], "y", axis=1)],
              {"x": ("N", 1), "i": ("N", 3)}, {"y": ("N", 3)})
    m.graph.input[1].type.tensor_type.elem_type = TensorProto.INT64
    feeds = {"x": np.full((2, 1), 0.5, F32), "i": np.array([[0, index, 0], [0, 0, 0]], np.int64)}
    fused = fused_session(m, tmp_path)
    if raises:
        with pytest.raises(Exception, match="[Oo]ut of range"):
            original_session(m).run(None, feeds)
        with pytest.raises(Exception, match="index out of range"):
            fused.run(None, feeds)
    else:
        assert_bitwise_equal(fused.run(None, feeds)[0], original_session(m).run(None, feeds)[0])


def test_arithmetic_fence_builds_for_aarch64():
    """The fence is an LLVM intrinsic every backend lowers: the kernel still builds for aarch64,
    with a multiply and an add."""
    asm = _assembly(model(MUL_ADD["mul_add"], {"x": ("N", 32), "w": ("N", 32), "z": ("N", 32)}, {"y": ("N", 32)}),
                    AARCH64)
    assert "fmla" not in asm and "fmul" in asm
