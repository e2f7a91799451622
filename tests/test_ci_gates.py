"""onnxfuse as a CI step: gates that fail a run, the versioned report, verify --json, and fused
nodes that say what they replaced."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
import tvm
from click.testing import CliRunner
from conftest import MODELS, assert_outputs_match, run_both
from onnx_builder import model, node, resnet_block
from onnxfuse_cli.main import main

import onnxfuse
from onnxfuse.gates import gate_failures, is_compute_op
from onnxfuse.kernel_spec import DOMAIN


@pytest.fixture
def half_fails(tmp_path):
    """Two groups: Celu has no TVM frontend (its group fails), Sigmoid+Tanh compiles; 2 of 4
    compute nodes can be fused, plus a Reshape (shape plumbing) that counts on neither side."""
    m = model(
        [node("Celu", ["x"], "c"), node("Neg", ["c"], "y1"),
         node("Sigmoid", ["x"], "s"), node("Tanh", ["s"], "t"),
         node("Reshape", ["t", "shape"], "y2")],
        {"x": (4, 8)}, {"y1": (4, 8), "y2": (32,)}, {"shape": np.array([32], dtype=np.int64)},
    )
    path = tmp_path / "mixed.onnx"
    onnx.save(m, str(path))
    return path


def optimize_cli(*args):
    return CliRunner().invoke(main, ["optimize", *map(str, args)])


def test_fail_on_fallback_exits_1_after_writing_output_and_report(half_fails, tmp_path, cache):
    out, report = tmp_path / "o" / "m.fused.onnx", tmp_path / "o" / "r.json"
    plain = optimize_cli(half_fails, "-o", out, "--cache-dir", cache, "-q", "-j", "1")
    assert plain.exit_code == 0, plain.output

    gated = optimize_cli(half_fails, "-o", out, "--report", report, "--cache-dir", cache, "-q", "--fail-on-fallback")
    assert gated.exit_code == 1, gated.output
    assert "gate failed: --fail-on-fallback: 1 group(s) fell back" in gated.stderr and "Celu" in gated.stderr
    data = json.loads(report.read_text())
    (failed,) = [g for g in data["groups"] if g["status"] == "fallback"]
    assert failed["fallback_kind"] == "failed" and "Celu" in failed["op_types"]
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    assert_outputs_match(*run_both(half_fails, out, {"x": x}))  # the output is still usable


def test_min_fused_counts_compute_nodes_only(half_fails, tmp_path, cache):
    out = tmp_path / "m.fused.onnx"
    at_half = optimize_cli(half_fails, "-o", out, "--cache-dir", cache, "-q", "--min-fused", "0.5")
    assert at_half.exit_code == 0, at_half.output
    assert "2 of 4 compute nodes" in at_half.output
    above = optimize_cli(half_fails, "-o", out, "--cache-dir", cache, "-q", "--min-fused", "0.51")
    assert above.exit_code == 1
    assert "--min-fused 0.51: 2 of 4 compute nodes fused (50.0%)" in above.stderr
    assert out.is_file()


def test_selection_is_not_a_failed_fallback(tmp_path, cache):
    """`auto` leaves convolutions over 32 channels to onnxruntime on purpose: --fail-on-fallback
    lets that pass."""
    source = tmp_path / "block.onnx"
    onnx.save(resnet_block(32, 16), str(source))
    result = optimize_cli(source, "-o", tmp_path / "c.onnx", "--cache-dir", cache, "-q", "--fail-on-fallback")
    assert result.exit_code == 0, result.output
    # the Convs are planned out of every group (select/auto.py), so none fails; their epilogue fuses
    assert "0 fell back; 2 of 5 nodes fused" in result.output  # 2 batch norms folded into their Convs


def test_timed_out_groups_fail_the_gate_and_show_their_real_time(tmp_path):
    """Every group timed out: 0 of 14 nodes fused used to exit 0, and the fallback said 0.00s."""
    out, report = tmp_path / "cell.fused.onnx", tmp_path / "r.json"
    result = optimize_cli(MODELS / "lstm_cell.onnx", "-o", out, "--report", report, "--no-cache",
                          "--compile-timeout", "1", "--fail-on-fallback", "--min-fused", "0.1")
    assert result.exit_code == 1, result.output
    data = json.loads(report.read_text())
    assert data["fused_fraction"] == 0.0 and data["groups_failed"] == 1
    (group,) = data["groups"]
    assert group["reason"] == "compile timed out after 1s" and group["fallback_kind"] == "failed"
    assert group["compile_seconds"] >= 1.0
    line = next(ln for ln in result.stderr.splitlines() if "timed out" in ln and "[1/1]" in ln)
    assert float(line.rsplit(" ", 1)[1].rstrip("s")) >= 1.0
    assert len(gate_failures(data, fail_on_fallback=True, min_fused=0.1)) == 2


def test_shape_plumbing_is_not_compute():
    assert not any(map(is_compute_op, ["Constant", "Shape", "Reshape", "Unsqueeze", "Identity"]))
    assert all(map(is_compute_op, ["MatMul", "Add", "Gather", "Cast", "Concat"]))


def test_report_is_versioned_and_names_tools_target_and_timings(tmp_path, cache):
    result = optimize_cli(MODELS / "lstm_gate.onnx", "-o", tmp_path / "g.onnx", "--report", "-", "--cache-dir", cache,
                          "--mcpu", "skylake", "--mattr", "+avx2")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)  # stdout is the report alone; the summary went to stderr
    assert "lstm_gate.onnx →" in result.stderr and not (tmp_path / "-").exists()
    assert report["schema_version"] == 1
    assert report["versions"] == {"onnxfuse": onnxfuse.__version__, "tvm": tvm.__version__,
                                  "onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__}
    assert report["target"]["cpu"] == "skylake" and report["target"]["features"] == ["+avx2"]
    assert report["target"]["triple"].startswith(("x86_64", "aarch64"))
    assert set(report["timings"]) >= {"load", "plan", "compile", "package"}
    assert all("compile_seconds" in g for g in report["groups"])
    assert report["fused_node_count"] == report["node_count"]


def test_report_fields_are_all_documented():
    """docs/report.md states the schema: every top-level and group field the report has."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "report.md").read_text()
    fields = ["schema_version", "model", "output", "library", "external_data", "versions", "target", "seconds",
              "timings", "node_count", "fused_node_count", "compute_node_count", "fused_compute_node_count",
              "fused_fraction", "groups_total", "groups_compiled", "groups_cached", "groups_fallback", "groups_failed",
              "options", "groups", "unfused", "measured", "status", "fallback_kind", "reason", "kernel",
              "compile_seconds", "node_indices", "op_types"]
    missing = [f for f in fields if f"`{f}`" not in doc]
    assert not missing


