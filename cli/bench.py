"""`onnxfuse bench`: time a model under onnxruntime, onnxfuse, TVM's own pipeline and (on request) IREE and
OpenVINO, side by side."""

from __future__ import annotations

import json
import sys

import click
from onnxfuse_cli.common import EXIT_FAILED, clean_errors, parse_dims, parse_sizes

from onnxfuse.atomic import write_text_atomic
from onnxfuse.errors import UsageError
from onnxfuse.report import format_measured_groups


def _peers(text: str | None) -> tuple[str, ...]:
    from onnxfuse.measure.peers import PEERS

    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if names == ["all"]:
        return PEERS
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise UsageError(f"--peers: unknown {', '.join(unknown)} (choose from {', '.join(PEERS)}, or all)")
    return tuple(dict.fromkeys(names))


def _extra_models(items: tuple[str, ...]) -> dict[str, str]:
    extras = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--ort {item!r} is not NAME=MODEL.onnx")
        extras[name] = path
    return extras


@click.command("bench")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--fused", type=click.Path(dir_okay=False),
              help="An already fused model to time (default: optimize MODEL first, using the kernel cache).")
@click.option("--batch", "batches", metavar="N,N",
              help="Batch sizes, one run each: the value of every symbolic dimension that --dim does not set "
                   "(default 1,64,1000; with --inputs, the file's own sizes). Models with static shapes run at theirs.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=N",
              help="Value of one named symbolic dimension in every run, e.g. --dim seq=128. Repeatable.")
@click.option("--inputs", type=click.Path(dir_okay=False),
              help="An .npz of inputs keyed by input name (e.g. recorded from real data) instead of random ones; "
                   "--batch and --dim resize it, repeating its entries along those axes.")
@click.option("--threads", default="1", show_default=True, metavar="N,N",
              help="Thread counts: onnxruntime intra-op threads and TVM_NUM_THREADS; each runs in a fresh process.")
@click.option("--rounds", type=click.IntRange(min=1), default=15, show_default=True,
              help="Alternating rounds per measurement (fewer for slow models, to stay near --budget).")
@click.option("--budget", type=click.FloatRange(min=0.1), default=20.0, show_default=True,
              help="Seconds one batch × thread count may take about; slow models get fewer rounds (at least 5).")
@click.option("--ort", "extra", multiple=True, metavar="NAME=MODEL",
              help="Another ONNX model with the same inputs and outputs to time in onnxruntime, e.g. "
                   "--ort trees-ml=forest_ml.onnx; inputs and outputs named otherwise are taken by position. "
                   "Repeatable.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write all numbers as JSON.")
@click.option("--no-tvm", is_flag=True, help="Leave out TVM's own pipeline (its build can take minutes).")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Kernel cache for optimizing (default: $ONNXFUSE_CACHE_DIR or ~/.cache/onnxfuse).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--select", type=click.Choice(["auto", "all", "measured"]), default="auto", show_default=True,
              help="How onnxfuse picks groups when it optimizes MODEL (see `onnxfuse optimize --help`); "
                   "measured times each kernel at the --batch sizes and the first --threads.")
@click.option("--call", "call_style", type=click.Choice(["iobinding", "run"]), default="iobinding", show_default=True,
              help="How onnxruntime is called: iobinding binds inputs and pre-allocated outputs once (a serving "
                   "loop; times the model), run calls session.run(None, feeds) (adds Python's numpy conversions, "
                   "5-7 µs per call, to every contender).")
@click.option("--peers", "peers", metavar="NAME,NAME",
              help="Other compilers to time too, each at static shapes per batch on its fastest call path: iree "
                   "(iree-import-onnx + llvm-cpu at the host CPU, local-sync runtime) and/or openvino (CPU plugin, "
                   "one reused InferRequest), or all. Needs pip install 'onnxfuse[bench]'.")
@click.option("--groups", is_flag=True,
              help="Instead of the whole model: optimize MODEL with --select measured (into a temporary directory) "
                   "and print each group's kernel and onnxruntime times and achieved memory bandwidth against "
                   "this machine's copy bandwidth, at the --batch sizes and --threads.")
@clean_errors
def bench(model, fused, batches, dims, inputs, threads, rounds, budget, extra, json_path, no_tvm, cache_dir, seed,
          select, call_style, peers, groups) -> None:
    """Time MODEL under onnxruntime (ORT_ENABLE_ALL), as onnxfuse's fused model in onnxruntime, and
    under TVM's own pipeline (from_onnx + default Relax pipeline + VM), and with --peers under IREE and
    OpenVINO, at each batch size and thread count. Prints median ms per call and the speedup over
    onnxruntime: the median over rounds of onnxruntime's time / the contender's in the same round.

    Inputs are random (integers used as Gather indices span the gathered axis, other integers are 0
    or 1) unless --inputs gives them. Every contender's outputs are checked against onnxruntime on
    the original model first; a contender that differs is refused, not timed. Any contender that
    was refused or failed makes the exit code 1 (leave TVM out with --no-tvm where it cannot build).

    \b
    onnxfuse bench models/lstm_cell.onnx --batch 1,64 --threads 1,2
    onnxfuse bench tree_trav.onnx --ort trees-ml=tree_ensemble.onnx --no-tvm --json out.json
    onnxfuse bench bert.onnx --inputs bert.inputs.npz --dim batch=64 --no-tvm
    onnxfuse bench models/lstm_gate.onnx --groups --batch 1,64
    onnxfuse bench models/gru_cell.onnx --peers iree,openvino --no-tvm
    """
    from onnxfuse.bench import BenchOptions, bench_model, format_compile_table, format_table, not_timed, report_json
    from onnxfuse.fatal_signals import die_promptly_on_fatal_signals

    die_promptly_on_fatal_signals()  # kernels run in this process (the fused model is verified here)

    if batches is not None:
        sizes: tuple[int | None, ...] = parse_sizes(batches, "--batch")
    else:
        sizes = (None,) if inputs else (1, 64, 1000)
    options = BenchOptions(batches=sizes, dims=parse_dims(dims), inputs=inputs, threads=parse_sizes(threads, "--threads"),
                           rounds=rounds, budget_seconds=budget, tvm=not no_tvm, cache_dir=cache_dir, seed=seed,
                           select=select, call_style=call_style, peers=_peers(peers))
    if groups:
        _bench_groups(model, fused, options, json_path)
        return
    log = lambda message: click.echo(f"onnxfuse: {message}", err=True)  # noqa: E731
    result = bench_model(model, fused, options, extra_models=_extra_models(extra), log=log)
    click.echo(format_table([result]))
    click.echo()
    click.echo(format_compile_table([result]))
    for note in result.notes:
        click.echo(f"note: {note}")
    if json_path:
        write_text_atomic(json_path, json.dumps(report_json([result], options), indent=1))
    untimed = not_timed([result])
    for line in untimed:
        click.echo(f"onnxfuse: error: not timed: {line}", err=True)
    if untimed:
        sys.exit(EXIT_FAILED)


def _bench_groups(model: str, fused: str | None, options, json_path: str | None) -> None:
    """`--groups`: the per-group table of a measured optimize run; --json writes its whole report."""
    from onnxfuse.bench import measure_groups

    if fused:
        raise UsageError("--groups measures the groups of MODEL as it optimizes it; it does not take --fused")
    if options.inputs or options.dims or None in options.batches:
        raise UsageError("--groups times each group on random inputs at --batch; it does not take --inputs or --dim")
    report = measure_groups(model, options)
    click.echo(format_measured_groups(report))
    if json_path:
        write_text_atomic(json_path, json.dumps({"model": model, **report}, indent=1))
