"""Gates for CI: conditions under which a finished optimize run counts as failed (exit 1).

The output is written first either way, so a failed gate still leaves a usable model.
"""

from __future__ import annotations

SHAPE_PLUMBING = frozenset({
    "Constant", "ConstantOfShape", "Shape", "Size", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
})
"""Ops that move no data worth a kernel: constants, shape queries and reshapes (which only
relabel a buffer). They are left out of the fused fraction, above and below the line."""


def is_compute_op(op_type: str) -> bool:
    """A node that computes values: every op except constants and pure shape plumbing."""
    return op_type not in SHAPE_PLUMBING


def gate_failures(report: dict, *, fail_on_fallback: bool = False, min_fused: float | None = None) -> list[str]:
    """Why `report` (an optimize report) fails the gates, one line each; empty if it passes.

    fail_on_fallback: a group that failed to import, compile or verify (or timed out) fails the
    run. Groups left to onnxruntime by choice (`--select`, the weight limit) do not.
    min_fused: the share of compute nodes inside compiled kernels must be at least this.
    """
    failures = []
    if fail_on_fallback:
        failed = [g for g in report["groups"] if g.get("fallback_kind") == "failed"]
        if failed:
            named = "; ".join(f"{g['name']}: {g.get('reason', '')}"[:160] for g in failed[:3])
            more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
            failures.append(f"--fail-on-fallback: {len(failed)} group(s) fell back ({named}{more})")
    if min_fused is not None and report["fused_fraction"] < min_fused:
        failures.append(f"--min-fused {min_fused:g}: {report['fused_compute_node_count']} of "
                        f"{report['compute_node_count']} compute nodes fused ({report['fused_fraction']:.1%})")
    return failures
