"""Shrink a failing component to a few nodes and one input row that still fail the same way.

Greedy delta debugging, each step kept only if the case still fails with the same kind of
finding (every check recompiles with onnxfuse, a few seconds each):
1. one output, one input set: the first finding's (for an error or a crash, the first output
   that alone still shows it);
2. cut nodes, inputs side first: a node's outputs become graph inputs fed with the values
   onnxruntime computes for them on the failing inputs, and what then feeds nothing is pruned;
3. one batch row: inputs with the batch axis keep only the first failing row.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from .campaign import Failure, OptimizeFailed, optimize, save_failure
from .execute import Case, Finding, Job, run_cases
from .graphs import BATCH, prune


def findings_for(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[Finding]:
    """Compile `model` with onnxfuse and check it on `feeds` (an empty list: it passes)."""
    with tempfile.TemporaryDirectory(prefix="fuzz-min-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, path)
        try:
            fused, library, _ = optimize(path, Path(tmp), jobs=1, timeout=300)
        except OptimizeFailed as exc:
            return [Finding("case", "crash", detail=f"optimize: {exc}")]
        case = Case("case", [o.name for o in model.graph.output], [feeds])
        return run_cases(Job(str(path), str(fused), str(library) if library else None, [case]), timeout=300)


def minimise_failure(failure: Failure, directory: Path | None = None, log=lambda s: None) -> Failure:
    """The smallest failing case found by the steps in the module docstring (saved to `directory`)."""
    first = failure.findings[0]
    feeds = failure.feeds[max(first.input_set, 0)]
    model = prune(failure.model, [first.output]) if first.output else failure.model

    def still_fails(candidate, candidate_feeds):
        found = [f for f in findings_for(candidate, candidate_feeds) if f.kind == first.kind]
        return found[0] if found else None

    finding = still_fails(model, feeds)
    if finding is None:  # flaky or dependent on other outputs: keep it as it is
        return replace(failure, feeds=[feeds])
    if not first.output:  # an error or a crash: keep only an output that still shows it
        for output in [o.name for o in model.graph.output]:
            one = prune(model, [output])
            if len(model.graph.output) > 1 and (found := still_fails(one, {i.name: feeds[i.name] for i in one.graph.input})):
                model, finding = one, found
                feeds = {i.name: feeds[i.name] for i in one.graph.input}
                break
    progress = True
    while progress:
        progress = False
        for node in list(model.graph.node):
            cut = _cut(model, node, feeds)
            if cut is None:
                continue
            found = still_fails(*cut)
            if found is not None:
                (model, feeds), finding, progress = cut, found, True
                log(f"minimise: cut {node.op_type}, {len(model.graph.node)} nodes left")
                break
    row = _first_failing_row(finding)
    if row is not None:
        one_row = _one_row(model, feeds, row)
        if one_row is not None and (found := still_fails(model, one_row)) is not None:
            feeds, finding = one_row, found
    small = Failure(model, [feeds], [finding], failure.bug)
    if directory is not None:
        save_failure(small, directory)
        np.savez(directory / "inputs.npz", **feeds)  # regressions.save's format for one input set
    return small


def _cut(model: onnx.ModelProto, node: onnx.NodeProto, feeds: dict) -> tuple[onnx.ModelProto, dict] | None:
    """`model` without `node`: its outputs become inputs fed with onnxruntime's values for them."""
    import onnxruntime as ort

    outputs = [o.name for o in model.graph.output]
    if any(o in outputs for o in node.output) or len(model.graph.node) <= 2:
        return None
    upstream = prune(model, list(node.output))
    try:
        session = ort.InferenceSession(upstream.SerializeToString(), providers=["CPUExecutionProvider"])
        values = session.run(None, {i.name: feeds[i.name] for i in upstream.graph.input})
    except Exception:
        return None
    g = model.graph
    new_inputs = [_input_like(v, np.asarray(a)) for v, a in zip(upstream.graph.output, values)]
    graph = helper.make_graph([n for n in g.node if n is not node], g.name, list(g.input) + new_inputs,
                              list(g.output), list(g.initializer))
    cut = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    cut = prune(cut, outputs)
    new_feeds = {**feeds, **{v.name: np.asarray(a) for v, a in zip(upstream.graph.output, values)}}
    return cut, {i.name: new_feeds[i.name] for i in cut.graph.input}


def _input_like(value: onnx.ValueInfoProto, array: np.ndarray) -> onnx.ValueInfoProto:
    """A graph input for an intermediate: its inferred shape, unknown dims filled from `array`."""
    dims = []
    for d, n in zip(value.type.tensor_type.shape.dim, array.shape):
        dims.append(d.dim_param if d.dim_param else d.dim_value if d.HasField("dim_value") else n)
    return helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type, dims)


def _first_failing_row(finding: Finding) -> int | None:
    match = re.search(r"at \[(\d+)", finding.detail)
    return int(match.group(1)) if match else None


def _one_row(model: onnx.ModelProto, feeds: dict, row: int) -> dict | None:
    """`feeds` with only `row` along the batch axis, if every batched input has it first."""
    out = {}
    for i in model.graph.input:
        dims = i.type.tensor_type.shape.dim
        batched = [k for k, d in enumerate(dims) if d.dim_param == BATCH]
        if batched and batched != [0]:
            return None
        out[i.name] = feeds[i.name][row:row + 1] if batched else feeds[i.name]
    return out
