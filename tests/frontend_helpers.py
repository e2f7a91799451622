"""Helpers for the front-end tests: write a model the way exporters do, run it in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper


def as_exported(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with every initializer written as a Constant node, as PyTorch and
    Hummingbird export them."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    constants = [helper.make_node("Constant", [], [t.name], name=f"const_{t.name}", value=t) for t in g.initializer]
    nodes = constants + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    return out


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    if any(o.type.tensor_type.elem_type == 0 for o in model.graph.output):  # outputs left to inference
        inferred = onnx.shape_inference.infer_shapes(model)
        model = onnx.ModelProto()
        model.CopyFrom(inferred)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def random_feeds(model: onnx.ModelProto, sizes: dict[str, int] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs: symbolic and unknown dims take `sizes[name]` (default 3)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    init_names = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            else:
                shape.append((sizes or {}).get(d.dim_param, 3))
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[vi.name] = rng.integers(0, 3, shape).astype(dtype)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, sizes=None, seeds=(0, 1, 2)) -> None:
    """onnxruntime gives the same outputs for both models on random inputs."""
    for seed in seeds:
        feeds = random_feeds(before, sizes, seed)
        for x, y in zip(run(before, feeds), run(after, feeds), strict=True):
            np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-6)


def apply(pass_, model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """One onnx-ir pass on a ModelProto: the model after it, and whether it changed anything."""
    import onnx_ir as ir

    ir_model = ir.serde.deserialize_model(model)
    result = pass_(ir_model)
    return ir.serde.serialize_model(result.model), result.modified


def with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with onnx's inferred shapes on its values, as the passes that need them see it."""
    return onnx.shape_inference.infer_shapes(model, data_prop=True)
