"""The native runtime end to end: TVM kernels → one custom-op library → onnxruntime runs them.

Every kernel is compiled here with TVM (TE or TVMScript), linked by `build_library` into a single
library, and run from small ONNX models both through `onnxfuse.InferenceSession` and through
plain `SessionOptions.register_custom_ops_library`, against numpy.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxfuse
from onnxfuse.errors import CompileError, UsageError
from onnxfuse.kernel_spec import DOMAIN, DOMAIN_VERSION, ONNX_DTYPE_CODES, KernelSpec, TensorSpec
from onnxfuse.runtime.library import build_library, kernel_table_source
from onnxfuse.session import LIBRARY_METADATA_KEY
from onnxfuse.target import resolve_target

tvm = pytest.importorskip("tvm")
from tvm import te  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

LIBRARY_NAME = "libkernels.so"
F32 = TensorProto.FLOAT


# ---- Kernels, compiled once per module --------------------------------------------------------
def compile_object(prim_func, name: str, directory, **more_funcs) -> str:
    """`name.o` holding prim_func as `name`, and any more_funcs under their own names."""
    funcs = {name: prim_func, **more_funcs}
    module = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()})
    executable = tvm.compile(module, target=tvm.target.Target({"kind": "llvm"}))
    path = directory / f"{name}.o"
    executable.mod.write_to_file(str(path))
    return str(path)


def scale_add():
    """C = A + 2 B: plain elementwise."""
    a = te.placeholder((4, 8), "float32", name="A")
    b = te.placeholder((4, 8), "float32", name="B")
    c = te.compute((4, 8), lambda i, j: a[i, j] + 2.0 * b[i, j], name="C")
    return te.create_prim_func([a, b, c])


def row_stats():
    """Three outputs of two dtypes: row sums, squares, and int32(10 A)."""
    a = te.placeholder((3, 5), "float32", name="A")
    k = te.reduce_axis((0, 5), name="k")
    sums = te.compute((3,), lambda i: te.sum(a[i, k], axis=k), name="S")
    squares = te.compute((3, 5), lambda i, j: a[i, j] * a[i, j], name="Q")
    tenths = te.compute((3, 5), lambda i, j: (a[i, j] * 10.0).astype("int32"), name="I")
    return te.create_prim_func([a, sums, squares, tenths])


def batch_mul():
    """Z = X Y + 1 over a symbolic batch n shared by both inputs."""
    n = te.var("n")
    x = te.placeholder((n, 16), "float32", name="X")
    y = te.placeholder((n, 16), "float32", name="Y")
    z = te.compute((n, 16), lambda i, j: x[i, j] * y[i, j] + 1.0, name="Z")
    return te.create_prim_func([x, y, z])


def parallel_scale():
    """Y = 3 X with the batch loop parallel: the kernel calls __TVMBackendParallelLaunch."""
    n = te.var("n")
    x = te.placeholder((n, 64), "float32", name="X")
    y = te.compute((n, 64), lambda i, j: x[i, j] * 3.0, name="Y")
    schedule = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    rows, _ = schedule.get_loops(schedule.get_sblock("Y"))
    schedule.parallel(rows)
    return schedule.mod["main"]


def copy_of(dtype):
    """B = A: checks the runtime's ONNX → DLPack dtype mapping, one kernel per contract dtype."""
    a = te.placeholder((5,), dtype, name="A")
    return te.create_prim_func([a, te.compute((5,), lambda i: a[i], name="B")])


@T.prim_func
def checked_gather(table: T.Buffer((8,), "float32"), index: T.Buffer((4,), "int32"), out: T.Buffer((4,), "float32")):
    """out = table[index]; a bad index makes the kernel report an error (returns -1)."""
    for i in range(4):
        assert 0 <= index[i] and index[i] < 8, "gather index out of range"
        out[i] = table[index[i]]


@T.prim_func
def parallel_gather(table: T.Buffer((8,), "float32"), index_handle: T.handle, out_handle: T.handle):
    """checked_gather over a symbolic length, in parallel: the failing task's error must surface."""
    n = T.int64()
    index = T.match_buffer(index_handle, (n,), "int32")
    out = T.match_buffer(out_handle, (n,), "float32")
    for i in T.parallel(n):
        assert 0 <= index[i] and index[i] < 8, "parallel gather index out of range"
        out[i] = table[index[i]]


