"""A fuzzing campaign: batches of random components, each batch one model and one onnxfuse call.

Per batch: generate components (graphs.py), keep those onnx's checker accepts and onnxruntime
loads, assemble them into one model, `onnxfuse optimize --select all --no-cache` it in a child
process (a compile is 1-3 s a group; one call compiles all the batch's groups with `--jobs`),
then check every component on adversarial inputs (feeds.py, execute.py). Findings are sorted
into known bugs (known_bugs.py) and new ones; each failing case is saved (component model +
inputs) so it can be minimised (minimise.py) and replayed.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .execute import Case, Finding, Job, run_cases
from .feeds import input_sets
from .generic_sigmoid import sigmoids_left, with_generic_sigmoid
from .graphs import Component, GeneratorConfig, assemble, check, generate_component, prune
from .known_bugs import known_bug_of
from .levels import host_levels, level_for_batch, runs_generic_sigmoid

ONNXFUSE = str(Path(sys.executable).with_name("onnxfuse"))


@dataclass
class Failure:
    """One failing component: its findings, and the model and inputs that show them."""
    model: onnx.ModelProto
    feeds: list[dict[str, np.ndarray]]
    findings: list[Finding]
    bug: str | None  # a known bug's name, or None when new

    @property
    def signature(self) -> tuple[str, str]:
        """(kind, op) of the first finding: the op onnxruntime raised in, or that made the output."""
        first = self.findings[0]
        raised_in = re.search(r"running (\w+) node", first.detail)
        producer = next((n.op_type for n in self.model.graph.node if first.output in n.output), "")
        return first.kind, raised_in.group(1) if raised_in else producer


@dataclass
class Tally:
    graphs: int = 0
    skipped: int = 0
    groups_compiled: int = 0
    groups_fallback: int = 0
    mismatches: int = 0
    crashes: int = 0
    known: dict[str, int] = field(default_factory=dict)
    fallback_reasons: dict[str, int] = field(default_factory=dict)
    fused_ops: dict[str, int] = field(default_factory=dict)  # op type → nodes of it inside compiled groups
    levels: dict[str, int] = field(default_factory=dict)  # ISA level → graphs compiled for it
    seconds: dict[str, float] = field(default_factory=lambda: {"generate": 0.0, "optimize": 0.0, "check": 0.0})
    new: list[Failure] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    def line(self) -> str:
        return f"fuzz: {self.graphs} graphs, {self.mismatches} mismatches, {self.crashes} crashes"


class OptimizeFailed(Exception):
    pass


def optimize(model_path: Path, out_dir: Path, jobs: int = 2, timeout: float = 900,
             level_options: list[str] = ()) -> tuple[Path, Path | None, dict]:
    """`onnxfuse optimize --select all --no-cache` in a child process: (fused model, library, report).
    level_options: build one ISA level (levels.py); by default every portable level."""
    fused, report = out_dir / "fused.onnx", out_dir / "report.json"
    cmd = [ONNXFUSE, "optimize", str(model_path), "-o", str(fused), "--select", "all", "--no-cache",
           "--jobs", str(jobs), "--report", str(report), "-q", *level_options]
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        raise OptimizeFailed(f"exit {proc.returncode}: {proc.stderr.decode(errors='replace')[-1500:]}")
    data = json.loads(report.read_text())
    return fused, Path(data["library"]) if data["library"] else None, data


def runnable(component: Component) -> bool:
    """onnx's checker accepts it and onnxruntime loads and runs it on ordinary inputs."""
    import onnxruntime as ort

    if not component.outputs:
        return False
    model = assemble([component])
    try:
        check(model)
        options = ort.SessionOptions()
        options.log_severity_level = 4
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = input_sets(component, np.random.default_rng(0))[4]  # batch 17, normal
        session.run(None, feeds)
    except Exception:
        return False
    return True


