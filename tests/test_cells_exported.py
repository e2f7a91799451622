"""PyTorch's own LSTMCell and GRUCell exports (models/exported/, both torch.onnx exporters): each
cell is ONE group that compiles and gives onnxruntime's results.

The TorchScript exporter writes Split sizes, Gather indices and Unsqueeze axes as Constant
nodes, which the front end makes initializers at load; the tests convert them first
(cell_forms.constants_as_initializers) so a group can be compared with the whole graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from cell_forms import constants_as_initializers, random_feeds
from conftest import MODELS, assert_outputs_match, run_both

import onnxfuse
from onnxfuse import optimize

EXPORTED = MODELS / "exported"
CELLS = ["lstm_cell_stacked_ts", "lstm_cell_stacked_dynamo", "gru_cell_ts", "gru_cell_dynamo"]


def _exported(name: str) -> onnx.ModelProto:
    path = EXPORTED / f"{name}.onnx"
    if not path.is_file():
        pytest.skip(f"{path.name} is not in models/exported (the exported corpus)")
    return constants_as_initializers(onnx.load(str(path)))


@pytest.mark.parametrize("name", CELLS)
def test_exported_cell_is_one_group(name):
    m = _exported(name)
    plan = onnxfuse.plan(m)
    assert [len(g.node_indices) for g in plan.groups] == [len(m.graph.node)]
    assert plan.groups[0].op_types.count("Gemm") == 2


@pytest.mark.parametrize("name", ["lstm_cell_loop8_ts", "lstm_cell_loop8_dynamo"])
def test_unrolled_loop_of_cells_is_one_group(name):
    """Step t+1's GEMM on h_t lies between step t's GEMM and the Concat of all hidden states,
    and x[:, t] is read in place: all 8 steps are one group."""
    m = _exported(name)
    plan = onnxfuse.plan(m)
    assert [len(g.node_indices) for g in plan.groups] == [len(m.graph.node)]
    assert plan.groups[0].op_types.count("Gemm") == 16


@pytest.mark.parametrize("name", CELLS)
def test_exported_cell_matches_onnxruntime(name, tmp_path, cache):
    m = _exported(name)
    source = tmp_path / f"{name}.onnx"
    onnx.save(m, source)
    result = optimize(source, tmp_path / f"{name}.fused.onnx", cache_dir=cache, jobs=1)
    assert [n.domain for n in onnx.load(str(result.model_path)).graph.node] == ["ai.onnxfuse"]
    recorded = dict(np.load(EXPORTED / f"{name}.inputs.npz"))
    for feeds in [recorded] + [random_feeds(m, batch, seed=batch) for batch in (1, 5, 64)]:
        expected, actual = run_both(source, result.model_path, feeds)
        assert_outputs_match(expected, actual)
