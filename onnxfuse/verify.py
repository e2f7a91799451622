"""Compare an optimized model with its original under onnxruntime, output by output."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .errors import ModelLoadError, OnnxfuseError, first_line
from .measure.inputs import random_feeds_for_session
from .session import InferenceSession, quiet_session_options


@dataclass
class OutputComparison:
    name: str
    max_abs_error: float
    max_rel_error: float
    ok: bool


@dataclass
class VerifyResult:
    runs: int
    outputs: list[OutputComparison]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def worst(self) -> OutputComparison:
        return max(self.outputs, key=lambda o: (not o.ok, o.max_abs_error))


NORM_RTOL = 1e-5
"""Tolerance relative to an output's largest magnitude: a sum of large terms that cancel to a
small value carries rounding error of the terms' size, which an element-wise rtol calls wrong."""


def compare_arrays(
    name: str, expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float, norm_rtol: float = NORM_RTOL
) -> OutputComparison:
    """|actual - expected| <= atol + rtol·|expected| + norm_rtol·max|expected|, NaNs in the same places."""
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return OutputComparison(name, float("inf"), float("inf"), False)
    if expected.size == 0:
        return OutputComparison(name, 0.0, 0.0, True)
    if expected.dtype.kind in "biu":
        diff = np.abs(expected.astype(np.int64) - actual.astype(np.int64))
        return OutputComparison(name, float(diff.max()), float(diff.max()), bool((diff == 0).all()))
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    same_nan = np.isnan(e) == np.isnan(a)
    e, a = np.nan_to_num(e), np.nan_to_num(a)
    diff = np.abs(e - a)
    rel = diff / np.maximum(np.abs(e), 1e-12)
    ok = bool(same_nan.all() and np.all(diff <= atol + rtol * np.abs(e) + norm_rtol * np.abs(e).max()))
    return OutputComparison(name, float(diff.max()), float(rel.max()), ok)


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
    try:
        reference = ort.InferenceSession(str(original), quiet_session_options(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelLoadError(f"{original}: onnxruntime cannot load it ({first_line(exc)})") from None
    try:
        candidate = InferenceSession(str(fused), quiet_session_options(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelLoadError(f"{fused}: onnxruntime cannot load it ({first_line(exc)})") from None

    feed_sets = [dict(np.load(inputs))] if inputs else [
        random_feeds_for_session(reference, dims, default_dim=d, seed=k)
        for k, d in zip(range(runs), [1, 3, 7, 2, 5, 4, 6, 8])
    ]
    worst: dict[str, OutputComparison] = {}
    for feeds in feed_sets:
        try:
            expected = reference.run(None, feeds)
        except Exception as exc:
            raise OnnxfuseError(
                f"the original model fails on these inputs ({first_line(exc, 160)}); pass --inputs FILE.npz"
            ) from None
        actual = candidate.run(None, feeds)
        for meta, e, a in zip(reference.get_outputs(), expected, actual):
            cmp = compare_arrays(meta.name, np.asarray(e), np.asarray(a), rtol, atol, norm_rtol)
            before = worst.get(meta.name)
            if before is None or (not cmp.ok, cmp.max_abs_error) > (not before.ok, before.max_abs_error):
                worst[meta.name] = cmp
    return VerifyResult(len(feed_sets), list(worst.values()))