def fuzz_batch(seed: int, size: int, config: GeneratorConfig, work: Path, tally: Tally, jobs: int = 2,
               level: tuple[str, list[str]] | None = None) -> None:
    """Generate, compile and check one batch of `size` components; add what it found to `tally`.
    level: (name, optimize options) of the one ISA level to build (levels.py), else all."""
    rng = np.random.default_rng(seed)
    started = time.monotonic()
    components = []
    for index in range(size * 3):
        if len(components) == size:
            break
        c = generate_component(rng, index, config)
        if runnable(c):
            components.append(c)
        else:
            tally.skipped += 1
    work.mkdir(parents=True, exist_ok=True)
    model = assemble(components, f"fuzz_{seed}")
    onnx.save(model, work / "model.onnx")
    generated = time.monotonic()
    tally.seconds["generate"] += generated - started
    fused, library, report = optimize(work / "model.onnx", work, jobs, level_options=level[1] if level else [])
    if level:
        tally.levels[level[0]] = tally.levels.get(level[0], 0) + len(components)
    optimized = time.monotonic()
    tally.seconds["optimize"] += optimized - generated
    tally.graphs += len(components)
    tally.groups_compiled += report["groups_compiled"]
    tally.groups_fallback += report["groups_fallback"]
    for group in report["groups"]:
        if group["status"] == "compiled":
            for op in group["op_types"]:
                tally.fused_ops[op] = tally.fused_ops.get(op, 0) + 1
        if group["status"] == "fallback":
            reason = group.get("reason", "?")[:90]
            tally.fallback_reasons[reason] = tally.fallback_reasons.get(reason, 0) + 1
    cases = [Case(f"c{c.index}", [o.name for o in c.outputs], input_sets(c, rng)) for c in components]
    reference = work / "model.onnx"
    if level and runs_generic_sigmoid(level[0]):  # the level's CPUs run onnxruntime's other Sigmoid
        reference = work / "model.generic_sigmoid.onnx"
        onnx.save(with_generic_sigmoid(model, sigmoids_left(onnx.load(fused))), reference)
    findings = run_cases(Job(str(reference), str(fused), str(library) if library else None, cases))
    tally.seconds["check"] += time.monotonic() - optimized
    by_case: dict[str, list[Finding]] = {}
    for f in findings:
        by_case.setdefault(f.case, []).append(f)
    for case in cases:
        if case.id not in by_case:
            continue
        found = by_case[case.id]
        component_model = prune(model, case.outputs)
        bugs = [known_bug_of(component_model, f.output, f.kind, f.detail) for f in found]
        bug = None if None in bugs else sorted(b.name for b in bugs)[0]
        unknown_first = [f for f, b in zip(found, bugs) if b is None] + [f for f, b in zip(found, bugs) if b]
        failure = Failure(component_model, case.feeds, unknown_first, bug)
        tally.failures.append(failure)
        if any(f.kind == "crash" for f in found):
            tally.crashes += 1
        else:
            tally.mismatches += 1
        if bug:
            tally.known[bug] = tally.known.get(bug, 0) + 1
        else:
            tally.new.append(failure)


def save_failure(failure: Failure, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(failure.model, directory / "model.onnx")
    (directory / "case.pkl").write_bytes(pickle.dumps(failure))
    (directory / "findings.json").write_text(json.dumps([f.to_json() for f in failure.findings], indent=1))
    return directory


def run_campaign(seconds: float, seed: int, size: int, config: GeneratorConfig, out: Path, jobs: int = 2,
                 log=print) -> Tally:
    """Batches until `seconds` run out; prints a line per batch and returns the tally."""
    tally = Tally()
    started, batch = time.monotonic(), 0
    levels = host_levels()
    while time.monotonic() - started < seconds:
        work = out / f"batch{batch:04d}"
        before = len(tally.failures)
        try:
            fuzz_batch(seed * 100_003 + batch, size, config, work, tally, jobs, level_for_batch(batch, levels))
        except (OptimizeFailed, subprocess.TimeoutExpired) as exc:
            log(f"fuzz: batch {batch} (seed {seed}): onnxfuse optimize failed: {str(exc)[:300]}")
            tally.crashes += 1
            crash = Finding("model", "crash", detail=str(exc)[:500])
            tally.new.append(Failure(onnx.load(work / "model.onnx"), [], [crash], None))
        for i, failure in enumerate(tally.failures[before:]):
            save_failure(failure, work / f"failure{i}_{failure.bug or 'new'}")
        elapsed = time.monotonic() - started
        log(f"fuzz: batch {batch} {elapsed:.0f}s: {tally.graphs} graphs, {tally.groups_compiled} groups compiled, "
            f"{tally.groups_fallback} fell back, {tally.mismatches} mismatches, {tally.crashes} crashes "
            f"(known: {tally.known or 'none'}; new: {len(tally.new)}; seconds "
            f"{', '.join(f'{k} {v:.0f}' for k, v in tally.seconds.items())})")
        batch += 1
    return tally
