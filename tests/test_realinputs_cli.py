"""`onnxfuse bench` and `onnxfuse verify` on the user's inputs and sizes: --inputs, --dim,
integer ids over the whole vocabulary, --ort models with other input names, and exit code 1
for any contender that was refused or failed. Models here are tiny and hand-made: a "fused"
model is any model given with --fused, so a wrong one can be made on purpose."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from onnxfuse_cli.main import main

from onnxfuse.measure.contenders import FUSED

FAST = ["--no-tvm", "--rounds", "2", "--budget", "1"]


def save(path, nodes, inputs, outputs, inits=()) -> str:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


def unary(path, op: str, x: str = "x", y: str = "y", shape=("N", "S")) -> str:
    return save(path, [helper.make_node(op, [x], [y])], [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
                [helper.make_tensor_value_info(y, TensorProto.FLOAT, shape)])


def embedding(path, table: np.ndarray) -> str:
    """ids [N, S] → Gather(table, ids)."""
    return save(path, [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
                [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "S"])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", table.shape[1]])],
                [numpy_helper.from_array(table, "table")])


def bench(*args) -> tuple[int, str, dict]:
    result = CliRunner().invoke(main, ["bench", *args])
    report = {}
    if "--json" in args:
        path = args[list(args).index("--json") + 1]
        try:
            with open(path) as f:
                report = json.load(f)
        except FileNotFoundError:
            pass
    return result.exit_code, result.output, report


@pytest.fixture
def tables(tmp_path):
    """An embedding and a 'fused' copy that is wrong only in rows 2 and up: ids drawn from {0, 1}
    never see the difference."""
    table = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    wrong = table.copy()
    wrong[2:] += 1.0
    return embedding(tmp_path / "emb.onnx", table), embedding(tmp_path / "emb.wrong.onnx", wrong)


def test_bench_draws_ids_over_the_vocabulary_and_refuses_a_model_wrong_past_row_1(tmp_path, tables):
    original, wrong = tables
    out = tmp_path / "r.json"
    code, output, report = bench(original, "--fused", wrong, "--batch", "4", "--dim", "S=8", *FAST, "--json", str(out))
    assert code == 1, output
    run = report["models"][0]["runs"][0]
    assert run["contenders"][FUSED]["na"].startswith("refused: output y differs")
    assert run["dims"] == {"N": 4, "S": 8} and run["label"] == "N=4, S=8"


def test_verify_draws_ids_over_the_vocabulary(tables):
    original, wrong = tables
    result = CliRunner().invoke(main, ["verify", original, wrong])
    assert result.exit_code == 1 and "MISMATCH" in result.output
    assert CliRunner().invoke(main, ["verify", original, original]).exit_code == 0


def test_bench_times_on_the_users_inputs_and_resizes_them(tmp_path):
    """Relu and Identity agree on non-negative inputs only: timed on such a file, refused on random ones."""
    original, identity = unary(tmp_path / "relu.onnx", "Relu"), unary(tmp_path / "id.onnx", "Identity")
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.abs(np.random.default_rng(1).standard_normal((2, 5))).astype(np.float32))
    out = tmp_path / "r.json"
    code, output, report = bench(original, "--fused", identity, "--inputs", str(inputs), *FAST, "--json", str(out))
    assert code == 0, output
    run = report["models"][0]["runs"][0]
    assert run["label"] == "inputs N=2, S=5" and run["contenders"][FUSED]["median_ms"] > 0
    code, output, report = bench(original, "--fused", identity, "--inputs", str(inputs), "--dim", "N=64",
                                 "--batch", "3,7", *FAST, "--json", str(out))
    assert code == 0, output
    assert [r["dims"] for r in report["models"][0]["runs"]] == [{"N": 64, "S": 3}, {"N": 64, "S": 7}]
    code, output, _ = bench(original, "--fused", identity, "--batch", "3", *FAST)
    assert code == 1 and "refused" in output


def test_bench_and_verify_say_which_inputs_or_dims_do_not_fit(tmp_path):
    original = unary(tmp_path / "relu.onnx", "Relu")
    inputs = tmp_path / "x.npz"
    np.savez(inputs, input_0=np.zeros((2, 5), np.float32))
    code, output, _ = bench(original, "--fused", original, "--inputs", str(inputs), *FAST)
    assert code == 2 and "do not match the model's inputs ['x']" in output
    result = CliRunner().invoke(main, ["verify", original, original, "--inputs", str(inputs)])
    assert result.exit_code == 2 and "do not match the model's inputs ['x']" in result.output
    code, output, _ = bench(original, "--fused", original, "--dim", "seq=4", *FAST)
    assert code == 2 and "no dimension of that name (named: N, S)" in output
    result = CliRunner().invoke(main, ["verify", original, original, "--dim", "seq=4"])
    assert result.exit_code == 2 and "no dimension of that name" in result.output


def test_verify_resizes_the_users_inputs_with_dim(tmp_path):
    original = unary(tmp_path / "relu.onnx", "Relu")
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.ones((2, 5), np.float32))
    result = CliRunner().invoke(main, ["verify", original, original, "--inputs", str(inputs), "--dim", "N=9", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ok"] is True


def test_ort_model_with_other_input_and_output_names_is_fed_by_position(tmp_path):
    original = unary(tmp_path / "relu.onnx", "Relu")
    renamed = unary(tmp_path / "renamed.onnx", "Relu", x="input_0", y="variable")
    out = tmp_path / "r.json"
    code, output, report = bench(original, "--fused", original, "--ort", f"other={renamed}", "--batch", "3", *FAST,
                                 "--json", str(out))
    assert code == 0, output
    assert report["models"][0]["runs"][0]["contenders"]["other"]["median_ms"] > 0


def test_a_failed_or_refused_ort_model_makes_the_exit_code_1(tmp_path):
    original = unary(tmp_path / "relu.onnx", "Relu")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    wrong = unary(tmp_path / "sigmoid.onnx", "Sigmoid")
    for extra, why in ((broken, "failed: onnxruntime cannot run it"), (wrong, "refused: output y differs")):
        out = tmp_path / "r.json"
        code, output, report = bench(original, "--fused", original, "--ort", f"other={extra}", "--batch", "3", *FAST,
                                     "--json", str(out))
        assert code == 1, output
        assert report["models"][0]["runs"][0]["contenders"]["other"]["na"].startswith(why)
        assert "not timed: other on relu batch 3, 1 thread(s)" in output
