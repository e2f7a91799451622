"""The runtime's per-thread workspace cache (runtime/onnxfuse_runtime.c), driven from a small C
program that includes the glue with posix_memalign counted: blocks of sizes no kernel asks for
again must not keep a later kernel's per-tile blocks out of the cache."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from onnxfuse.runtime.library import KERNEL_TABLE, RUNTIME_DIR, kernel_table_source, table_levels, tvm_include_dirs
from onnxfuse.target import default_cc, resolve_target

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
static int allocations;
static int counted_memalign(void **block, size_t alignment, size_t size) {
    allocations++;
    return posix_memalign(block, alignment, size);
}
#define posix_memalign counted_memalign
#include "onnxfuse_runtime.c"
#undef posix_memalign

int main(void) {
    /* Eight kernels each leave a block of a size nobody asks for again: the slots fill up. */
    void *stale[8];
    for (int i = 0; i < 8; i++) stale[i] = alloc_workspace(1, 0, 100 + 1000 * (i + 1) * (i + 1), 2, 32);
    for (int i = 0; i < 8; i++) free_workspace(1, 0, stale[i]);
    /* Then a kernel allocates and frees two blocks per row tile, 1,000 tiles. */
    int before = allocations;
    for (int tile = 0; tile < 1000; tile++) {
        void *rows = alloc_workspace(1, 0, 1 << 20, 2, 32), *small = alloc_workspace(1, 0, 1024, 2, 32);
        if (!rows || !small || ((size_t)rows % 64) || ((size_t)small % 64)) return 2;
        ((char *)rows)[(1 << 20) - 1] = 1, ((char *)small)[1023] = 1;
        free_workspace(1, 0, small), free_workspace(1, 0, rows);
    }
    printf("%d\n", allocations - before);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which(default_cc().split()[0]) is None, reason="needs a C compiler")
def test_per_tile_blocks_are_reused_when_stale_blocks_fill_the_cache(tmp_path):
    target = resolve_target("native")
    (tmp_path / KERNEL_TABLE).write_text(kernel_table_source([], table_levels([], target), target.arch))
    (tmp_path / "driver.c").write_text(DRIVER)
    program = tmp_path / "driver"
    subprocess.run([*default_cc().split(), "-std=gnu11", "-O1", "-pthread", f"-I{tmp_path}", f"-I{RUNTIME_DIR}",
                    *(f"-I{path}" for path in tvm_include_dirs()), str(tmp_path / "driver.c"), "-o", str(program)],
                   check=True, capture_output=True, text=True)
    done = subprocess.run([str(program)], capture_output=True, text=True, check=True)
    # The first tile allocates its two blocks; every later tile takes them from the cache
    # (before the fix: 1,000, the 1 MB block went back to glibc on every tile).
    assert int(done.stdout) == 2
