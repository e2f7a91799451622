"""Run an ONNX model with the aarch64 onnxruntime under qemu-user, on this x86-64 machine.

Pieces (all installed by `make install` → scripts/install-aarch64.sh):
- `aarch64-linux-gnu-gcc` builds our host program `ort_host.c` (it declares the onnxruntime C
  API through onnxfuse/runtime/ort_abi.h + ort_host_abi.h and dlopens libonnxruntime);
- `qemu-aarch64 -cpu neoverse-n1 -L SYSROOT` runs it. The CPU is named: qemu's default, `max`,
  has SVE, on which onnxruntime takes its SVE kernels (another exp, other sums), where the
  Neoverse-N1 and Cortex-A7x servers and phones this stands for have NEON only. SYSROOT is a
  small overlay made here: `lib` links to the
  Debian cross sysroot (/usr/aarch64-linux-gnu/lib) and `proc/cpuinfo` is an aarch64-looking
  file. qemu-user 7.2 maps absolute paths into the -L prefix when the file exists there, so the
  guest reads our cpuinfo instead of the host's x86 one, on which libonnxruntime (arm64) crashes.
  No system file is touched.
- libonnxruntime.so.1 for arm64 from npm's onnxruntime-node tarball, in .cache/aarch64/.

Tensors travel through files in the "raw tensor" format of ort_host.c:
  b"OFT1", int32 onnx element type, int32 rank, int64 dims[rank], data (C order, little-endian).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
from onnx import helper

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUNTIME_DIR = REPO / "onnxfuse" / "runtime"
HOST_SOURCE = HERE / "ort_host.c"
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
CPU = "neoverse-n1"  # the CPU CPUINFO_CORE describes
CROSS_SYSROOT = Path("/usr/aarch64-linux-gnu")
CACHE = REPO / ".cache" / "aarch64"
MAGIC = b"OFT1"

# What an arm64 Linux machine (a 2-core Neoverse-N1) shows in /proc/cpuinfo.
CPUINFO_CORE = """processor\t: {index}
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

"""


def onnxruntime_library() -> Path | None:
    """The arm64 libonnxruntime.so.1 (env ONNXFUSE_AARCH64_ORT overrides), or None."""
    if os.environ.get("ONNXFUSE_AARCH64_ORT"):
        path = Path(os.environ["ONNXFUSE_AARCH64_ORT"])
        return path if path.is_file() else None
    found = sorted(CACHE.glob("onnxruntime-node-*/libonnxruntime.so.1"))
    return found[-1] if found else None


def missing_pieces() -> list[str]:
    """What this machine lacks to run the harness (empty = ready)."""
    missing = []
    if shutil.which(CROSS_CC) is None:
        missing.append(f"{CROSS_CC} (apt gcc-aarch64-linux-gnu)")
    if shutil.which(QEMU) is None:
        missing.append(f"{QEMU} (apt qemu-user)")
    if not (CROSS_SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        missing.append(f"{CROSS_SYSROOT} (apt libc6-arm64-cross)")
    if onnxruntime_library() is None:
        where = os.environ.get("ONNXFUSE_AARCH64_ORT") or f"{CACHE}/onnxruntime-node-*/"
        missing.append(f"arm64 libonnxruntime.so.1 at {where} (scripts/install-aarch64.sh)")
    for tool, package in (("file", "file"), ("readelf", "binutils")):  # the library checks
        if shutil.which(tool) is None:
            missing.append(f"{tool} (apt {package})")
    return missing


def make_sysroot(directory: Path) -> Path:
    """A qemu -L prefix: the cross libc/libstdc++ through a symlink, plus an arm64 /proc/cpuinfo."""
    root = Path(directory)
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "cpuinfo").write_text("".join(CPUINFO_CORE.format(index=i) for i in range(2)))
    link = root / "lib"
    if not link.is_symlink():
        link.symlink_to(CROSS_SYSROOT / "lib", target_is_directory=True)
    return root


def build_host(out: Path) -> Path:
    """Cross-compile ort_host.c for aarch64."""
    subprocess.run(
        [CROSS_CC, "-std=gnu11", "-O2", "-Wall", "-Werror", f"-I{RUNTIME_DIR}", f"-I{HERE}",
         str(HOST_SOURCE), "-o", str(out), "-ldl"],
        check=True, capture_output=True, text=True,
    )
    return out


def write_tensor(path: Path, array: np.ndarray) -> None:
    array = np.ascontiguousarray(array)
    code = helper.np_dtype_to_tensor_dtype(array.dtype)
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<ii", code, array.ndim) + struct.pack(f"<{array.ndim}q", *array.shape))
        f.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())


def read_tensor(path: Path) -> np.ndarray:
    data = Path(path).read_bytes()
    if data[:4] != MAGIC:
        raise ValueError(f"{path}: not a raw tensor file")
    code, rank = struct.unpack_from("<ii", data, 4)
    dims = struct.unpack_from(f"<{rank}q", data, 12)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(code)).newbyteorder("<")
    return np.frombuffer(data, dtype=dtype, offset=12 + 8 * rank).reshape(dims).astype(dtype.newbyteorder("="))


class Aarch64Runner:
    """Runs models with the aarch64 onnxruntime under qemu; builds the host and sysroot in `workdir`."""

    def __init__(self, workdir: Path, threads: int = 1, timeout: float = 300):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ort = onnxruntime_library()
        self.host = build_host(self.workdir / "ort_host")
        self.sysroot = make_sysroot(self.workdir / "sysroot")
        self.threads = threads
        self.timeout = timeout
        self._runs = 0

    def run(self, model: Path, feeds: dict[str, np.ndarray], output_names: list[str],
            library: Path | None = None) -> list[np.ndarray]:
        self._runs += 1
        io_dir = self.workdir / f"run{self._runs}"
        io_dir.mkdir()
        command = [QEMU, "-cpu", CPU, "-L", str(self.sysroot), str(self.host), str(self.ort), str(Path(model).resolve()),
                   "--threads", str(self.threads)]
        if library is not None:
            command += ["--library", str(Path(library).resolve())]
        for i, (name, array) in enumerate(feeds.items()):
            write_tensor(io_dir / f"in{i}.bin", array)
            command += ["--input", f"{name}={io_dir / f'in{i}.bin'}"]
        for i, name in enumerate(output_names):
            command += ["--output", f"{name}={io_dir / f'out{i}.bin'}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=self.timeout)
        if result.returncode != 0:
            raise RuntimeError(f"ort_host under qemu failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
        return [read_tensor(io_dir / f"out{i}.bin") for i in range(len(output_names))]
