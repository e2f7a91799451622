"""Run an onnxfuse model: onnxruntime with the model's kernel library registered.

A fused model names its library in the metadata key `onnxfuse.library`: a bare file name of a
library written beside the model. Only a bare name is accepted, so a model cannot make us load a
library from anywhere else on the machine. The model also records the library's SHA-256
(`onnxfuse.library.sha256`), checked before the library is loaded: a damaged or replaced library
is a one-line error, where loading a truncated one ends the process (SIGBUS in the loader).
"""

from __future__ import annotations

import os
import pathlib

import onnx
import onnxruntime

from .kernel_spec import LIBRARY_DIGEST_METADATA_KEY, LIBRARY_METADATA_KEY, file_sha256

# Session config entries copied from a caller's options. onnxruntime cannot list the entries
# that are set, so these are the documented keys; unknown ones are skipped.
_CONFIG_KEYS = (
    "session.disable_prepacking",
    "session.use_env_allocators",
    "session.load_model_format",
    "session.save_model_format",
    "session.set_denormal_as_zero",
    "session.disable_quant_qdq",
    "session.disable_double_qdq_remover",
    "session.enable_quant_qdq_cleanup",
    "session.disable_aot_function_inlining",
    "session.use_device_allocator_for_initializers",
    "session.inter_op.allow_spinning",
    "session.intra_op.allow_spinning",
    "session.force_spinning_stop",
    "session.intra_op_thread_affinities",
    "session.dynamic_block_base",
    "session.strict_shape_type_inference",
    "session.allow_released_opsets_only",
    "session.disable_cpu_ep_fallback",
    "session.qdqisint8allowed",
    "session.x64quantprecision",
    "session.optimized_model_external_initializers_file_name",
    "session.optimized_model_external_initializers_min_size_in_bytes",
    "optimization.enable_gelu_approximation",
    "optimization.disable_specified_optimizers",
    "mlas.enable_gemm_fastmath_arm64_bfloat16",
)


def quiet_session_options():
    """Session options that keep onnxruntime's log (old-opset warnings; the error lines of a run
    that fails, which reach us anyway as the exception we report) out of our output."""
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    return options


def session_options(library, base: onnxruntime.SessionOptions | None = None) -> onnxruntime.SessionOptions:
    """New SessionOptions with `library` registered, carrying over `base`'s settings.

    `base` is never modified (onnxruntime cannot copy options, so its settable attributes and the
    documented config entries are copied one by one). Not carried over, because onnxruntime does
    not expose them: custom-op libraries already registered on `base`, free dimension overrides,
    added initializers and undocumented config entries.
    """
    options = onnxruntime.SessionOptions()
    if base is not None:
        for name in dir(type(base)):
            attribute = getattr(type(base), name, None)
            if isinstance(attribute, property) and attribute.fset is not None:
                setattr(options, name, getattr(base, name))
        for key in _CONFIG_KEYS:
            try:
                value = base.get_session_config_entry(key)
            except Exception:  # onnxruntime raises a bare Fail/RuntimeError for "not set"
                continue
            options.add_session_config_entry(key, value)
    options.register_custom_ops_library(os.fspath(library))
    return options


def library_of(model_path) -> pathlib.Path | None:
    """The library a fused model names (beside the model), or None for a plain ONNX model."""
    model = onnx.load(os.fspath(model_path), load_external_data=False)
    name = next((p.value for p in model.metadata_props if p.key == LIBRARY_METADATA_KEY), None)
    if name is None:
        return None
    if not _is_bare_file_name(name):
        raise ValueError(
            f"{model_path}: metadata {LIBRARY_METADATA_KEY}={name!r} must be the bare file name of a "
            f"library beside the model (no directories, '..' or absolute paths)"
        )
    library = pathlib.Path(model_path).resolve().parent / name
    if not library.is_file():
        raise FileNotFoundError(f"{model_path}: its kernel library {name!r} is missing (expected {library})")
    digest = next((p.value for p in model.metadata_props if p.key == LIBRARY_DIGEST_METADATA_KEY), None)
    if digest is not None and file_sha256(library) != digest:
        raise ValueError(f"{model_path}: its kernel library {name!r} is not the one it was written with (damaged or "
                         f"replaced: its SHA-256 differs); optimize the model again")
    return library


def _is_bare_file_name(name: str) -> bool:
    return (
        bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and not os.path.isabs(name)
        and os.path.basename(name) == name
    )


class InferenceSession(onnxruntime.InferenceSession):
    """`onnxruntime.InferenceSession` that also registers the model's onnxfuse kernel library.

    Same signature and behaviour; a model without the `onnxfuse.library` key runs as plain
    onnxruntime. A model given as bytes cannot name a library (there is no directory to look in).
    """

    def __init__(self, model_path, sess_options=None, providers=None, **kwargs):
        if isinstance(model_path, (bytes, bytearray)):
            _refuse_library_in_bytes(model_path)
        else:
            library = library_of(model_path)
            if library is not None:
                sess_options = session_options(library, base=sess_options)
        super().__init__(model_path, sess_options, providers, **kwargs)


def _refuse_library_in_bytes(model_bytes) -> None:
    model = onnx.load_from_string(bytes(model_bytes))
    if any(p.key == LIBRARY_METADATA_KEY for p in model.metadata_props):
        raise ValueError(
            f"this model names an onnxfuse kernel library ({LIBRARY_METADATA_KEY}); load it from its "
            f"file so the library beside it can be found"
        )
