"""Human-readable text for plans and optimize results: what was fused, and why not."""

from __future__ import annotations

from collections import Counter

from .fusion.plan import FusionPlan


def ops_summary(op_types: tuple[str, ...], limit: int = 8) -> str:
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
        lines.append(f"  {g.name}: {len(g.node_indices)} ops [{ops_summary(g.op_types)}] "
                     f"nodes {_ranges(g.node_indices)} → {', '.join(g.outputs)}{reuse}")
    if plan.unfused:
        lines.append("  unfused:")
        for u in plan.unfused:
            lines.append(f"    {u.where} {u.op_type}: {u.reason}")
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


def format_measured_groups(report: dict) -> str:
    """The groups of a `--select measured` optimize report: per group, batch and thread count, kernel
    and onnxruntime time, the kernel's achieved bandwidth against the machine's copy bandwidth and,
    for groups with multiply-adds, its GFLOP/s against the GEMM peak with the largest ratio any
    kernel could reach, call cost included (roofline.ratio_bound); then the whole-model check's steps."""
    measured = report.get("measured", {})
    copy_gbs = measured.get("copy_bandwidth_gbs")
    peaks = measured.get("gemm_peak_gflops", {})
    header = ["group", "ops", "batch", "thr", "kernel µs", "onnxruntime µs", "ratio", "GB/s", "% copy",
              "GFLOP/s", "% peak", "bound", "used"]
    rows = []
    for g in report["groups"]:
        ops = f"{g['size']} [{ops_summary(tuple(g['op_types']), limit=3)}]"
        for m in g.get("measured", []):
            compute = ([f"{m['kernel_gflops']:.1f}", f"{m['gemm_peak_pct']:.1f}", f"{m['ratio_bound']:.2f}×"]
                       if "gemm_peak_pct" in m else ["", "", ""])
            rows.append([g["name"], ops, str(m["batch"]), str(m["threads"]), f"{m['kernel_us']:.1f}",
                         f"{m['onnxruntime_us']:.1f}", f"{m.get('speedup', m['onnxruntime_us'] / m['kernel_us']):.2f}×",
                         f"{m['kernel_gbs']:.2f}", f"{m.get('copy_bandwidth_pct', 0.0):.1f}", *compute, _used(g)])
    lines = [f"copy bandwidth of this machine: {copy_gbs} GB/s (numpy copy, bytes read + written)"
             if copy_gbs else "no group was compiled: nothing measured"]
    floors = measured.get("call_floor_us", {})
    lines += [f"GEMM peak at {threads} thread(s): {peak} GFLOP/s (onnxruntime MatMul, 512x512x512); an empty "
              f"onnxruntime call: {floors.get(threads, 0.0)} µs; bound = onnxruntime µs / (the group's "
              "multiply-adds at that peak + that call)" for threads, peak in peaks.items()]
    lines.append(render_table(header, rows, markdown=False))
    check = measured.get("whole_model_check", {})
    if "skipped" in check:
        lines.append(f"whole-model check skipped: {check['skipped']}")
    lines += [whole_model_step_line(step) for step in check.get("steps", [])]
    return "\n".join(lines)


def whole_model_step_line(step: dict) -> str:
    """One step of the whole-model check (its JSON form), with what it decided."""
    if step["readd"]:
        verdict = f"{step['kept'][-1]} {'re-added' if step['accepted'] else 'stays out'}"
    else:
        verdict = "kept" if step["accepted"] else "slower, least-gain half dropped"
    return f"whole model with {len(step['kept'])} groups: " + ", ".join(
        f"batch {t['batch']}×{t['threads']}t {t['fused_ms']:.4g} ms vs onnxruntime {t['onnxruntime_ms']:.4g} ms "
        f"({t['ratio']:.3f}×)" for t in step["timings"]) + f" → {verdict}"


def _used(group: dict) -> str:
    if group["status"] != "fallback":
        return "yes"
    return "no: whole model" if group.get("reason", "").startswith("dropped by the whole-model") else "no: slower"


def render_table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    """Aligned plain-text columns, or a markdown table."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def fmt(row):
        return "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])
