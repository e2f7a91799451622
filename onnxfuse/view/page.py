"""One self-contained HTML page from a graph dump: the template with its style, script and data inlined.

Nothing on the page refers to anything outside it (no scripts, styles, fonts or images to fetch),
so it opens the same from a CI artifact store with no network as from a laptop.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from ..atomic import write_text_atomic
from .layout import layout_scenes
from .scenes import SCENES, build_scene

COLLAPSE_ABOVE_NODES = 300
"""Plans with more nodes than this open with every group collapsed into one box."""


def render_page(dump: dict) -> str:
    """The page's HTML text for `dump` (onnxfuse.graph_dump.graph_dump)."""
    scenes = [build_scene(dump, name) for name in SCENES]
    layouts = layout_scenes(scenes)
    for scene in scenes:
        for box_id, box in scene.boxes.items():
            layouts[scene.name]["boxes"][box_id] += [box.kind, box.lines]
    data = {"dump": dump, "layouts": layouts,
            "start_collapsed": len(dump["graph"]["nodes"]) > COLLAPSE_ABOVE_NODES}
    template = _asset("page.html")
    return (template
            .replace("/*STYLE*/", _asset("view.css"))
            .replace("/*SCRIPT*/", _asset("view.js"))
            .replace("{{TITLE}}", _escape_html(f"onnxfuse plan: {dump['model']}"))
            .replace("{{DATA}}", _script_json(data)))


def write_page(dump: dict, path: str | Path) -> None:
    write_text_atomic(Path(path), render_page(dump))


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _script_json(data: dict) -> str:
    """JSON safe inside <script>: no `</script>` or `<!--` can end the element early."""
    return json.dumps(data, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
