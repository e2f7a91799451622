"""Shared helpers of the exported-model corpus: the data set, saving a model with its inputs,
describing an ONNX graph for the manifest, and merging entries into manifest.json.

Runs in both exporter virtualenvs (the torch one and the Hummingbird one, whose onnx is
older), so it uses only long-standing onnx and numpy APIs.
"""

from __future__ import annotations

import collections
import json
import os
import traceback

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "manifest.json")
SEED = 0

# Ops that only compute shapes or move indices around (the exporters' "plumbing").
SHAPE_PLUMBING = ("Shape", "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice", "Reshape",
                  "ConstantOfShape", "Expand", "Range", "Size")

DTYPE_NAMES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.STRING: "string",
}


def higgs_like():
    """Synthetic stand-in for HIGGS: 5,000 rows, 28 float32 features, 2 classes."""
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=5000, n_features=28, n_informative=10,
                               random_state=SEED)
    return X.astype(np.float32), y.astype(np.int64)


def _dims(value_info):
    out = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


def _value(value_info):
    tt = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type"):
        return {"name": value_info.name, "type": str(value_info.type.WhichOneof("value"))}
    return {"name": value_info.name, "dtype": DTYPE_NAMES.get(tt.elem_type, str(tt.elem_type)),
            "shape": _dims(value_info) if tt.HasField("shape") else None}


def _walk(nodes, counter, depth, stats):
    """Counts ops in a node list and, recursively, in the subgraphs of If/Loop/Scan."""
    for node in nodes:
        counter[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
        for attr in node.attribute:
            graphs = list(attr.g.node and [attr.g] or []) + list(attr.graphs)
            for g in graphs:
                stats["subgraphs"] += 1
                stats["max_subgraph_depth"] = max(stats["max_subgraph_depth"], depth + 1)
                _walk(g.node, counter, depth + 1, stats)


def describe(model: onnx.ModelProto) -> dict:
    """Facts about a model for the manifest: counts, opsets, inputs/outputs and pattern notes."""
    g = model.graph
    top = collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in g.node)
    everything: collections.Counter = collections.Counter()
    stats = {"subgraphs": 0, "max_subgraph_depth": 0}
    _walk(g.node, everything, 0, stats)
    fn_nodes = collections.Counter()
    for f in model.functions:
        for n in f.node:
            fn_nodes[n.op_type] += 1
    init_names = {i.name for i in g.initializer}
    inputs = [_value(v) for v in g.input if v.name not in init_names]
    outputs = [_value(v) for v in g.output]
    symbolic = sorted({d for v in inputs for d in (v.get("shape") or []) if isinstance(d, str)})
    param_count = int(sum(np.prod(t.dims) if len(t.dims) else 1 for t in g.initializer))

    notes = []
    if any(d is None for v in inputs for d in (v.get("shape") or [])):
        notes.append("input dims that are dynamic but unnamed (no dim_param)")
    out_syms = sorted({d for v in outputs for d in (v.get("shape") or []) if isinstance(d, str)}
                      - set(symbolic))
    if out_syms:
        notes.append("output dims the exporter named itself: " + ", ".join(out_syms))
    if top["Constant"]:
        notes.append(f"{top['Constant']} Constant nodes at top level")
    plumbing = {op: top[op] for op in SHAPE_PLUMBING if top[op]}
    if top["Shape"]:
        notes.append("Shape-driven plumbing: " + ", ".join(f"{k}x{v}" for k, v in plumbing.items()))
    elif plumbing:
        notes.append("index/reshape ops without Shape: "
                     + ", ".join(f"{k}x{v}" for k, v in plumbing.items()))
    for op in ("If", "Loop", "Scan"):
        if everything[op]:
            notes.append(f"control flow: {everything[op]} {op} "
                         f"({stats['subgraphs']} subgraphs, nesting depth {stats['max_subgraph_depth']})")
    for op in ("LSTM", "GRU", "RNN"):
        if everything[op]:
            notes.append(f"{everything[op]} one-op {op} node(s)")
    if model.functions:
        notes.append(f"{len(model.functions)} local functions ("
                     + ", ".join(sorted({f'{f.domain}.{f.name}' for f in model.functions}))
                     + f"), {sum(fn_nodes.values())} nodes inside them")
    custom = sorted({d for d in (n.domain for n in g.node) if d not in ("", "ai.onnx")})
    if custom:
        notes.append("non-default domains at top level: " + ", ".join(custom))
    for op in ("Conv", "BatchNormalization", "MatMul", "Gemm", "LayerNormalization", "Softmax",
               "GatherElements", "TreeEnsembleClassifier", "Where", "Cast"):
        if everything[op]:
            notes.append(f"{op}x{everything[op]}")

    return {
        "ir_version": int(model.ir_version),
        "opset": {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "node_count": len(g.node),
        "node_count_with_subgraphs": int(sum(everything.values())),
        "local_function_count": len(model.functions),
        "initializer_count": len(g.initializer),
        "parameter_count": param_count,
        "op_counts": dict(sorted(top.items())),
        "op_counts_in_subgraphs_and_top": dict(sorted(everything.items())),
        "op_counts_in_functions": dict(sorted(fn_nodes.items())),
        "inputs": inputs,
        "outputs": outputs,
        "symbolic_dims": symbolic,
        "patterns_auto": notes,
    }


def write_npz(path: str, arrays: dict, compress: bool = False) -> None:
    """Like numpy.savez, but with a fixed timestamp so the same arrays give the same bytes."""
    import io
    import zipfile

    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=mode) as zf:
        for key in arrays:
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = mode
            zf.writestr(info, buf.getvalue())


