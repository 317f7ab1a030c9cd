"""monitors/steady.py: the band of states inside which no monitor's answer moves, on states sampled from a laptop
fixture tree (pure: the table is dry-run, nothing changes)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from monitors.speed.present import AT_REST, speed_from_state
from monitors.speed.refresh_policy import RefreshPolicy
from monitors.steady import BAND, band
from monitors.table import Member, MonitorTable

THREADS = 2


@pytest.fixture
def quiet(quiet_laptop):
    return quiet_laptop


def table_with(latency_ms: float, meets: bool = True, device: str = "cpu", memory: int = 0) -> MonitorTable:
    """One monitor of one member, its deadline 100 ms, stored with this answer."""
    table = MonitorTable()
    table.add("m", [Member(latency_ms, device, 100.0, memory_bytes=memory)], meets, 1)
    return table


def made(table: MonitorTable, state, policy: RefreshPolicy | None = None, until: float = 10.0, veto: bool = False):
    speed = speed_from_state(state, THREADS)
    return band(table, state, speed, 7, 0.0, until, until, threads=THREADS, measurement=None, current=False,
                policy=policy, veto=veto)  # a sample every `until` s: the band's own end, `until`, binds


def with_cpu(state, **changes):
    return dataclasses.replace(state, cpu=dataclasses.replace(state.cpu, **changes))


def test_laptop_fixture_tree_a_monitor_far_from_its_edge_leaves_a_band_that_holds_while_nothing_moves(quiet):
    steady = made(table_with(40.0), quiet)
    assert steady is not None and steady.number == 7
    speed = speed_from_state(quiet, THREADS).cpu
    assert steady.cpu == pytest.approx((speed / BAND, speed * BAND), rel=1e-3)
    assert steady.holds(quiet, 1.0)
    assert not steady.holds(quiet, 10.0)  # its time is up: the sample is evaluated whatever it says


def test_laptop_fixture_tree_the_band_ends_where_a_load_or_a_mark_moves(quiet):
    steady = made(table_with(40.0), quiet)
    assert steady is not None
    assert not steady.holds(with_cpu(quiet, others_busy_cores=2.0, load=0.5), 1.0)  # others' load: a change
    hot = dataclasses.replace(quiet, thermal=dataclasses.replace(quiet.thermal, throttling=True, cpu_throttling=True))
    assert not steady.holds(hot, 1.0)
    battery = quiet.battery
    replugged = dataclasses.replace(quiet, battery=dataclasses.replace(battery, plugged=not battery.plugged))
    assert not steady.holds(replugged, 1.0)
    drained = dataclasses.replace(quiet, battery=dataclasses.replace(quiet.battery, percent=12.0))
    assert not steady.holds(drained, 1.0)  # the power policy reads the battery's level
    saver = dataclasses.replace(quiet, power=dataclasses.replace(quiet.power, power_mode="power-saver"))
    assert not steady.holds(saver, 1.0)


def test_laptop_fixture_tree_a_speed_outside_the_band_ends_it_where_no_mark_moves(quiet):
    """Where a move of others' load marks no change (a policy that asks for a large one), what it costs the CPU's
    speed still ends the band."""
    policy = RefreshPolicy(load_delta_cores=10.0)
    policy.observe(quiet, 0.0)
    policy.refreshed(quiet, 0.0, cpu_s=0.0)
    steady = made(table_with(40.0), quiet, policy=policy)
    assert steady is not None
    cores = quiet.cpu.cores
    loaded = with_cpu(quiet, busy_cores=cores, others_busy_cores=cores, runnable_others=2.0 * cores, load=1.0)
    assert speed_from_state(loaded, THREADS).cpu > steady.cpu[1]
    assert not steady.holds(loaded, 1.0)


def test_laptop_fixture_tree_no_band_near_an_edge(quiet):
    """A monitor whose latency a 5 % slower CPU would take past its deadline and margin gets no band; neither does
    one that a 5 % faster CPU would bring back under it."""
    speed = speed_from_state(quiet, THREADS).cpu
    assert made(table_with(108.0 / speed), quiet) is None  # met, 2 % inside its margin of 10 %
    assert made(table_with(91.0 / speed, meets=False), quiet) is None  # about to be met (under 90 % of its deadline)
    assert made(table_with(80.0 / speed), quiet) is not None
    assert made(table_with(120.0 / speed, meets=False), quiet) is not None


def test_laptop_fixture_tree_memory_that_would_fit_again_bounds_the_band(quiet):
    available = quiet.memory.available_bytes
    assert available
    close = table_with(10.0, meets=False, memory=int(available * 1.02))  # does not fit now; 5 % more memory would
    assert made(close, quiet) is None
    assert made(table_with(10.0, meets=False, memory=int(available * 2)), quiet) is not None


def test_laptop_fixture_tree_no_band_for_an_accelerator_a_pending_flip_or_an_app_running_its_monitor(quiet):
    assert made(table_with(40.0, device="gpu"), quiet) is None
    pending = table_with(400.0)  # stored as met, priced far past its deadline: its flip waits (dwell, a hold)
    pending.add("m", [Member(400.0, "cpu", 100.0)], True, 1)
    assert made(pending, quiet) is None
    running = table_with(40.0)
    running.set_classes([AT_REST, AT_REST], {"m": 1})
    assert made(running, quiet) is None


def test_laptop_fixture_tree_the_band_ends_before_the_refresh_is_due(quiet):
    policy = RefreshPolicy(period_s=3.0)
    policy.observe(quiet, 0.0)
    assert made(table_with(40.0), quiet, policy=policy) is None  # none has run yet: one is due now
    policy.refreshed(quiet, 0.0, cpu_s=0.0)
    steady = made(table_with(40.0), quiet, policy=policy)
    assert steady is not None and steady.until == pytest.approx(3.0)


def test_laptop_fixture_tree_a_veto_holds_every_answer_false_inside_its_band(quiet):
    table = table_with(40.0)
    table.evaluate(5.0, speed_from_state(quiet, THREADS), veto=True)
    assert not table.meets("m")
    assert made(table, quiet, veto=True) is not None
    assert made(table, quiet, veto=False) is None  # lifted, it would turn true


def test_laptop_fixture_tree_unknown_memory_stays_unknown_inside_the_band(quiet):
    unknown = dataclasses.replace(quiet, memory=dataclasses.replace(quiet.memory, available_bytes=None))
    steady = made(table_with(40.0), unknown)
    assert steady is not None and steady.available == (math.inf, math.inf)
    assert steady.holds(unknown, 1.0) and not steady.holds(quiet, 1.0)