def spec(name, inputs, outputs, obj):
    return KernelSpec(name, tuple(TensorSpec(*t) for t in inputs), tuple(TensorSpec(*t) for t in outputs), obj)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """The kernel objects and one library holding all of them."""
    directory = tmp_path_factory.mktemp("runtime")
    objects = {
        name: compile_object(make(), name, directory)
        for name, make in [
            ("scale_add", scale_add),
            ("row_stats", row_stats),
            ("batch_mul", batch_mul),
            ("parallel_scale", parallel_scale),
            ("checked_gather", lambda: checked_gather),
            ("parallel_gather", lambda: parallel_gather),
            *((f"copy_{dtype}", lambda dtype=dtype: copy_of(dtype)) for dtype in ONNX_DTYPE_CODES),
        ]
    }
    specs = [
        spec("scale_add", [("float32", (4, 8)), ("float32", (4, 8))], [("float32", (4, 8))], objects["scale_add"]),
        spec(
            "row_stats",
            [("float32", (3, 5))],
            [("float32", (3,)), ("float32", (3, 5)), ("int32", (3, 5))],
            objects["row_stats"],
        ),
        spec(
            "batch_mul", [("float32", ("n", 16)), ("float32", ("n", 16))], [("float32", ("n", 16))], objects["batch_mul"]
        ),
        spec("parallel_scale", [("float32", ("n", 64))], [("float32", ("n", 64))], objects["parallel_scale"]),
        spec(
            "checked_gather", [("float32", (8,)), ("int32", (4,))], [("float32", (4,))], objects["checked_gather"]
        ),
        spec(
            "parallel_gather", [("float32", (8,)), ("int32", ("n",))], [("float32", ("n",))], objects["parallel_gather"]
        ),
        *(spec(f"copy_{d}", [(d, (5,))], [(d, (5,))], objects[f"copy_{d}"]) for d in ONNX_DTYPE_CODES),
    ]
    library = build_library(specs, directory / LIBRARY_NAME)
    return directory, library, objects


def write_model(directory, name, op, inputs, outputs, library_name=LIBRARY_NAME):
    """A one-node model calling custom op `op`; inputs/outputs are (name, elem_type, shape|None)."""
    node = helper.make_node(op, [i[0] for i in inputs], [o[0] for o in outputs], domain=DOMAIN)
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
    )
    model = helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
    )
    if library_name is not None:
        helper.set_model_props(model, {LIBRARY_METADATA_KEY: library_name})
    path = directory / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def sessions(model, library, threads=1):
    """The same model through onnxfuse.InferenceSession and through plain onnxruntime."""
    base = ort.SessionOptions()
    base.intra_op_num_threads = threads
    plain = ort.SessionOptions()
    plain.intra_op_num_threads = threads
    plain.register_custom_ops_library(str(library))
    return [
        onnxfuse.InferenceSession(str(model), base, providers=["CPUExecutionProvider"]),
        ort.InferenceSession(str(model), plain, providers=["CPUExecutionProvider"]),
    ]


def session(model, threads=1):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return onnxfuse.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


# ---- Correctness ---------------------------------------------------------------------------------
def test_elementwise(build):
    directory, library, _ = build
    model = write_model(directory, "elementwise", "scale_add", [("a", F32, [4, 8]), ("b", F32, [4, 8])],
                        [("c", F32, [4, 8])])
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 4, 8), dtype=np.float32)
    for sess in sessions(model, library):
        (c,) = sess.run(None, {"a": a, "b": b})
        np.testing.assert_allclose(c, a + 2 * b, rtol=1e-6)


def test_several_outputs(build):
    directory, library, _ = build
    model = write_model(directory, "several", "row_stats", [("a", F32, [3, 5])],
                        [("s", F32, None), ("q", F32, None), ("i", TensorProto.INT32, None)])
    a = np.random.default_rng(1).standard_normal((3, 5), dtype=np.float32)
    for sess in sessions(model, library):
        s, q, i = sess.run(None, {"a": a})
        np.testing.assert_allclose(s, a.sum(axis=1), rtol=1e-5)
        np.testing.assert_allclose(q, a * a, rtol=1e-6)
        assert i.dtype == np.int32
        np.testing.assert_array_equal(i, (a * np.float32(10)).astype(np.int32))


