"""Every cell form of tests/cell_forms.py compiled into one kernel and run against onnxruntime.

The fusion rules pin each form's group (test_fusion_rules.py); here the single group must also
compile, verify and give onnxruntime's results through the fused model, at batch 1 (the
small-batch variant), 5 (a ragged row tile) and 64.
"""

from __future__ import annotations

import onnx
import pytest
from cell_forms import GRU_FORMS, LSTM_FORMS, gru_cell, lstm_cell, random_feeds
from conftest import assert_outputs_match, run_both

from onnxfuse import optimize

FORMS = [("lstm", name) for name in sorted(LSTM_FORMS)] + [("gru", name) for name in sorted(GRU_FORMS)]


@pytest.mark.parametrize("cell, form", FORMS)
def test_cell_form_is_one_kernel_matching_onnxruntime(cell, form, tmp_path, cache):
    m, nodes = lstm_cell(**LSTM_FORMS[form]) if cell == "lstm" else gru_cell(**GRU_FORMS[form])
    source = tmp_path / f"{cell}_{form}.onnx"
    onnx.save(m, source)
    result = optimize(source, tmp_path / f"{cell}_{form}.fused.onnx", cache_dir=cache, jobs=1, select="all")
    (group,) = result.report["groups"]
    assert group.get("reason") is None and len(group["node_indices"]) == len(nodes)
    fused = onnx.load(str(result.model_path))
    assert [n.domain for n in fused.graph.node] == ["ai.onnxfuse"]
    for batch in (1, 5, 64):
        expected, actual = run_both(source, result.model_path, random_feeds(m, batch, seed=batch))
        assert_outputs_match(expected, actual)
