"""The kernel cache: what it stores comes back whole."""

from __future__ import annotations

import dataclasses

import numpy as np

from onnxfuse.cache import KernelCache
from onnxfuse.kernel_spec import DerivedDim, GroupKernel, KernelSpec, TensorSpec


def test_a_stored_kernel_loads_back_with_every_spec_field(tmp_path):
    """Each field steers the runtime (variants, pool choice, shapes): losing one in the cache's
    metadata would silently change how a cached kernel runs."""
    obj = tmp_path / "k.o"
    obj.write_bytes(b"object")
    spec = KernelSpec("k", (TensorSpec("float32", ("N", 8)),), (TensorSpec("int64", (DerivedDim("N", 8, 2),)),),
                      str(obj), small_batch_below=8, row_work=1234, serial_variant=True)
    weights = {"w": np.arange(6, dtype=np.float32)}
    cache = KernelCache(tmp_path / "cache")
    cache.store("ab" * 16, GroupKernel(spec, ("x", "w"), weights), {"note": 1})

    loaded, info = cache.load("ab" * 16)
    assert dataclasses.replace(loaded.spec, object_file=spec.object_file) == spec
    assert open(loaded.spec.object_file, "rb").read() == b"object"
    assert loaded.arg_sources == ("x", "w") and info == {"note": 1}
    np.testing.assert_array_equal(loaded.extra_weights["w"], weights["w"])
    assert cache.load("cd" * 16) is None
