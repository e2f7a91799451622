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
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from .cache import KernelCache, default_cache_dir, group_key, kernel_name
from .codegen.worker import compile_one
from .errors import CompileError, UsageError
from .frontend.ir_version import require_loadable_ir_version
from .frontend.loader import load_model
from .fusion.extract import extract_group
from .fusion.partition import FusionOptions
from .fusion.plan import FusedGroup, FusionPlan, plan_fusion
from .ir import Graph
from .kernel_spec import GroupKernel, KernelSpec
from .package import package_model
from .progress import Progress
from .runtime.library import build_library
from .select import SELECTIONS
from .select.auto import auto_rejects, leave_to_onnxruntime
from .select.measured import judge_groups
from .select.whole_model import check_whole_model
from .target import Target, resolve_target
from .workers import run_with_deadline

EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # bytes; protobuf cannot hold 2 GB


@dataclass(frozen=True)
class OptimizeOptions:
    """Everything that decides what optimize builds (see `optimize` for each field)."""

    target: str = "native"
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

    def fallen_back(self, reason: str) -> GroupOutcome:
        """This outcome after selection decided to leave the group to onnxruntime."""
        return dataclasses.replace(self, status="fallback", kernel=None, reason=reason)

    def to_json(self) -> dict:
        out = {**self.group.to_json(), "status": self.status, "compile_seconds": round(self.seconds, 3)}
        if self.kernel:
            out["kernel"] = self.kernel.spec.name
        if self.reason:
            out["reason"] = self.reason
        out.update(self.info)
        return out


@dataclass
class OptimizeResult:
    model_path: Path
    library_path: Path | None
    plan: FusionPlan
    outcomes: list[GroupOutcome]
    seconds: float
    measured: dict = field(default_factory=dict)  # --select measured: copy bandwidth, whole-model check

    @property
    def report(self) -> dict:
        counts = {s: sum(o.status == s for o in self.outcomes) for s in ("compiled", "cached", "fallback")}
        return {
            "output": str(self.model_path),
            "library": str(self.library_path) if self.library_path else None,
            "seconds": round(self.seconds, 3),
            "node_count": self.plan.node_count,
            "fused_node_count": sum(len(o.group.node_indices) for o in self.outcomes if o.kernel),
            "groups_total": len(self.outcomes),
            **{f"groups_{k}": v for k, v in counts.items()},
            "options": self.plan.options_json(),
            "groups": [o.to_json() for o in self.outcomes],
            "unfused": [u.to_json() for u in self.plan.unfused],
            **({"measured": self.measured} if self.measured else {}),
        }


def default_output(model_path: Path) -> Path:
    name = model_path.name[: -len(".onnx")] if model_path.name.endswith(".onnx") else model_path.name
    return model_path.with_name(f"{name}.fused.onnx")


def library_path_for(model_out: Path) -> Path:
    stem = model_out.name[: -len(".onnx")] if model_out.name.endswith(".onnx") else model_out.name
    return model_out.with_name(f"{stem}.so")


def optimize(model: str | os.PathLike, output: str | os.PathLike | None = None, *, progress: Progress | None = None,
             threads: int | tuple[int, ...] = 1, select_batches=(1, 64), **options) -> OptimizeResult:
    """Fuse and compile `model`; returns the written paths, the plan and each group's outcome.

    Options (keywords; see OptimizeOptions):
    target / mcpu / mattr: the CPU to build for ("native", "x86_64", "aarch64").
    max_depth / max_inputs / max_duplication: the fusion bounds.
    cache_dir: a directory, True for the default (~/.cache/onnxfuse or $ONNXFUSE_CACHE_DIR),
    or False/None to compile everything afresh.
    select: "auto" (deterministic) compiles every group except those with an op onnxruntime still
    runs much faster (convolutions, pooling: see OpInfo.competitive); "all" compiles every group;
    "measured" keeps a kernel only if it is not slower than onnxruntime on the group's own nodes
    at each of `select_batches` (symbolic dims) and each of `threads` (intra-op thread counts),
    then drops kept groups while the whole fused model is slower than the original.
    compile_timeout: seconds one group may take to compile and verify before it falls back.
    jobs: compile processes (default: the machine's cores).
    """
    threads = (threads,) if isinstance(threads, int) else tuple(threads)
    settings = OptimizeOptions(threads=threads, select_batches=tuple(select_batches), **options)
    return run_pipeline(Path(model), Path(output) if output else None, settings, progress or Progress(enabled=False))


