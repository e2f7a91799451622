"""The graph dump (`inspect --json`, `--report`) and the view's scenes and dot layout, without a browser."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from onnxfuse_cli.main import main

from onnxfuse.frontend.loader import load_model
from onnxfuse.view.layout import layout_scene
from onnxfuse.view.scenes import SCENES, build_scene, group_box_id

MODELS = Path(__file__).resolve().parent.parent / "models"
BRANCHY = MODELS / "exported" / "branchy_cell_ts.onnx"  # an If whose branches hold groups of their own
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed (make install installs it)")


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def inspect_json(model: Path, *args: str) -> dict:
    result = run("inspect", str(model), "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture(scope="module")
def lstm_report(tmp_path_factory, cache) -> Path:
    """A real optimize report of the bundled LSTM cell."""
    out = tmp_path_factory.mktemp("lstm")
    result = run("optimize", str(MODELS / "lstm_cell.onnx"), "-o", str(out / "lstm.fused.onnx"), "--report",
                 str(out / "report.json"), "--cache-dir", str(cache), "-q")
    assert result.exit_code == 0, result.output
    return out / "report.json"


@pytest.mark.parametrize("model", [MODELS / "lstm_cell.onnx", BRANCHY], ids=lambda p: p.name)
def test_dump_has_every_node_once_with_its_group_or_reason(model):
    dump = inspect_json(model)
    graph = load_model(str(model))
    expected = {f"{scope}#{n.index}": (n.op_type, n.name) for scope, body in graph.scopes() for n in body.nodes}
    nodes = {n["id"]: n for n in dump["graph"]["nodes"]}
    assert len(nodes) == len(dump["graph"]["nodes"]) == dump["node_count"]
    assert {k: (n["op_type"], n["name"]) for k, n in nodes.items()} == expected

    in_groups = {f"{g.get('scope', '')}#{i}": g["name"] for g in dump["groups"] for i in g["node_indices"]}
    reasons = {f"{u.get('scope', '')}#{u['node_index']}": u["reason"] for u in dump["unfused"]}
    for key, node in nodes.items():
        assert node.get("group") == in_groups.get(key) and node.get("unfused_reason") == reasons.get(key)
        assert ("group" in node) != ("unfused_reason" in node)


def test_dump_edges_and_values_follow_the_model():
    dump = inspect_json(MODELS / "lstm_cell.onnx")
    graph = load_model(str(MODELS / "lstm_cell.onnx"))
    expected_edges = Counter((f"#{graph.value(name).producer}", f"#{n.index}", name)
                             for n in graph.nodes for name in graph.data_inputs(n) if graph.value(name).producer is not None)
    assert Counter((e["from"], e["to"], e["value"]) for e in dump["graph"]["edges"]) == expected_edges
    values = dump["graph"]["values"]
    for name, value in graph.values.items():
        if value.consumers or value.producer is not None:
            assert values[name]["dtype"] == value.dtype and values[name]["shape"] == list(value.shape)
    assert [v["name"] for v in dump["graph"]["inputs"]] == graph.inputs
    assert values["W"].get("constant") is True


def test_dump_keeps_the_plans_keys():
    plan = inspect_json(MODELS / "tree_trav_d8.onnx", "--max-depth", "20")
    assert {"model", "node_count", "fused_node_count", "options", "groups", "unfused", "graph"} <= set(plan)
    assert plan["options"]["max_depth"] == 20


def test_report_brings_each_groups_outcome(lstm_report):
    report = json.loads(lstm_report.read_text())
    dump = inspect_json(MODELS / "lstm_cell.onnx", "--report", str(lstm_report))
    assert [g["name"] for g in dump["groups"]] == [g["name"] for g in report["groups"]]
    for mine, theirs in zip(dump["groups"], report["groups"]):
        assert mine["status"] == theirs["status"] and theirs["status"] in ("compiled", "cached")  # shared cache
        assert mine["kernel"] == theirs["kernel"] and mine["compile_seconds"] == theirs["compile_seconds"]
    assert dump["report"]["groups_compiled"] == report["groups_compiled"]


def test_report_of_another_model_is_refused(lstm_report):
    result = CliRunner().invoke(main, ["inspect", str(MODELS / "gru_cell.onnx"), "--report", str(lstm_report)])
    assert result.exit_code == 2
    assert result.output.strip().startswith("onnxfuse: error: the report does not describe this model")


def member_box_ids(dump: dict, group: str) -> set[str]:
    """The boxes a group's nodes get when the group is drawn node by node."""
    return {n["id"] for n in dump["graph"]["nodes"] if n.get("group") == group}