@pytest.mark.parametrize("dtype", list(ONNX_DTYPE_CODES))
def test_every_contract_dtype(build, dtype):
    directory, library, _ = build
    code = ONNX_DTYPE_CODES[dtype]
    model = write_model(directory, f"copy_{dtype}", f"copy_{dtype}", [("a", code, [5])], [("b", code, None)])
    a = (np.arange(5) % 2 == 1) if dtype == "bool" else np.arange(5).astype(dtype) + 1
    for sess in sessions(model, library):
        (b,) = sess.run(None, {"a": a})
        assert b.dtype == a.dtype
        np.testing.assert_array_equal(b, a)


def test_symbolic_batch(build):
    directory, library, _ = build
    model = write_model(directory, "symbolic", "batch_mul", [("x", F32, ["batch", 16]), ("y", F32, ["batch", 16])],
                        [("z", F32, None)])
    rng = np.random.default_rng(2)
    for sess in sessions(model, library):
        assert sess.get_outputs()[0].shape == ["batch", 16]  # InferOutputShapeFn kept the symbol
        for batch in (3, 7, 0):
            x, y = rng.standard_normal((2, batch, 16), dtype=np.float32)
            (z,) = sess.run(None, {"x": x, "y": y})
            assert z.shape == (batch, 16)
            np.testing.assert_allclose(z, x * y + 1, rtol=1e-6)


@pytest.mark.parametrize("kernel", ["parallel_scale", "parallel_gather"])
def test_kernel_object_really_launches_in_parallel(build, kernel):
    _, _, objects = build
    symbols = subprocess.run(["nm", objects[kernel]], capture_output=True, text=True, check=True).stdout
    assert "__TVMBackendParallelLaunch" in symbols


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_launch(build, threads):
    directory, library, _ = build
    model = write_model(directory, "parallel", "parallel_scale", [("x", F32, ["n", 64])], [("y", F32, None)])
    rng = np.random.default_rng(3)
    for sess in sessions(model, library, threads):
        for batch in (1000, 1, 0):
            x = rng.standard_normal((batch, 64), dtype=np.float32)
            (y,) = sess.run(None, {"x": x})
            np.testing.assert_allclose(y, 3 * x, rtol=1e-6)


@pytest.mark.parametrize("row_work", [1 << 20, 1])
def test_work_estimate_picks_pool_or_inline_and_both_compute(build, tmp_path, row_work):
    """A kernel with a work estimate uses onnxruntime's pool only when batch x row_work is worth
    waking it (1<<20 per row: always; 1 per row: never below a million rows): both paths run the
    parallel kernel's every task and give numpy's answer."""
    _, _, objects = build
    heavy = KernelSpec("parallel_scale", (TensorSpec("float32", ("n", 64)),), (TensorSpec("float32", ("n", 64)),),
                       objects["parallel_scale"], row_work=row_work)
    assert f"__tvm_ffi_parallel_scale, NULL, 0, 0, NULL, {row_work}," in kernel_table_source([heavy])
    library = build_library([heavy], tmp_path / LIBRARY_NAME)
    model = write_model(tmp_path, "work", "parallel_scale", [("x", F32, ["n", 64])], [("y", F32, None)])
    rng = np.random.default_rng(4)
    for sess in sessions(model, library, threads=2):
        for batch in (1, 7, 300):
            x = rng.standard_normal((batch, 64), dtype=np.float32)
            (y,) = sess.run(None, {"x": x})
            np.testing.assert_allclose(y, 3 * x, rtol=1e-6)


def serial_marker():
    """Y = 3 X + 1, serial: stands in for parallel_scale's serial twin so a test can tell which of
    the two the runtime called (a real twin computes the same as its parallel kernel)."""
    n = te.var("n")
    x = te.placeholder((n, 64), "float32", name="X")
    return te.create_prim_func([x, te.compute((n, 64), lambda i, j: x[i, j] * 3.0 + 1.0, name="Y")])


def twins_library(tmp_path, row_work=1 << 20):
    """parallel_scale (Y = 3 X) with serial_marker (Y = 3 X + 1) as its serial twin: each result
    says which of the two ran. Returns the model, the library and its kernel table's source."""
    obj = compile_object(parallel_scale(), "twins", tmp_path, twins_serial=serial_marker())
    twins = KernelSpec("twins", (TensorSpec("float32", ("n", 64)),), (TensorSpec("float32", ("n", 64)),), obj,
                       row_work=row_work, serial_variant=True)
    library = build_library([twins], tmp_path / LIBRARY_NAME)
    model = write_model(tmp_path, "twins", "twins", [("x", F32, ["n", 64])], [("y", F32, None)])
    return model, library, kernel_table_source([twins])


