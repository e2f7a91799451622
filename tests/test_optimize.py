"""End to end: optimize → load in onnxruntime with our library → compare with the original.

Every comparison is against onnxruntime running the original model, or against the expected
outputs the ONNX backend test data ships.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from conftest import MODELS, assert_outputs_match, run_both
from onnx import numpy_helper
from onnx_builder import model, node, resnet_block
from onnxfuse_cli.main import main

import onnxfuse
from onnxfuse import optimize
from onnxfuse.errors import CompileError
from onnxfuse.session import quiet_session_options

BACKEND = Path(onnx.__file__).parent / "backend" / "test" / "data"


def random_inputs(path: Path, batch: int, seed: int = 0) -> dict:
    """Float inputs drawn normal; the symbolic batch dimension set to `batch`."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in onnx.load(str(path), load_external_data=False).graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


BUNDLED = [
    "lstm_gate", "lstm_cell", "gru_cell", "tree_trav_d3", "tree_trav_d8", "perf_tree_trav_d3",
    "perf_tree_trav_d8", "conv_block", "transformer_mlp", "diamond", "concat_exit",
]


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_model_matches_onnxruntime(name, tmp_path, cache):
    source = MODELS / f"{name}.onnx"
    result = optimize(source, tmp_path / f"{name}.fused.onnx", cache_dir=cache, jobs=1, select="all")
    report = result.report
    assert report["groups_total"] >= 1
    assert report["groups_fallback"] == 0, [g.get("reason") for g in report["groups"]]
    assert result.library_path.is_file()
    for batch in (1, 5, 64):
        expected, actual = run_both(source, result.model_path, random_inputs(source, batch, seed=batch))
        assert_outputs_match(expected, actual)


@pytest.mark.parametrize("name", ["lstm_gate", "lstm_cell", "gru_cell"])
def test_recurrent_cell_becomes_one_kernel(name, tmp_path, cache):
    """MatMul, Split and every gate op in ONE custom op: the whole cell is one node."""
    result = optimize(MODELS / f"{name}.onnx", tmp_path / "cell.fused.onnx", cache_dir=cache, jobs=1)
    fused = onnx.load(str(result.model_path))
    assert [n.domain for n in fused.graph.node] == ["ai.onnxfuse"]
    (group,) = result.report["groups"]
    assert {"MatMul", "Split", "Sigmoid", "Tanh"} <= set(group["op_types"])


