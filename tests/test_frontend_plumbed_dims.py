"""Front end: dims sized by run-time shape plumbing get their true names where that is exact
(`onnxfuse/frontend/plumbed_dims.py`)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from frontend_helpers import apply, assert_same_outputs, run, with_shapes
from onnx_builder import const_i64, model, node, weights

import onnxfuse
from onnxfuse.frontend.loader import load_model
from onnxfuse.frontend.plumbed_dims import NamePlumbedDimsPass
from onnxfuse.pipeline import optimize
from onnxfuse.session import quiet_session_options

MAX_POSITIONS = 8
SIZES = {"N": 2, "S": 5}


def positions_model(other="x", buffer_rows=MAX_POSITIONS, use_sum=True):
    """BERT's embeddings as torch.jit writes them: the first `seq` rows of a position buffer,
    `Slice(buffer, 0, Shape(ids)[1], axes=1)`, embedded and added to the ids' embeddings; the
    Add broadcasts the sliced dim against `other`'s axis 1."""
    embeddings = [
        node("Shape", ["ids"], "s"),
        node("Gather", ["s", "one"], "seq", axis=0),
        node("Unsqueeze", ["seq", "zero1"], "end"),
        node("Slice", ["buffer", "zero1", "end", "one1", "one1"], "positions"),
        node("Gather", ["position_table", "positions"], "pos_emb"),
        node("Gather", ["word_table", other], "word_emb"),
    ]
    if use_sum:
        nodes = [*embeddings, node("Add", ["word_emb", "pos_emb"], "sum"), node("Relu", ["sum"], "y")]
    else:
        nodes = [*embeddings, node("Relu", ["pos_emb"], "y")]
    inputs = {"ids": ("N", "S")} if other == "ids" else {"ids": ("N", "S"), "x": ("N", "T")}
    inits = {"one": np.array(1, np.int64), "zero1": const_i64(0), "one1": const_i64(1),
             "buffer": np.arange(buffer_rows, dtype=np.int64).reshape(1, buffer_rows),
             "position_table": weights(buffer_rows, 4), "word_table": weights(10, 4, seed=1)}
    m = model(nodes, inputs, ["y"], inits)
    for vi in m.graph.input:
        vi.type.tensor_type.elem_type = onnx.TensorProto.INT64
    return m


def dims_of(m: onnx.ModelProto, name: str):
    (vi,) = [v for v in list(m.graph.value_info) + list(m.graph.output) if v.name == name]
    return tuple(d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim)


def test_positions_sliced_to_the_ids_length_are_named_seq_where_they_meet_the_ids():
    m = positions_model(other="ids")
    before = with_shapes(m)
    assert dims_of(before, "positions")[1] != "S" and dims_of(before, "sum")[:2] != ("N", "S")
    after, modified = apply(NamePlumbedDimsPass(), before)
    assert modified and dims_of(after, "positions") == (1, "S")
    assert_same_outputs(m, after, SIZES)
    assert load_model(m).value("y").shape == ("N", "S", 4)  # the whole front end: onnx carries it on


def test_the_original_refuses_what_the_name_would_get_wrong():
    """The argument of rule 2: with seq > the buffer, the Add meets 8 against seq and fails."""
    m = positions_model(other="ids")
    ids = np.zeros((2, MAX_POSITIONS + 2), np.int64)
    with pytest.raises(Exception, match="Add"):
        run(m, {"ids": ids})


def test_without_a_broadcast_against_seq_the_sliced_dim_is_only_min_and_stays_unnamed():
    m = positions_model(other="ids", use_sum=False)
    after, _ = apply(NamePlumbedDimsPass(), with_shapes(m))
    assert dims_of(after, "positions")[0] == 1  # rule 1: the axis it does not slice
    assert dims_of(after, "positions")[1] != "S"
    ids = np.zeros((2, MAX_POSITIONS + 2), np.int64)
    assert run(m, {"ids": ids})[0].shape == (1, MAX_POSITIONS, 4)  # min(seq, 8): naming it seq would be wrong


def test_a_broadcast_against_another_symbol_proves_nothing():
    m = positions_model(other="x")
    after, _ = apply(NamePlumbedDimsPass(), with_shapes(m))
    assert dims_of(after, "positions")[1] not in ("S", "T")


def test_a_buffer_of_one_position_is_never_renamed():
    """min(seq, 1) = 1 broadcasts against seq: the original accepts every seq."""
    m = positions_model(other="ids", buffer_rows=1)
    after, _ = apply(NamePlumbedDimsPass(), with_shapes(m))
    assert dims_of(after, "positions")[1] != "S"
    ids = np.zeros((2, 5), np.int64)
    assert run(m, {"ids": ids})[0].shape == (2, 5, 4)


def test_a_broadcast_whose_output_nobody_reads_proves_nothing():
    m = positions_model(other="ids", use_sum=False)
    m.graph.node.append(onnx.helper.make_node("Add", ["word_emb", "pos_emb"], ["dead"], name="dead"))
    after, _ = apply(NamePlumbedDimsPass(), with_shapes(m))
    assert dims_of(after, "positions")[1] != "S"


def test_range_to_a_run_time_size_has_that_length():
    m = model(
        [node("Shape", ["x"], "s"), node("Gather", ["s", "one"], "n", axis=0),
         node("Range", ["zero", "n", "one"], "r"), node("Cast", ["r"], "rf", to=onnx.TensorProto.FLOAT),
         node("Add", ["x", "rf"], "y")],
        {"x": ("N", "S")}, ["y"], {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)},
    )
    before = with_shapes(m)
    assert dims_of(before, "r") != ("S",)
    after, modified = apply(NamePlumbedDimsPass(), before)
    assert modified and dims_of(after, "r") == ("S",)
    assert_same_outputs(m, after, SIZES)