@pytest.mark.parametrize("row_work, serial_runs", [(1 << 20, False), (1, True)])
def test_calls_without_the_pool_run_the_serial_variant(tmp_path, row_work, serial_runs):
    """A kernel with a serial variant: a node's first call, when worth the pool, runs the parallel
    kernel through it; calls not worth the pool run `<name>_serial`, at every thread count; the
    table names both."""
    model, library, table = twins_library(tmp_path, row_work)
    assert f"__tvm_ffi_twins, NULL, 0, 0, __tvm_ffi_twins_serial, {row_work}," in table
    x = np.random.default_rng(5).standard_normal((40, 64), dtype=np.float32)
    for threads in (1, 2):
        for sess in sessions(model, library, threads):
            (y,) = sess.run(None, {"x": x})
            np.testing.assert_allclose(y, 3 * x + (1 if serial_runs else 0), rtol=1e-6)


def ran_through_the_pool(sess, x) -> bool:
    (y,) = sess.run(None, {"x": x})
    through_pool = np.allclose(y, 3 * x, rtol=1e-6)
    assert through_pool or np.allclose(y, 3 * x + 1, rtol=1e-6)
    return through_pool


def test_a_node_without_pool_threads_runs_the_serial_twin(tmp_path):
    """At 1 thread onnxruntime has no pool: after its first 8 calls through it (probes, all run
    on the calling thread) a node runs the serial twin, probing the pool again every 64th call."""
    model, library, _ = twins_library(tmp_path)
    x = np.random.default_rng(7).standard_normal((40, 64), dtype=np.float32)
    for sess in sessions(model, library, threads=1):
        paths = [ran_through_the_pool(sess, x) for _ in range(70)]
        assert paths == [call < 8 or call == 64 for call in range(70)]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the kernel splits its loop in one task per CPU")
def test_a_node_whose_pool_runs_its_tasks_keeps_using_the_pool(tmp_path):
    """At 2 threads onnxruntime's worker takes one of the tasks of a probe (an 8 MB batch: each task
    takes long enough for a sleeping worker to wake), and from then on every call goes through the
    pool. On a busy machine the worker may sleep through the first probes: the node then runs the
    serial twin until a later probe (every 64th call) finds it, and never after."""
    model, library, _ = twins_library(tmp_path)
    x = np.random.default_rng(8).standard_normal((32768, 64), dtype=np.float32)
    for sess in sessions(model, library, threads=2):
        paths = [ran_through_the_pool(sess, x) for _ in range(200)]
        found = next((call for call, pooled in enumerate(paths) if pooled and (call < 8 or call % 64 == 0)
                      and all(paths[call:])), None)
        assert found is not None, "no probe in 200 calls saw the pool's worker take a task"
        assert paths[:found] == [call < 8 or call % 64 == 0 for call in range(found)]


# ---- Constant inputs: checked once, read every call ----------------------------------------------
def scale_add_with_weight(directory, name, weight, overridable):
    """scale_add(a, w) with `w` an initializer: a constant one, or (`overridable`) also a graph
    input, which a feed may replace with another tensor on any call."""
    model = onnx.load(str(write_model(directory, name, "scale_add", [("a", F32, [4, 8]), ("w", F32, None)],
                                      [("c", F32, None)])))
    model.graph.initializer.append(onnx.numpy_helper.from_array(weight, "w"))
    if not overridable:
        model.graph.input.pop()
    path = directory / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def test_a_constant_input_is_read_on_every_call(build):
    directory, library, _ = build
    weight = np.arange(32, dtype=np.float32).reshape(4, 8)
    model = scale_add_with_weight(directory, "constant_weight", weight, overridable=False)
    rng = np.random.default_rng(6)
    for sess in sessions(model, library):
        for _ in range(3):
            a = rng.standard_normal((4, 8), dtype=np.float32)
            np.testing.assert_allclose(sess.run(None, {"a": a})[0], a + 2 * weight, rtol=1e-6)