def run_onnxruntime(path: str, feeds: dict) -> list:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.get_outputs(), sess.run(None, feeds)


def save_model(name: str, model_path_written: str, feeds: dict, entry: dict,
               reference: list | None = None, rtol=1e-4, atol=1e-4, strict=True) -> dict:
    """After an exporter wrote `<name>.onnx`: checks it, writes inputs/expected npz, fills entry."""
    model = onnx.load(model_path_written)
    onnx.checker.check_model(model)
    input_names = [v.name for v in model.graph.input
                   if v.name not in {i.name for i in model.graph.initializer}]
    missing = set(input_names) - set(feeds)
    extra = set(feeds) - set(input_names)
    if missing or extra:
        raise RuntimeError(f"{name}: feeds {sorted(feeds)} do not match inputs {input_names}")
    feeds = {k: np.ascontiguousarray(feeds[k]) for k in input_names}
    write_npz(os.path.join(HERE, f"{name}.inputs.npz"), feeds)
    out_info, outs = run_onnxruntime(model_path_written, feeds)
    expected = {o.name: np.asarray(v) for o, v in zip(out_info, outs)}
    write_npz(os.path.join(HERE, f"{name}.expected.npz"), expected, compress=True)

    entry = dict(entry)
    entry.update(describe(model))
    entry["status"] = "ok"
    entry["file"] = f"{name}.onnx"
    entry["file_bytes"] = os.path.getsize(model_path_written)
    entry["inputs_file"] = f"{name}.inputs.npz"
    entry["expected_file"] = f"{name}.expected.npz"
    entry["feed_shapes"] = {k: list(v.shape) for k, v in feeds.items()}
    entry["output_shapes_on_feeds"] = {k: list(v.shape) for k, v in expected.items()}
    for k, v in expected.items():
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            raise RuntimeError(f"{name}: onnxruntime output {k} is not finite")
    entry["symbolic_dims_varied"] = vary_symbolic_dims(model_path_written, feeds, entry)
    if reference is not None:
        diffs = []
        for ref, got in zip(reference, outs):
            ref = np.asarray(ref)
            got = np.asarray(got)
            if ref.shape != got.shape:
                raise RuntimeError(f"{name}: reference shape {ref.shape} != onnxruntime {got.shape}")
            if ref.dtype.kind == "f":
                diffs.append(float(np.max(np.abs(ref.astype(np.float64) - got))) if ref.size else 0.0)
                if not np.allclose(ref, got, rtol=rtol, atol=atol):
                    msg = f"onnxruntime differs from the framework by {diffs[-1]:.3g}"
                    if strict:
                        raise RuntimeError(f"{name}: {msg}")
                    entry.setdefault("framework_mismatch", []).append(msg)
            else:  # labels: the fraction that disagrees
                diffs.append(float(np.mean(ref != got)))
        entry["framework_vs_onnxruntime_max_abs_diff"] = diffs
    return entry


