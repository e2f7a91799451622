"""A CI-sized slice of the exported corpus (models/exported/): each model optimized through the
CLI with default options, its outputs compared with onnxruntime's, bit for bit, on the model's
recorded inputs and on them cut to one along every symbolic dim (where onnxruntime takes kernels
of its own, e.g. a product of one row by a run-time weight), and its fusion plan (`onnxfuse
inspect --json`) checked for unfused nodes that the frontend should have made fusable.

What counts as "the frontend's fault" (an exporter's constant or shape plumbing left in the way):
- a reason "it reads only constants" (constant folding, in the main graph or a body, missed it);
- a reason "input K of OP is computed at run time" where that input, traced back through the
  loaded graph, depends on nothing but initializers, Constant nodes, and Shape/Size of values
  whose (sliced) shape is static: its value is known before the model runs;
- a reason saying a dtype or shape "is unknown" (exporter plumbing that type inference missed),
  in the plan or in a group's fallback reason in the optimize report;
- a group that falls back because an output dim "is an expression" the kernel cannot name (a
  flatten of two symbolic dims was one, in PyTorch's nn.MultiheadAttention).
A run-time input that depends on a symbolic dimension or on input data is legitimate, and so is
a group that `--select auto` declines (mobilenet's convolutions: onnxruntime's Conv is faster).

`benchmarks/corpus.py` runs the whole corpus the same way (make corpus-check).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from onnxfuse_cli.main import main

from onnxfuse.frontend.loader import load_model
from onnxfuse.ir import Graph
from onnxfuse.measure.inputs import load_inputs, model_inputs, resize_inputs
from onnxfuse.verify import verify_models

CORPUS = Path(__file__).resolve().parent.parent / "models" / "exported"
SUBSET = ["lstm_cell_stacked_ts", "gru_cell_dynamo", "hb_rf_tree_trav", "hb_lgbm_perf_tree_trav",
          "bert_tiny_2l_dynamo", "mobilenet_tiny_ts", "skl2onnx_mlp", "denoiser_tiny_dynamo", "keras_mlp", "keras_gru",
          "keras_encoder", "transformer_layer_dynamo", "prenorm_block_dynamo_defaults", "vit_block_dynamo",
          "vit_block_ts"]
RUN_TIME_INPUT = re.compile(r"input (\d+) of \w+ is computed at run time")
UNKNOWN = re.compile(r"\b(dtype|shape) of .* is unknown")
SHAPE_GAP = re.compile(UNKNOWN.pattern + r"|dimension .* is an expression")


def known_before_running(graph: Graph, name: str) -> bool:
    """Whether `name`'s value follows from initializers, Constants and static shapes alone."""
    stack, seen = [name], set()
    while stack:
        value = graph.value(stack.pop())
        if value.name in seen or value.is_constant:
            continue
        seen.add(value.name)
        if value.is_graph_input or value.producer is None:
            return False
        node = graph.nodes[value.producer]
        if node.op_type in ("Shape", "Size"):
            shape = graph.value(node.inputs[0]).shape
            if shape is None:
                return False
            if node.op_type == "Shape":
                shape = shape[node.attributes.get("start", 0):node.attributes.get("end", len(shape))]
            if not all(isinstance(d, int) for d in shape):
                return False
            continue
        if node.has_subgraph or node.op_type in ("RandomNormal", "RandomUniform", "RandomNormalLike",
                                                  "RandomUniformLike", "Multinomial"):
            return False
        stack.extend(n for n in node.inputs + node.implicit_inputs if n)
    return True


def frontend_misses(model: Path) -> list[str]:
    """Unfused nodes the plan blames on constants or shape plumbing that are known statically."""
    result = CliRunner().invoke(main, ["inspect", str(model), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    graph = load_model(str(model))
    misses = []
    for entry in plan["unfused"]:
        scope = graph.scope(entry.get("scope", ""))  # an If/Loop/Scan body's entries name their body
        node = scope.nodes[entry["node_index"]]
        assert node.op_type == entry["op_type"]  # inspect's indices are the loaded graph's
        run_time = RUN_TIME_INPUT.search(entry["reason"])
        if "reads only constants" in entry["reason"]:
            misses.append(f"{node.label}: {entry['reason']} (the front end folds those)")
        elif run_time and known_before_running(scope, node.inputs[int(run_time.group(1))]):
            misses.append(f"{node.label}: {entry['reason']} (but it is known before the model runs)")
        elif UNKNOWN.search(entry["reason"]):
            misses.append(f"{node.label}: {entry['reason']}")
    return misses


def test_the_check_spots_a_folded_constant_and_a_static_shape(tmp_path):
    """The plan check itself: Reshape's shape from Shape of a static value (or from constants
    alone) is known before running; from Shape of a symbolic one it is not."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def reshape_model(x_shape) -> Path:
        nodes = [helper.make_node("Shape", ["x"], ["s"]),
                 helper.make_node("Add", ["s", "zero"], ["t"]),  # an op shape_values does not follow
                 helper.make_node("Reshape", ["x", "t"], ["y"])]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(np.zeros(2, np.int64), "zero")])
        path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
        return path

    graph = load_model(str(reshape_model([4, 3])))
    assert known_before_running(graph, "t")
    graph = load_model(str(reshape_model(["N", 3])))
    assert not known_before_running(graph, "t")
    assert not known_before_running(graph, "x")


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBSET)
def test_corpus_model_optimizes_and_matches_onnxruntime_on_its_inputs(name, tmp_path, cache):
    model, inputs = CORPUS / f"{name}.onnx", CORPUS / f"{name}.inputs.npz"
    fused = tmp_path / f"{name}.fused.onnx"
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["optimize", str(model), "-o", str(fused), "--cache-dir", str(cache),
                                       "--report", str(report_path)])
    assert result.exit_code == 0, result.output
    check = verify_models(model, fused, inputs=inputs)
    assert check.ok, f"{name}: {check.worst.name} differs (max abs error {check.worst.max_abs_error})"
    assert check.bitwise, f"{name}: {check.worst.name} is not onnxruntime's bits (max abs error {check.worst.max_abs_error})"
    specs = model_inputs(model)
    one = tmp_path / "at_one.npz"
    np.savez(one, **resize_inputs(load_inputs(inputs, specs), specs, batch=1))  # every symbolic dim cut to 1
    at_one = verify_models(model, fused, inputs=one)
    assert at_one.bitwise, f"{name} at one: {at_one.worst.name} (max abs error {at_one.worst.max_abs_error})"
    assert frontend_misses(model) == []
    report = json.loads(report_path.read_text())
    shape_gaps = [f"{g['name']}: {g['reason']}" for g in report["groups"]
                  if g["status"] == "fallback" and SHAPE_GAP.search(g["reason"])]
    assert shape_gaps == []


ALL = sorted(p.stem for p in CORPUS.glob("*.onnx"))


@pytest.mark.parametrize("name", ALL)
def test_no_corpus_model_is_left_unfused_for_a_constant_or_static_shape(name):
    """The plan alone (no compile), for every model of the corpus: see frontend_misses."""
    assert frontend_misses(CORPUS / f"{name}.onnx") == []
