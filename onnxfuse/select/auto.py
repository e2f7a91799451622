"""`--select auto`: leave to onnxruntime the groups whose ops it still runs much faster."""

from __future__ import annotations

from ..fusion.plan import FusedGroup
from ..ops import uncompetitive_ops


def auto_rejects(group: FusedGroup) -> str | None:
    """Why `auto` leaves this group to onnxruntime, or None to compile it."""
    slow = uncompetitive_ops(group.op_types)
    if not slow:
        return None
    return (f"auto: onnxruntime's {'/'.join(slow)} is faster than our kernel today "
            f"(--select all compiles it, --select measured times it)")
