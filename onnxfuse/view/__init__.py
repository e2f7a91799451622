"""The fusion plan as one self-contained HTML page, drawn from a graph dump (onnxfuse.graph_dump).

Apart from the core: dump → scenes (what to draw) → layout (Graphviz `dot`) → page (template,
style and script inlined). Nothing here is imported by fusion, codegen or the pipeline.
"""

from .page import render_page, write_page

__all__ = ["render_page", "write_page"]