def run_pipeline(model_path: Path, out_path: Path | None, options: OptimizeOptions, progress: Progress) -> OptimizeResult:
    started = time.perf_counter()
    tgt = resolve_target(options.target, options.mcpu, options.mattr)
    tgt.require_toolchain()
    out_path = out_path or default_output(model_path)
    graph = load_model(model_path)
    require_loadable_ir_version(graph.model, model_path)
    plan = plan_fusion(graph, options.fusion, leave_to_onnxruntime if options.select == "auto" else None)

    with tempfile.TemporaryDirectory(prefix="onnxfuse-build-") as build_dir:
        outcomes = _compile_groups(graph, plan, tgt, options, Path(build_dir), progress)
        measured = {}
        if options.select == "measured":
            outcomes, measured = _select_measured(graph, outcomes, tgt, Path(build_dir), options, progress)
        fused = [(o.group, o.kernel) for o in outcomes if o.kernel is not None]
        out_path.parent.mkdir(parents=True, exist_ok=True)
        library = library_path_for(out_path) if fused else None
        staged_library = _build_library([k for _, k in fused], library, tgt) if library else None
        packaged = package_model(graph, fused, library.name, tgt.name) if fused else graph.model
        staged_model = _stage_model(packaged, out_path)
        # Both files are complete on disk; now make them visible, library first.
        if staged_library:
            os.replace(staged_library, library)
        for staged, final in staged_model:
            os.replace(staged, final)
    return OptimizeResult(out_path, library, plan, outcomes, time.perf_counter() - started, measured)


# -- compiling every group ----------------------------------------------------------------------

def _compile_groups(graph: Graph, plan: FusionPlan, tgt: Target, options: OptimizeOptions, build_dir: Path,
                    progress: Progress) -> list[GroupOutcome]:
    cache = options.kernel_cache()
    dup = plan.options.max_duplication
    outcomes: dict[str, GroupOutcome] = {}
    pending: dict[str, tuple[bytes, str, int]] = {}  # key → (group model, kernel name, max duplication)
    waiting: dict[str, list[FusedGroup]] = {}
    for group in plan.groups:
        rejected = auto_rejects(group) if options.select == "auto" else None
        if rejected:
            outcomes[group.name] = GroupOutcome(group, "fallback", reason=rejected)
            continue
        try:
            group_model = extract_group(graph, group)
        except CompileError as exc:
            outcomes[group.name] = GroupOutcome(group, "fallback", reason=str(exc))
            continue
        key = group_key(group_model, f"{tgt.key}|dup{dup}")
        hit = cache.load(key)
        if hit is not None:
            outcomes[group.name] = GroupOutcome(group, "cached", hit[0], info=hit[1])
            continue
        pending.setdefault(key, (group_model.SerializeToString(deterministic=True), kernel_name(key), dup))
        waiting.setdefault(key, []).append(group)

    progress.start(len(pending), sum(o.status == "cached" for o in outcomes.values()))
    for key, result in _run_compiles(pending, tgt, build_dir, options.jobs, options.verify, options.compile_timeout):
        kernel, info, reason, seconds = result
        if kernel is not None:
            try:
                kernel = cache.store(key, kernel, info)
            except OSError as exc:  # an unwritable cache must not cost the user the kernel
                info = {**info, "cache_error": str(exc)}
        for group in waiting[key]:
            status = "compiled" if kernel is not None else "fallback"
            outcomes[group.name] = GroupOutcome(group, status, kernel, reason, seconds, info)
        progress.step(waiting[key][0], kernel is not None, seconds, reason)
    progress.finish()
    return [outcomes[g.name] for g in plan.groups]


