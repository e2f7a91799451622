"""Run components of an original and a fused model in onnxruntime, in a child process, and compare.

`run_cases` is the parent's side: it starts `python -m fuzz.execute JOB RESULTS` and reads one
JSON line per event back. A kernel that segfaults or aborts kills only the child: the case it was
running is recorded as a crash and a new child carries on with the rest.
Each case is one component, cut out of both models (graphs.prune), so an input that makes one
component raise in onnxruntime leaves the others' comparisons intact.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from .compare import EXACT_OPS, ULP_BUDGET, compare_output, largest_magnitude
from .graphs import prune

TESTS_DIR = Path(__file__).resolve().parents[1]


@dataclass
class Case:
    """One component to check: its output names and the input sets to run it on."""
    id: str
    outputs: list[str]
    feeds: list[dict[str, np.ndarray]]


@dataclass
class Finding:
    case: str
    kind: str  # a compare.Verdict kind, "fused-raised", "missed-error" or "crash"
    output: str = ""
    input_set: int = -1
    detail: str = ""

    def to_json(self) -> dict:
        return self.__dict__.copy()


@dataclass
class Job:
    original: str  # model paths
    fused: str
    library: str | None
    cases: list[Case] = field(default_factory=list)


def exact_outputs(model: onnx.ModelProto) -> dict[str, bool]:
    """Whether every op upstream of each graph output is IEEE-exact (compare.py, rule 2)."""
    return {name: not approximated for name, (approximated, _) in _upstream(model).items()}


def approximation_precisions(model: onnx.ModelProto) -> dict[str, str | None]:
    """For each graph output downstream of an approximation (compare.py, rule 3), the narrowest
    float type an upstream value has: its ulps are the budget's (a float32 result cast to
    float64 keeps float32's error); None for an exact output."""
    return {name: precision if approximated else None for name, (approximated, precision) in _upstream(model).items()}


_FLOAT_WIDTH = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64"}
_NARROWEST_FIRST = ("float16", "float32", "float64")


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Every value's element type, as shape inference gives it."""
    inferred = onnx.shape_inference.infer_shapes(model)
    return {v.name: v.type.tensor_type.elem_type
            for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}


