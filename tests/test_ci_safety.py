"""optimize never destroys its input, checks where it writes before compiling, fails a write in
one line (exit 2) without leaving temp files, and refuses invalid models and its own output."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import MODELS
from onnx import TensorProto, helper, numpy_helper
from onnx_builder import model, node
from onnxfuse_cli.main import main

import onnxfuse
import onnxfuse.pipeline as pipeline
from onnxfuse.errors import ModelLoadError


def run(*args):
    return CliRunner().invoke(main, [*map(str, args)])


def assert_one_line_exit_2(result):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxfuse: error: "), result.output
    assert "Traceback" not in result.output


@pytest.fixture
def no_compiling(monkeypatch):
    """A refusal must come before any group is compiled."""
    def compiles(*args):
        raise AssertionError("compiled before checking the outputs")
    monkeypatch.setattr(pipeline, "_run_compiles", compiles)


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "m.onnx"
    shutil.copy(MODELS / "lstm_gate.onnx", path)
    return path


@pytest.mark.parametrize("output,report", [
    ("m.onnx", None),                   # -o over the input
    ("out.onnx", "m.onnx"),             # --report over the input
    ("out.onnx", "out.onnx"),           # the report over the output
    ("out.onnx", "out.so"),             # the report over the library
    ("m.so.onnx", None),                # harmless: only the names look alike
])
def test_outputs_never_overwrite_the_input_or_each_other(source, tmp_path, output, report, no_compiling, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = source.read_bytes()
    args = ["optimize", "m.onnx", "-o", output, "-q", "--no-cache"] + (["--report", report] if report else [])
    result = run(*args)
    if output == "m.so.onnx":
        assert "compiled before checking" in str(result.exception)  # got past the checks
        return
    assert_one_line_exit_2(result)
    assert "choose another path" in result.output
    assert source.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_output_over_the_inputs_external_data_is_refused(tmp_path, no_compiling):
    source = tmp_path / "m.onnx"
    onnx.save_model(onnx.load(str(MODELS / "lstm_cell.onnx")), str(source), save_as_external_data=True,
                    location="out.onnx.data", size_threshold=0)
    data = (tmp_path / "out.onnx.data").read_bytes()
    result = run("optimize", source, "-o", tmp_path / "out.onnx", "-q")
    assert_one_line_exit_2(result)
    assert "input's external data" in result.output
    assert (tmp_path / "out.onnx.data").read_bytes() == data


def test_a_symlink_to_the_input_is_the_input(source, tmp_path, no_compiling):
    (tmp_path / "link.onnx").symlink_to(source)
    assert_one_line_exit_2(run("optimize", source, "-o", tmp_path / "link.onnx", "-q"))


def test_report_dash_is_stdout_not_a_file(source, tmp_path, cache, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("optimize", "m.onnx", "-o", "out.onnx", "--report", "-", "--cache-dir", cache, "-q")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "-").exists()
    assert result.stdout.lstrip().startswith("{") and "schema_version" in result.stdout


@contextlib.contextmanager
def mounted_tmpfs(where, options):
    """A tmpfs at `where` (root only): a read-only or tiny file system, for real write failures."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and mount to make a read-only or full file system")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_read_only_output_directory_is_refused_before_compiling(source, tmp_path, no_compiling):
    with mounted_tmpfs(tmp_path / "ro", "size=1m,ro") as ro:
        result = run("optimize", source, "-o", ro / "m.fused.onnx", "-q")
        assert_one_line_exit_2(result)
        assert "read-only file system" in result.output
        missing_dir = run("optimize", source, "-o", ro / "new" / "dir" / "m.fused.onnx", "-q")
        assert_one_line_exit_2(missing_dir)
        report_there = run("optimize", source, "-o", tmp_path / "ok.onnx", "--report", ro / "r.json", "-q")
        assert_one_line_exit_2(report_there)
        assert "report" in report_there.output
    assert not (tmp_path / "ok.onnx").exists()


