"""onnxfuse as a library others install: the wheel, its dependency range, its license, its help."""

from __future__ import annotations

import json
import pydoc
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import onnxfuse

ROOT = Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_onnxruntime_has_no_upper_bound():
    """A `<1.32` pin once downgraded a newer onnxruntime in the user's environment."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ort,) = [d for d in deps if d.startswith("onnxruntime")]
    assert "<" not in ort and ">=" in ort


def test_license_and_type_marker_ship():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0" and project["project"]["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "onnxfuse" / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["onnxfuse"]


def test_help_names_every_public_function():
    text = pydoc.render_doc(onnxfuse, renderer=pydoc.plaintext)
    for name in ("optimize(", "plan(", "verify_models(", "InferenceSession("):
        assert name in text
    for name in ("optimize", "plan", "verify_models"):
        assert ">>>" in getattr(onnxfuse, name).__doc__


def test_readme_stays_short_and_shows_the_api():
    readme = (ROOT / "README.md").read_text()
    assert len(readme) <= 12_000
    for call in ("onnxfuse.optimize(", "onnxfuse.plan(", "onnxfuse.verify_models(", "onnxfuse.InferenceSession("):
        assert call in readme


@pytest.mark.slow
def test_wheel_installs_and_runs_from_another_directory(tmp_path):
    wheels, env, work = tmp_path / "wheels", tmp_path / "env", tmp_path / "work"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "-w", str(wheels), "--no-deps", "-q"],
                   check=True, timeout=600, cwd=tmp_path)
    (wheel,) = wheels.glob("onnxfuse-*.whl")
    subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
    pip = env / "bin" / "pip"
    subprocess.run([str(pip), "install", "-q", str(wheel)], check=True, timeout=900)
    work.mkdir()
    shutil.copy(ROOT / "models" / "diamond.onnx", work / "m.onnx")
    cli = subprocess.run([str(env / "bin" / "onnxfuse"), "optimize", "m.onnx", "-o", "out/m.fused.onnx", "--report", "-",
                          "--cache-dir", "cache", "--fail-on-fallback", "--min-fused", "1"],
                         cwd=work, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["fused_fraction"] == 1.0
    script = ("import onnxfuse, numpy as np\n"
              "assert 'site-packages' in onnxfuse.__file__, onnxfuse.__file__\n"
              "r = onnxfuse.optimize('m.onnx', 'api/m.fused.onnx', cache_dir='cache')\n"
              "check = onnxfuse.verify_models('m.onnx', r.model_path)\n"
              "sess = onnxfuse.InferenceSession(str(r.model_path))\n"
              "x = np.ones((2, 32), np.float32)\n"
              "print(check.ok, r.report['groups_cached'], sess.run(None, {sess.get_inputs()[0].name: x})[0].shape)\n")
    api = subprocess.run([str(env / "bin" / "python"), "-c", script], cwd=work, capture_output=True, text=True, timeout=600)
    assert api.returncode == 0, api.stderr
    assert api.stdout.split()[:2] == ["True", "1"]
