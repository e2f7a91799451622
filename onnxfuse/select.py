"""`--select measured`: keep a group's kernel only where it is not slower than onnxruntime.

For each compiled group we time, inside onnxruntime and in alternating rounds, a model holding
just the custom node against the group's original nodes (with onnxruntime's own graph
optimizations on). The kernel is kept only if it is at least as fast at every measured batch
size, which makes "never slower than onnxruntime" true group by group, by construction.

Each measurement also counts the bytes the kernel moves (its inputs, the weights it reads and its
outputs), so its time can be read as achieved memory bandwidth: a kernel far below the machine's
copy bandwidth is compute- or latency-bound, one near it has little left to gain.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from .fusion.plan import FusedGroup
from .kernel_spec import DOMAIN, DOMAIN_VERSION
from .package import GroupKernel, custom_op_node

ROUNDS = 15
ROUND_SECONDS = 0.004  # each contender runs about this long per round
CLEARLY_SLOWER = 3.0


@dataclass(frozen=True)
class Measurement:
    batch: int  # the value given to every symbolic dimension
    threads: int  # onnxruntime intra-op threads
    kernel_us: float
    onnxruntime_us: float
    bytes_moved: int = 0  # the kernel's inputs, weights and outputs at this batch

    @property
    def gain_us(self) -> float:
        return self.onnxruntime_us - self.kernel_us

    @property
    def kernel_gbs(self) -> float:
        """Achieved bandwidth: bytes moved per second of kernel time, in GB/s."""
        return self.bytes_moved / self.kernel_us / 1e3 if self.kernel_us > 0 else 0.0

    def to_json(self, copy_gbs: float | None = None) -> dict:
        out = {"batch": self.batch, "threads": self.threads, "kernel_us": round(self.kernel_us, 2),
               "onnxruntime_us": round(self.onnxruntime_us, 2), "bytes": self.bytes_moved,
               "kernel_gbs": round(self.kernel_gbs, 3)}
        if copy_gbs:
            out["copy_bandwidth_pct"] = round(100 * self.kernel_gbs / copy_gbs, 1)
        return out


def kernel_model(group: FusedGroup, kernel: GroupKernel, group_model: onnx.ModelProto) -> onnx.ModelProto:
    """The group's own model with its nodes replaced by the one custom node."""
    node, extra = custom_op_node(group, kernel)
    used = set(node.input)
    g = group_model.graph
    inits = [t for t in g.initializer if t.name in used] + extra
    graph = helper.make_graph([node], f"{group.name}_kernel", list(g.input), list(g.output), inits)
    opsets = list(group_model.opset_import) + [helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=group_model.ir_version)


def measure_group(
    group: FusedGroup,
    kernel: GroupKernel,
    group_model: onnx.ModelProto,
    library: Path,
    batches: tuple[int, ...] = (1, 64),
    threads: tuple[int, ...] = (1,),
) -> list[Measurement]:
    """Kernel vs onnxruntime on the group at every batch size (symbolic dims) and thread count."""
    from .bench import bound_call, has_symbolic_inputs, timing_session
    from .feeds import random_feeds_for_session

    kernel_proto = kernel_model(group, kernel, group_model)
    kernel_bytes = kernel_proto.SerializeToString()
    reference_bytes = group_model.SerializeToString()
    results = []
    for n_threads in threads:
        fused = timing_session(kernel_bytes, n_threads, library)
        original = timing_session(reference_bytes, n_threads)
        for batch in (batches if has_symbolic_inputs(original) else batches[:1]):
            feeds = random_feeds_for_session(original, default_dim=batch, seed=batch)
            moved = bytes_moved(kernel_proto, feeds, original.run(None, feeds))
            calls = [bound_call(fused, feeds), bound_call(original, feeds)]  # bench's call style
            once = [best_of_three(call) for call in calls]
            # Over CLEARLY_SLOWER times slower needs no careful rounds (a 50x slower convolution
            # would otherwise cost seconds per group to measure).
            clear = once[0] > CLEARLY_SLOWER * once[1]
            kernel_s, ort_s = once if clear else alternate_medians(calls, once)
            results.append(Measurement(batch, n_threads, kernel_s * 1e6, ort_s * 1e6, moved))
    return results


def bytes_moved(model: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs) -> int:
    """Bytes a model's single kernel reads and writes once: its inputs, its initializers, its outputs.

    A lower bound on its memory traffic (intermediates kept in caches are free), which is what
    makes bytes / time comparable with the machine's copy bandwidth.
    """
    weights = sum(int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
                  for t in model.graph.initializer)
    return weights + sum(np.asarray(a).nbytes for a in feeds.values()) + sum(np.asarray(a).nbytes for a in outputs)


def alternate_medians(contenders, once: list[float], rounds: int = ROUNDS,
                      round_seconds: float = ROUND_SECONDS) -> list[float]:
    """Median seconds per call of each contender, timed in alternating rounds (bench's timer);
    `once` is one call's seconds per contender, to size the rounds."""
    from .bench import alternating_rounds, calls_per_round

    reps = [calls_per_round(o, round_seconds) for o in once]
    return [statistics.median(s) for s in alternating_rounds(contenders, reps, rounds)]


def best_of_three(run) -> float:
    """Seconds of the fastest of three calls, after a warm-up call."""
    run()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def kernel_is_faster(measurements: list[Measurement]) -> bool:
    return all(m.kernel_us <= m.onnxruntime_us for m in measurements)
