"""The `onnxfuse` command line (exit codes: see cli/common.py)."""

from __future__ import annotations

import json
import sys

import click
from onnxfuse_cli.bench import bench
from onnxfuse_cli.common import EXIT_FAILED, clean_errors, parse_dims, parse_sizes

from onnxfuse.report import format_plan

fusion_options = [
    click.option("--max-depth", type=click.IntRange(min=1), default=256, show_default=True,
                 help="Most ops in one fused group."),
    click.option("--max-inputs", type=click.IntRange(min=1), default=64, show_default=True,
                 help="Most distinct input values (weights included) of one group."),
    click.option("--max-duplication", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Most copies of one value's expression inside a kernel; a value read more often is "
                      "computed once (keeps deep tree chains linear to compile)."),
]


def with_fusion_options(command):
    for option in reversed(fusion_options):
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="onnxfuse")
def main() -> None:
    """Fuse ONNX operators into groups and compile each group into one native kernel.

    \b
    onnxfuse inspect model.onnx          show the fusion plan and why nodes stay unfused
    onnxfuse optimize model.onnx         write model.fused.onnx + model.fused.so
    onnxfuse verify model.onnx model.fused.onnx   compare both under onnxruntime
    onnxfuse bench model.onnx            time onnxruntime, onnxfuse and TVM side by side
    """


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@with_fusion_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan and the whole graph as one JSON object (docs/view.md).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Write the plan as one self-contained HTML page.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="With --json or --html: the groups of this optimize report of MODEL, with status, kernel and times.")
@clean_errors
def inspect(model: str, max_depth: int, max_inputs: int, max_duplication: int, as_json: bool, html_path: str | None,
            report_path: str | None) -> None:
    """Show how MODEL would be fused: groups, their ops, and why other nodes stay unfused."""
    from onnxfuse.fusion.partition import FusionOptions
    from onnxfuse.fusion.tree_rewrite import plan_with_trees
    from onnxfuse.graph_dump import graph_dump, read_report

    graph, plan = plan_with_trees(model, FusionOptions(max_depth=max_depth, max_inputs=max_inputs,
                                                       max_duplication=max_duplication))
    if as_json or html_path or report_path:
        dump = graph_dump(model, graph, plan.to_json(), read_report(report_path) if report_path else None)
    if html_path:
        from onnxfuse.view import write_page

        write_page(dump, html_path)
    if as_json:
        click.echo(json.dumps(dump))
        return

    click.echo(format_plan(model, plan))


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Where to write the fused model (default: MODEL's stem + .fused.onnx). The library goes beside it.")
@click.option("--target", type=click.Choice(["portable", "native", "x86_64", "aarch64"]),
              help="CPUs to compile for (default: $ONNXFUSE_TARGET, else portable). "
                   "portable: any CPU of this machine's architecture (x86-64 or aarch64); each "
                   "kernel is built per ISA level (x86-64: baseline, v3/AVX2, v4/AVX-512) and the library runs the "
                   "best one the serving CPU has. native: this machine's CPU only (the library refuses CPUs "
                   "without its features). x86_64 / aarch64: portable for that architecture (aarch64 is "
                   "cross-compiled). --mcpu/--mattr build one level, for that CPU.")
@click.option("--mcpu", help="LLVM CPU name to tune for, e.g. neoverse-n1 or skylake.")
@click.option("--mattr", help="Comma-separated LLVM CPU features, e.g. +neon,+dotprod.")
@with_fusion_options
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Groups compiled in parallel (default: CPU count).")
@click.option("--compile-timeout", type=click.FloatRange(min=1), default=600, show_default=True, metavar="SECONDS",
              help="A group still compiling after this long falls back to onnxruntime.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write what was fused, compiled and why not as JSON (docs/report.md); - writes it to stdout "
                   "and the summary to stderr.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Kernel cache (default: $ONNXFUSE_CACHE_DIR or ~/.cache/onnxfuse).")
@click.option("--no-cache", is_flag=True, help="Compile every kernel afresh.")
@click.option("--no-verify", is_flag=True,
              help="Skip checking each kernel, and the written model with its library, against onnxruntime.")
@click.option("--inputs", type=click.Path(dir_okay=False, exists=True),
              help="An .npz of model inputs for the final check of the written model against the original "
                   "(default: random inputs). Groups that make it differ fall back.")
@click.option("--select", type=click.Choice(["auto", "all", "measured"]), default="auto", show_default=True,
              help="Which compiled groups to use. auto: all but those onnxruntime still runs much faster "
                   "(convolutions, pooling); all: every group; measured: time each kernel against onnxruntime "
                   "on its own group and keep the faster, then drop kept groups (least gain first) while the "
                   "whole model is slower than the original (output then depends on the machine).")
@click.option("--select-batch", "select_batches", default="1,64", show_default=True, metavar="N,N",
              help="With --select measured: the batch sizes (symbolic dims) to time at; a kernel must win at all.")
@click.option("--threads", default="1", show_default=True, metavar="N,N",
              help="With --select measured: onnxruntime intra-op thread counts to time at; a kernel must win at all.")
@click.option("--fail-on-fallback", is_flag=True,
              help="Exit 1 if a group failed to compile or verify, or timed out (after writing the output and report). "
                   "Groups left to onnxruntime by --select do not count.")
@click.option("--min-fused", type=click.FloatRange(0, 1), metavar="FRACTION",
              help="Exit 1 (after writing the output and report) if less than this share of the compute nodes "
                   "(all but Constant and shape plumbing: Shape, Reshape, Squeeze, ...) runs in compiled kernels.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the summary.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False),
              help="Also write the plan with each group's outcome as one self-contained HTML page.")
@clean_errors
def optimize(model, output, target, mcpu, mattr, max_depth, max_inputs, max_duplication, jobs, compile_timeout,
             report_path, cache_dir, no_cache, no_verify, inputs, select, select_batches, threads, fail_on_fallback,
             min_fused, quiet, html_path) -> None:
    """Fuse MODEL, compile each group into one kernel, and write the fused model + its library.

    Exit codes: 0 written; 1 written, but a --fail-on-fallback or --min-fused gate failed;
    2 nothing written: bad input, bad option, or an output that cannot or must not be written.
    """
    from onnxfuse.fatal_signals import die_promptly_on_fatal_signals
    from onnxfuse.gates import gate_failures
    from onnxfuse.pipeline import optimize as run_optimize
    from onnxfuse.progress import Progress

    die_promptly_on_fatal_signals()  # kernels run in this process (verification, --select measured)
    to_stdout = report_path == "-"
    result = run_optimize(
        model, output, report=None if to_stdout else report_path, target=target, mcpu=mcpu, mattr=mattr,
        max_depth=max_depth, max_inputs=max_inputs, max_duplication=max_duplication,
        jobs=jobs, cache_dir=False if no_cache else (cache_dir or True), verify=not no_verify,
        select=select, select_batches=parse_sizes(select_batches, "--select-batch"),
        threads=parse_sizes(threads, "--threads"), compile_timeout=compile_timeout, inputs=inputs,
        progress=Progress(enabled=not quiet),
    )
    report = result.report
    if to_stdout:
        click.echo(json.dumps(report, indent=1))
    say = lambda text: click.echo(text, err=to_stdout)  # noqa: E731 - the summary yields stdout to the report
    say(f"{model} → {result.model_path}"
        + (f" + {result.library_path.name}" if result.library_path else " (nothing compiled: no library)"))
    say(f"  {report['groups_total']} groups: {report['groups_compiled']} compiled, {report['groups_cached']} cached, "
        f"{report['groups_fallback']} fell back; {report['fused_node_count']} of {report['node_count']} nodes fused "
        f"({report['fused_compute_node_count']} of {report['compute_node_count']} compute nodes) "
        f"in {report['seconds']:.1f}s")
    for g in report["groups"]:
        if g["status"] == "fallback":
            say(f"  fallback {g['name']} ({g['size']} ops): {g['reason']}")
    if html_path:
        from onnxfuse.graph_dump import model_dump
        from onnxfuse.view import write_page

        write_page(model_dump(model, result.plan.options, report), html_path)
        say(f"  plan page: {html_path}")
    failures = gate_failures(report, fail_on_fallback=fail_on_fallback, min_fused=min_fused)
    for failure in failures:
        click.echo(f"onnxfuse: gate failed: {failure}", err=True)
    if failures:
        sys.exit(EXIT_FAILED)


@main.command()
@click.argument("original", type=click.Path(dir_okay=False))
@click.argument("fused", type=click.Path(dir_okay=False))
@click.option("--rtol", type=float, default=1e-4, show_default=True)
@click.option("--atol", type=float, default=1e-5, show_default=True)
@click.option("--norm-rtol", type=float, default=1e-5, show_default=True,
              help="Tolerance relative to each output's largest magnitude (rounding in sums that cancel).")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Random input sets (symbolic dims take 1, 3, 7, ...).")
@click.option("--inputs", type=click.Path(dir_okay=False),
              help="An .npz of inputs keyed by input name, used once instead of random ones.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N",
              help="Value of a named symbolic dimension, e.g. --dim N=8 (with --inputs: the file's entries repeated "
                   "or cut to that size). Repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as one JSON object.")
@clean_errors
def verify(original, fused, rtol, atol, norm_rtol, runs, inputs, dims, as_json) -> None:
    """Run ORIGINAL and FUSED under onnxruntime on the same inputs; exit 0 only if all outputs match.

    Each output is also reported as the same bits as the original's (NaN matching NaN) or as how
    many of its elements differ; "match, bit for bit" when all are the same bits."""
    from onnxfuse.verify import verify_models

    result = verify_models(original, fused, rtol=rtol, atol=atol, runs=runs, inputs=inputs, dims=parse_dims(dims),
                           norm_rtol=norm_rtol)
    if as_json:
        click.echo(json.dumps({"original": original, "fused": fused, **result.to_json(),
                               "tolerance": {"rtol": rtol, "atol": atol, "norm_rtol": norm_rtol}}))
        sys.exit(0 if result.ok else EXIT_FAILED)
    for o in result.outputs:
        bits = "same bits" if o.bitwise else f"{o.differing:,} of {o.elements:,} elements differ"
        click.echo(f"  {'ok  ' if o.ok else 'FAIL'} {o.name}: {bits}; max abs error {o.max_abs_error:.3g}, "
                   f"max rel error {o.max_rel_error:.3g}")
    worst = result.worst
    verdict = ("match, bit for bit" if result.bitwise else "match") if result.ok else "MISMATCH"
    click.echo(f"{verdict}: {len(result.outputs)} outputs over {result.runs} runs; worst {worst.name} "
               f"(max abs error {worst.max_abs_error:.3g}, rtol {rtol}, atol {atol})")
    sys.exit(0 if result.ok else EXIT_FAILED)


main.add_command(bench)


if __name__ == "__main__":
    main()
