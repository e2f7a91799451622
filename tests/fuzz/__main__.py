"""`python -m fuzz` (from tests/): a time-bounded campaign; exit 1 on any finding that is not a known bug.

Environment: FUZZ_SECONDS (default 1500), FUZZ_SEED (default 0), FUZZ_BATCH (components per
onnxfuse call, default 16), FUZZ_JOBS (compile jobs, default 2), FUZZ_OUT (default out/fuzz),
FUZZ_EXCLUDE_KNOWN=1 (generate none of the known-bug patterns), FUZZ_MINIMISE (new failures to
minimise at the end, default 3), FUZZ_DTYPES (the generator's dtype draw, comma-separated, a
repeated name drawn more often, e.g. `float16,float16,float32`; default graphs.GeneratorConfig's).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .campaign import run_campaign
from .graphs import GeneratorConfig
from .known_bugs import all_exclusions
from .minimise import minimise_failure


def main() -> int:
    seconds = float(os.environ.get("FUZZ_SECONDS", 1500))
    seed = int(os.environ.get("FUZZ_SEED", 0))
    size = int(os.environ.get("FUZZ_BATCH", 16))
    jobs = int(os.environ.get("FUZZ_JOBS", 2))
    out = Path(os.environ.get("FUZZ_OUT", "out/fuzz")).resolve()
    exclude = all_exclusions() if os.environ.get("FUZZ_EXCLUDE_KNOWN") == "1" else frozenset()
    dtypes = tuple(os.environ["FUZZ_DTYPES"].split(",")) if os.environ.get("FUZZ_DTYPES") else GeneratorConfig.dtypes
    config = GeneratorConfig(dtypes=dtypes, exclude=exclude)
    print(f"fuzz: {seconds:.0f}s, seed {seed}, {size} components per batch, output in {out}", flush=True)
    tally = run_campaign(seconds, seed, size, config, out, jobs, log=lambda s: print(s, flush=True))
    by_count = sorted(tally.fused_ops.items(), key=lambda kv: -kv[1])
    print("fuzz: ops in compiled groups: " + ", ".join(f"{op} {n}" for op, n in by_count))
    print("fuzz: graphs per ISA level: " + ", ".join(f"{level} {n}" for level, n in tally.levels.items()))
    for reason, count in sorted(tally.fallback_reasons.items(), key=lambda kv: -kv[1]):
        print(f"fuzz: {count} groups fell back: {reason}")
    for bug, count in sorted(tally.known.items()):
        print(f"fuzz: known bug {bug}: {count} components")
    signatures = set()  # one minimised case per look-alike group of new failures
    for failure in tally.new:
        signature = failure.signature
        if not failure.feeds or signature in signatures or len(signatures) >= int(os.environ.get("FUZZ_MINIMISE", 3)):
            continue
        signatures.add(signature)
        i = len(signatures) - 1
        small = minimise_failure(failure, out / f"new{i}")
        print(f"fuzz: NEW {failure.findings[0].kind} ({failure.findings[0].detail[:160]}) minimised to "
              f"{len(small.model.graph.node)} nodes: {out / f'new{i}'}", flush=True)
    print(tally.line(), flush=True)
    return 1 if tally.new else 0


if __name__ == "__main__":
    sys.exit(main())