def _upstream(model: onnx.ModelProto) -> dict[str, tuple[bool, str | None]]:
    """Per graph output: (whether an op upstream is not IEEE-exact, the narrowest float type of
    a value upstream, the output included)."""
    types = _element_types(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for output in model.graph.output:
        stack, seen, approximated, floats = [output.name], set(), False, set()
        while stack:
            value = stack.pop()
            if value in seen:
                continue
            seen.add(value)
            if types.get(value) in _FLOAT_WIDTH:
                floats.add(_FLOAT_WIDTH[types[value]])
            n = producers.get(value)
            if n is None:
                continue
            approximated |= n.op_type not in EXACT_OPS
            stack.extend(n.input)
        out[output.name] = (approximated, next((f for f in _NARROWEST_FIRST if f in floats), None))
    return out


def upstream_nodes(producers: dict[str, onnx.NodeProto], value: str):
    """Every node `value` depends on, each once (`producers`: output name → node)."""
    stack, seen = [value], set()
    while stack:
        n = producers.get(stack.pop())
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(n.input)


def _approximated(producers: dict[str, onnx.NodeProto], value: str) -> bool:
    """Whether an op that is not IEEE-exact computes anything `value` depends on."""
    return any(n.op_type not in EXACT_OPS for n in upstream_nodes(producers, value))


def sin_cos_arguments(model: onnx.ModelProto) -> dict[str, set[str]]:
    """compare.py, rule 3's magnitude: the input of each Sin/Cos computed by a not IEEE-exact op
    upstream → the graph outputs downstream of that Sin/Cos."""
    producers = {o: n for n in model.graph.node for o in n.output}

    arguments: dict[str, set[str]] = {}
    for output in model.graph.output:
        for n in upstream_nodes(producers, output.name):
            if n.op_type in ("Sin", "Cos") and _approximated(producers, n.input[0]):
                arguments.setdefault(n.input[0], set()).add(output.name)
    return arguments


_INTEGER = {onnx.TensorProto.INT8: np.int8, onnx.TensorProto.INT16: np.int16, onnx.TensorProto.INT32: np.int32,
            onnx.TensorProto.INT64: np.int64, onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.UINT16: np.uint16,
            onnx.TensorProto.UINT32: np.uint32, onnx.TensorProto.UINT64: np.uint64}
_COMPARISONS = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
_INTEGER_SUMS = ("ReduceSum", "ReduceMean", "ReduceProd", "ReduceSumSquare", "ReduceL1")


def _uncompared_probes(model: onnx.ModelProto) -> dict[str, list[tuple[tuple, set[str]]]]:
    """The values whose contents decide whether an output is compared (compare.py, rules 5 to 7):
    value → [(rule, the graph outputs downstream of it)]. Rules: ("nan",) for a ReduceMax/ReduceMin
    input; ("cast-range", dtype) for a float → integer Cast's input; ("integer-sum", dtype) for an
    integer ReduceSum/Mean/Prod/SumSquare/L1 output; ("approximate-compare", other, dtype) for a
    comparison's first operand when an approximation is upstream of either (`other`: the second)."""
    types = _element_types(model)
    producers = {o: n for n in model.graph.node for o in n.output}

    rules: dict[str, dict[tuple, set[str]]] = {}
    for output in model.graph.output:
        for n in upstream_nodes(producers, output.name):
            if n.op_type in ("ReduceMax", "ReduceMin"):
                rules.setdefault(n.input[0], {}).setdefault(("nan",), set()).add(output.name)
            to = next((a.i for a in n.attribute if a.name == "to"), None)
            if n.op_type == "Cast" and to in _INTEGER and types.get(n.input[0]) in _FLOAT_WIDTH:
                rules.setdefault(n.input[0], {}).setdefault(("cast-range", _INTEGER[to]), set()).add(output.name)
            if n.op_type in _INTEGER_SUMS and types.get(n.output[0]) in _INTEGER:
                rule = ("integer-sum", _INTEGER[types[n.output[0]]])
                rules.setdefault(n.output[0], {}).setdefault(rule, set()).add(output.name)
            if (n.op_type in _COMPARISONS and types.get(n.input[0]) in _FLOAT_WIDTH
                    and (_approximated(producers, n.input[0]) or _approximated(producers, n.input[1]))):
                rule = ("approximate-compare", n.input[1], _FLOAT_WIDTH[types[n.input[0]]])
                rules.setdefault(n.input[0], {}).setdefault(rule, set()).add(output.name)
    return {value: list(by_rule.items()) for value, by_rule in rules.items()}


def _probed_values(uncompared: dict) -> list[str]:
    """Every value the rules read: the probed ones and a comparison's second operand."""
    return [*uncompared, *(rule[1] for by_rule in uncompared.values() for rule, _ in by_rule
                           if rule[0] == "approximate-compare")]


def _rule_applies(rule: tuple, value: np.ndarray, rows: dict | None = None) -> bool:
    """Whether `value` is one that onnxruntime answers off-spec or without a defined answer for, or
    (approximate-compare) one the approximation's allowed error decides."""
    if rule[0] == "nan":
        return bool(np.isnan(value).any())
    if rule[0] == "approximate-compare":  # compare.py, rule 7
        other = np.asarray(rows[rule[1]])
        with np.errstate(invalid="ignore", over="ignore"):
            a, b = np.broadcast_arrays(value.astype(np.float64), other.astype(np.float64))
            scale = np.maximum(np.abs(a), np.abs(b))
            budget = ULP_BUDGET[rule[2]] * np.spacing(scale.astype(rule[2])).astype(np.float64)
            return bool((np.isfinite(a) & np.isfinite(b) & (np.abs(a - b) <= budget)).any())
    info = np.iinfo(rule[1])
    if rule[0] == "cast-range":  # out of the integer type's range: undefined in ONNX
        whole = np.trunc(value[np.isfinite(value)].astype(np.float64))
        return bool(((whole < info.min) | (whole > info.max)).any())
    # integer-sum: onnxruntime sums in double and saturates (test_fuzz_slice.py pins it)
    exact_limit = 2.0 ** 53 if info.bits == 64 else float("inf")
    return bool(((value == info.min) | (value == info.max) | (np.abs(value.astype(np.float64)) >= exact_limit)).any())


def run_cases(job: Job, timeout: float = 600) -> list[Finding]:
    """Every case of `job` checked in child processes; a crash costs one case, not the run."""
    findings: list[Finding] = []
    remaining = list(job.cases)
    with tempfile.TemporaryDirectory(prefix="fuzz-exec-") as tmp:
        while remaining:
            job_path, results = Path(tmp) / "job.pkl", Path(tmp) / "results.jsonl"
            job_path.write_bytes(pickle.dumps(Job(job.original, job.fused, job.library, remaining)))
            results.unlink(missing_ok=True)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
            try:
                proc = subprocess.run([sys.executable, "-m", "fuzz.execute", str(job_path), str(results)], env=env,
                                      capture_output=True, timeout=timeout)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            events = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
            done = {e["case"] for e in events if e["event"] == "done"}
            findings += [Finding(**f) for e in events if e["event"] == "done" for f in e["findings"]]
            if code == 0:
                break
            started = [e for e in events if e["event"] == "start"]
            if not started or started[-1]["case"] in done:
                raise RuntimeError(f"the fuzz runner failed outside any case (exit {code}): "
                                   f"{proc.stderr.decode(errors='replace')[-2000:] if code != 'timeout' else ''}")
            crashed = started[-1]
            if crashed["side"] == "fused":
                how = f"signal {signal.Signals(-code).name}" if isinstance(code, int) and code < 0 else f"exit {code}"
                findings.append(Finding(crashed["case"], "crash", input_set=crashed["set"], detail=how))
            remaining = [c for c in remaining if c.id not in done and c.id != crashed["case"]]
    return findings


# -- the child's side ----------------------------------------------------------------------------

def _session(model: onnx.ModelProto, library: str | None, optimized: bool = True):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if library:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _run(session, feeds):
    try:
        return session.run(None, feeds), None
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument/RuntimeException types
        return None, str(exc).strip().splitlines()[0][:200]


def _check(case: Case, original: onnx.ModelProto, fused: onnx.ModelProto, library, emit) -> list[Finding]:
    reference_model = prune(original, case.outputs)
    exact = exact_outputs(reference_model)
    precision = approximation_precisions(reference_model)
    reference = _session(reference_model, None)
    emit({"event": "start", "case": case.id, "set": -1, "side": "fused"})
    try:
        compiled = _session(prune(fused, case.outputs), library)
    except Exception as exc:
        return [Finding(case.id, "fused-raised", detail=f"session: {str(exc).strip()[:200]}")]
    uncompared = _uncompared_probes(reference_model)
    periodic = sin_cos_arguments(reference_model)
    constants = {i.name: numpy_helper.to_array(i) for i in reference_model.graph.initializer}
    given = {i.name for i in reference_model.graph.input} | set(constants)
    computed = [v for v in dict.fromkeys([*_probed_values(uncompared), *periodic]) if v not in given]
    probe = _session(prune(reference_model, computed), None) if computed else None
    findings = []
    for number, feeds in enumerate(case.feeds):
        emit({"event": "start", "case": case.id, "set": number, "side": "reference"})
        expected, error = _run(reference, feeds)
        if error is not None and "Fusion/" in error:
            # onnxruntime's own graph rewrite failed (MatmulTransposeFusion raises on an empty batch:
            # test_fuzz_slice.py pins it); the graph as written is the reference then.
            expected, error = _run(_session(reference_model, None, optimized=False), feeds)
        emit({"event": "start", "case": case.id, "set": number, "side": "fused"})
        actual, fused_error = _run(compiled, feeds)
        if error is not None and fused_error is None:
            findings.append(Finding(case.id, "missed-error", input_set=number, detail=f"onnxruntime: {error}"))
        elif error is None and fused_error is not None:
            findings.append(Finding(case.id, "fused-raised", input_set=number, detail=fused_error))
        elif error is None:
            magnitude = largest_magnitude(list(feeds.values()))
            magnitudes = dict.fromkeys(case.outputs, magnitude)
            skipped = set()
            if uncompared or periodic:  # compare.py, rules 3 (Sin/Cos), 5 to 7
                probed = probe.run(None, {i.name: feeds[i.name] for i in probe.get_inputs()}) if probe else []
                rows = {**constants, **feeds, **dict(zip(computed, probed))}
                skipped = {o for value, by_rule in uncompared.items() for rule, outputs in by_rule
                           if _rule_applies(rule, np.asarray(rows[value]), rows) for o in outputs}
                for value, outputs in periodic.items():
                    for o in outputs:
                        magnitudes[o] = max(magnitudes[o], largest_magnitude([np.asarray(rows[value])]))
            for name, e, a in zip(case.outputs, expected, actual):
                if name in skipped:
                    continue
                verdict = compare_output(np.asarray(e), np.asarray(a), exact[name], magnitudes[name], precision[name])
                if not verdict.ok:
                    findings.append(Finding(case.id, verdict.kind, name, number, verdict.detail))
    return findings


def main(job_path: str, results_path: str) -> None:
    job: Job = pickle.loads(Path(job_path).read_bytes())
    original, fused = onnx.load(job.original), onnx.load(job.fused)
    with open(results_path, "a") as out:
        def emit(event):
            out.write(json.dumps(event) + "\n")
            out.flush()
            os.fsync(out.fileno())

        for case in job.cases:
            findings = _check(case, original, fused, job.library, emit)
            emit({"event": "done", "case": case.id, "findings": [f.to_json() for f in findings]})


if __name__ == "__main__":
    main(*sys.argv[1:3])
