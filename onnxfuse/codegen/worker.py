"""One group's compile job, run in a worker process: compile, then verify against onnxruntime.

A job never raises for a bad group: it returns (kernel, info, reason, seconds), with kernel None
and the reason when the group must fall back.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from ..errors import CompileError, first_line, short_reason
from ..kernel_spec import DerivedDim, GroupKernel, KernelSpec, product_symbols
from ..measure.inputs import random_feeds_for_session
from ..session import quiet_session_options
from ..target import resolve_target
from ..verify import compare_arrays
from .compile import compile_group
from .recurrent import compile_recurrent, is_recurrent_group

GROUP_RTOL, GROUP_ATOL = 1e-3, 1e-4


def compile_one(model_bytes: bytes, name: str, target_args: tuple, build_dir: str, verify: bool,
                max_duplication: int = 1, weights: dict[str, np.ndarray] | None = None, parallel_levels: int = 0):
    """Compile and verify one group (runs in a worker process). Never raises for a bad group.
    `weights`: values for the model's inputs that are weights (kernel_identity.py), which the
    kernel is verified with. `parallel_levels`: ISA levels built in forked children meanwhile
    (compile.compile_group)."""
    started = time.perf_counter()
    group_model = onnx.load_from_string(model_bytes)
    try:
        tgt = resolve_target(*target_args)
        out_dir = Path(build_dir) / name
        out_dir.mkdir(parents=True, exist_ok=True)
        verify = verify and tgt.name != "aarch64"  # a cross-compiled kernel cannot run here
        with native_stderr_captured() as messages:
            if is_recurrent_group(group_model):
                compiled = compile_recurrent(group_model, name, tgt, out_dir, parallel_levels)
            else:
                compiled = compile_group(group_model, name, tgt, out_dir, max_duplication=max_duplication,
                                         parallel_levels=parallel_levels, host_kernel=verify,
                                         weight_inputs=frozenset(weights or {}))
        info: dict = {"stats": _jsonable(compiled.stats)}
        if messages:
            info["tvm_messages"] = messages
        if verify:
            info["verify"] = verify_kernel(compiled, group_model, weights or {})
        kernel = GroupKernel(compiled.spec, tuple(compiled.arg_sources), dict(compiled.extra_weights))
        return kernel, info, None, time.perf_counter() - started
    except CompileError as exc:
        return None, {}, str(exc), time.perf_counter() - started
    except Exception as exc:  # anything unexpected in TVM is still only this group's problem
        return None, {}, f"unexpected {type(exc).__name__}: {short_reason(exc, 300)}", time.perf_counter() - started


@contextlib.contextmanager
def native_stderr_captured():
    """Collect what TVM writes while compiling: C++ logging on file descriptor 2 (it bypasses
    sys.stderr) and the frontend's print() calls.

    Its messages are about TVM internals (e.g. topi's unchecked gather, which our index checks
    replace); the user gets them in the report, not mixed into the tool's output.
    """
    messages: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    printed = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stdout(printed):
                yield messages
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace") + printed.getvalue()
            messages.extend(dict.fromkeys(line.split("] ", 1)[-1].strip() for line in text.splitlines() if line.strip()))


VERIFY_ROWS_PAST_TILES = 19  # kernels with a symbolic dim only
"""A symbolic dim of this size spans several row tiles of every size the schedule picks (4, 6, 8,
16) and ends in a ragged one. A kernel that read rows no tile had computed yet passed at 1 and 3
and was wrong from 8 on (schedule._covers_one_tile)."""


def verify_kernel(compiled, group_model: onnx.ModelProto, weights: dict[str, np.ndarray] | None = None) -> dict:
    """Run the kernel and onnxruntime on the same random inputs (and the given weights); a
    mismatch is a CompileError."""
    weights = weights or {}
    try:
        session = ort.InferenceSession(_with_initializers(group_model, weights).SerializeToString(),
                                       quiet_session_options(),
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise CompileError(f"verify: onnxruntime cannot run this group as a reference ({first_line(exc)})") from None
    worst = 0.0
    sizes = [(1, 0), (3, 1)]
    if compiled.spec.small_batch_below:  # 1 and 3 run the small-batch variant: a full tile and a tail too
        sizes.append((compiled.spec.small_batch_below + 3, 2))
    if any(t.symbols for t in compiled.spec.inputs):  # a static kernel's shapes are the same at any size
        sizes.append((VERIFY_ROWS_PAST_TILES, 3))
    for dim, seed in sizes:
        feeds = random_feeds_for_session(session, _whole_multiples(compiled.spec, dim), default_dim=dim, seed=seed)
        try:
            expected = session.run(None, feeds)
        except Exception as exc:
            return {"checked": False, "why": f"reference rejects random inputs: {first_line(exc, 120)}"}
        actual = compiled.run({**feeds, **weights})
        for meta, e, a in zip(session.get_outputs(), expected, actual):
            cmp = compare_arrays(meta.name, np.asarray(e), np.asarray(a), GROUP_RTOL, GROUP_ATOL)
            if not cmp.ok:
                raise CompileError(f"verify: output {meta.name} differs from onnxruntime (max abs error {cmp.max_abs_error:.3g})")
            worst = max(worst, cmp.max_abs_error)
    return {"checked": True, "max_abs_error": worst}


def _with_initializers(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The model with the inputs named in `weights` turned back into initializers."""
    if not weights:
        return model
    whole = onnx.ModelProto()
    whole.CopyFrom(model)
    kept = [v for v in whole.graph.input if v.name not in weights]
    del whole.graph.input[:]
    whole.graph.input.extend(kept)
    whole.graph.initializer.extend(numpy_helper.from_array(array, name) for name, array in weights.items())
    return whole


def _whole_multiples(spec: KernelSpec, dim: int) -> dict[str, int]:
    """Symbols an output divides (`M // 100` folds a flat `[M]` back to rows) or a Reshape splits
    (spec.multiples) set to `dim` whole multiples of every divisor they meet: random inputs must
    fold evenly, as the real ones do. A product of two symbols a Reshape splits makes its first
    symbol a multiple (enough for the product)."""
    split = [(product_symbols(key)[0], n) for key, n in spec.multiples]
    folded = [(d.symbol, d.divisor) for t in spec.outputs for d in t.shape if isinstance(d, DerivedDim) and d.divisor > 1]
    divisors: dict[str, int] = {}
    for symbol, n in split + folded:
        divisors[symbol] = math.lcm(divisors.get(symbol, 1), n)
    return {symbol: dim * divisor for symbol, divisor in divisors.items()}


def _jsonable(stats: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()
            if isinstance(v, (int, float, str, bool))}
