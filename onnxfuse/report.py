"""Human-readable text for plans and optimize results: what was fused, and why not."""

from __future__ import annotations

from collections import Counter

from .fusion.plan import FusionPlan


def _ops_summary(op_types: tuple[str, ...], limit: int = 8) -> str:
    counts = Counter(op_types)
    parts = [f"{op}×{n}" if n > 1 else op for op, n in counts.most_common()]
    return ", ".join(parts[:limit]) + (f", … ({len(parts) - limit} more kinds)" if len(parts) > limit else "")


def format_plan(model_name: str, plan: FusionPlan) -> str:
    fused = sum(len(g.node_indices) for g in plan.groups)
    lines = [
        f"{model_name}: {plan.node_count} nodes; {len(plan.groups)} fused groups cover {fused}; "
        f"{len(plan.unfused)} stay with onnxruntime "
        f"(max depth {plan.options.max_depth}, max inputs {plan.options.max_inputs}, "
        f"max duplication {plan.options.max_duplication})"
    ]
    for g in plan.groups:
        reuse = (f"; {len(g.reuse)} values read by several ops (up to {max(g.reuse.values())}×), "
                 f"{g.materialised(plan.options.max_duplication)} computed once by the duplication bound"
                 if g.reuse else "")
        lines.append(f"  {g.name}: {len(g.node_indices)} ops [{_ops_summary(g.op_types)}] "
                     f"nodes {_ranges(g.node_indices)} → {', '.join(g.outputs)}{reuse}")
    if plan.unfused:
        lines.append("  unfused:")
        for u in plan.unfused:
            lines.append(f"    #{u.node_index} {u.op_type}: {u.reason}")
    return "\n".join(lines)


def _ranges(indices: tuple[int, ...]) -> str:
    """1,2,3,7 → '1-3,7': compact node lists for long groups."""
    out, run = [], []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