def vary_symbolic_dims(path: str, feeds: dict, entry: dict) -> dict:
    """Runs the model again with every symbolic input dim 3 larger (values repeated along that
    axis): does the graph really accept other sizes, or did the exporter bake one in?"""
    import re

    def key(v, axis, d):  # an unnamed dynamic dim (None) varies on its own
        return d if isinstance(d, str) else f"{v['name']}[{axis}] (unnamed)"

    sizes = {}
    for v in entry["inputs"]:
        for axis, d in enumerate(v["shape"] or []):
            if not isinstance(d, int):
                sizes[key(v, axis, d)] = feeds[v["name"]].shape[axis] + 3
    new_feeds = {}
    for v in entry["inputs"]:
        arr = feeds[v["name"]]
        for axis, d in enumerate(v["shape"] or []):
            if not isinstance(d, int):
                idx = np.arange(sizes[key(v, axis, d)]) % arr.shape[axis]
                arr = np.take(arr, idx, axis=axis)
        new_feeds[v["name"]] = np.ascontiguousarray(arr)
    result = {"sizes": sizes}
    try:
        _, outs = run_onnxruntime(path, new_feeds)
        result["status"] = "ok"
        result["output_shapes"] = [list(np.asarray(o).shape) for o in outs]
        stale = []
        for decl, got in zip(entry["outputs"], result["output_shapes"]):
            shape = decl.get("shape")
            if shape and any(isinstance(d, int) and d != g for d, g in zip(shape, got)):
                stale.append(f"{decl['name']} declared {shape}, got {got}")
        if stale:
            result["declared_output_shape_wrong"] = stale
    except Exception as exc:
        msg = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()[0]
        result["status"] = "failed"
        result["error"] = msg[:600]
    return result


def failed_entry(entry: dict, exc: BaseException) -> dict:
    import re

    entry = dict(entry)
    text = re.sub(r"\x1b\[[0-9;]*m", "", "".join(traceback.format_exception_only(type(exc), exc)))
    if "## Exception summary" in text:  # torch.onnx's long error: keep its summary
        text = text.split("## Exception summary", 1)[1]
        text = text.split("(Refer to the full stack trace", 1)[0]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    entry["status"] = "failed"
    entry["error"] = lines[0][:2000] if len(lines) == 1 else " | ".join(lines)[:2000]
    return entry


def export_recorded(entries: dict, name: str, path: str, entry: dict, export) -> None:
    """Runs `export()`, which writes `path` and returns the model's manifest entry; an exporter
    that fails is recorded in the manifest (its error, no file) instead of stopping the part."""
    try:
        entries[name] = export()
    except Exception as exc:  # recorded in the manifest, not fatal
        if os.path.exists(path):
            os.remove(path)
        entries[name] = failed_entry(entry, exc)
    print(f"{name}: {entries[name]['status']} "
          f"{entries[name].get('node_count', entries[name].get('error', ''))}", flush=True)


def merge_manifest(entries: dict, part: str) -> None:
    """Replaces this part's entries in manifest.json, keeping the other part's."""
    manifest = {"format": 1, "models": {}}
    if os.path.exists(MANIFEST):
        with open(MANIFEST) as f:
            manifest = json.load(f)
    manifest["models"] = {k: v for k, v in manifest["models"].items() if v.get("part") != part}
    for k, v in entries.items():
        v["part"] = part
        manifest["models"][k] = v
    manifest["models"] = dict(sorted(manifest["models"].items()))
    manifest["generated_by"] = "models/exported/make_corpus.py"
    with open(MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")