def test_full_disk_is_one_line_and_leaves_no_temp_files(source, tmp_path, cache):
    with mounted_tmpfs(tmp_path / "full", "size=8k") as full:
        result = run("optimize", source, "-o", full / "m.fused.onnx", "--cache-dir", cache, "-q")
        assert_one_line_exit_2(result)
        assert "no space left on the device" in result.output
        assert list(full.iterdir()) == []


def test_write_failure_after_compiling_is_one_line(source, tmp_path, cache, monkeypatch):
    """Where no tmpfs can be mounted: the model write itself fails with ENOSPC."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pipeline, "stage_model", full)
    out = tmp_path / "out"
    result = run("optimize", source, "-o", out / "m.fused.onnx", "--cache-dir", cache, "-q")
    assert_one_line_exit_2(result)
    assert "no space left on the device" in result.output
    assert list(out.iterdir()) == []  # the staged library went too


def test_onnxfuse_output_is_refused(tmp_path, cache):
    first = onnxfuse.optimize(MODELS / "diamond.onnx", tmp_path / "d.fused.onnx", cache_dir=cache, jobs=1)
    result = run("optimize", first.model_path, "-o", tmp_path / "again.onnx", "-q")
    assert_one_line_exit_2(result)
    assert "already optimized by onnxfuse" in result.output


# -- invalid models ---------------------------------------------------------------------------------

def small_model(**changes) -> onnx.ModelProto:
    m = model([node("Relu", ["x"], "a"), node("Neg", ["a"], "y")], {"x": (2, 3)}, {"y": (2, 3)})
    for key, value in changes.items():
        setattr(m, key, value)
    return m


def opset_30():
    m = small_model()
    m.opset_import[0].version = 30
    return m, "opset 30 of the default ONNX domain is newer than the installed onnx"


def undeclared_domain():
    m = small_model()
    m.graph.node[1].domain = "com.example"
    return m, "node 'y' (Neg) is in domain 'com.example', which the model does not import"


@pytest.mark.parametrize("make", [opset_30, undeclared_domain])
def test_invalid_model_exits_2(tmp_path, make, no_compiling):
    broken, message = make()
    path = tmp_path / "bad.onnx"
    onnx.save(broken, str(path))
    result = run("optimize", path, "-o", tmp_path / "o.onnx")
    assert_one_line_exit_2(result)
    assert message in result.output
    verified = run("verify", path, path)
    assert_one_line_exit_2(verified)
    assert message in verified.output


def truncated_external_data(tmp_path, declare_length: bool):
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                          [numpy_helper.from_array(w, "w")])
    path = tmp_path / "t.onnx"
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path),
                    save_as_external_data=True, location="t.data", size_threshold=0)
    if not declare_length:
        header = onnx.load(str(path), load_external_data=False)
        entries = [e for e in header.graph.initializer[0].external_data if e.key != "length"]
        del header.graph.initializer[0].external_data[:]
        header.graph.initializer[0].external_data.extend(entries)
        onnx.save(header, str(path))
    with open(tmp_path / "t.data", "r+b") as f:
        f.truncate(w.nbytes - 100)
    return path


@pytest.mark.parametrize("declare_length", [True, False])
def test_truncated_external_data_exits_2(tmp_path, declare_length, no_compiling):
    path = truncated_external_data(tmp_path, declare_length)
    result = run("optimize", path, "-o", tmp_path / "o.onnx")
    assert_one_line_exit_2(result)
    assert "tensor 'w': t.data holds 16284 bytes from offset 0, the tensor needs 16384" in result.output
    with pytest.raises(ModelLoadError, match="truncated external data"):
        onnxfuse.verify_models(path, path)


def test_external_data_outside_the_model_directory_is_refused(tmp_path, no_compiling):
    path = truncated_external_data(tmp_path, True)
    header = onnx.load(str(path), load_external_data=False)
    for e in header.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../t.data"
    onnx.save(header, str(path))
    assert_one_line_exit_2(run("optimize", path, "-o", tmp_path / "o.onnx"))