def test_expand_to_a_computed_shape_and_gather_elements_get_their_dims():
    """torch.jit's token types: GatherElements(buffer, positions) expanded to Shape(ids)."""
    m = positions_model(other="ids")
    nodes = list(m.graph.node)
    nodes[-2:-2] = [
        node("GatherElements", ["types", "positions"], "picked", axis=1),
        node("Shape", ["ids"], "ids_shape"),
        node("Expand", ["picked", "ids_shape"], "token_types"),
        node("Gather", ["type_table", "token_types"], "type_emb"),
    ]
    nodes[-1] = node("Add", ["sum", "type_emb"], "y")
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    m.graph.initializer.extend([onnx.numpy_helper.from_array(np.zeros((1, MAX_POSITIONS), np.int64), "types"),
                                onnx.numpy_helper.from_array(weights(2, 4, seed=2), "type_table")])
    after = with_shapes(m)
    for _ in range(3):  # each round names one more step; onnx's inference carries the names on
        after, _ = apply(NamePlumbedDimsPass(), after)
        after = with_shapes(after)
    assert dims_of(after, "picked") == (1, "S")
    assert dims_of(after, "token_types") == ("N", "S")
    assert_same_outputs(m, after, SIZES)
    assert load_model(m).value("y").shape == ("N", "S", 4)


def test_a_declared_dim_is_never_overwritten():
    m = with_shapes(positions_model(other="ids"))
    (vi,) = [v for v in m.graph.value_info if v.name == "positions"]
    vi.type.tensor_type.shape.dim[1].dim_param = "declared"
    after, _ = apply(NamePlumbedDimsPass(), m)
    assert dims_of(after, "positions") == (1, "declared")


def test_fused_positions_compile_and_a_too_long_input_fails_as_in_the_original(tmp_path):
    """The kernel takes the Slice's output (named seq) and the ids: given seq > 8 it gets 8 and
    10 for one symbol and returns an error status, as onnxruntime's Add does in the original."""
    source = tmp_path / "positions.onnx"
    onnx.save(with_shapes(positions_model(other="ids")), str(source))
    result = optimize(source, tmp_path / "fused.onnx", cache_dir=False, jobs=1)
    assert [o.status for o in result.outcomes] == ["compiled"]
    reference = ort.InferenceSession(str(source), quiet_session_options(), providers=["CPUExecutionProvider"])
    fused = onnxfuse.InferenceSession(str(result.model_path), quiet_session_options(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for seq in (1, 5, MAX_POSITIONS):
        feeds = {"ids": rng.integers(0, 10, (3, seq)).astype(np.int64)}
        np.testing.assert_allclose(fused.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=1e-6)
    feeds = {"ids": rng.integers(0, 10, (3, MAX_POSITIONS + 2)).astype(np.int64)}
    with pytest.raises(Exception, match="Add"):
        reference.run(None, feeds)
    with pytest.raises(Exception, match=r"onnxfuse kernel .*dim 1 is 10, but dim '\w+' is 8"):
        fused.run(None, feeds)


@pytest.mark.slow
def test_torch_jit_bert_compiles_every_group_and_refuses_what_the_original_refuses(tmp_path, cache):
    from conftest import MODELS

    source = MODELS / "exported" / "bert_tiny_2l_ts.onnx"
    report = tmp_path / "report.json"
    result = optimize(source, tmp_path / "fused.onnx", report=report, cache_dir=cache)
    failed = [f"{g['name']}: {g['reason']}" for g in json.loads(report.read_text())["groups"]
              if g["status"] == "fallback" and g.get("fallback_kind") != "declined"]
    assert failed == []
    reference = ort.InferenceSession(str(source), quiet_session_options(), providers=["CPUExecutionProvider"])
    fused = onnxfuse.InferenceSession(str(result.model_path), quiet_session_options(), providers=["CPUExecutionProvider"])
    inputs = dict(np.load(MODELS / "exported" / "bert_tiny_2l_ts.inputs.npz"))
    for expected, actual in zip(reference.run(None, inputs), fused.run(None, inputs), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    too_long = {"input_ids": np.ones((2, 130), np.int64), "attention_mask": np.ones((2, 130), np.int64)}
    for session in (reference, fused):
        with pytest.raises(Exception, match="INVALID_ARGUMENT"):
            session.run(None, too_long)


def test_torch_jit_bert_carries_batch_and_seq_everywhere_and_the_pass_settles():
    from conftest import MODELS

    from onnxfuse.frontend.canonicalize import canonicalize

    source = onnx.load(str(MODELS / "exported" / "bert_tiny_2l_ts.onnx"))
    canonical = canonicalize(source)
    def names(values):
        return {d.dim_param for v in values for d in v.type.tensor_type.shape.dim if d.dim_param}

    declared = names(source.graph.output)  # the exporter's names for the outputs' dims stay
    left = names(canonical.graph.value_info) - declared - {"batch", "seq"}
    assert "seq" in names(canonical.graph.value_info)
    assert "batch*seq" in left  # the mask's Flatten → Reshape, named by its product (reshape_products.py)
    assert len(left) <= 2 and all(n.startswith("unk__") for n in left - {"batch*seq"})
    _, modified = apply(NamePlumbedDimsPass(), canonical)
    assert not modified  # the front end's fixed point reached it
