"""bench/slow_phase: the bytes each kernel writes, and the split of timed windows into a host's two phases."""

from __future__ import annotations

import pytest

from bench.slow_phase import phase_rows, split_phases, written_bytes
from monitors.kernels import Kernel


def test_written_bytes_is_each_family_s_output_in_float32() -> None:
    assert written_bytes(Kernel("conv", (3136, 288, 64), 0)) == 3136 * 64 * 4
    assert written_bytes(Kernel("conv1x1", (100, 32, 16), 0, repeat=4)) == 100 * 16 * 4 * 4  # per group x groups
    assert written_bytes(Kernel("gemm", (32, 1024, 1000), 0)) == 32 * 1000 * 4
    assert written_bytes(Kernel("dwconv", (96, 12544, 9), 0)) == 96 * 12544 * 4
    assert written_bytes(Kernel("bmm", (4, 128, 64, 128), 0)) == 4 * 128 * 128 * 4
    assert written_bytes(Kernel("eltwise", (3e6,), 3e6)) == 1.5e6
    assert written_bytes(Kernel("view", (1e6,), 1e6)) == 0.0


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
