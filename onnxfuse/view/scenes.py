"""The pictures the page can show, as boxes, nested clusters and edges (no coordinates yet).

One graph dump gives three scenes:
- `plan`: every node, each group a cluster around its nodes (the plan, expanded);
- `collapsed`: each group one box (what keeps 1,000-node plans readable);
- `fused`: the fused model: a compiled group is one custom node, a group that fell back keeps
  its nodes (without a report every group counts as compiled).
If/Loop/Scan bodies are clusters of their own, drawn below their model graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..report import ops_summary

SCENES = ("plan", "collapsed", "fused")


@dataclass
class Box:
    id: str
    lines: list[str]  # the label, one entry per line
    kind: str  # node, unfused, group, kernel, fallback, input, output


@dataclass
class Cluster:
    name: str
    label: str
    kind: str  # group or body
    boxes: list[str] = field(default_factory=list)
    children: list[Cluster] = field(default_factory=list)


@dataclass
class Scene:
    name: str
    boxes: dict[str, Box]
    root: Cluster  # the model's graph; its children are groups and bodies
    edges: list[tuple[str, str]]


def group_box_id(group_name: str) -> str:
    return f"group:{group_name}"


def build_scene(dump: dict, name: str) -> Scene:
    """Collapse groups per the scene (see the module doc); edges between the same two boxes merge."""
    groups = {g["name"]: g for g in dump["groups"]}
    collapse = {
        "plan": set(),
        "collapsed": set(groups),
        "fused": {n for n, g in groups.items() if g.get("status") != "fallback"},
    }[name]
    box_of: dict[str, str] = {}
    boxes: dict[str, Box] = {}
    for node in dump["graph"]["nodes"]:
        group = node.get("group")
        if group in collapse:
            box_of[node["id"]] = group_box_id(group)
            continue
        box_of[node["id"]] = node["id"]
        kind = "unfused" if "unfused_reason" in node else ("fallback" if group and groups[group].get("status") == "fallback"
                                                           else "node")
        boxes[node["id"]] = Box(node["id"], [node["op_type"]], kind)
    for group in collapse:
        g = groups[group]
        kind = "kernel" if name == "fused" else "group"
        title = g.get("kernel", group) if name == "fused" else group
        boxes[group_box_id(group)] = Box(group_box_id(group), [title, f"{g['size']} ops: {ops_summary(tuple(g['op_types']), 2)}"],
                                         kind)
    edges = _edges(dump, box_of, boxes)
    root = _clusters(dump, box_of, collapse)
    return Scene(name, boxes, root, edges)


def _edges(dump: dict, box_of: dict[str, str], boxes: dict[str, Box]) -> list[tuple[str, str]]:
    graph = dump["graph"]
    seen: dict[tuple[str, str], None] = {}
    for e in graph["edges"]:
        pair = (box_of[e["from"]], box_of[e["to"]])
        if pair[0] != pair[1]:
            seen[pair] = None
    model_inputs = {v["name"] for v in graph["inputs"]}
    model_outputs = {v["name"] for v in graph["outputs"]}
    for v in graph["inputs"]:
        boxes[f"input:{v['name']}"] = Box(f"input:{v['name']}", [v["name"]], "input")
    for v in graph["outputs"]:
        boxes[f"output:{v['name']}"] = Box(f"output:{v['name']}", [v["name"]], "output")
    for node in graph["nodes"]:
        if node.get("scope"):
            continue
        for name in node["inputs"]:
            if name in model_inputs:
                seen[(f"input:{name}", box_of[node["id"]])] = None
        for name in node["outputs"]:
            if name in model_outputs:
                seen[(box_of[node["id"]], f"output:{name}")] = None
    return list(seen)


def _clusters(dump: dict, box_of: dict[str, str], collapse: set[str]) -> Cluster:
    """The model's graph holds its bodies (by scope path) and groups; each box goes in the innermost."""
    root = Cluster("", "", "body")
    bodies: dict[str, Cluster] = {"": root}

    def body(scope: str) -> Cluster:
        if scope not in bodies:
            parent_scope = scope.rsplit("/", 2)[0] if scope.count("/") >= 2 else ""
            bodies[scope] = Cluster(f"body:{scope}", scope, "body")
            body(parent_scope).children.append(bodies[scope])
        return bodies[scope]

    group_clusters: dict[str, Cluster] = {}
    placed: set[str] = set()
    for node in dump["graph"]["nodes"]:
        box = box_of[node["id"]]
        if box in placed:
            continue
        placed.add(box)
        home = body(node.get("scope", ""))
        group = node.get("group")
        if group and group not in collapse:
            if group not in group_clusters:
                group_clusters[group] = Cluster(f"group:{group}", group, "group")
                home.children.append(group_clusters[group])
            home = group_clusters[group]
        home.boxes.append(box)
    for v in dump["graph"]["inputs"]:
        root.boxes.append(f"input:{v['name']}")
    for v in dump["graph"]["outputs"]:
        root.boxes.append(f"output:{v['name']}")
    return root
