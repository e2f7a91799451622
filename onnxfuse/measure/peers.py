"""Other compilers a user could pick instead of onnxfuse, as `bench` contenders: IREE and OpenVINO.

Both come with the optional `bench` extra (pip install 'onnxfuse[bench]'); without it their cells
say so. Each gets the model with every input shape fixed to the run's (both generate better code
for static shapes) and its own fastest call path from Python:

  iree      iree-import-onnx, then iree-compile for llvm-cpu at the host's CPU and features; run on
            the local-sync driver (inline on the calling thread) at 1 thread, or local-task with
            that many workers; inputs uploaded to device buffers once, one VmContext.invoke a call
  openvino  Core.compile_model(model reshaped to the run's shapes, "CPU", INFERENCE_NUM_THREADS,
            f32 precision); one InferRequest whose input tensors share the feeds' memory, whose
            outputs stay in its own tensors: a call is infer()
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from ..errors import OnnxfuseError, short_reason
from .timing import Contender

IREE = "iree"
OPENVINO = "openvino"
PEERS = (IREE, OPENVINO)
_MODULES = {IREE: ("iree.compiler", "iree.runtime"), OPENVINO: ("openvino",)}


class PeerBuildError(OnnxfuseError):
    """A peer could not import or compile the model: the reason goes in its cell."""


def not_installed(peer: str) -> str | None:
    """Why `peer` cannot run here, or None when its packages are importable."""
    missing = [m for m in _MODULES[peer] if importlib.util.find_spec(m.split(".")[0]) is None
               or importlib.util.find_spec(m) is None]
    return f"not installed ({', '.join(missing)}): pip install 'onnxfuse[bench]'" if missing else None


def static_model(model_path, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """The model with every input shape fixed to `shapes`, and each named symbolic dimension they
    fix (an input's 'N') fixed wherever else it appears (outputs, value_info)."""
    model = onnx.load(str(model_path))
    sizes: dict[str, int] = {}
    for value in model.graph.input:
        if value.name not in shapes:
            continue  # an initializer listed as an input
        for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
            if dim.dim_param:
                sizes[dim.dim_param] = size
            dim.dim_value = size  # clears dim_param (a oneof)
    for value in [*model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in sizes:
                dim.dim_value = sizes[dim.dim_param]
    return model


def output_names(model_path) -> list[str]:
    return [o.name for o in onnx.load(str(model_path), load_external_data=False).graph.output]


# -- IREE -----------------------------------------------------------------------------------------

def iree_compile_flags() -> list[str]:
    """llvm-cpu code for this machine's CPU and its features, as `--iree-llvmcpu-target-cpu=host` says."""
    return ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=host", "--iree-opt-level=O3"]


def build_iree(model_path, shapes: dict[str, list[int]], vmfb_path) -> float:
    """Import the model at static `shapes` and compile it to `vmfb_path`; returns the seconds taken.

    Raises PeerBuildError with the importer's or compiler's last words when either refuses."""
    reason = not_installed(IREE)
    if reason:
        raise PeerBuildError(reason)
    from iree.compiler import CompilerToolError, compile_file

    vmfb_path = Path(vmfb_path)
    static_path, mlir_path = vmfb_path.with_suffix(".static.onnx"), vmfb_path.with_suffix(".mlir")
    started = time.perf_counter()
    onnx.save_model(static_model(model_path, shapes), str(static_path))
    imported = subprocess.run([sys.executable, "-m", "iree.compiler.tools.import_onnx", str(static_path),
                               "-o", str(mlir_path)], capture_output=True, text=True)
    if imported.returncode != 0:
        raise PeerBuildError(f"iree-import-onnx failed: {_last_error_line(imported.stderr)}")
    try:
        vmfb_path.write_bytes(compile_file(str(mlir_path), extra_args=iree_compile_flags()))
    except CompilerToolError as exc:
        raise PeerBuildError(f"iree-compile failed: {_last_error_line(str(exc))}") from None
    return time.perf_counter() - started


def _last_error_line(text: str) -> str:
    """The line of a tool's output that says what went wrong: its first 'error:' line (without the
    file:line:col before it, and the op's name instead of its IR with every attribute), else its last."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln]
    if not errors:
        return (lines[-1] if lines else "no message")[:300]
    line = re.sub(r"^\S+:\d+:\d+: ", "", errors[0])
    op = re.search(r'name = "(onnx\.\w+)"', line)
    if op and ": %" in line:
        line = f"{line[:line.index(': %')]}: {op.group(1)}"
    return line[:300]


def iree_contender(vmfb_path, model_path, feeds: dict[str, np.ndarray], threads: int) -> Contender:
    """IREE's runtime on a module from `build_iree`, inputs in device buffers made once."""
    import iree.runtime as rt
    from iree.runtime.array_interop import map_dtype_to_element_type

    if threads == 1:
        device = rt.get_device("local-sync")  # runs each dispatch inline: no thread hand-off
    else:
        rt.flags.parse_flags(f"--task_topology_group_count={threads}")
        device = rt.get_device("local-task")
    instance = rt.VmInstance()
    module = rt.VmModule.copy_buffer(instance, Path(vmfb_path).read_bytes())
    context = rt.VmContext(instance, modules=[rt.create_hal_module(instance, device), module])
    entry = [n for n in module.function_names if n != "__init" and not n.endswith("$async")]
    if len(entry) != 1:
        raise PeerBuildError(f"the IREE module has {len(entry)} entry functions ({entry}), expected one")
    function = module.lookup_function(entry[0])
    args = rt.VmVariantList(len(feeds))
    for array in feeds.values():  # the original's input order, which the imported function keeps
        array = np.ascontiguousarray(array)
        args.push_ref(device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=device,
            buffer=array, element_type=map_dtype_to_element_type(array.dtype)))
    names = output_names(model_path)

    def call():
        results = rt.VmVariantList(len(names))
        context.invoke(function, args, results)
        return results

    def outputs(results) -> dict[str, np.ndarray]:
        return {name: rt.DeviceArray(device, results.get_as_object(i, rt.HalBufferView)).to_host()
                for i, name in enumerate(names)}

    return Contender(IREE, call, outputs)


def iree_build_worker(job: dict) -> dict:
    """The "build_iree" task of a bench worker process: {"seconds"} or {"error": reason}."""
    try:
        return {"seconds": build_iree(job["model"], job["shapes"], job["module"])}
    except Exception as exc:
        return {"error": short_reason(exc)}


# -- OpenVINO -------------------------------------------------------------------------------------

def openvino_contender(model_path, feeds: dict[str, np.ndarray], threads: int) -> Contender:
    """OpenVINO's CPU plugin on the model reshaped to the feeds' shapes, one InferRequest reused."""
    reason = not_installed(OPENVINO)
    if reason:
        raise PeerBuildError(reason)
    import openvino as ov

    core = ov.Core()
    try:
        model = core.read_model(str(model_path))
        model.reshape({name: ov.PartialShape(list(array.shape)) for name, array in feeds.items()})
        compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
                                                     "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"})
    except RuntimeError as exc:  # OpenVINO reports an unsupported op or shape as a RuntimeError
        raise PeerBuildError(f"OpenVINO cannot compile it: {_last_error_line(str(exc))}") from None
    request = compiled.create_infer_request()
    inputs = {name: np.ascontiguousarray(array) for name, array in feeds.items()}  # shared: must outlive the request
    for name, array in inputs.items():
        request.set_tensor(name, ov.Tensor(array, shared_memory=True))
    names = output_names(model_path)
    ports = [_onnx_name(port.get_names(), names, k) for k, port in enumerate(compiled.outputs)]

    def outputs(_) -> dict[str, np.ndarray]:
        return {name: request.get_output_tensor(k).data.copy() for k, name in enumerate(ports)}

    def call():
        return request.infer(share_outputs=True)

    call.shared_inputs = inputs  # the request reads them in place: they live as long as the call
    return Contender(OPENVINO, call, outputs)


def _onnx_name(port_names: set[str], onnx_names: list[str], position: int) -> str:
    """The ONNX output an OpenVINO output port stands for: by name, else by position."""
    shared = [n for n in onnx_names if n in port_names]
    return shared[0] if shared else onnx_names[position]


# -- in a bench worker ------------------------------------------------------------------------------

def peer_contenders(job: dict, key: str, feeds: dict[str, np.ndarray]) -> tuple[list[Contender], dict[str, str]]:
    """The peers `job` names for run `key`: their contenders, and why any could not be made.

    job["peers"] lists them; job["iree_modules"] maps a run's key to its compiled module (a run
    whose build failed has none: bench_model already knows why)."""
    contenders, not_run = [], {}
    for peer in job.get("peers", ()):
        try:
            if peer == IREE and key in job.get("iree_modules", {}):
                contenders.append(iree_contender(job["iree_modules"][key], job["model"], feeds, job["threads"]))
            elif peer == OPENVINO:
                contenders.append(openvino_contender(job["model"], feeds, job["threads"]))
        except PeerBuildError as exc:
            not_run[peer] = str(exc)
        except Exception as exc:
            not_run[peer] = f"failed: {short_reason(exc)}"
    return contenders, not_run
