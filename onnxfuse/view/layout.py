"""Coordinates for a scene from Graphviz's `dot` (run as a program, `-Tjson`).

The page draws the picture itself from these numbers (y grows downwards, in points), so it can
give every box the attributes that selection, search and collapsing need.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from ..errors import UsageError
from .scenes import Box, Cluster, Scene

DOT_TIMEOUT_SECONDS = 600
GRAPH_ATTRIBUTES = ('rankdir=TB; nodesep=0.12; ranksep=0.28; fontname="sans-serif"; fontsize=10; newrank=true; '
                    'nslimit=2;')  # few network-simplex passes for x: seconds, not minutes, at 1,000 nodes
NODE_ATTRIBUTES = 'shape=box; fontname="sans-serif"; fontsize=10; height=0.28; margin="0.06,0.03";'


def dot_program() -> str:
    """The `dot` executable, or a one-line error saying how to get it."""
    path = shutil.which("dot")
    if path is None:
        raise UsageError("the HTML view needs Graphviz's `dot` program, which is not on PATH "
                         "(Debian: apt-get install graphviz; or run `make install`)")
    return path


def layout_scenes(scenes: list[Scene]) -> dict[str, dict]:
    """Each scene's layout, by scene name; the `dot` runs go side by side."""
    program = dot_program()
    with ThreadPoolExecutor(max_workers=len(scenes) or 1) as pool:
        layouts = pool.map(lambda s: layout_scene(s, program), scenes)
        return {s.name: layout for s, layout in zip(scenes, layouts)}


def layout_scene(scene: Scene, program: str = "dot") -> dict:
    """{width, height, boxes: {id: [cx, cy, w, h]}, clusters: {name: [x, y, w, h]},
    edges: [[from, to, svg path, [x0, y0, x1, y1] of the arrow]]}.

    A scene with group clusters is laid out in two levels (see `_layout_groups_whole`): dot's
    cluster handling grows far faster than its node count, and a 1,000-node plan with 170
    clusters took it over ten minutes where the same plan in two levels takes seconds."""
    groups = [c for c in _clusters_in(scene.root) if c.kind == "group"]
    if groups:
        return _layout_groups_whole(scene, groups, program)
    return _run_dot(dot_source(scene), scene.name, program)


