"""The shipped check: the written model, with its library, in onnxruntime against the original.

Each kernel was verified alone, against onnxruntime on its own group (codegen/worker.py). That
does not vouch for what ships: the model as a whole can still differ where a kernel's last-ulp
differences are amplified downstream (a DynamicQuantizeLinear rounds them to a whole step of its
scale: kernels each within 2e-6 gave a model that differed by 0.24). So the pipeline hands this
check the packaged model and the very library file it is about to rename into place, and runs
both, and the original, on the same inputs (the user's `--inputs`, else seeded random ones).

Where they differ, the groups responsible are found by bisection: the model is packaged again
with half of the suspects compiled (the rest left to onnxruntime), and each half that still
differs is split further, down to single groups. Those fall back, with the reason; the rest are
kept, and the final packaging is checked once more. Only when no group is left and the model
still differs (the loader's canonicalization changed the result) is it an error.
"""

from __future__ import annotations

import ctypes
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from ..errors import OnnxfuseError, first_line
from ..fusion.plan import FusedGroup
from ..kernel_spec import GroupKernel
from ..measure.inputs import random_feeds_for_session
from ..model_file import weight_bytes
from ..session import quiet_session_options, session_options
from ..verify import NORM_RTOL, compare_arrays

RTOL, ATOL = 1e-4, 1e-5  # the `onnxfuse verify` defaults: what the user would check the output with
RANDOM_DIMS = (1, 3, 7)  # symbolic dims of the random input sets (one set each)
CHECKED_MODEL_LIMIT = 1_800_000_000  # bytes: a larger model cannot be serialized into one protobuf

Fused = list[tuple[FusedGroup, GroupKernel]]
Package = Callable[[Fused], tuple[onnx.ModelProto, "Path | None"]]  # kept groups → (model, library file)


class ShippedModelDiffers(OnnxfuseError):
    """Even with every group left to onnxruntime, the output model differs from the original."""


@dataclass
class ShippedCheck:
    """What the check decided: the groups to fall back (name → reason), the model and library to
    ship (packaged for the groups kept), and a summary for the report."""

    model: onnx.ModelProto
    library: Path | None
    dropped: dict[str, str] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)


def check_shipped(original: Path, fused: Fused, package: Package, model: onnx.ModelProto, library: Path | None,
                  inputs: str | Path | None = None, note: Callable[[str], None] = lambda _: None) -> ShippedCheck:
    """Checks `model` + `library` (as packaged for `fused`) against the `original` file; returns
    what to ship. `package(kept)` must package anew for a subset, as the pipeline does."""
    if not fused:
        return ShippedCheck(model, library, summary={"checked": False, "why": "no kernels"})
    with tempfile.TemporaryDirectory(prefix="onnxfuse-shipped-") as scratch:
        return _check(original, fused, package, model, library, inputs, note, _Loader(Path(scratch)))


class _Loader:
    """Gives each library to load a path of its own. The dynamic loader keeps a library loaded
    under its path, and packaging again rewrites the same staging file: loading it by that path
    a second time would bring back the first library."""

    def __init__(self, scratch: Path):
        self.scratch, self.count = scratch, 0

    def __call__(self, library: Path) -> Path:
        self.count += 1
        copy = self.scratch / f"{self.count}-{library.name.strip('.')}"
        shutil.copyfile(library, copy)
        return copy


