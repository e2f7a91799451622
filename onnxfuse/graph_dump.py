"""The whole graph and its fusion plan as one JSON object: what `inspect --json` prints and what the
HTML view (onnxfuse/view) draws.

The plan's own JSON (`FusionPlan.to_json`) names nodes by index only; a reader who wants to see the
plan needs the graph around it too: every node with its name, op type and values, every value's
dtype and shape, the edges, and which group (or which reason to stay unfused) each node got.
Given an optimize report, the dump takes the report's groups and unfused nodes (the plan optimize
actually used: `--select auto` plans convolutions out of groups) and each group's outcome: status,
kernel, compile time, measured times.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx

from .errors import UsageError
from .frontend.loader import load_model
from .fusion.plan import plan_fusion
from .ir import Graph, Node, Value

REPORT_SUMMARY_FIELDS = ("output", "library", "seconds", "fused_fraction", "groups_compiled", "groups_cached",
                         "groups_fallback", "groups_failed", "versions", "target", "timings")


def node_id(scope: str, index: int) -> str:
    """A node's key across scopes: `#5` in the model's graph, `If_3/then_branch#5` inside a body."""
    return f"{scope}#{index}"


def graph_dump(model_name: str, graph: Graph, plan_json: dict, report: dict | None = None) -> dict:
    """`plan_json` is `FusionPlan.to_json()`; with `report` (optimize's JSON report of the same model)
    its groups, unfused nodes and outcomes replace the plan's. The plan's keys stay at the top level."""
    if report is not None:
        _check_report_matches(graph, report)
        plan_json = {**plan_json, **{k: report[k] for k in ("node_count", "fused_node_count", "options",
                                                            "groups", "unfused") if k in report}}
    dump = {"model": model_name, **plan_json, "graph": _graph_json(graph, plan_json)}
    if report is not None:
        dump["report"] = {k: report[k] for k in REPORT_SUMMARY_FIELDS if k in report}
    return dump


def _check_report_matches(graph: Graph, report: dict) -> None:
    ops = {node_id(scope, n.index): n.op_type for scope, body in graph.scopes() for n in body.nodes}
    for g in report.get("groups", []):
        for index, op in zip(g["node_indices"], g["op_types"]):
            if ops.get(node_id(g.get("scope", ""), index)) != op:
                raise UsageError(f"the report does not describe this model: its {g['name']} has {op} as node "
                                 f"{index}, the model does not")


def _graph_json(graph: Graph, plan_json: dict) -> dict:
    where: dict[str, dict] = {}
    for g in plan_json["groups"]:
        for index in g["node_indices"]:
            where[node_id(g.get("scope", ""), index)] = {"group": g["name"]}
    for u in plan_json["unfused"]:
        where[node_id(u.get("scope", ""), u["node_index"])] = {"unfused_reason": u["reason"]}
    nodes, edges, values = [], [], {}
    for scope, body in graph.scopes():
        for node in body.nodes:
            key = node_id(scope, node.index)
            nodes.append({**_node_json(scope, node), **where.get(key, {})})
            for name in body.data_inputs(node):
                value = body.value(name)
                values.setdefault(_value_key(scope, value, graph), _value_json(value))
                if value.producer is not None:
                    edges.append({"from": node_id(scope, value.producer), "to": key, "value": name})
            for name in node.outputs:
                if name:
                    values.setdefault(_value_key(scope, body.value(name), graph), _value_json(body.value(name)))
    return {
        "inputs": [_value_json(graph.value(n)) for n in graph.inputs],
        "outputs": [_value_json(graph.value(n)) for n in graph.outputs],
        "nodes": nodes,
        "edges": edges,
        "values": values,
    }


def _value_key(scope: str, value: Value, graph: Graph) -> str:
    """Values are keyed by name; a body's own values can repeat an outer name, so they get its scope."""
    return value.name if not scope or value.name in graph.values else f"{scope}/{value.name}"


def _node_json(scope: str, node: Node) -> dict:
    out = {
        "id": node_id(scope, node.index),
        "index": node.index,
        "name": node.name,
        "op_type": node.op_type,
        "domain": node.domain,
        "inputs": list(node.inputs),
        "outputs": list(node.outputs),
        "attributes": {k: _attribute_text(v) for k, v in node.attributes.items()},
    }
    if scope:
        out["scope"] = scope
    if node.bodies:
        out["bodies"] = sorted(node.bodies)
    return out


def _value_json(value: Value) -> dict:
    out: dict[str, Any] = {"name": value.name, "dtype": value.dtype,
                           "shape": list(value.shape) if value.shape is not None else None}
    if value.is_constant:
        out["constant"] = True
    if value.is_graph_input:
        out["graph_input"] = True
    if value.is_graph_output:
        out["graph_output"] = True
    return out


def _attribute_text(value: Any, limit: int = 80) -> str:
    """A short readable form: numbers and strings as they are, tensors and graphs by their shape."""
    if isinstance(value, onnx.GraphProto):
        text = f"graph {value.name or ''} ({len(value.node)} nodes)"
    elif isinstance(value, onnx.TensorProto):
        text = f"tensor {onnx.helper.tensor_dtype_to_np_dtype(value.data_type)} {list(value.dims)}"
    elif isinstance(value, np.ndarray):
        text = f"array {value.dtype} {list(value.shape)}" if value.size > 8 else str(value.tolist())
    elif isinstance(value, bytes):
        text = value.decode("utf-8", "replace")
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def model_dump(model: str, options, report: dict | None = None) -> dict:
    """Load and plan `model` (FusionOptions `options`), then dump it (with `report`'s facts, if given)."""
    graph = load_model(model)
    return graph_dump(model, graph, plan_fusion(graph, options).to_json(), report)


def read_report(path: str) -> dict:
    """An optimize report (`--report`), or a one-line error."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the report {path}: {exc}") from None
    if not isinstance(report, dict) or "groups" not in report:
        raise UsageError(f"{path} is not an onnxfuse optimize report (no groups)")
    return report
