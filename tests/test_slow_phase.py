"""bench/slow_phase: the split of timed windows into a host's two phases."""

from __future__ import annotations

import pytest

from bench.slow_phase import phase_rows, refresh_views, split_phases
from monitors.speed.present import MEASURED_WEIGHT
from probes.refresh import HANDOFF_KEY, HANDOFF_MB, LOCKSTEP_KEY


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


def test_refresh_views_score_the_handoff_extra_against_the_slowdown_alone() -> None:
    """A slow phase the compute probe hardly sees: 0.1 ms per MB on top; only the handoff view follows it."""

    mbytes = {"bytes": 20.0, "flops": 1.0}
    windows = [{"bytes": 4.0, "flops": 10.0}, {"bytes": 6.0, "flops": 10.1}]
    readings = [{LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: 0.5e-3},
                {LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: 0.5e-3 + HANDOFF_MB * 1e-4}]
    views = refresh_views(windows, mbytes, readings)
    assert views["slowdown + handoff extra"] == pytest.approx([0.0, 0.0, 0.0, 0.0], abs=1e-9)
    assert views["slowdown alone"] == pytest.approx([0.0, 0.0, 4.0 / 6.0 - 1, 10.0 / 10.1 - 1])
    assert views["no correction"] == views["slowdown alone"]
    assert views["the agent (blend + extra)"] == views["slowdown + handoff extra"]  # the probe read 1.0: no blend


def test_refresh_views_blend_a_measured_slowdown_as_the_agent_does() -> None:
    """With no signal predicting it, the agent takes a measured 1.44x slowdown at MEASURED_WEIGHT in log space."""

    windows = [{"m": 10.0}, {"m": 14.4}]
    readings = [{LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: 1e-3}, {LOCKSTEP_KEY: 1.44e-3, HANDOFF_KEY: 1.44e-3}]
    views = refresh_views(windows, {"m": 1.0}, readings)
    assert views["slowdown + handoff extra"] == pytest.approx([0.0, 0.0])
    assert views["the agent (blend + extra)"] == pytest.approx([0.0, 10.0 * 1.44 ** MEASURED_WEIGHT / 14.4 - 1])
    assert views["the agent (blend + extra)"][1] < -0.05  # not the measurement taken whole