def body_scopes(dump: dict) -> set[str]:
    """Every If/Loop/Scan body the dump holds a node of (named as the front end names them)."""
    return {n["scope"] for n in dump["graph"]["nodes"] if n.get("scope")}


def test_scenes_collapse_what_they_say():
    dump = inspect_json(BRANCHY)
    groups = {g["name"]: g for g in dump["groups"]}
    plan, collapsed, fused = (build_scene(dump, name) for name in SCENES)
    node_ids = {n["id"] for n in dump["graph"]["nodes"]}
    assert node_ids <= set(plan.boxes)
    assert {group_box_id(g) for g in groups} <= set(collapsed.boxes)
    grouped = {n["id"] for n in dump["graph"]["nodes"] if "group" in n}
    assert grouped and not grouped & set(collapsed.boxes)
    assert node_ids - grouped <= set(collapsed.boxes)
    assert set(fused.boxes) == set(collapsed.boxes)  # no report: every group counts as compiled

    fell_back = dump["groups"][0]["name"]
    report_like = {**dump, "groups": [{**g, "status": "fallback" if g["name"] == fell_back else "compiled"}
                                      for g in dump["groups"]]}
    fused = build_scene(report_like, "fused")
    assert group_box_id(fell_back) not in fused.boxes
    members = member_box_ids(dump, fell_back)
    assert members and members <= set(fused.boxes)
    assert {fused.boxes[m].kind for m in members} == {"fallback"}


@needs_dot
def test_layout_places_every_box_and_edge_inside_the_picture():
    dump = inspect_json(BRANCHY)
    for name in SCENES:
        scene = build_scene(dump, name)
        layout = layout_scene(scene)
        assert set(layout["boxes"]) == set(scene.boxes)
        for cx, cy, w, h in layout["boxes"].values():
            assert 0 <= cx - w / 2 and cx + w / 2 <= layout["width"] + 0.5 and 0 <= cy - h / 2 <= layout["height"]
        assert Counter((a, b) for a, b, _, _ in layout["edges"]) == Counter(scene.edges)
        drawn_clusters = set(layout["clusters"])
        expected = {f"body:{scope}" for scope in body_scopes(dump)}
        if name == "plan":
            expected |= {f"group:{g['name']}" for g in dump["groups"]}
        assert drawn_clusters == expected


def test_missing_dot_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    result = CliRunner().invoke(main, ["inspect", str(MODELS / "lstm_cell.onnx"), "--html", str(tmp_path / "p.html")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("onnxfuse: error: the HTML view needs Graphviz's `dot`")
    assert not (tmp_path / "p.html").exists()


@needs_dot
@pytest.mark.parametrize("model", [MODELS / "lstm_cell.onnx", BRANCHY, MODELS / "exported" / "bert_tiny_2l_ts.onnx"],
                         ids=lambda p: p.name)
def test_each_groups_nodes_lie_inside_its_rectangle_and_groups_do_not_overlap(model):
    """The plan is laid out in two levels (each group alone, then the graph of group boxes):
    the composition must put every member inside its group and keep groups apart."""
    dump = inspect_json(model)
    layout = layout_scene(build_scene(dump, "plan"))
    rects = {name[len("group:"):]: rect for name, rect in layout["clusters"].items() if name.startswith("group:")}
    assert set(rects) == {g["name"] for g in dump["groups"]}
    for node in dump["graph"]["nodes"]:
        if "group" in node:
            x, y, w, h = rects[node["group"]]
            cx, cy, bw, bh = layout["boxes"][node["id"]]
            assert x <= cx - bw / 2 and cx + bw / 2 <= x + w and y <= cy - bh / 2 and cy + bh / 2 <= y + h
    boxes = list(rects.values())
    for i, (x, y, w, h) in enumerate(boxes):
        for x2, y2, w2, h2 in boxes[i + 1:]:
            assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y
