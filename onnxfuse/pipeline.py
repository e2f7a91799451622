"""`optimize`: the tool's main job, from a model file to a fused model and its kernel library.

    load + canonicalize (frontend/) → plan (fusion/) → per group: cached kernel, or
    compile + verify in a worker (codegen/worker.py) → select (select/) →
    one custom-op library (runtime/) → the rewritten model (package.py)

A group that fails anywhere falls back to its original nodes with the reason in the report: one
hard group never fails the whole model. Outputs are written to temporary files and renamed at the
end, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections import ChainMap
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from . import __version__
from .atomic import write_text_atomic
from .cache import KernelCache, default_cache_dir, group_key, kernel_name
from .codegen.float16_boundaries import carry_float32
from .codegen.worker import compile_one
from .errors import CompileError, UsageError
from .frontend.ir_version import require_loadable_ir_version
from .frontend.loader import load_model
from .frontend.validate import external_data_files, validate_model_file
from .fusion.extract import extract_group
from .fusion.float32_boundaries import carried_name
from .fusion.partition import GROUP_WEIGHT_LIMIT, FusionOptions, weight_bytes
from .fusion.plan import FusedGroup, FusionPlan, plan_fusion
from .fusion.tree_rewrite import products_left
from .gates import is_compute_op
from .ir import Graph
from .kernel_identity import CanonicalGroup, canonical_group
from .kernel_spec import GroupKernel, KernelSpec, file_sha256
from .model_file import load_unchanged, stage_model
from .output_paths import OutputError, OutputPaths, check_outputs, describe
from .package import package_model
from .progress import Progress
from .runtime.library import build_library
from .select import SELECTIONS
from .select.auto import auto_rejects, leave_to_onnxruntime
from .select.decisions import DecisionCache
from .select.measured import judge_groups
from .select.shipped import ShippedCheck, check_shipped, too_large_to_check
from .select.whole_model import check_whole_model
from .target import Target, resolve_target
from .workers import run_with_deadline

EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # bytes of weights; protobuf cannot hold 2 GB


@dataclass(frozen=True)
class OptimizeOptions:
    """Everything that decides what optimize builds (see `optimize` for each field)."""

    target: str | None = None  # None: $ONNXFUSE_TARGET, else portable (target.py)
    mcpu: str | None = None
    mattr: str | None = None
    max_depth: int = 256
    max_inputs: int = 64
    max_duplication: int = 1
    jobs: int | None = None
    cache_dir: str | os.PathLike | None | bool = True
    verify: bool = True
    select: str = "auto"
    select_batches: tuple[int, ...] = (1, 64)
    threads: tuple[int, ...] = (1,)
    compile_timeout: float | None = None
    inputs: str | os.PathLike | None = None  # an .npz for the shipped check (default: random inputs)

    def __post_init__(self):
        if self.select not in SELECTIONS:
            raise UsageError(f"unknown selection {self.select!r}; choose one of {', '.join(SELECTIONS)}")
        if self.select == "measured" and self.target == "aarch64":
            raise UsageError("--select measured needs kernels this machine can run; not with --target aarch64")

    @property
    def fusion(self) -> FusionOptions:
        return FusionOptions(max_depth=self.max_depth, max_inputs=self.max_inputs,
                             max_duplication=self.max_duplication)

    def kernel_cache(self) -> KernelCache:
        if self.cache_dir is True:
            return KernelCache(default_cache_dir())
        return KernelCache(Path(self.cache_dir) if self.cache_dir else None)


@dataclass(frozen=True)
class GroupOutcome:
    group: FusedGroup
    status: str  # "compiled" | "cached" | "fallback"
    kernel: GroupKernel | None = None
    reason: str | None = None
    seconds: float = 0.0
    info: dict = field(default_factory=dict)
    declined: bool = False  # a fallback by choice (selection, size limit), not a failure

    def fallen_back(self, reason: str) -> GroupOutcome:
        """This outcome after selection decided to leave the group to onnxruntime."""
        return dataclasses.replace(self, status="fallback", kernel=None, reason=reason, declined=True)

    def to_json(self) -> dict:
        out = {**self.group.to_json(), "status": self.status, "compile_seconds": round(self.seconds, 3)}
        if self.kernel:
            out["kernel"] = self.kernel.spec.name
        if self.status == "fallback":
            out["fallback_kind"] = "declined" if self.declined else "failed"
        if self.reason:
            out["reason"] = self.reason
        out.update(self.info)
        return out


REPORT_SCHEMA_VERSION = 1  # docs/report.md; bumped when a field changes meaning or goes away


@dataclass
class OptimizeResult:
    model_path: Path
    library_path: Path | None
    plan: FusionPlan
    outcomes: list[GroupOutcome]
    seconds: float
    measured: dict = field(default_factory=dict)  # --select measured: copy bandwidth, whole-model check
    source_path: Path | None = None
    target: Target | None = None
    node_op_types: tuple[tuple[str, int, str], ...] = ()  # (scope, index, op type) of every node, bodies' too
    timings: dict = field(default_factory=dict)  # stage → seconds
    data_path: Path | None = None  # the model's external data file, when it has one
    report_path: Path | None = None
    shipped_check: dict = field(default_factory=dict)  # the written model against the original (select/shipped.py)

    @property
    def report(self) -> dict:
        """What --report writes (docs/report.md states every field)."""
        counts = {s: sum(o.status == s for o in self.outcomes) for s in ("compiled", "cached", "fallback")}
        fused = {(o.group.scope, i) for o in self.outcomes if o.kernel for i in o.group.node_indices}
        compute = [(scope, i) for scope, i, op in self.node_op_types if is_compute_op(op)]
        fused_compute = sum(i in fused for i in compute)
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "model": str(self.source_path) if self.source_path else None,
            "output": str(self.model_path),
            "library": str(self.library_path) if self.library_path else None,
            "external_data": str(self.data_path) if self.data_path else None,
            "versions": tool_versions(),
            "target": target_json(self.target),
            "seconds": round(self.seconds, 3),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "node_count": self.plan.node_count,
            "fused_node_count": len(fused),
            "compute_node_count": len(compute),
            "fused_compute_node_count": fused_compute,
            "fused_fraction": round(fused_compute / len(compute), 4) if compute else 1.0,
            "groups_total": len(self.outcomes),
            **{f"groups_{k}": v for k, v in counts.items()},
            "groups_failed": sum(o.status == "fallback" and not o.declined for o in self.outcomes),
            "options": self.plan.options_json(),
            "groups": [o.to_json() for o in self.outcomes],
            "unfused": [u.to_json() for u in self.plan.unfused],
            **({"measured": self.measured} if self.measured else {}),
            **({"shipped_check": self.shipped_check} if self.shipped_check else {}),
        }


def tool_versions() -> dict[str, str]:
    import onnxruntime
    import tvm

    return {"onnxfuse": __version__, "tvm": tvm.__version__, "onnxruntime": onnxruntime.__version__,
            "onnx": onnx.__version__}


def target_json(tgt: Target | None) -> dict | None:
    if tgt is None:
        return None
    return {"name": tgt.name, "triple": tgt.triple, "cpu": tgt.mcpu, "features": list(tgt.mattr)}


def default_output(model_path: Path) -> Path:
    name = model_path.name[: -len(".onnx")] if model_path.name.endswith(".onnx") else model_path.name
    return model_path.with_name(f"{name}.fused.onnx")


def library_path_for(model_out: Path) -> Path:
    return OutputPaths.beside(model_out).library


def optimize(model: str | os.PathLike, output: str | os.PathLike | None = None, *,
             report: str | os.PathLike | None = None, progress: Progress | None = None,
             threads: int | tuple[int, ...] = 1, select_batches=(1, 64), **options) -> OptimizeResult:
    """Fuse and compile `model`; write the fused model (default: MODEL's stem + .fused.onnx), its
    kernel library beside it (`<stem>.so`) and, if `report` names a file, the JSON report.
    Returns the written paths, the plan and each group's outcome (`result.report`).

    Raises onnxfuse.errors.OnnxfuseError subclasses with one-line messages: ModelLoadError for an
    unreadable or invalid model, UsageError for bad options, an output that would overwrite the
    input or cannot be written (checked before compiling), or a model that already is onnxfuse
    output. A group that cannot compile never raises: it falls back, with the reason in the report.

    Options (keywords; see OptimizeOptions):
    target / mcpu / mattr: the CPUs to build for ("portable", "native", "x86_64", "aarch64"; target.py).
    max_depth / max_inputs / max_duplication: the fusion bounds.
    cache_dir: a directory, True for the default (~/.cache/onnxfuse or $ONNXFUSE_CACHE_DIR),
    or False/None to compile everything afresh.
    select: "auto" (deterministic) compiles every group except what rules calibrated by measurement
    leave to onnxruntime (convolutions and pooling, shapes our schedule handles badly: select/auto.py);
    "all" compiles every group;
    "measured" keeps a kernel only if it is not slower than onnxruntime on the group's own nodes
    at each of `select_batches` (symbolic dims) and each of `threads` (intra-op thread counts),
    then drops kept groups while the whole fused model is slower than the original.
    compile_timeout: seconds one group may take to compile and verify before it falls back.
    jobs: compile processes (default: the machine's cores).
    progress: a `onnxfuse.progress.Progress` to show compiling as it happens (default: silent).

        >>> result = onnxfuse.optimize("model.onnx", "out/model.fused.onnx", report="out/report.json")
        >>> result.report["fused_fraction"], result.library_path
    """
    threads = (threads,) if isinstance(threads, int) else tuple(threads)
    settings = OptimizeOptions(threads=threads, select_batches=tuple(select_batches), **options)
    return run_pipeline(Path(model), Path(output) if output else None, settings, progress or Progress(enabled=False),
                        Path(report) if report else None)


def run_pipeline(model_path: Path, out_path: Path | None, options: OptimizeOptions, progress: Progress,
                 report_path: Path | None = None) -> OptimizeResult:
    started = time.perf_counter()
    clock = _StageClock()
    tgt = resolve_target(options.target, options.mcpu, options.mattr)
    tgt.require_toolchain()
    out = OutputPaths.beside(out_path or default_output(model_path), report_path)
    header = validate_model_file(model_path)
    check_outputs([("input model", model_path)] + [("input's external data", p) for p in external_data_files(header, model_path)],
                  out)
    del header
    for batch_first_trees in (True, False):
        graph = load_model(model_path, batch_first_trees=batch_first_trees)
        require_loadable_ir_version(graph.model, model_path)
        node_op_types = tuple((scope, n.index, n.op_type) for scope, body in graph.scopes() for n in body.nodes)
        clock.lap("load")
        plan = carry_float32(graph, plan_fusion(graph, options.fusion,
                                                leave_to_onnxruntime if options.select == "auto" else None))
        clock.lap("plan")
        if batch_first_trees and products_left(graph, plan.groups):
            continue  # a product left to onnxruntime already: nothing of this round would be kept

        with tempfile.TemporaryDirectory(prefix="onnxfuse-build-") as build_dir:
            outcomes = _compile_groups(graph, plan, tgt, options, Path(build_dir), progress)
            clock.lap("compile")
            measured = {}
            if options.select == "measured":
                outcomes, measured = _select_measured(graph, outcomes, tgt, Path(build_dir), options, progress)
                clock.lap("select")
            fused = [(o.group, o.kernel) for o in outcomes if o.kernel is not None]
            # Checked before writing (a product left out by selection or a failed compile) and
            # after (one the shipped check dropped): either way the original is optimized again.
            if batch_first_trees and products_left(graph, [group for group, _ in fused]):
                continue
            written = _write_outputs(model_path, graph, fused, out, tgt, Path(build_dir), options, progress)
            outcomes = [o.fallen_back(written.dropped[o.group.name]) if o.group.name in written.dropped else o
                        for o in outcomes]
            clock.lap("package")
        if not batch_first_trees or not products_left(graph, [o.group for o in outcomes if o.kernel is not None]):
            break
    result = OptimizeResult(out.model, written.library, plan, outcomes, time.perf_counter() - started, measured,
                            source_path=model_path, target=tgt, node_op_types=node_op_types, timings=clock.laps,
                            data_path=written.data, report_path=report_path, shipped_check=written.shipped_summary)
    if report_path:
        try:
            write_text_atomic(report_path, json.dumps(result.report, indent=1))
        except OSError as exc:
            raise OutputError(f"cannot write the report {report_path}: {describe(exc)}") from None
    return result


class _StageClock:
    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        """Adds the time since the last lap to `stage` (a second round adds to the first's)."""
        now = time.perf_counter()
        self.laps[stage] = self.laps.get(stage, 0.0) + now - self._last
        self._last = now


@dataclass(frozen=True)
class _Written:
    library: Path | None  # None when no kernel ships
    data: Path | None  # the model's external data file, when it needed one
    dropped: dict[str, str]  # groups the shipped check fell back → why
    shipped_summary: dict


def _write_outputs(model_path: Path, graph: Graph, fused: list, out: OutputPaths, tgt: Target, build_dir: Path,
                   options: OptimizeOptions, progress: Progress) -> _Written:
    """The library and the model, staged beside their final names, checked as they will ship
    (select/shipped.py), and renamed into place only when both are complete; a failure leaves no
    temp file and is one OutputError line."""
    staged: list[tuple[Path, Path]] = []
    library_files: set[Path] = set()  # every staged library file (packaging again rewrites the same one)

    def package(kept, consume=False):  # the model and its staged library for `kept`
        library = _stage_library([k for _, k in kept], out.library, tgt, build_dir) if kept else None
        if library:
            library_files.add(library)
        return (package_model(graph, kept, out.library.name, tgt, consume=consume, library_digest=file_sha256(library))
                if kept else load_unchanged(model_path)), library

    try:
        out.model.parent.mkdir(parents=True, exist_ok=True)
        unchecked = ("--no-verify" if not options.verify else "no kernels" if not fused
                     else "the model is too large to check in one protobuf" if too_large_to_check(graph.model) else None)
        if unchecked is None:  # packaged from a copy: the check may package again from the graph
            shipped = check_shipped(model_path, fused, package, *package(fused), options.inputs, progress.note)
        else:  # packaged in place: a 2 GB model is held once
            shipped = ShippedCheck(*package(fused, consume=True), summary={"checked": False, "why": unchecked})
        if shipped.library is not None:
            staged.append((shipped.library, out.library))
        packaged, shipped.model = shipped.model, None
        staged += stage_model(packaged, out.model, out.data, EXTERNAL_DATA_THRESHOLD)
        del packaged
        written = [final for _, final in staged]
        for tmp, final in staged:  # the library first: a model is never visible without it
            os.replace(tmp, final)
        staged = []
    except OSError as exc:
        raise OutputError(f"cannot write {out.model}: {describe(exc)}") from None
    finally:
        for tmp in [tmp for tmp, _ in staged] + list(library_files):  # renamed ones are gone already
            tmp.unlink(missing_ok=True)
    return _Written(out.library if out.library in written else None, out.data if out.data in written else None,
                    shipped.dropped, shipped.summary)


# -- compiling every group ----------------------------------------------------------------------

def _compile_groups(graph: Graph, plan: FusionPlan, tgt: Target, options: OptimizeOptions, build_dir: Path,
                    progress: Progress) -> list[GroupOutcome]:
    cache = options.kernel_cache()
    dup = plan.options.max_duplication
    outcomes: dict[str, GroupOutcome] = {}
    pending: dict[str, tuple[bytes, str, int, dict]] = {}  # key → (canonical model, kernel name, max duplication, weights)
    waiting: dict[str, list[tuple[FusedGroup, CanonicalGroup]]] = {}  # groups with one kernel identity
    for group in plan.groups:
        auto = auto_rejects(group, graph.scope(group.scope)) if options.select == "auto" else None
        rejected = auto or _too_heavy(graph, group)
        if rejected:
            outcomes[group.name] = GroupOutcome(group, "fallback", reason=rejected, declined=True)
            continue
        try:
            canonical = canonical_group(extract_group(graph, group))
        except CompileError as exc:
            outcomes[group.name] = GroupOutcome(group, "fallback", reason=str(exc))
            continue
        key = group_key(canonical.model, f"{tgt.key}|dup{dup}")
        hit = cache.load(key)
        if hit is not None:
            bound = canonical.bind(hit[0], _argument_values(graph, group))
            outcomes[group.name] = GroupOutcome(group, "cached", bound, info=hit[1])
            continue
        pending.setdefault(key, (canonical.model.SerializeToString(deterministic=True), kernel_name(key), dup,
                                 canonical.weights))
        waiting.setdefault(key, []).append((group, canonical.slim(_argument_values(graph, group))))

    jobs = max(1, min(options.jobs or os.cpu_count() or 1, len(pending)))
    running = _InFlight([waiting[key][0][0] for key in pending], pending, jobs)
    progress.start(len(pending), sum(o.status == "cached" for o in outcomes.values()),
                   groups=sum(len(w) for w in waiting.values()))
    progress.compiling(running.groups())
    try:
        for key, result in _run_compiles(pending, tgt, build_dir, jobs, options.verify, options.compile_timeout):
            kernel, info, reason, seconds = result
            seconds = seconds or running.elapsed(key)  # a timed-out or killed compile reports no time of its own
            running.finished(key)
            if kernel is not None:
                try:
                    kernel = cache.store(key, kernel, info)
                except OSError as exc:  # an unwritable cache must not cost the user the kernel
                    info = {**info, "cache_error": str(exc)}
            for group, canonical in waiting[key]:
                status = "compiled" if kernel is not None else "fallback"
                bound = canonical.bind(kernel, _argument_values(graph, group)) if kernel is not None else None
                outcomes[group.name] = GroupOutcome(group, status, bound, reason, seconds, info)
            progress.step(waiting[key][0][0], kernel is not None, seconds, reason, groups=len(waiting[key]))
            progress.compiling(running.groups())
    finally:
        progress.finish()
    return [outcomes[g.name] for g in plan.groups]


def _argument_values(graph: Graph, group: FusedGroup) -> ChainMap:
    """The values the group's custom node can read: the model's, and the float32 values of the
    float16 ones it reads unrounded (fusion/float32_boundaries.py)."""
    return ChainMap(graph.scope(group.scope).values, dict.fromkeys(map(carried_name, group.float32_inputs)))


def _too_heavy(graph: Graph, group: FusedGroup) -> str | None:
    """Why a group is left alone for the size of its weights (GROUP_WEIGHT_LIMIT), or None."""
    total = weight_bytes(graph.scope(group.scope), group.inputs)
    if total <= GROUP_WEIGHT_LIMIT:
        return None
    return (f"its weights take {total / 2**20:.0f} MB; groups over {GROUP_WEIGHT_LIMIT // 2**20} MB stay with "
            "onnxruntime (compiling and verifying one holds several copies of them)")


def _select_measured(graph: Graph, outcomes: list[GroupOutcome], tgt: Target, build_dir: Path,
                     options: OptimizeOptions, progress: Progress) -> tuple[list[GroupOutcome], dict]:
    """Per-group timing, then the whole-model check (select/); returns the outcomes with the
    decisions applied and what the report records of the run as a whole."""
    kernels = {o.group.name: (o.group, o.kernel) for o in outcomes if o.kernel is not None}
    if not kernels:
        return outcomes, {}
    library = _build_library([k for _, k in kernels.values()], build_dir / "measure.so", tgt)
    decisions = DecisionCache(options.kernel_cache().root)  # verdicts timed before on this machine class
    verdicts = judge_groups(graph, kernels, library, options.select_batches, options.threads, progress.note, decisions)
    kept = {name: pair for name, pair in kernels.items() if name not in verdicts.dropped}
    whole = check_whole_model(graph, kept, verdicts.gains_us, library, tgt.name, options.select_batches,
                              options.threads, progress.note, decisions)
    dropped = {**verdicts.dropped, **whole.dropped}
    decided = []
    for o in outcomes:
        if o.group.name in verdicts.measured:
            o = dataclasses.replace(o, info={**o.info, "measured": verdicts.measured[o.group.name]})
        decided.append(o.fallen_back(dropped[o.group.name]) if o.group.name in dropped else o)
    return decided, {**verdicts.summary(), "whole_model_check": whole.summary}


class _InFlight:
    """Which groups are compiling now, and since when: the worker pool hands tasks out in order,
    one to each free worker, so the first `jobs` unfinished tasks are the ones running."""

    def __init__(self, groups: list[FusedGroup], keys, jobs: int):
        self._queue = list(zip(keys, groups))
        self._jobs = jobs
        self._running: dict[str, tuple[FusedGroup, float]] = {}
        self._fill()

    def _fill(self) -> None:
        while self._queue and len(self._running) < self._jobs:
            key, group = self._queue.pop(0)
            self._running[key] = (group, time.monotonic())

    def elapsed(self, key: str) -> float:
        return time.monotonic() - self._running[key][1] if key in self._running else 0.0

    def finished(self, key: str) -> None:
        self._running.pop(key, None)
        self._fill()

    def groups(self) -> list[tuple[FusedGroup, float]]:
        """(group, monotonic start) of each running compile."""
        return list(self._running.values())


def _run_compiles(pending: dict, tgt: Target, build_dir: Path, jobs: int, verify: bool, timeout: float | None):
    """Yield (key, (kernel, info, reason, seconds)) as compiles finish.

    In worker processes when running in parallel or under a deadline; in this process only for
    jobs=1 without a deadline (the cheapest way for tests and small models).
    """
    if not pending:
        return  # no worker process to start (each imports TVM: seconds)
    target_args = tgt.args
    parallel_levels = _parallel_levels(min(jobs, len(pending)))
    tasks = {key: (model_bytes, name, target_args, str(build_dir), verify, dup, weights, parallel_levels)
             for key, (model_bytes, name, dup, weights) in pending.items()}
    if jobs == 1 and timeout is None:
        for key, args in tasks.items():
            yield key, compile_one(*args)
        return
    yield from run_with_deadline(compile_one, tasks, jobs, timeout, lambda reason: (None, {}, reason, 0.0))


def _parallel_levels(workers: int) -> int:
    """How many ISA levels each compile may build in forked children beside its own (compile.py):
    each worker's share of the cores. A portable tree kernel is one group built three times, and
    with one worker on two cores the other core idled through all three. The parent's own work
    (the best level, then the verification kernel) is lighter than a child's (schedule and
    build), so one process more than cores evens the load out; the OS shares the cores."""
    return (os.cpu_count() or 1) // max(1, workers)


def _build_library(kernels: list[GroupKernel], library: Path, tgt: Target) -> Path:
    """The library of `kernels` (each distinct kernel once) at `library`."""
    unique: dict[str, KernelSpec] = {}
    for k in kernels:
        unique.setdefault(k.spec.name, k.spec)
    return build_library(list(unique.values()), library, target=tgt)


def _stage_library(kernels: list[GroupKernel], library: Path, tgt: Target, build_dir: Path) -> Path:
    """The library linked in the build directory, then copied beside `library` under a temporary
    name for the caller to rename: a full or read-only output disk is then an OSError of ours,
    not a linker message."""
    built = _build_library(kernels, build_dir / library.name, tgt)
    staged = library.with_name(f".{library.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(built, staged)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return staged
