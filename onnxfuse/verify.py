"""Compare an optimized model with its original under onnxruntime, output by output."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .errors import ModelLoadError, OnnxfuseError, first_line
from .frontend.validate import validate_model_file
from .measure.inputs import (
    check_dim_names,
    index_limits,
    load_inputs,
    load_model_skeleton,
    model_inputs,
    random_feeds_for_session,
    resize_inputs,
)
from .session import InferenceSession, quiet_session_options


@dataclass
class OutputComparison:
    name: str
    max_abs_error: float
    max_rel_error: float
    ok: bool
    differing: int = 0
    """Elements whose bits differ from the original's (NaN matching NaN): 0 is the same answers
    bit for bit, which the tolerance cannot tell from close ones."""
    elements: int = 0

    @property
    def bitwise(self) -> bool:
        return self.ok and self.differing == 0

    def merged(self, other: OutputComparison) -> OutputComparison:
        """Both runs' comparisons of this output as one: the worse errors, the elements summed."""
        return OutputComparison(self.name, max(self.max_abs_error, other.max_abs_error),
                                max(self.max_rel_error, other.max_rel_error), self.ok and other.ok,
                                self.differing + other.differing, self.elements + other.elements)


@dataclass
class VerifyResult:
    runs: int
    outputs: list[OutputComparison]

    def to_json(self) -> dict:
        """The verdict `onnxfuse verify --json` prints."""
        worst = self.worst
        return {"ok": self.ok, "bitwise": self.bitwise, "runs": self.runs, "worst": worst.name if worst else None,
                "outputs": [{"name": o.name, "ok": o.ok, "bitwise": o.bitwise, "max_abs_error": _finite(o.max_abs_error),
                             "max_rel_error": _finite(o.max_rel_error), "differing_elements": o.differing,
                             "elements": o.elements} for o in self.outputs]}

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def bitwise(self) -> bool:
        """Every output the original's bits (NaN matching NaN) on every run."""
        return all(o.bitwise for o in self.outputs)

    @property
    def worst(self) -> OutputComparison:
        return max(self.outputs, key=lambda o: (not o.ok, o.max_abs_error))


def _finite(x: float) -> float | None:
    """JSON has no inf: a shape or dtype mismatch (error inf) is null."""
    return x if np.isfinite(x) else None


NORM_RTOL = 1e-5
"""Tolerance relative to an output's largest magnitude: a sum of large terms that cancel to a
small value carries rounding error of the terms' size, which an element-wise rtol calls wrong."""


def compare_arrays(
    name: str, expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float, norm_rtol: float = NORM_RTOL
) -> OutputComparison:
    """|actual - expected| <= atol + rtol·|expected| + norm_rtol·max|expected|, NaNs in the same
    places; and how many elements differ in their bits."""
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return OutputComparison(name, float("inf"), float("inf"), False, expected.size, expected.size)
    if expected.size == 0:
        return OutputComparison(name, 0.0, 0.0, True)
    differing = differing_elements(expected, actual)
    if expected.dtype.kind in "biu":
        diff = np.abs(expected.astype(np.int64) - actual.astype(np.int64))
        return OutputComparison(name, float(diff.max()), float(diff.max()), bool((diff == 0).all()), differing,
                                expected.size)
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    same_nan = np.isnan(e) == np.isnan(a)
    e, a = np.nan_to_num(e), np.nan_to_num(a)
    diff = np.abs(e - a)
    rel = diff / np.maximum(np.abs(e), 1e-12)
    ok = bool(same_nan.all() and np.all(diff <= atol + rtol * np.abs(e) + norm_rtol * np.abs(e).max()))
    return OutputComparison(name, float(diff.max()), float(rel.max()), ok, differing, expected.size)


def differing_elements(expected: np.ndarray, actual: np.ndarray) -> int:
    """Elements of two same-shaped arrays whose bytes differ; NaN matches NaN (any payload)."""
    if expected.dtype.kind not in "fc" or expected.dtype.itemsize not in (2, 4, 8):
        return int(np.count_nonzero(expected != actual))
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[expected.dtype.itemsize]
    same = np.ascontiguousarray(expected).view(bits) == np.ascontiguousarray(actual).view(bits)
    return int(np.count_nonzero(~(same | (np.isnan(expected) & np.isnan(actual)))))


def verify_models(
    original: str | Path,
    fused: str | Path,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    runs: int = 3,
    inputs: str | Path | None = None,
    dims: dict[str, int] | None = None,
    norm_rtol: float = NORM_RTOL,
) -> VerifyResult:
    """Run `original` and `fused` under onnxruntime on the same inputs and compare output by output.

    inputs: an .npz of feeds (one run), resized along the dimensions `dims` names; otherwise `runs`
    random input sets, symbolic dims taking 1, 3, 7, ... unless `dims` names them, integers used as
    Gather indices spanning the gathered axis (measure/inputs.py). An output matches when
    |fused - original| <= atol + rtol·|original| + norm_rtol·max|original| everywhere.
    The two sessions are open one after the other, so a large model is in memory once.

        >>> check = onnxfuse.verify_models("model.onnx", "out/model.fused.onnx", dims={"N": 8})
        >>> check.ok, check.worst.name, check.worst.max_abs_error
    """
    validate_model_file(original, allow_onnxfuse_output=True)
    validate_model_file(fused, allow_onnxfuse_output=True)
    specs = model_inputs(original)
    check_dim_names(specs, dims or {})
    reference = _open(ort.InferenceSession, original)
    if inputs:
        feed_sets = [resize_inputs(load_inputs(inputs, specs), specs, dims=dims)]
    else:
        limits = index_limits(load_model_skeleton(original))
        feed_sets = [random_feeds_for_session(reference, dims, default_dim=d, seed=k, index_limits=limits)
                     for k, d in zip(range(runs), [1, 3, 7, 2, 5, 4, 6, 8])]
    names = [meta.name for meta in reference.get_outputs()]
    expected_sets = []
    for feeds in feed_sets:
        try:
            expected_sets.append(reference.run(None, feeds))
        except Exception as exc:
            raise OnnxfuseError(
                f"the original model fails on these inputs ({first_line(exc, 160)}); pass --inputs FILE.npz"
            ) from None
    del reference
    candidate = _open(InferenceSession, fused)
    compared: dict[str, OutputComparison] = {}
    for feeds, expected in zip(feed_sets, expected_sets):
        actual = candidate.run(None, feeds)
        for name, e, a in zip(names, expected, actual):
            cmp = compare_arrays(name, np.asarray(e), np.asarray(a), rtol, atol, norm_rtol)
            compared[name] = compared[name].merged(cmp) if name in compared else cmp
    return VerifyResult(len(feed_sets), list(compared.values()))


def _open(session_type, path):
    try:
        return session_type(str(path), quiet_session_options(), providers=["CPUExecutionProvider"])
    except OnnxfuseError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"{path}: onnxruntime cannot load it ({first_line(exc)})") from None