def test_an_overridable_initializer_is_checked_on_every_call(build):
    """An initializer that is also a graph input is no constant: a feed replaces it, and a feed of
    the wrong shape is refused like any other input."""
    directory, library, _ = build
    weight = np.ones((4, 8), np.float32)
    model = scale_add_with_weight(directory, "overridable_weight", weight, overridable=True)
    a = np.full((4, 8), 0.5, np.float32)
    for sess in sessions(model, library):
        np.testing.assert_allclose(sess.run(None, {"a": a})[0], a + 2 * weight, rtol=1e-6)
        other = np.full((4, 8), 3.0, np.float32)
        np.testing.assert_allclose(sess.run(None, {"a": a, "w": other})[0], a + 2 * other, rtol=1e-6)
        with pytest.raises(Exception, match=r"scale_add.*input 1 dim 1 is 9, expected 8"):
            sess.run(None, {"a": a, "w": np.ones((4, 9), np.float32)})
        np.testing.assert_allclose(sess.run(None, {"a": a})[0], a + 2 * weight, rtol=1e-6)


def test_a_constant_input_of_the_wrong_shape_is_refused_when_run(build):
    directory, library, _ = build
    model = scale_add_with_weight(directory, "misshapen_weight", np.ones((4, 9), np.float32), overridable=False)
    for sess in sessions(model, library):
        with pytest.raises(Exception, match=r"scale_add.*input 1 dim 1 is 9, expected 8"):
            sess.run(None, {"a": GOOD})


# ---- Errors: a clear exception, and the session keeps working -----------------------------------
@pytest.fixture(scope="module")
def loose_elementwise(build):
    """scale_add behind graph inputs with no declared shape, so bad shapes reach the kernel."""
    directory, _, _ = build
    model = write_model(directory, "loose", "scale_add", [("a", F32, None), ("b", F32, None)], [("c", F32, None)])
    return session(model)


def run_scale_add(sess, a, b):
    (c,) = sess.run(None, {"a": a, "b": b})
    np.testing.assert_allclose(c, a + 2 * b, rtol=1e-6)


GOOD = np.ones((4, 8), np.float32)


def test_wrong_shape(loose_elementwise):
    with pytest.raises(Exception, match=r"scale_add.*input 1 dim 1 is 9, expected 8"):
        loose_elementwise.run(None, {"a": GOOD, "b": np.ones((4, 9), np.float32)})
    run_scale_add(loose_elementwise, GOOD, GOOD)


def test_wrong_rank(loose_elementwise):
    with pytest.raises(Exception, match=r"scale_add.*input 0 has rank 3, expected 2"):
        loose_elementwise.run(None, {"a": np.ones((1, 4, 8), np.float32), "b": GOOD})
    run_scale_add(loose_elementwise, GOOD, GOOD)


def test_wrong_dtype(loose_elementwise, build):
    # onnxruntime checks feeds against the graph's declared types before the kernel runs ...
    with pytest.raises(Exception, match="data type"):
        loose_elementwise.run(None, {"a": GOOD.astype(np.float64), "b": GOOD})
    run_scale_add(loose_elementwise, GOOD, GOOD)
    # ... and wiring a wrongly typed tensor into the op fails when the session is created,
    # because each op declares its input element types.
    directory, _, _ = build
    model = write_model(directory, "mistyped", "scale_add", [("a", TensorProto.INT64, None), ("b", F32, None)],
                        [("c", F32, None)])
    with pytest.raises(Exception, match="scale_add|type"):
        session(model)


def test_unnamed_batch_gets_a_fresh_symbol(build, capfd):
    directory, _, _ = build
    model = write_model(directory, "unnamed_batch", "batch_mul", [("x", F32, [None, 16]), ("y", F32, [None, 16])],
                        [("z", F32, None)])
    sess = session(model)
    batch, width = sess.get_outputs()[0].shape
    assert isinstance(batch, str) and batch and width == 16
    x = np.ones((5, 16), np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "y": x})[0], 2 * x)
    assert "does not match actual shape" not in capfd.readouterr().err  # no -1 dim reached ORT


def test_symbol_bound_inconsistently(build):
    directory, _, _ = build
    model = write_model(directory, "loose_symbolic", "batch_mul", [("x", F32, None), ("y", F32, None)],
                        [("z", F32, None)])
    sess = session(model)
    with pytest.raises(Exception, match=r"input 1 dim 0 is 4, but dim 'n' is 3"):
        sess.run(None, {"x": np.ones((3, 16), np.float32), "y": np.ones((4, 16), np.float32)})
    (z,) = sess.run(None, {"x": np.ones((3, 16), np.float32), "y": np.ones((3, 16), np.float32)})
    np.testing.assert_array_equal(z, np.full((3, 16), 2, np.float32))


