"""Coordinates for a scene from Graphviz's `dot` (run as a program, `-Tjson`).

The page draws the picture itself from these numbers (y grows downwards, in points), so it can
give every box the attributes that selection, search and collapsing need.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from ..errors import UsageError
from .scenes import Cluster, Scene

DOT_TIMEOUT_SECONDS = 600
GRAPH_ATTRIBUTES = 'rankdir=TB; nodesep=0.12; ranksep=0.28; fontname="sans-serif"; fontsize=10; newrank=true;'
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
    edges: [[from, to, svg path, [x0, y0, x1, y1] of the arrow]]}."""
    source, names = dot_source(scene)
    try:
        proc = subprocess.run([program, "-Tjson"], input=source, capture_output=True, text=True,
                              timeout=DOT_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise UsageError(f"dot took over {DOT_TIMEOUT_SECONDS} s to lay out the {scene.name} view") from None
    if proc.returncode != 0:
        raise UsageError(f"dot could not lay out the {scene.name} view: {proc.stderr.strip()[:200]}")
    return parse_dot_json(json.loads(proc.stdout), names)


def dot_source(scene: Scene) -> tuple[str, list[str]]:
    """The scene in the dot language; boxes are `n<k>` there, `names[k]` is the box's id."""
    names = list(scene.boxes)
    number = {box_id: k for k, box_id in enumerate(names)}
    lines = ["digraph plan {", GRAPH_ATTRIBUTES, f"node [{NODE_ATTRIBUTES}];", "edge [arrowsize=0.5];"]

    def emit(cluster: Cluster, depth: int) -> None:
        pad = "  " * depth
        for box_id in cluster.boxes:
            box = scene.boxes[box_id]
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