def _run_dot(source_and_names: tuple[str, list[str]], what: str, program: str) -> dict:
    source, names = source_and_names
    try:
        proc = subprocess.run([program, "-Tjson"], input=source, capture_output=True, text=True,
                              timeout=DOT_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise UsageError(f"dot took over {DOT_TIMEOUT_SECONDS} s to lay out the {what} view") from None
    if proc.returncode != 0:
        raise UsageError(f"dot could not lay out the {what} view: {proc.stderr.strip()[:200]}")
    return parse_dot_json(json.loads(proc.stdout), names)


GROUP_PAD = 6.0  # points between a group's rectangle and its nodes
GROUP_LABEL = 14.0  # points above them for the group's name (view.js draws it at y + 11)
LABEL_POINTS_PER_CHAR = 6.0


def _layout_groups_whole(scene: Scene, groups: list[Cluster], program: str) -> dict:
    """Each group laid out alone, then the graph with each group one box of that size; the
    group's nodes and inner edges are moved into its box. An edge into or out of a group is
    drawn to the group's rectangle, once per pair of boxes it joins."""
    owner = {box_id: group.name for group in groups for box_id in group.boxes}
    inner_edges: dict[str, list[tuple[str, str]]] = {g.name: [] for g in groups}
    outer_pair: dict[tuple[str, str], tuple[str, str]] = {}  # a scene edge -> the outer boxes it joins
    for a, b in scene.edges:
        pair = (owner.get(a, a), owner.get(b, b))
        if pair[0] == pair[1]:
            inner_edges[pair[0]].append((a, b))
        else:
            outer_pair[(a, b)] = pair
    with ThreadPoolExecutor(max_workers=2) as pool:
        inner = dict(zip((g.name for g in groups), pool.map(
            lambda g: _run_dot(dot_source(Scene(f"{scene.name} {g.label}", {b: scene.boxes[b] for b in g.boxes},
                                                Cluster("", "", "body", list(g.boxes)), inner_edges[g.name])),
                               scene.name, program), groups)))
    sizes = {g.name: (max(inner[g.name]["width"], len(g.label) * LABEL_POINTS_PER_CHAR + 16) + 2 * GROUP_PAD,
                      inner[g.name]["height"] + 2 * GROUP_PAD + GROUP_LABEL) for g in groups}
    outer_boxes = {b: box for b, box in scene.boxes.items() if b not in owner}
    outer_boxes.update({g.name: Box(g.name, [""], "group") for g in groups})
    outer = Scene(scene.name, outer_boxes, _groups_as_boxes(scene.root), list(dict.fromkeys(outer_pair.values())))
    placed = _run_dot(dot_source(outer, sizes), scene.name, program)

    layout = {"width": placed["width"], "height": placed["height"], "clusters": placed["clusters"], "boxes": {}, "edges": []}
    layout["boxes"] = {b: xywh for b, xywh in placed["boxes"].items() if b in scene.boxes}
    drawn_between = {(a, b): (path, arrow) for a, b, path, arrow in placed["edges"]}
    for g in groups:
        cx, cy, w, h = placed["boxes"][g.name]
        x0, y0 = cx - w / 2, cy - h / 2
        layout["clusters"][g.name] = [round(x0, 1), round(y0, 1), w, h]
        dx = x0 + (w - inner[g.name]["width"]) / 2
        dy = y0 + GROUP_PAD + GROUP_LABEL
        for b, (bx, by, bw, bh) in inner[g.name]["boxes"].items():
            layout["boxes"][b] = [round(bx + dx, 1), round(by + dy, 1), bw, bh]
        for a, b, path, arrow in inner[g.name]["edges"]:
            layout["edges"].append([a, b, _moved_path(path, dx, dy), _moved_points(arrow, dx, dy)])
    for (a, b), pair in outer_pair.items():
        layout["edges"].append([a, b, *drawn_between[pair]])
    return layout


def _clusters_in(cluster: Cluster):
    for child in cluster.children:
        yield child
        yield from _clusters_in(child)


def _groups_as_boxes(cluster: Cluster) -> Cluster:
    """The cluster tree with each group cluster turned into one box (named as the cluster)."""
    kept = [child for child in cluster.children if child.kind != "group"]
    as_boxes = [child.name for child in cluster.children if child.kind == "group"]
    return Cluster(cluster.name, cluster.label, cluster.kind, [*cluster.boxes, *as_boxes],
                   [_groups_as_boxes(child) for child in kept])


def _moved_points(points: list[float], dx: float, dy: float) -> list[float]:
    return [round(v + (dx if k % 2 == 0 else dy), 1) for k, v in enumerate(points)]


def _moved_path(path: str, dx: float, dy: float) -> str:
    """An SVG path of M/C commands with every point moved by (dx, dy)."""
    def move(match: re.Match) -> str:
        return f"{round(float(match.group(1)) + dx, 1)},{round(float(match.group(2)) + dy, 1)}"
    return re.sub(r"(-?[\d.]+),(-?[\d.]+)", move, path)


def dot_source(scene: Scene, sizes: dict[str, tuple[float, float]] | None = None) -> tuple[str, list[str]]:
    """The scene in the dot language; boxes are `n<k>` there, `names[k]` is the box's id. A box
    in `sizes` is an empty rectangle of that many points, which dot may not resize."""
    sizes = sizes or {}
    names = list(scene.boxes)
    number = {box_id: k for k, box_id in enumerate(names)}
    lines = ["digraph plan {", GRAPH_ATTRIBUTES, f"node [{NODE_ATTRIBUTES}];", "edge [arrowsize=0.5];"]

    def emit(cluster: Cluster, depth: int) -> None:
        pad = "  " * depth
        for box_id in cluster.boxes:
            box = scene.boxes[box_id]
            if box_id in sizes:
                w, h = sizes[box_id]
                lines.append(f'{pad}n{number[box_id]} [label="" fixedsize=true width={w / 72:.4f} height={h / 72:.4f}];')
                continue
            shape = ' shape=ellipse' if box.kind in ("input", "output") else ""
            lines.append(f'{pad}n{number[box_id]} [label={_quote(chr(10).join(box.lines))}{shape}];')
        for k, child in enumerate(cluster.children):
            lines.append(f"{pad}subgraph cluster_{depth}_{len(lines)}_{k} {{ label={_quote(child.label)}; "
                         f'id={_quote(child.name)}; margin=6;')
            emit(child, depth + 1)
            lines.append(f"{pad}}}")

    emit(scene.root, 1)
    lines += [f"  n{number[a]} -> n{number[b]};" for a, b in scene.edges]
    lines.append("}")
    return "\n".join(lines), names


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def parse_dot_json(graph: dict, names: list[str]) -> dict:
    """dot's coordinates (points, y upwards) → the page's (points, y downwards), rounded."""
    _, _, width, height = (float(v) for v in graph["bb"].split(","))

    def point(text: str) -> tuple[float, float]:
        x, y = text.split(",")[-2:]
        return round(float(x), 1), round(height - float(y), 1)

    boxes, clusters, box_at = {}, {}, {}
    for k, obj in enumerate(graph.get("objects", [])):
        if "nodes" in obj or obj.get("name", "").startswith("cluster_"):
            if "bb" in obj:
                x0, y0, x1, y1 = (float(v) for v in obj["bb"].split(","))
                clusters[obj["id"]] = [round(x0, 1), round(height - y1, 1), round(x1 - x0, 1), round(y1 - y0, 1)]
            continue
        box_id = names[int(obj["name"][1:])]
        box_at[k] = box_id
        cx, cy = point(obj["pos"])
        boxes[box_id] = [cx, cy, round(float(obj["width"]) * 72, 1), round(float(obj["height"]) * 72, 1)]
    edges = []
    for e in graph.get("edges", []):
        path, arrow = _spline(e["pos"], point)
        edges.append([box_at[e["tail"]], box_at[e["head"]], path, arrow])
    return {"width": round(width, 1), "height": round(height, 1), "boxes": boxes, "clusters": clusters, "edges": edges}


def _spline(pos: str, point) -> tuple[str, list[float]]:
    """dot's `e,x,y p0 p1 ... p3n` (cubic Bézier pieces, then the arrow tip) → an SVG path."""
    end, points = None, []
    for part in pos.split(" "):
        if part.startswith("e,"):
            end = point(part[2:])
        elif not part.startswith("s,"):
            points.append(point(part))
    path = f"M{points[0][0]},{points[0][1]}" + "".join(
        f"C{a[0]},{a[1]} {b[0]},{b[1]} {c[0]},{c[1]}" for a, b, c in zip(points[1::3], points[2::3], points[3::3]))
    tip = end or points[-1]
    return path, [*points[-1], *tip]
