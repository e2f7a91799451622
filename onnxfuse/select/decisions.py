"""Measured verdicts cached by content: what was timed once on a machine class is not timed again.

`--select measured` times every kernel against onnxruntime, then the whole model. Those timings
take seconds to minutes, and on a shared machine two runs could still land on either side of a
threshold. So each verdict is stored under a key of everything it depends on, and a later run
with the same key reuses it instead of timing again: the output is then the same on every run
on this kind of machine, and the second run costs no timing at all.

The key: the machine class (CPU model and core count), onnxruntime's and onnxfuse's versions,
RULES (bumped when a decision rule changes), the batches and thread counts timed, and the
content timed (a kernel's name, which hashes its canonical group, target and code generator,
with a hash of the group's own model, weights included; or the whole model's bytes with the
kernels kept). Entries are small JSON files under `<kernel cache>/decisions/`; an unreadable one
is a miss.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from pathlib import Path

import onnxruntime

from .. import __version__
from ..atomic import write_text_atomic

RULES = 1  # the decision rules' version (select/measured.py, select/whole_model.py)


@functools.lru_cache(maxsize=1)
def machine_class() -> str:
    """The CPU model and the number of cores: timings transfer between machines that share both."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}|{os.cpu_count()} cores"


def decision_key(what: str, content: bytes, batches, threads) -> str:
    """The key of one verdict on `content` (what: 'group' or 'model'), timed at `batches` x `threads`."""
    h = hashlib.sha256()
    fields = {"what": what, "machine": machine_class(), "onnxruntime": onnxruntime.__version__,
              "onnxfuse": __version__, "rules": RULES, "batches": list(batches), "threads": list(threads)}
    h.update(json.dumps(fields, sort_keys=True).encode())
    h.update(hashlib.sha256(content).digest())
    return h.hexdigest()


class DecisionCache:
    """JSON verdicts by key under `root` (None: nothing is cached)."""

    def __init__(self, root: Path | None):
        self.root = Path(root) / "decisions" if root is not None else None

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}.json"

    def load(self, key: str):
        if self.root is None:
            return None
        try:
            entry = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        return entry.get("value") if isinstance(entry, dict) and entry.get("key") == key else None

    def store(self, key: str, value) -> None:
        """Best effort: an unwritable cache only means timing again next run."""
        if self.root is None:
            return
        try:
            self._path(key).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self._path(key), json.dumps({"key": key, "value": value}))
        except OSError:
            pass