def test_kernel_reports_its_own_error(build):
    directory, _, _ = build
    model = write_model(directory, "gather", "checked_gather", [("t", F32, [8]), ("i", TensorProto.INT32, [4])],
                        [("o", F32, None)])
    sess = session(model)
    table = np.arange(8, dtype=np.float32) * 10
    with pytest.raises(Exception, match="checked_gather.*gather index out of range"):
        sess.run(None, {"t": table, "i": np.array([1, 2, 9, 0], np.int32)})
    index = np.array([7, 0, 3, 3], np.int32)
    np.testing.assert_array_equal(sess.run(None, {"t": table, "i": index})[0], table[index])


@pytest.mark.parametrize("threads", [1, 2])
def test_failing_parallel_task_reports_its_error(build, threads):
    directory, _, _ = build
    model = write_model(directory, "parallel_gather", "parallel_gather",
                        [("t", F32, [8]), ("i", TensorProto.INT32, ["n"])], [("o", F32, None)])
    sess = session(model, threads)
    table = np.arange(8, dtype=np.float32) * 10
    index = np.arange(20000, dtype=np.int32) % 8
    for bad in (0, len(index) - 1):  # in the first task, and in the last one
        broken = index.copy()
        broken[bad] = -1
        with pytest.raises(Exception, match="parallel_gather.*parallel gather index out of range"):
            sess.run(None, {"t": table, "i": broken})
    np.testing.assert_array_equal(sess.run(None, {"t": table, "i": index})[0], table[index])


# ---- Concurrency -----------------------------------------------------------------------------------
def test_one_session_from_many_threads(build):
    directory, _, _ = build
    model = write_model(directory, "concurrent", "parallel_scale", [("x", F32, ["n", 64])], [("y", F32, None)])
    sess = session(model, threads=2)
    failures = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            x = rng.standard_normal((int(rng.integers(0, 300)), 64), dtype=np.float32)
            (y,) = sess.run(None, {"x": x})
            if y.shape != x.shape or not np.allclose(y, 3 * x, rtol=1e-6):
                failures.append(seed)
                return

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


# ---- The library file ---------------------------------------------------------------------------
def test_library_needs_no_tvm_and_exports_only_the_entry_point(build):
    _, library, _ = build
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    needed = [line for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed and not any("tvm" in line or "onnxruntime" in line for line in needed), needed
    exported = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                              check=True).stdout.split()
    assert "RegisterCustomOps" in exported
    assert not any(name.startswith(("__tvm", "__TVM", "TVMFFI")) for name in exported), exported


def test_build_failures_are_compile_errors(build, tmp_path):
    garbage = tmp_path / "garbage.o"
    garbage.write_bytes(b"not an object file")
    with pytest.raises(CompileError, match="building the kernel library failed"):
        build_library([spec("garbage", [("float32", (1,))], [("float32", (1,))], str(garbage))], tmp_path / "x.so")
    _, _, objects = build
    # The object does not define __tvm_ffi_missing: the link must fail rather than crash later.
    with pytest.raises(CompileError, match="__tvm_ffi_missing"):
        build_library([spec("missing", [("float32", (1,))], [("float32", (1,))], objects["scale_add"])],
                      tmp_path / "y.so")
    assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob(".*partial"))


def small_library_spec(build):
    _, _, objects = build
    return spec("scale_add", [("float32", (4, 8)), ("float32", (4, 8))], [("float32", (4, 8))], objects["scale_add"])


def test_library_builds_with_the_compiler_CC_names(build, tmp_path, monkeypatch):
    """A pip user's CC (here a wrapper with an argument, as in CC="ccache gcc") builds the library."""
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "cc-wrapper"
    wrapper.write_text(f'#!/bin/sh\necho "$1" >> {log}\nshift\nexec gcc "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", f"{wrapper} --from-CC")
    assert resolve_target("native").cc == f"{wrapper} --from-CC"
    library = build_library([small_library_spec(build)], tmp_path / LIBRARY_NAME)
    assert library.is_file() and log.read_text().split() == ["--from-CC"]


def test_a_missing_compiler_says_which_and_how_to_name_one(build, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "onnxfuse-no-such-cc")
    with pytest.raises(CompileError) as built:
        build_library([small_library_spec(build)], tmp_path / LIBRARY_NAME)
    with pytest.raises(UsageError) as checked:
        resolve_target("native").require_toolchain()
    for message in (str(built.value), str(checked.value)):
        assert "'onnxfuse-no-such-cc' is not installed" in message and "set CC to" in message, message
        assert "make install" not in message, message
    assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob(".*partial"))