def test_fused_nodes_name_what_they_replaced_and_the_model_names_its_target(tmp_path, cache):
    result = onnxfuse.optimize(MODELS / "lstm_cell.onnx", tmp_path / "c.onnx", cache_dir=cache, jobs=1)
    fused = onnx.load(str(result.model_path))
    (custom,) = [n for n in fused.graph.node if n.domain == DOMAIN]
    original = onnx.load(str(MODELS / "lstm_cell.onnx")).graph.node
    assert custom.doc_string.startswith("onnxfuse kernel for group_0: 14 nodes [")
    for n in original:
        assert f"{n.name} ({n.op_type})" in custom.doc_string
    meta = {p.key: p.value for p in fused.metadata_props}
    target = result.report["target"]
    assert meta["onnxfuse.target.triple"] == target["triple"] and meta["onnxfuse.target.cpu"] == target["cpu"]


def test_huge_group_doc_string_is_bounded(tmp_path, cache):
    nodes = [node("Relu", ["x"], "a0")] + [node("Neg" if i % 2 else "Abs", [f"a{i}"], f"a{i + 1}") for i in range(199)]
    path = tmp_path / "chain.onnx"
    onnx.save(model(nodes, {"x": (2, 3)}, {"a199": (2, 3)}), str(path))
    result = onnxfuse.optimize(path, tmp_path / "chain.fused.onnx", cache_dir=cache, jobs=1)
    (custom,) = [n for n in onnx.load(str(result.model_path)).graph.node if n.domain == DOMAIN]
    assert "200 nodes" in custom.doc_string and "… and 176 more" in custom.doc_string
    assert len(custom.doc_string) < 1000


def test_verify_json_verdict(tmp_path, cache):
    out = tmp_path / "d.onnx"
    onnxfuse.optimize(MODELS / "diamond.onnx", out, cache_dir=cache, jobs=1)
    ok = CliRunner().invoke(main, ["verify", str(MODELS / "diamond.onnx"), str(out), "--json"])
    assert ok.exit_code == 0, ok.output
    verdict = json.loads(ok.stdout)
    assert verdict["ok"] is True and verdict["runs"] == 3 and verdict["outputs"][0]["ok"] is True
    assert verdict["bitwise"] is True and verdict["outputs"][0]["differing_elements"] == 0
    assert verdict["outputs"][0]["elements"] > 0
    for name, op in (("a.onnx", "Relu"), ("b.onnx", "Sigmoid")):
        onnx.save(model([node(op, ["x"], "y")], {"x": (2, 3)}, {"y": (2, 3)}), str(tmp_path / name))
    bad = CliRunner().invoke(main, ["verify", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), "--json"])
    assert bad.exit_code == 1
    verdict = json.loads(bad.stdout)
    assert verdict["ok"] is False and verdict["worst"] == "y" and verdict["outputs"][0]["max_abs_error"] > 0.1
    assert verdict["bitwise"] is False and verdict["outputs"][0]["differing_elements"] > 0


def test_verify_tells_close_answers_from_the_same_bits(tmp_path):
    """Outputs one ulp apart pass the tolerance; the verdict still says they are not the same bits."""
    for name, factor in (("a.onnx", 1.0), ("b.onnx", 1.0000001)):
        onnx.save(model([node("Mul", ["x", "k"], "y")], {"x": (4, 8)}, {"y": (4, 8)},
                        {"k": np.array(factor, np.float32)}), str(tmp_path / name))
    close = CliRunner().invoke(main, ["verify", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), "--runs", "1"])
    assert close.exit_code == 0, close.output
    assert "elements differ" in close.output and "bit for bit" not in close.output
    same = CliRunner().invoke(main, ["verify", str(tmp_path / "a.onnx"), str(tmp_path / "a.onnx"), "--runs", "1"])
    assert same.exit_code == 0 and "match, bit for bit" in same.output and "y: same bits" in same.output