def _check(original: Path, fused: Fused, package: Package, model: onnx.ModelProto, library: Path | None,
           inputs, note, load: _Loader) -> ShippedCheck:
    unrunnable = _why_not_runnable(model, load(library) if library else None)
    if unrunnable:
        return ShippedCheck(model, library, summary={"checked": False, "why": unrunnable})
    try:
        reference = ort.InferenceSession(str(original), quiet_session_options(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # optimize takes models onnxruntime cannot load (an old opset): nothing to check against
        why = f"onnxruntime cannot load the original model ({first_line(exc, 160)})"
        note(f"shipped check skipped: {why}")
        return ShippedCheck(model, library, summary={"checked": False, "why": why})
    feed_sets, expected, refused = _runnable_sets(reference, _feed_sets(reference, inputs))
    if not feed_sets:  # e.g. random indices out of range, an integer division by zero
        why = f"the original model fails on {'the given' if inputs else 'random'} inputs ({refused})"
        note(f"shipped check skipped: {why}")
        return ShippedCheck(model, library, summary={"checked": False, "why": why})
    names = [o.name for o in reference.get_outputs()]

    def deviation(candidate_model: onnx.ModelProto, candidate_library: Path | None) -> str | None:
        return _deviation(candidate_model, load(candidate_library) if candidate_library else None, feed_sets,
                          expected, names)

    first = deviation(model, library)
    summary = {"checked": True, "input_sets": len(feed_sets), "inputs": str(inputs) if inputs else "random"}
    if first is None:
        return ShippedCheck(model, library, summary={**summary, "ok": True})
    note(f"shipped check: the fused model differs from the original ({first}); finding the groups responsible")

    def differs(kept: Fused) -> bool:
        return deviation(*package(kept)) is not None

    responsible = _responsible(fused, differs)
    kept = [pair for pair in fused if pair[0].name not in responsible]
    model, library = package(kept)
    final = deviation(model, library)
    if final is not None:  # what is left still differs: then it is not the kernels' doing
        raise ShippedModelDiffers(f"the output model differs from the original even with every group left to "
                                  f"onnxruntime ({final})")
    reason = f"shipped check: with this kernel the fused model differs from the original ({first})"
    note(f"shipped check: {len(responsible)} of {len(fused)} groups fall back: {', '.join(sorted(responsible))}")
    return ShippedCheck(model, library, dict.fromkeys(responsible, reason),
                        {**summary, "ok": True, "first_deviation": first, "fallen_back": sorted(responsible)})


def _responsible(fused: Fused, differs: Callable[[Fused], bool]) -> set[str]:
    """Groups whose kernels make the model differ: halves that differ alone are split further;
    if neither half does, the deviation needs both, and the whole set falls back. Repeated until
    what is left agrees (or nothing is left)."""
    def split(suspects: Fused) -> set[str]:
        if len(suspects) == 1:
            return {suspects[0][0].name}
        halves = (suspects[: len(suspects) // 2], suspects[len(suspects) // 2:])
        found = set().union(*(split(half) for half in halves if differs(half)))
        return found or {group.name for group, _ in suspects}

    responsible: set[str] = set()
    remaining = list(fused)
    while remaining and differs(remaining):
        found = split(remaining)
        responsible |= found
        remaining = [pair for pair in remaining if pair[0].name not in found]
    return responsible


def _deviation(model: onnx.ModelProto, library: Path | None, feed_sets, expected, names) -> str | None:
    """None if the model agrees with the expected outputs on every input set; else the first
    difference in words."""
    options = session_options(library, base=quiet_session_options()) if library else quiet_session_options()
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for feeds, wanted in zip(feed_sets, expected):
            for name, e, a in zip(names, wanted, session.run(None, feeds)):
                cmp = compare_arrays(name, np.asarray(e), np.asarray(a), RTOL, ATOL, NORM_RTOL)
                if not cmp.ok:
                    return f"output {name}: max abs error {cmp.max_abs_error:.3g}"
    except Exception as exc:  # a model that does not even run differs too
        return f"onnxruntime fails: {first_line(exc, 160)}"
    return None


def _runnable_sets(reference: ort.InferenceSession, feed_sets: Sequence[dict]) -> tuple[list, list, str | None]:
    """The input sets the original model runs on, its outputs on them, and why it refused the
    first one it refused (a set the original itself fails on can check nothing)."""
    kept, outputs, refused = [], [], None
    for feeds in feed_sets:
        try:
            outputs.append(reference.run(None, feeds))
            kept.append(feeds)
        except Exception as exc:
            refused = refused or first_line(exc, 160)
    return kept, outputs, refused


def _feed_sets(reference: ort.InferenceSession, inputs: str | Path | None) -> Sequence[dict]:
    if inputs:
        with np.load(inputs) as data:
            return [dict(data)]
    return [random_feeds_for_session(reference, None, default_dim=dim, seed=k) for k, dim in enumerate(RANDOM_DIMS)]


def too_large_to_check(model: onnx.ModelProto) -> bool:
    """Counted from the weights' shapes: serializing a model over 2 GB to measure it fails."""
    return weight_bytes(model) > CHECKED_MODEL_LIMIT


def _why_not_runnable(model: onnx.ModelProto, library: Path | None) -> str | None:
    """Why this machine cannot run the packaged model, if it cannot (then it is not checked)."""
    if too_large_to_check(model):
        return "the model is too large to check in one protobuf"
    if library is None:
        return None
    try:
        level = ctypes.CDLL(str(library)).onnxfuse_isa_level
    except OSError as exc:  # another architecture's library (--target aarch64 on x86-64)
        return f"this machine cannot load the library ({first_line(exc, 120)})"
    level.restype = ctypes.c_char_p
    if level() is None:
        return "this CPU has none of the library's ISA levels"
    return None