# ---- Registration: which onnxruntime C API the library asks for ----------------------------------
API_SLOTS = 300  # past the highest slot the library reads (274)
ORT_CREATE_STATUS, ORT_CREATE_CUSTOM_OP_DOMAIN, ORT_CUSTOM_OP_DOMAIN_ADD, ORT_ADD_CUSTOM_OP_DOMAIN = 0, 26, 27, 28
GET_API = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
GET_VERSION_STRING = ctypes.CFUNCTYPE(ctypes.c_void_p)
CREATE_STATUS = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
CREATE_DOMAIN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p))
DOMAIN_ADD = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
ADD_DOMAIN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
FAILED_STATUS, FAKE_DOMAIN, FAKE_OPTIONS = 0x5EED, 0xD0, 0x0B
OP_GET_NAME = 2  # OrtCustomOp's slot of GetName


class FakeRuntime:
    """An OrtApiBase for an onnxruntime whose newest C API is `newest`: it records the versions the
    library asks for, and what it registers, in a table that has only the slots registration uses."""

    def __init__(self, newest: int, version: str):
        self.newest, self.asked, self.statuses, self.ops, self.added = newest, [], [], [], []
        self.version = ctypes.create_string_buffer(version.encode())
        self.callbacks = [  # kept alive as long as the library may call them
            CREATE_STATUS(lambda code, message: self.statuses.append((code, message.decode())) or FAILED_STATUS),
            CREATE_DOMAIN(self.create_domain),
            DOMAIN_ADD(lambda domain, op: self.ops.append((domain, op)) and None),
            ADD_DOMAIN(lambda options, domain: self.added.append((options, domain)) and None),
        ]
        self.table = (ctypes.c_void_p * API_SLOTS)()
        for slot, callback in zip((ORT_CREATE_STATUS, ORT_CREATE_CUSTOM_OP_DOMAIN, ORT_CUSTOM_OP_DOMAIN_ADD,
                                   ORT_ADD_CUSTOM_OP_DOMAIN), self.callbacks):
            self.table[slot] = ctypes.cast(callback, ctypes.c_void_p)
        self.get_api = GET_API(self.api)
        self.get_version = GET_VERSION_STRING(lambda: ctypes.addressof(self.version))
        self.base = (ctypes.c_void_p * 2)(ctypes.cast(self.get_api, ctypes.c_void_p),
                                          ctypes.cast(self.get_version, ctypes.c_void_p))

    def api(self, version):
        self.asked.append(version)
        return ctypes.addressof(self.table) if 1 <= version <= self.newest else None

    def create_domain(self, name, out):
        assert name == DOMAIN.encode()
        out[0] = FAKE_DOMAIN
        return None

    def register(self, library, tmp_path):
        """RegisterCustomOps from a fresh copy of `library` (its registration state is per load)."""
        copy = tmp_path / f"fresh-{len(list(tmp_path.iterdir()))}.so"
        shutil.copyfile(library, copy)
        register = ctypes.CDLL(str(copy)).RegisterCustomOps
        register.restype, register.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]
        return register(FAKE_OPTIONS, ctypes.addressof(self.base))


def test_a_newer_onnxruntime_is_asked_for_the_oldest_api_the_library_needs(build, tmp_path):
    """API 17 is the oldest with every slot the library reads. A runtime that knows a newer one
    hands out the same, grown table; asking for its newest would only shut out older runtimes."""
    _, library, objects = build
    runtime = FakeRuntime(newest=40, version="1.40.0")
    assert runtime.register(library, tmp_path) is None
    assert runtime.asked == [17, 24] and runtime.statuses == []  # 24: dims read without allocating, if it has it
    assert runtime.added == [(FAKE_OPTIONS, FAKE_DOMAIN)]
    assert {domain for domain, _ in runtime.ops} == {FAKE_DOMAIN}
    get_name = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)
    names = [get_name(ctypes.c_void_p.from_address(op + OP_GET_NAME * ctypes.sizeof(ctypes.c_void_p)).value)(op)
             for _, op in runtime.ops]
    assert sorted(n.decode() for n in names) == sorted(objects)
    op_versions = {ctypes.c_uint32.from_address(op).value for _, op in runtime.ops}
    assert op_versions == {17}, "ORT reads an OrtCustomOp only as far as its version says"


