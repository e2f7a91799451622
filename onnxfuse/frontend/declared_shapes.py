"""The model written back carries the value_info its source declared, not the front end's.

The front end infers a shape for every intermediate value (`infer_shapes.py`, with data
propagation, and `plumbed_dims.py`'s names) and onnx-ir writes each one into the canonical model
as value_info. Fusion and code generation need those shapes; onnxruntime must not get them.
onnxruntime decides some of its own graph fusions from the shapes it knows, and a shape it could
not infer itself turns on fusions the original never got, not all of them faster. PyTorch's
TorchScript export of BERT computes its Reshape targets at run time, so onnxruntime cannot tell
that the residual Add's operands are both [batch, seq, hidden] and leaves Add + Add +
LayerNormalization alone; given our shapes it fuses them into SkipLayerNormalization, whose CPU
kernel in onnxruntime 1.32 ran 4-6x slower than the three nodes at 1 thread (bert_tiny_2l_ts,
batch 64, seq 16: the whole model at 0.70x of the original; see docs/frontend.md).

So the loader reads every inferred shape into its Graph, then drops from `Graph.model` the
value_info of every value the source did not declare: the model then tells onnxruntime what the
exporter told it, and no more. Graph outputs keep theirs (their types are the model's interface).
"""

from __future__ import annotations

import onnx


def declared_value_names(model: onnx.ModelProto) -> set[str]:
    """Names of the values the model declares a value_info for, in its graph and every body."""
    return {vi.name for g in _graphs(model.graph) for vi in g.value_info}


def keep_declared_value_info(model: onnx.ModelProto, declared: set[str]) -> None:
    """Remove, in place, the value_info of every value not in `declared`, in every body too."""
    for g in _graphs(model.graph):
        kept = [vi for vi in g.value_info if vi.name in declared]
        if len(kept) != len(g.value_info):
            del g.value_info[:]
            g.value_info.extend(kept)


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _graphs(body)