def test_parallel_kernel_and_its_serial_twin_match_onnxruntime(tmp_path, cache):
    """The LSTM cell's kernel has a parallel row loop over the batch, so it also carries a serial
    twin: batch 20 is too little work for onnxruntime's pool (the twin runs), batch 300 is not
    (the parallel kernel runs on the pool); both on 1 and 2 threads."""
    source = MODELS / "lstm_cell.onnx"
    result = optimize(source, tmp_path / "cell.fused.onnx", cache_dir=cache, jobs=1, select="all")
    (group,) = result.report["groups"]
    assert group["stats"]["parallel"] and group["stats"]["serial_variant"]
    row_work = group["stats"]["row_work"]
    assert 20 * row_work < (1 << 20) <= 300 * row_work  # the runtime's POOL_MIN_WORK
    reference = ort.InferenceSession(str(source), quiet_session_options(), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        options = quiet_session_options()
        options.intra_op_num_threads = threads
        candidate = onnxfuse.InferenceSession(str(result.model_path), options, providers=["CPUExecutionProvider"])
        for batch in (20, 300):
            feeds = random_inputs(source, batch, seed=batch)
            assert_outputs_match(reference.run(None, feeds), candidate.run(None, feeds))


def _offset_view(values: np.ndarray, byte_offset: int) -> np.ndarray:
    """A float32 copy of `values` whose data starts `byte_offset` bytes past a 64-byte boundary."""
    storage = np.zeros(values.nbytes + 128, np.uint8)
    start = (-storage.ctypes.data) % 64 + byte_offset
    view = storage[start:start + values.nbytes].view(np.float32).reshape(values.shape)
    view[...] = values
    return view


@pytest.mark.parametrize("name", ["diamond", "lstm_cell"])
@pytest.mark.parametrize("byte_offset", [4, 16])
def test_unaligned_input_memory(tmp_path, cache, name, byte_offset):
    """Numpy memory is rarely 64-byte aligned (large arrays sit 16 bytes past a page boundary):
    kernels read it in place, elementwise and GEMM alike, and results must not change."""
    source = MODELS / f"{name}.onnx"
    result = optimize(source, tmp_path / f"{name}.fused.onnx", cache_dir=cache, jobs=1)
    for batch in (1, 7, 33):
        feeds = {k: _offset_view(v, byte_offset) for k, v in random_inputs(source, batch, seed=batch).items()}
        assert all(v.ctypes.data % 64 == byte_offset for v in feeds.values())
        expected, actual = run_both(source, result.model_path, feeds)
        assert_outputs_match(expected, actual)


def test_input_not_even_element_aligned(tmp_path, cache):
    """A float32 tensor at an odd address is copied to aligned memory before the kernel runs."""
    source = MODELS / "lstm_gate.onnx"
    result = optimize(source, tmp_path / "gate.fused.onnx", cache_dir=cache, jobs=1)
    feeds = {k: _offset_view(v, 1) for k, v in random_inputs(source, 5).items()}
    assert all(v.ctypes.data % 4 == 1 for v in feeds.values())
    expected, actual = run_both(source, result.model_path, feeds)
    assert_outputs_match(expected, actual)


def test_second_optimize_compiles_nothing(tmp_path):
    cache_dir = tmp_path / "cache"
    first = optimize(MODELS / "tree_trav_d3.onnx", tmp_path / "a" / "t.fused.onnx", cache_dir=cache_dir, jobs=1)
    second = optimize(MODELS / "tree_trav_d3.onnx", tmp_path / "b" / "t.fused.onnx", cache_dir=cache_dir, jobs=1)
    assert first.report["groups_compiled"] >= 1
    assert second.report["groups_compiled"] == 0
    assert second.report["groups_cached"] == first.report["groups_total"]
    for result in (first, second):
        assert result.model_path.read_bytes() == first.model_path.read_bytes()
        assert result.library_path.read_bytes() == first.library_path.read_bytes()


def test_same_input_gives_byte_identical_files(tmp_path):
    outs = []
    for run in ("one", "two"):
        result = optimize(MODELS / "lstm_cell.onnx", tmp_path / run / "cell.fused.onnx", cache_dir=False, jobs=1)
        outs.append((result.model_path.read_bytes(), result.library_path.read_bytes()))
    assert outs[0] == outs[1]


def test_group_that_cannot_compile_falls_back(tmp_path, cache):
    """Celu has no TVM frontend: its group stays as ONNX nodes, the other group is fused."""
    m = model(
        [
            node("Celu", ["x"], "c"), node("Neg", ["c"], "y1"),
            node("Sigmoid", ["x"], "s"), node("Tanh", ["s"], "y2"),
        ],
        {"x": (4, 8)}, {"y1": (4, 8), "y2": (4, 8)},
    )
    source = tmp_path / "mixed.onnx"
    onnx.save(m, str(source))
    result = optimize(source, tmp_path / "mixed.fused.onnx", cache_dir=cache, jobs=1)
    statuses = {tuple(g["op_types"]): g for g in result.report["groups"]}
    assert statuses[("Celu", "Neg")]["status"] == "fallback"
    assert "Celu" in statuses[("Celu", "Neg")]["reason"]
    assert statuses[("Sigmoid", "Tanh")]["status"] == "compiled"
    ops = [n.op_type for n in onnx.load(str(result.model_path)).graph.node]
    assert "Celu" in ops and "Neg" in ops and "Sigmoid" not in ops
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    expected, actual = run_both(source, result.model_path, {"x": x})
    assert_outputs_match(expected, actual)


def test_failed_run_leaves_no_files(tmp_path, monkeypatch, cache):
    import onnxfuse.pipeline as optimize_module

    def broken(*args, **kwargs):
        raise CompileError("library: linker exploded")

    monkeypatch.setattr(optimize_module, "build_library", broken)
    out = tmp_path / "out"
    with pytest.raises(CompileError):
        optimize(MODELS / "lstm_gate.onnx", out / "gate.fused.onnx", cache_dir=cache, jobs=1)
    assert not out.exists() or list(out.iterdir()) == []


def test_parallel_jobs_give_the_same_model(tmp_path):
    serial = optimize(MODELS / "conv_block.onnx", tmp_path / "s" / "c.fused.onnx", cache_dir=False, jobs=1, select="all")
    parallel = optimize(MODELS / "conv_block.onnx", tmp_path / "p" / "c.fused.onnx", cache_dir=False, jobs=2,
                        select="all")
    assert serial.model_path.read_bytes() == parallel.model_path.read_bytes()
    assert parallel.report["groups_compiled"] == 2


# -- the CLI ---------------------------------------------------------------------------------------

def test_cli_optimize_report_and_verify(tmp_path, cache):
    out = tmp_path / "gate.fused.onnx"
    report = tmp_path / "report.json"
    runner = CliRunner()
    result = runner.invoke(main, ["optimize", str(MODELS / "lstm_gate.onnx"), "-o", str(out), "--report", str(report),
                                  "--cache-dir", str(cache), "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["groups"][0]["status"] in ("compiled", "cached")
    assert data["groups"][0]["kernel"].startswith("k_")
    verified = runner.invoke(main, ["verify", str(MODELS / "lstm_gate.onnx"), str(out), "--dim", "N=17"])
    assert verified.exit_code == 0, verified.output
    assert "match" in verified.output


def test_cli_verify_exits_1_on_mismatch(tmp_path):
    for name, op in (("a.onnx", "Relu"), ("b.onnx", "Sigmoid")):
        onnx.save(model([node(op, ["x"], "y")], {"x": (2, 3)}, {"y": (2, 3)}), str(tmp_path / name))
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx")])
    assert result.exit_code == 1
    assert "MISMATCH" in result.output


def test_cli_optimize_bad_input_exits_2(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    result = CliRunner().invoke(main, ["optimize", str(bad), "-o", str(tmp_path / "o.onnx")])
    assert result.exit_code == 2
    assert not (tmp_path / "o.onnx").exists()


def test_cli_optimize_ir_version_onnxruntime_cannot_load_exits_2(tmp_path):
    """onnx's make_model stamps its newest IR version; the message says which one to use."""
    too_new = model([node("Relu", ["x"], "a"), node("Neg", ["a"], "y")], {"x": (2, 3)}, {"y": (2, 3)})
    too_new.ir_version = 99
    with pytest.raises(Exception, match="IR version"):
        ort.InferenceSession(too_new.SerializeToString(), providers=["CPUExecutionProvider"])
    path = tmp_path / "new.onnx"
    onnx.save(too_new, str(path))
    result = CliRunner().invoke(main, ["optimize", str(path), "-o", str(tmp_path / "o.onnx")])
    assert result.exit_code == 2, result.output
    assert "IR version 99 is newer than the installed onnxruntime loads (up to " in result.output
    assert len(result.output.strip().splitlines()) == 1 and "onnxruntime_src" not in result.output
    assert not (tmp_path / "o.onnx").exists()


# -- real models: the ONNX backend test data -------------------------------------------------------

def light_inputs(path: Path) -> dict:
    """The inputs the ONNX backend runner feeds light models: arange(n)/n in the input's shape."""
    feeds = {}
    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


LIGHT = sorted((BACKEND / "light").glob("*.onnx"))


@pytest.mark.slow
@pytest.mark.parametrize("path", LIGHT, ids=lambda p: p.stem)
def test_light_model_reproduces_shipped_outputs(path, tmp_path, cache):
    result = optimize(path, tmp_path / f"{path.stem}.fused.onnx", cache_dir=cache, jobs=1, select="all")
    assert result.report["groups_compiled"] + result.report["groups_cached"] >= 1
    feeds = light_inputs(path)
    expected, actual = run_both(path, result.model_path, feeds)
    assert_outputs_match(expected, actual, rtol=1e-3, atol=1e-5)
    shipped = numpy_helper.to_array(onnx.load_tensor(str(path.with_name(f"{path.stem}_output_0.pb"))))
    assert_outputs_match([shipped], actual[:1], rtol=1e-3, atol=1e-5)


def _ort_can_run(model_dir: Path) -> bool:
    try:
        ort.InferenceSession(str(model_dir / "model.onnx"), quiet_session_options(), providers=["CPUExecutionProvider"])
        return True
    except Exception:
        return False


OPERATOR_DIRS = sorted(d for d in (BACKEND / "pytorch-operator").iterdir() if (d / "model.onnx").is_file())


@pytest.mark.parametrize("model_dir", OPERATOR_DIRS, ids=lambda d: d.name)
def test_pytorch_operator_model_reproduces_shipped_outputs(model_dir, tmp_path, cache):
    if not _ort_can_run(model_dir):
        pytest.skip("onnxruntime itself cannot run this model (opset-6 kernels it no longer has)")
    result = optimize(model_dir / "model.onnx", tmp_path / "m.fused.onnx", cache_dir=cache, jobs=1, select="all")
    assert result.report["groups_fallback"] == 0, result.report["groups"]
    data = sorted(model_dir.glob("test_data_set_*"))[0]
    inputs = [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob("input_*.pb"))]
    outputs = [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob("output_*.pb"))]
    session = onnxfuse.InferenceSession(str(result.model_path), quiet_session_options(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    actual = session.run(None, dict(zip(names, inputs)))
    assert_outputs_match(outputs, actual, rtol=1e-3, atol=1e-5)


# -- external data (models over protobuf's 2 GB limit keep their weights in files) --------------

def test_model_with_external_weights(tmp_path, cache):
    m = onnx.load(str(MODELS / "lstm_cell.onnx"))
    source = tmp_path / "ext" / "cell.onnx"
    source.parent.mkdir()
    onnx.save_model(m, str(source), save_as_external_data=True, location="cell.weights", size_threshold=1024)
    assert (source.parent / "cell.weights").is_file()
    result = optimize(source, tmp_path / "out" / "cell.fused.onnx", cache_dir=cache, jobs=1)
    assert result.report["groups_fallback"] == 0
    feeds = random_inputs(source, 3)
    expected, actual = run_both(source, result.model_path, feeds)
    assert_outputs_match(expected, actual)


def test_large_output_is_written_with_external_data(tmp_path, cache, monkeypatch):
    import onnxfuse.pipeline as optimize_module

    monkeypatch.setattr(optimize_module, "EXTERNAL_DATA_THRESHOLD", 10_000)  # stands in for 2 GB
    source = MODELS / "lstm_cell.onnx"
    result = optimize(source, tmp_path / "cell.fused.onnx", cache_dir=cache, jobs=1)
    data_file = tmp_path / "cell.fused.onnx.data"
    assert data_file.is_file() and data_file.stat().st_size > 10_000
    assert result.model_path.stat().st_size < 10_000
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    expected, actual = run_both(source, result.model_path, random_inputs(source, 2))
    assert_outputs_match(expected, actual)


def test_auto_selection_leaves_convolutions_to_onnxruntime(tmp_path, cache):
    """Two 3x3 convolutions over 32 channels (where onnxruntime's blocked kernel is faster than
    ours, select/auto.py) with a residual Add + Relu: only that epilogue becomes a kernel."""
    source = tmp_path / "c.onnx"
    onnx.save(resnet_block(32, 16, batch_norm=False), str(source))
    result = optimize(source, tmp_path / "c.fused.onnx", cache_dir=cache, jobs=1)
    assert [g["op_types"] for g in result.report["groups"]] == [["Add", "Relu"]]  # the residual epilogue
    convs = [u for u in result.report["unfused"] if u["op_type"] == "Conv"]
    assert len(convs) == 2 and all(u["reason"].startswith("opaque: auto: onnxruntime's Conv") for u in convs)
    expected, actual = run_both(source, result.model_path, random_inputs(source, 2))
    assert_outputs_match(expected, actual)


def test_duplication_bound_reaches_the_kernel_and_the_cache_key(tmp_path, cache):
    source = MODELS / "tree_trav_d3.onnx"
    kernels = {}
    for bound in (1, 2):
        result = optimize(source, tmp_path / f"d{bound}" / "t.fused.onnx", cache_dir=cache, jobs=1, max_duplication=bound)
        (group,) = result.report["groups"]
        kernels[bound] = group["kernel"]
        assert result.report["options"]["max_duplication"] == bound
        assert group["stats"]["max_duplication"] == bound
        expected, actual = run_both(source, result.model_path, random_inputs(source, 9))
        assert_outputs_match(expected, actual)
    assert kernels[1] != kernels[2]


def test_verification_runs_both_gemm_variants(tmp_path, monkeypatch):
    """A MatMul group over a symbolic batch has a small-batch variant; verification must also run
    a batch the main (row-tiled) schedule handles, not only the small sizes 1 and 3."""
    from onnxfuse.codegen.compile import CompiledGroup, compile_group
    from onnxfuse.codegen.worker import verify_kernel
    from onnxfuse.target import resolve_target

    w = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    group = model([node("MatMul", ["x", "w"], "m"), node("Sigmoid", ["m"], "y")],
                  {"x": ("N", 16)}, {"y": ("N", 32)}, {"w": w})
    compiled = compile_group(group, "gemm_variants", resolve_target("native"), tmp_path)
    batches = []
    original_run = CompiledGroup.run
    monkeypatch.setattr(CompiledGroup, "run", lambda self, feeds: batches.append(len(feeds["x"])) or original_run(self, feeds))
    assert verify_kernel(compiled, group)["checked"]
    from onnxfuse.codegen.schedule import RAGGED_TILE_SLACK

    below = compiled.spec.small_batch_below
    assert below == compiled.stats["tile_rows"] - RAGGED_TILE_SLACK
    assert min(batches) < below <= max(batches)


def test_the_python_api_optimizes_twice_in_one_process(tmp_path, cache):
    """`onnxfuse.optimize` is the function on every call (a submodule of that name once shadowed it)."""
    first = onnxfuse.optimize(MODELS / "diamond.onnx", tmp_path / "a" / "d.fused.onnx", cache_dir=cache, jobs=1)
    second = onnxfuse.optimize(MODELS / "diamond.onnx", tmp_path / "b" / "d.fused.onnx", cache_dir=cache, jobs=1)
    assert first.report["fused_node_count"] == second.report["fused_node_count"] == 5
    assert callable(onnxfuse.optimize)
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    feeds = {onnx.load(str(MODELS / "diamond.onnx")).graph.input[0].name: x}
    assert_outputs_match(*run_both(MODELS / "diamond.onnx", second.model_path, feeds))


def test_python_dash_m_onnxfuse_is_the_cli():
    done = subprocess.run([sys.executable, "-m", "onnxfuse", "inspect", str(MODELS / "diamond.onnx")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 fused groups cover 5" in done.stdout
