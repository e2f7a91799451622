"""The `onnxfuse` command line.

Exit codes, for CI: 0 success; 1 the job ran but failed (e.g. `verify` found a mismatch);
2 bad input or usage (unreadable model, unknown option, missing toolchain).
"""

from __future__ import annotations

import functools
import json
import sys

import click

from onnxfuse.errors import OnnxfuseError

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _clean_errors(command):
    """Turn our own errors into one line on stderr and an exit code; never a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except OnnxfuseError as exc:
            click.echo(f"onnxfuse: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("onnxfuse: interrupted", err=True)
            sys.exit(130)

    return wrapper


fusion_options = [
    click.option("--max-depth", type=click.IntRange(min=1), default=256, show_default=True,
                 help="Most ops in one fused group."),
    click.option("--max-inputs", type=click.IntRange(min=1), default=64, show_default=True,
                 help="Most distinct input values (weights included) of one group."),
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
    """


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@with_fusion_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@_clean_errors
def inspect(model: str, max_depth: int, max_inputs: int, as_json: bool) -> None:
    """Show how MODEL would be fused: groups, their ops, and why other nodes stay unfused."""
    from onnxfuse.fusion.partition import FusionOptions
    from onnxfuse.fusion.plan import plan_fusion
    from onnxfuse.loader import load_model

    graph = load_model(model)
    plan = plan_fusion(graph, FusionOptions(max_depth=max_depth, max_inputs=max_inputs))
    if as_json:
        click.echo(json.dumps({"model": model, **plan.to_json()}))
        return
    from onnxfuse.report import format_plan

    click.echo(format_plan(model, plan))


if __name__ == "__main__":
    main()
