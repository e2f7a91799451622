"""What every onnxfuse command shares: exit codes, clean errors, option parsing.

Exit codes, for CI: 0 success; 1 the job ran but failed (e.g. `verify` found a mismatch);
2 bad input or usage (unreadable model, unknown option, missing toolchain).
"""

from __future__ import annotations

import functools
import sys

import click

from onnxfuse.errors import OnnxfuseError

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def clean_errors(command):
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


def parse_sizes(text: str, option: str) -> tuple[int, ...]:
    """'1,64,1000' → (1, 64, 1000); anything else is a usage error naming the option."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise click.BadParameter(f"{text!r} is not a list of positive numbers like 1,64", param_hint=option)
    return values


def parse_dims(items) -> dict[str, int]:
    """('seq=128', 'batch=4') → {'seq': 128, 'batch': 4}: the --dim options of bench and verify."""
    dims = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value.isdigit() or int(value) < 1:
            raise click.BadParameter(f"{item!r} is not NAME=N with N a positive number", param_hint="--dim")
        dims[name] = int(value)
    return dims
