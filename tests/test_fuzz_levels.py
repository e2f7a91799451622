"""fuzz/levels.py: each batch builds one ISA level this CPU runs, the levels taking turns."""

from __future__ import annotations

import platform

from fuzz.levels import X86_LEVEL_FLAGS, _cpu_flags, host_levels, level_for_batch

from onnxfuse.target import PORTABLE_LEVELS, host_triple, resolve_target


def test_levels_take_turns_best_first():
    levels = host_levels()
    assert [level_for_batch(b, levels)[0] for b in range(2 * len(levels))] == [name for name, _ in levels] * 2


def test_each_level_is_a_portable_level_this_cpu_has_built_alone():
    portable = [name for name, _, _ in PORTABLE_LEVELS[host_triple(platform.machine())]]
    levels = host_levels()
    assert levels and levels[-1][0] == portable[-1]  # the baseline always runs
    for name, options in levels:
        assert name in portable
        mcpu = options[options.index("--mcpu") + 1]
        mattr = options[options.index("--mattr") + 1] if "--mattr" in options else None
        target = resolve_target("portable", mcpu=mcpu, mattr=mattr)
        assert len(target.levels) == 1 and target.levels[0].mcpu == mcpu
        if platform.machine() == "x86_64":
            assert X86_LEVEL_FLAGS[name] <= _cpu_flags()
