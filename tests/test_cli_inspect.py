"""`onnxfuse inspect`: every ONNX backend test model, bad input, and the JSON contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnxfuse_cli.main import main

from onnxfuse.frontend.loader import load_model

BACKEND_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
BACKEND_MODELS = sorted(
    [p for d in ("light",) for p in (BACKEND_DATA / d).glob("*.onnx")]
    + [p for d in ("pytorch-converted", "pytorch-operator") for p in (BACKEND_DATA / d).glob("*/model.onnx")]
)


def run_inspect(*args: str):
    return CliRunner().invoke(main, ["inspect", *args], catch_exceptions=False)


def test_backend_models_are_found():
    assert len(BACKEND_MODELS) > 100


@pytest.mark.parametrize("path", BACKEND_MODELS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_inspect_succeeds_on_every_backend_model(path):
    result = run_inspect(str(path), "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    covered = [i for g in plan["groups"] for i in g["node_indices"]] + [u["node_index"] for u in plan["unfused"]]
    node_count = len(load_model(str(path)).nodes)  # indices are into the canonicalized model
    assert sorted(covered) == list(range(node_count))
    assert all(u["reason"] for u in plan["unfused"])


def test_json_contract_and_depth_option():
    plan = json.loads(run_inspect("models/tree_trav_d8.onnx", "--json", "--max-depth", "20").output)
    assert plan["groups"] and all(len(g["node_indices"]) <= 20 for g in plan["groups"])
    for g in plan["groups"]:
        assert set(g) >= {"name", "node_indices", "op_types"}
        assert len(g["op_types"]) == len(g["node_indices"])
    assert any("depth bound" in u["reason"] for u in plan["unfused"]) or len(plan["groups"]) > 1


def test_text_output_names_groups_and_reasons():
    result = run_inspect("models/tree_trav_d8.onnx")
    assert result.exit_code == 0
    assert "group_0" in result.output and "unfused:" in result.output and "Gather" in result.output
    assert "a shape" in result.output  # the reason the index set-up stays with onnxruntime


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    good = Path("models/gru_cell.onnx").read_bytes()
    files = {
        "text": b"this is not a model\n",
        "truncated": good[: len(good) // 3],
        "empty": b"",
        "random": os.urandom(4096),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / f"{name}.onnx"
        paths[name].write_bytes(data)
    paths["missing"] = tmp_path / "missing.onnx"
    return paths


def test_bad_input_gives_one_line_and_exit_2(tmp_path):
    for name, path in _bad_inputs(tmp_path).items():
        proc = subprocess.run(
            [sys.executable, "-m", "onnxfuse_cli.main", "inspect", str(path)],
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 2, (name, proc.stderr)
        assert "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("onnxfuse: error:"), (name, proc.stderr)


def test_json_reports_the_duplication_bound():
    plan = json.loads(run_inspect("models/tree_trav_d3.onnx", "--json", "--max-duplication", "3").output)
    assert plan["options"]["max_duplication"] == 3
    (group,) = plan["groups"]
    assert group["max_reuse"] == 4 and group["materialised_values"] == group["reused_values"] == 3
