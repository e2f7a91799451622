"""The kernel cache: what it stores comes back whole, and what comes back damaged is never used.

The end-to-end tests damage a real cached kernel the ways a disk, a crash or a stray write do,
optimize again, and run the output against onnxruntime on the original model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import MODELS, assert_outputs_match, run_both

from onnxfuse import optimize
from onnxfuse.cache import META, OBJECT, WEIGHTS, KernelCache
from onnxfuse.kernel_spec import DerivedDim, GroupKernel, KernelSpec, TensorSpec

MODEL = MODELS / "diamond.onnx"  # one small group: compiles in about 2 s
WARNING = re.compile(r"^onnxfuse: cache entry ([0-9a-f]{64}) is damaged \((.+)\); rebuilding$")


# ---- Store and load -------------------------------------------------------------------------------
def stored_kernel(tmp_path, weights=None) -> tuple[KernelCache, str, GroupKernel]:
    obj = tmp_path / "k.o"
    obj.write_bytes(b"object")
    spec = KernelSpec("k", (TensorSpec("float32", ("N", 8)),), (TensorSpec("int64", (DerivedDim("N", 8, 2),)),),
                      str(obj), small_batch_below=4, row_work=1234, serial_variant=True,
                      levels=("x86_64_v4", "x86_64_v3"), level_small_batch_below=(4, 6))
    kernel = GroupKernel(spec, ("x", "w"), weights or {})
    cache = KernelCache(tmp_path / "cache")
    key = "ab" * 32
    cache.store(key, kernel, {"note": 1})
    return cache, key, kernel


def test_a_stored_kernel_loads_back_with_every_spec_field(tmp_path):
    """Each field steers the runtime (variants, pool choice, shapes): losing one in the cache's
    metadata would silently change how a cached kernel runs."""
    weights = {"w": np.arange(6, dtype=np.float32)}
    cache, key, kernel = stored_kernel(tmp_path, weights)

    loaded, info = cache.load(key)
    assert dataclasses.replace(loaded.spec, object_file=kernel.spec.object_file) == kernel.spec
    assert open(loaded.spec.object_file, "rb").read() == b"object"
    assert loaded.arg_sources == ("x", "w") and info == {"note": 1}
    np.testing.assert_array_equal(loaded.extra_weights["w"], weights["w"])
    assert cache.load("cd" * 32) is None


def test_entries_are_private_whatever_the_umask(tmp_path):
    """Kernels are code that gets linked and shipped: other users must not be able to swap one."""
    for umask in (0o000, 0o022, 0o277):
        directory = tmp_path / f"umask{umask:o}"
        directory.mkdir()
        previous = os.umask(umask)
        try:
            cache, key, _ = stored_kernel(directory, {"w": np.zeros(2, np.float32)})
        finally:
            os.umask(previous)
        paths = [cache.root, *cache.root.rglob("*")]
        modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in paths}
        assert {OBJECT, WEIGHTS, META} == {p.name for p in paths if p.is_file()}
        assert all(mode == (0o700 if (tmp_path / p).is_dir() else 0o600) for p, mode in modes.items()), modes
        assert cache.load(key) is not None


def test_damaged_weights_are_a_miss_reported_once(tmp_path, capfd):
    cache, key, _ = stored_kernel(tmp_path, {"w": np.arange(64, dtype=np.float32)})
    weights = cache.root / key[:2] / key / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-40] ^= 0xFF
    weights.write_bytes(bytes(data))

    assert cache.load(key) is None
    assert damage_warnings(capfd) == [(key, f"{WEIGHTS} does not match its checksum")]
    assert not (cache.root / key[:2] / key).exists(), "the damaged entry is removed"
    assert cache.load(key) is None and damage_warnings(capfd) == [], "then it is a plain miss"


def test_an_entry_from_the_unchecked_format_is_rebuilt(tmp_path, capfd):
    """Entries written before checksums (format 1) carry nothing to check them by."""
    cache, key, kernel = stored_kernel(tmp_path)
    meta_path = cache.root / key[:2] / key / META
    meta = json.loads(meta_path.read_text())
    for added in ("format", "files", "key", "sha256"):
        del meta[added]
    meta_path.write_text(json.dumps(meta))

    assert cache.load(key) is None
    assert damage_warnings(capfd) == [(key, "cache format 1, this onnxfuse reads 2")]
    cache.store(key, kernel, {"note": 2})
    assert cache.load(key)[1] == {"note": 2} and damage_warnings(capfd) == []


def test_an_entry_filed_under_another_key_is_foreign(tmp_path, capfd):
    cache, key, _ = stored_kernel(tmp_path)
    other = "cd" * 32
    (cache.root / other[:2]).mkdir(mode=0o700)
    shutil.copytree(cache.root / key[:2] / key, cache.root / other[:2] / other)
    assert cache.load(other) is None
    assert damage_warnings(capfd) == [(other, f"it holds the entry for key {key!r}")]
    assert cache.load(key) is not None


# ---- Damage, end to end -------------------------------------------------------------------------
def truncate_object(entry: Path) -> str:
    obj = entry / OBJECT
    size = obj.stat().st_size
    obj.write_bytes(obj.read_bytes()[: size // 2])
    return f"{OBJECT} has {size // 2} bytes, expected {size}"


def overwrite_code(entry: Path) -> str:
    """The kernel's machine code becomes int3 (0xCC): linked, it would die of SIGTRAP when run."""
    obj = entry / OBJECT
    data = bytearray(obj.read_bytes())
    offset, size = elf_section(bytes(data), ".text")
    assert size > 0
    data[offset: offset + size] = b"\xcc" * size
    obj.write_bytes(bytes(data))
    return f"{OBJECT} does not match its checksum"


