"""A private D-Bus bus (a real dbus-daemon on a socket in the test's folder) and a stand-in power-profiles-daemon
on it, exported with dbus-fast as the real daemon exports its object, for probes/power_profiles.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from dbus_fast.aio import MessageBus
from dbus_fast.service import PropertyAccess, ServiceInterface, dbus_property

PPD = ("org.freedesktop.UPower.PowerProfiles", "/org/freedesktop/UPower/PowerProfiles")


@pytest.fixture
def bus_address(tmp_path: Path) -> Iterator[str]:
    """A dbus-daemon of its own (session rules: anyone may own a name), stopped after the test."""
    daemon = shutil.which("dbus-daemon")
    if daemon is None:
        message = "the D-Bus tests need dbus-daemon (Debian: apt install dbus-daemon)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    proc = subprocess.Popen([daemon, "--session", "--nofork", "--nopidfile", "--print-address=1",
                             f"--address=unix:path={tmp_path / 'bus'}"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(5)


class StandInPpd(ServiceInterface):
    """power-profiles-daemon's interface: its two properties that the agent reads, and a profile switch."""

    def __init__(self, profile: str = "balanced") -> None:
        super().__init__(PPD[0])
        self.profile = profile

    @dbus_property(access=PropertyAccess.READ)
    def ActiveProfile(self) -> s:  # noqa: F821 - D-Bus's signature: dbus-fast reads the annotation's text
        return self.profile

    @dbus_property(access=PropertyAccess.READ)
    def PerformanceDegraded(self) -> s:  # noqa: F821
        return ""

    def switch(self, profile: str) -> None:
        self.profile = profile
        self.emit_properties_changed({"ActiveProfile": profile})


async def start_ppd(address: str, profile: str = "balanced") -> tuple[MessageBus, StandInPpd]:
    """The stand-in on its own connection, under ppd's bus name."""
    bus = await MessageBus(bus_address=address).connect()
    ppd = StandInPpd(profile)
    bus.export(PPD[1], ppd)
    await bus.request_name(PPD[0])
    return bus, ppd