def test_an_older_onnxruntime_gets_a_clear_status(build, tmp_path):
    _, library, _ = build
    runtime = FakeRuntime(newest=16, version="1.16.3")
    assert runtime.register(library, tmp_path) == FAILED_STATUS
    assert runtime.asked == [17, 1] and runtime.ops == [] and runtime.added == []
    assert runtime.statuses == [(1, "onnxfuse kernels need onnxruntime 1.17 or newer (C API 17); this is 1.16.3")]


# ---- onnxfuse.InferenceSession and session_options -------------------------------------------------
@pytest.mark.parametrize("name", ["../" + LIBRARY_NAME, "/tmp/" + LIBRARY_NAME, "sub/x.so", "..", "", "a\\b.so"])
def test_model_cannot_point_outside_its_directory(build, name):
    directory, _, _ = build
    model = write_model(directory, "escape", "scale_add", [("a", F32, [4, 8]), ("b", F32, [4, 8])],
                        [("c", F32, None)], library_name=name)
    with pytest.raises(ValueError, match="bare file name"):
        onnxfuse.InferenceSession(str(model))


def test_plain_model_runs_as_plain_onnxruntime(tmp_path):
    node = helper.make_node("Add", ["a", "b"], ["c"])
    graph = helper.make_graph([node], "plain", [helper.make_tensor_value_info(n, F32, [2]) for n in "ab"],
                              [helper.make_tensor_value_info("c", F32, [2])])
    path = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    sess = onnxfuse.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert isinstance(sess, ort.InferenceSession)
    ones = np.ones(2, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"a": ones, "b": ones})[0], 2 * ones)


def test_session_options_copies_without_mutating_base(build):
    _, library, _ = build
    base = ort.SessionOptions()
    base.intra_op_num_threads = 3
    base.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    base.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options = onnxfuse.session_options(library, base=base)
    assert options is not base
    assert options.intra_op_num_threads == 3
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert onnxfuse.session_options(library).intra_op_num_threads == 0


# ---- Reading input dims: without allocating (C API 24+) and the older way ---------------------------
SHAPE_PROBE = """
import sys, numpy as np, onnxfuse
a, b = np.ones((4, 8), np.float32), np.full((4, 8), 3, np.float32)
loose = onnxfuse.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
symbolic = onnxfuse.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
print("sum", float(loose.run(None, {"a": a, "b": b})[0].sum()))
for sess, feeds in ((loose, {"a": a, "b": np.ones((4, 9), np.float32)}), (loose, {"a": a[None], "b": b}),
                    (symbolic, {"x": np.ones((3, 16), np.float32), "y": np.ones((4, 16), np.float32)})):
    try:
        sess.run(None, feeds)
        print("ran")
    except Exception as error:
        print(str(error).splitlines()[-1].split(": ", 1)[-1][-70:])
"""


@pytest.mark.parametrize("api", [None, "23"], ids=["by-reference", "api-23"])
def test_input_dims_are_read_alike_with_and_without_the_allocation_free_call(build, api):
    """onnxruntime 1.24+ (C API 24) hands a tensor's dims without allocating an info object per
    input per call; older ones (ONNXFUSE_ORT_API=23 emulates one) take the allocating calls. Both
    bind the same dims and refuse the same wrong ones."""
    directory, _, _ = build
    loose = write_model(directory, "loose", "scale_add", [("a", F32, None), ("b", F32, None)], [("c", F32, None)])
    symbolic = write_model(directory, "loose_symbolic", "batch_mul", [("x", F32, None), ("y", F32, None)],
                           [("z", F32, None)])
    env = {**os.environ, **({"ONNXFUSE_ORT_API": api} if api else {})}
    done = subprocess.run([sys.executable, "-c", SHAPE_PROBE, str(loose), str(symbolic)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"sum {4 * 8 * 7.0}"
    assert lines[1].endswith("input 1 dim 1 is 9, expected 8")
    assert lines[2].endswith("input 0 has rank 3, expected 2")
    assert "input 1 dim 0 is 4, but dim 'n' is 3" in lines[3]