def _select_measured(graph: Graph, outcomes: list[GroupOutcome], tgt: Target, build_dir: Path,
                     options: OptimizeOptions, progress: Progress) -> tuple[list[GroupOutcome], dict]:
    """Per-group timing, then the whole-model check (select/); returns the outcomes with the
    decisions applied and what the report records of the run as a whole."""
    kernels = {o.group.name: (o.group, o.kernel) for o in outcomes if o.kernel is not None}
    if not kernels:
        return outcomes, {}
    library = _build_library([k for _, k in kernels.values()], build_dir / "measure.so", tgt)
    verdicts = judge_groups(graph, kernels, library, options.select_batches, options.threads, progress.note)
    kept = {name: pair for name, pair in kernels.items() if name not in verdicts.dropped}
    whole = check_whole_model(graph, kept, verdicts.gains_us, library, tgt.name, options.select_batches,
                              options.threads, progress.note)
    dropped = {**verdicts.dropped, **whole.dropped}
    decided = []
    for o in outcomes:
        if o.group.name in verdicts.measured:
            o = dataclasses.replace(o, info={**o.info, "measured": verdicts.measured[o.group.name]})
        decided.append(o.fallen_back(dropped[o.group.name]) if o.group.name in dropped else o)
    return decided, {**verdicts.summary(), "whole_model_check": whole.summary}


def _run_compiles(pending: dict, tgt: Target, build_dir: Path, jobs: int | None, verify: bool, timeout: float | None):
    """Yield (key, (kernel, info, reason, seconds)) as compiles finish.

    In worker processes when running in parallel or under a deadline; in this process only for
    jobs=1 without a deadline (the cheapest way for tests and small models).
    """
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(pending)))
    target_args = (tgt.name, tgt.mcpu, ",".join(tgt.mattr) or None)
    tasks = {key: (model_bytes, name, target_args, str(build_dir), verify, dup)
             for key, (model_bytes, name, dup) in pending.items()}
    if jobs == 1 and timeout is None:
        for key, args in tasks.items():
            yield key, compile_one(*args)
        return
    yield from run_with_deadline(compile_one, tasks, jobs, timeout, lambda reason: (None, {}, reason, 0.0))


def _build_library(kernels: list[GroupKernel], library: Path, tgt: Target) -> Path:
    """The library of `kernels` (each distinct kernel once), staged beside `library` for the
    caller to rename into place."""
    unique: dict[str, KernelSpec] = {}
    for k in kernels:
        unique.setdefault(k.spec.name, k.spec)
    staged = library.with_name(f".{library.name}.{os.getpid()}.tmp")  # renamed into place by the caller
    try:
        build_library(list(unique.values()), staged, target=tgt)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return staged


def _stage_model(model: onnx.ModelProto, out_path: Path) -> list[tuple[Path, Path]]:
    """Write the model (and its external data when too large for one protobuf) to temp files."""
    staged = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    pairs = []
    try:
        if model.ByteSize() > EXTERNAL_DATA_THRESHOLD:
            data_name = f"{out_path.name}.data"
            staged_data = out_path.with_name(f".{data_name}.{os.getpid()}.tmp")
            onnx.save_model(model, str(staged), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=staged_data.name, size_threshold=1024)
            # The model must name the final data file, not the staging one.
            reloaded = onnx.load(str(staged), load_external_data=False)
            for t in reloaded.graph.initializer:
                for entry in t.external_data:
                    if entry.key == "location":
                        entry.value = data_name
            staged.write_bytes(reloaded.SerializeToString(deterministic=True))
            pairs.append((staged_data, out_path.with_name(data_name)))
        else:
            staged.write_bytes(model.SerializeToString(deterministic=True))
        pairs.append((staged, out_path))
    except BaseException:
        for tmp, _ in pairs + [(staged, out_path)]:
            tmp.unlink(missing_ok=True)
        raise
    return pairs


