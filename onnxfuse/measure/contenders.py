"""The ways to compute a model that `bench` times against each other.

  onnxruntime  the original model, ORT_ENABLE_ALL (the baseline every ratio is taken against)
  onnxfuse     onnxfuse's fused model in onnxruntime
  tvm          TVM's own pipeline on the original model (from_onnx with the batch bound,
               the default Relax pipeline, the VM)
  extras       further ORT models the caller names (e.g. the same forest as a TreeEnsemble)
  floor        onnxruntime calling a model that only copies its first input (BenchOptions.floor):
               a yardstick, not a contender (its outputs are not checked)
  iree         IREE, on request (peers.py, with OpenVINO: the optional `bench` extra)
  openvino     OpenVINO's CPU plugin, on request (peers.py)
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort

from ..session import InferenceSession
from .inputs import model_inputs
from .timing import Contender, bound_io, timing_session_options

BASELINE = "onnxruntime"
FUSED = "onnxfuse"
TVM = "tvm"
FLOOR = "onnxruntime floor"

CALL_STYLES = ("iobinding", "run")
"""How an onnxruntime contender is called: "iobinding" binds the inputs and pre-allocated outputs
once and times run_with_iobinding, as a serving loop does (the model's time, not Python's);
"run" times session.run(None, feeds), which adds numpy conversions worth 5-7 us per call."""


def ort_contender(name: str, model_path, feeds: dict[str, np.ndarray], threads: int,
                  call_style: str = "iobinding", reference_outputs: list[str] | None = None) -> Contender:
    """onnxruntime with all graph optimizations; loads an onnxfuse library if the model names one.

    `feeds` are keyed by the original model's input names, in its order. A model whose inputs are
    named otherwise (the same forest from another converter) takes them by position; so do its
    outputs, renamed to `reference_outputs`, when it shares no output name with the original.
    """
    if call_style not in CALL_STYLES:
        raise ValueError(f"call style must be one of {CALL_STYLES}, got {call_style!r}")
    options = timing_session_options(threads)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.inter_op_num_threads = 1
    session = InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    own_feeds = feeds_by_name_or_position([i.name for i in session.get_inputs()], feeds)
    names = output_names([o.name for o in session.get_outputs()], reference_outputs)
    if call_style == "run":
        return Contender(name, lambda: session.run(None, own_feeds), lambda result: dict(zip(names, result)))
    binding = bound_io(session, own_feeds)
    return Contender(name, lambda: session.run_with_iobinding(binding),
                     lambda _: dict(zip(names, binding.copy_outputs_to_cpu())))


def floor_model(model_path) -> onnx.ModelProto:
    """A model with `model_path`'s inputs whose one node copies the first input to its output:
    what a call into onnxruntime costs before any computation (session run, input binding, one
    kernel dispatch and one output), with the same inputs as the model itself."""
    original = onnx.load(str(model_path), load_external_data=False)
    initializers = {t.name for t in original.graph.initializer}
    inputs = [i for i in original.graph.input if i.name not in initializers]
    output = onnx.helper.make_tensor_value_info("floor", inputs[0].type.tensor_type.elem_type, None)
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", [inputs[0].name], ["floor"])], "floor",
                                   inputs, [output])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)],
                                  ir_version=original.ir_version)


def feeds_by_name_or_position(wanted: list[str], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feeds` for a model with inputs `wanted`: by name when it has them all, else by position."""
    if all(name in feeds for name in wanted):
        return {name: feeds[name] for name in wanted}
    if len(wanted) == len(feeds):
        return dict(zip(wanted, feeds.values()))
    raise ValueError(f"its inputs {wanted} match the original's {list(feeds)} neither by name nor by count")


def output_names(own: list[str], reference: list[str] | None) -> list[str]:
    """Own output names, or the reference's by position when none is shared and the counts agree."""
    if reference and not set(own) & set(reference) and len(own) == len(reference):
        return list(reference)
    return own


def tvm_target():
    import tvm

    return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})


def build_tvm(model_path, shapes: dict[str, list[int]], library_path) -> float:
    """TVM's own pipeline on the original model with every input's shape bound; returns build seconds."""
    import tvm  # imported here: a bench without TVM contenders need not load it
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    specs = model_inputs(model_path)
    started = time.perf_counter()
    model = onnx.load(str(model_path))
    mod = from_onnx(model, shape_dict={s.name: list(shapes[s.name]) for s in specs},
                    dtype_dict={s.name: s.dtype for s in specs})
    target = tvm_target()
    executable = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    seconds = time.perf_counter() - started
    executable.export_library(str(library_path))
    return seconds


def tvm_contender(library_path, model_path, feeds: dict[str, np.ndarray]) -> Contender:
    """TVM's VM on a library from `build_tvm`. Inputs are converted once; a call is `main(*inputs)`
    with outputs left in TVM tensors (copied to numpy only for the check)."""
    import tvm  # imported here: a bench without TVM contenders need not load it
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library_path)), tvm.cpu())
    main = vm["main"]  # fetch once: a lookup per call costs tens of microseconds
    args = [tvm.runtime.tensor(feeds[s.name]) for s in model_inputs(model_path)]
    names = [o.name for o in onnx.load(str(model_path), load_external_data=False).graph.output]

    def outputs(result) -> dict[str, np.ndarray]:
        tensors = [result] if hasattr(result, "numpy") else list(result)
        return {n: t.numpy() for n, t in zip(names, tensors)}

    return Contender(TVM, lambda: main(*args), outputs)
