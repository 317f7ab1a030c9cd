"""bench/slow_phase: the split of timed windows into a host's two phases."""

from __future__ import annotations

import pytest

from bench.slow_phase import phase_rows, split_phases


def test_split_recovers_a_constant_extra_per_megabyte_where_the_ratio_differs() -> None:
    # Two models: 1 ms writing 10 MB and 10 ms writing 1 MB; the slow phase adds 0.1 ms per MB.
    fast = [{"small": 1.0, "large": 10.0}, {"small": 1.05, "large": 10.2}]
    slow = [{"small": 2.0, "large": 10.2}, {"small": 2.0, "large": 10.2}]
    between = [{"small": 1.25, "large": 12.5}]
    assert split_phases(fast + between + slow) == (fast, slow)
    rows = {r.model: r for r in phase_rows(fast + slow + between, {"small": 10.0, "large": 1.0})}
    assert rows["small"].extra_ms_per_mb == pytest.approx(0.0975, rel=1e-3)
    assert rows["large"].extra_ms_per_mb == pytest.approx(0.1, rel=1e-3)
    assert rows["small"].slow_ms / rows["small"].fast_ms > 1.9  # while the ratios differ
    assert rows["large"].slow_ms / rows["large"].fast_ms < 1.02


def test_one_phase_only_gives_no_rows() -> None:
    assert phase_rows([{"m": 1.0}, {"m": 1.1}], {"m": 5.0}) == []
    assert split_phases([]) == ([], [])