def garble_meta(entry: Path) -> str:
    meta = entry / META
    raw = meta.read_bytes()
    meta.write_bytes(raw[: len(raw) // 2] + b"\0\0\0" + raw[len(raw) // 2 + 3:])
    return f"{META} is not JSON ({len(raw)} bytes)"


def edit_meta(entry: Path) -> str:
    """Still valid JSON, but a shape the kernel was not compiled for."""
    meta = entry / META
    content = json.loads(meta.read_text())
    content["inputs"][0]["shape"][-1] += 1
    meta.write_text(json.dumps(content, indent=1))
    return f"{META} does not match its checksum"


def elf_section(obj: bytes, wanted: str) -> tuple[int, int]:
    """(file offset, size) of section `wanted` in a little-endian ELF64 object."""
    assert obj[:5] == b"\x7fELF\x02"
    (section_headers,) = struct.unpack_from("<Q", obj, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", obj, 0x3A)

    def header(i):  # sh_name, sh_offset, sh_size
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", obj, section_headers + i * entry_size)
        return name, offset, size

    names_offset = header(names_index)[1]
    for i in range(count):
        name, offset, size = header(i)
        if obj[names_offset + name: obj.index(b"\0", names_offset + name)].decode() == wanted:
            return offset, size
    raise AssertionError(f"no section {wanted}")


def damage_warnings(capfd) -> list[tuple[str, str]]:
    """(key, why) of each damage warning on stderr since the last call; any other stderr line
    about the cache fails the test."""
    lines = [line for line in capfd.readouterr().err.splitlines() if "cache entry" in line]
    matches = [WARNING.match(line) for line in lines]
    assert all(matches), lines
    return [m.groups() for m in matches]


@pytest.fixture(scope="module")
def pristine_cache(tmp_path_factory):
    """A cache holding MODEL's kernel, compiled once for all the damage tests."""
    root = tmp_path_factory.mktemp("pristine") / "cache"
    result = optimize(MODEL, root.parent / "out" / "m.fused.onnx", cache_dir=root, jobs=1, select="all")
    assert result.report["groups_compiled"] == result.report["groups_total"] == 1
    return root


def run_against_original(fused: Path, batch: int) -> None:
    rng = np.random.default_rng(batch)
    feeds = {}
    for value in onnx.load(str(MODEL)).graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    assert_outputs_match(*run_both(MODEL, fused, feeds))


@pytest.mark.parametrize("damage", [truncate_object, overwrite_code, garble_meta, edit_meta])
def test_a_damaged_entry_is_rebuilt_and_the_output_runs(damage, pristine_cache, tmp_path, capfd):
    cache = tmp_path / "cache"
    shutil.copytree(pristine_cache, cache)
    (entry,) = [p for p in cache.glob("*/*") if p.is_dir()]
    why = damage(entry)
    capfd.readouterr()

    result = optimize(MODEL, tmp_path / "out" / "m.fused.onnx", cache_dir=cache, jobs=1, select="all")
    assert damage_warnings(capfd) == [(entry.name, why)]
    assert (result.report["groups_compiled"], result.report["groups_cached"]) == (1, 0)
    for batch in (1, 7, 300):
        run_against_original(result.model_path, batch)

    again = optimize(MODEL, tmp_path / "again" / "m.fused.onnx", cache_dir=cache, jobs=1, select="all")
    assert (again.report["groups_compiled"], again.report["groups_cached"]) == (0, 1)
    assert damage_warnings(capfd) == [], "the rebuilt entry checks out"
    assert not [p for p in cache.rglob("*") if p.name.startswith(".")], "no staging or discarded entries left"
