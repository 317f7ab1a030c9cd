"""probes/power_profiles.py: power-profiles-daemon followed over a real dbus-daemon (a private bus in the test's
folder, tests/dbus_bus.py) with a stand-in daemon on it; polled where the bus cannot be reached."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from dbus_bus import start_ppd

from agent.simulation.trees import laptop
from probes.power_profiles import PowerProfiles, PpdAnswer, PpdWatcher
from probes.state import Sampler


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.01)


async def test_private_bus_a_profile_switch_is_followed_and_told_at_once(bus_address: str):
    bus, ppd = await start_ppd(bus_address, "balanced")
    told = threading.Event()
    profiles = PowerProfiles(told.set, address=bus_address, poll=PpdWatcher(query=lambda: PpdAnswer("polled", "")))
    try:
        await until(lambda: profiles.following)
        assert profiles.current() == PpdAnswer("balanced", "")
        assert not told.is_set()  # the first read is not a change
        switched = time.monotonic()
        ppd.switch("power-saver")
        await until(told.is_set)
        assert time.monotonic() - switched < 1.0  # a signal, not the next poll (30 s)
        assert profiles.current() == PpdAnswer("power-saver", "")
    finally:
        profiles.close()
        bus.disconnect()


async def test_private_bus_a_daemon_that_starts_or_leaves_later_is_read_then(bus_address: str):
    told = threading.Event()
    profiles = PowerProfiles(told.set, address=bus_address)
    try:
        await until(lambda: profiles.following)
        assert profiles.current() is None  # no daemon yet: nothing to say, and no error
        bus, _ = await start_ppd(bus_address, "performance")
        await until(told.is_set)
        assert profiles.current() == PpdAnswer("performance", "")
        told.clear()
        bus.disconnect()  # the daemon leaves: its name has no owner
        await until(told.is_set)
        assert profiles.current() is None
    finally:
        profiles.close()


async def test_private_bus_a_close_at_once_ends_the_watching_thread(bus_address: str):
    profiles = PowerProfiles(address=bus_address)
    started = time.monotonic()
    profiles.close()  # before it has connected
    assert profiles._thread is not None and not profiles._thread.is_alive()
    assert time.monotonic() - started < 1.5


async def test_no_bus_at_the_address_the_daemon_is_polled_instead(tmp_path: Path):
    profiles = PowerProfiles(address=f"unix:path={tmp_path / 'none'}", interval_s=30.0,
                             poll=PpdWatcher(query=lambda: PpdAnswer("polled", "")))
    try:
        assert await asyncio.to_thread(profiles.wait, 5.0) == PpdAnswer("polled", "")
        assert not profiles.following
    finally:
        profiles.close()


async def test_laptop_fixture_tree_on_a_private_bus_the_sampler_is_woken_and_reads_the_new_profile(
        tmp_path: Path, bus_address: str, monkeypatch):
    """The fixture laptop has no platform profile: the power mode is ppd's."""
    tree = laptop(tmp_path)
    (tree.sys / "firmware/acpi/platform_profile").unlink(missing_ok=True)
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", bus_address)
    bus, ppd = await start_ppd(bus_address, "balanced")
    sampler = Sampler(tree.sys, tree.proc, ppd=True)
    try:
        assert sampler.ppd is not None
        await until(lambda: sampler.ppd is not None and sampler.ppd.following)
        assert sampler.sample().power_mode == "balanced"
        ppd.switch("power-saver")
        assert await asyncio.to_thread(sampler.changed.wait, 5.0)
        assert sampler.sample().power_mode == "power-saver"
    finally:
        sampler.close()
        bus.disconnect()
