"""A model over protobuf's 2 GB limit (weights in external data) optimizes and verifies, in memory
below twice its size: it used to fail with `EncodeError: Failed to serialize proto`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

K, H = 8192, 32832  # two weights of K×H float32: just over 2 GiB in all


def write_large_model(folder: Path) -> Path:
    """x → Relu → Add(c) → MatMul(W1) → Relu → MatMul(W2) → Add(b); W1 and W2 in one data file,
    written tensor by tensor (the test itself never holds 2 GB)."""
    data = folder / "large.onnx.data"
    initializers, offset = [], 0
    with open(data, "wb") as f:
        for name, shape, value in (("W1", (K, H), 1e-4), ("W2", (H, K), -2e-4)):
            array = np.full(shape, value, dtype=np.float32)
            array.tofile(f)
            tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape, data_location=TensorProto.EXTERNAL)
            for key, v in (("location", data.name), ("offset", str(offset)), ("length", str(array.nbytes))):
                tensor.external_data.add(key=key, value=v)
            offset += array.nbytes
            initializers.append(tensor)
            del array
    rng = np.random.default_rng(0)
    initializers += [numpy_helper.from_array(rng.standard_normal(K).astype(np.float32), n) for n in ("c", "b")]
    chain = [("Relu", ["x"], "r0"), ("Add", ["r0", "c"], "a0"), ("MatMul", ["a0", "W1"], "m1"), ("Relu", ["m1"], "r1"),
             ("MatMul", ["r1", "W2"], "m2"), ("Add", ["m2", "b"], "y")]
    nodes = [helper.make_node(op, inputs, [out], name=out) for op, inputs, out in chain]
    graph = helper.make_graph(nodes, "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", K])], initializers)
    path = folder / "large.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    assert data.stat().st_size > 2**31
    return path


def peak_rss_bytes(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, int]:
    """Run the onnxfuse command in a fresh wrapper process; its children's peak resident memory."""
    wrapper = ("import resource, subprocess, sys\n"
               "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
               "sys.stderr.write(done.stderr); sys.stdout.write(done.stdout)\n"
               "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr)\n"
               "sys.exit(done.returncode)\n")
    onnxfuse = str(Path(sys.executable).with_name("onnxfuse"))
    done = subprocess.run([sys.executable, "-c", wrapper, onnxfuse, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=900)
    peak = int(done.stderr.rsplit("PEAK ", 1)[1].split()[0])
    return done, peak


@pytest.mark.slow
def test_model_over_2gb_optimizes_and_verifies(tmp_path_factory, cache):
    folder = tmp_path_factory.mktemp("large-model")
    try:
        source = write_large_model(folder)
        model_bytes = (folder / "large.onnx.data").stat().st_size
        # --select all: auto leaves products over more than 256 k's to onnxruntime before they form
        # a group; this test is about a group too heavy to compile falling back.
        done, peak = peak_rss_bytes(["optimize", str(source), "-o", "out/large.fused.onnx", "--report", "out/r.json",
                                     "--cache-dir", str(cache), "--select", "all", "-q"], folder)
        assert done.returncode == 0, done.stderr
        assert peak < 2 * model_bytes, f"optimize peaked at {peak / 2**30:.2f} GiB for a {model_bytes / 2**30:.2f} GiB model"
        report = json.loads((folder / "out" / "r.json").read_text())
        fused = folder / "out" / "large.fused.onnx"
        assert report["external_data"] == "out/large.fused.onnx.data" and fused.stat().st_size < 100_000
        status = {tuple(g["op_types"]): g for g in report["groups"]}
        assert status[("Relu", "Add")]["status"] == "compiled"
        assert status[("MatMul", "Relu")]["status"] == "fallback"
        assert "stay with onnxruntime" in status[("MatMul", "Relu")]["reason"]

        checked, peak = peak_rss_bytes(["verify", str(source), str(fused), "--runs", "2", "--json"], folder)
        assert checked.returncode == 0, checked.stderr
        verdict = json.loads(checked.stdout)
        assert verdict["ok"] and verdict["outputs"][0]["max_abs_error"] is not None
        assert peak < 2 * model_bytes, f"verify peaked at {peak / 2**30:.2f} GiB"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
