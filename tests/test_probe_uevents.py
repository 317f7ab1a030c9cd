"""probes/uevents.py: the kernel's uevents, parsed (pure) and heard from the real kernel (a synthetic "change"
written to the loopback interface's uevent file, which needs root)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from probes.uevents import Uevents, parse

LOOPBACK_UEVENT = "/sys/class/net/lo/uevent"


def test_a_kernel_uevent_is_parsed_and_udev_s_resend_is_not():
    kernel = b"change@/devices/LNXSYSTM:00/PNP0C0A:00/power_supply/BAT0\0ACTION=change\0" \
             b"DEVPATH=/devices/LNXSYSTM:00/PNP0C0A:00/power_supply/BAT0\0SUBSYSTEM=power_supply\0" \
             b"POWER_SUPPLY_NAME=BAT0\0POWER_SUPPLY_STATUS=Discharging\0SEQNUM=4242\0"
    keys = parse(kernel)
    assert keys is not None and keys["SUBSYSTEM"] == "power_supply" and keys["POWER_SUPPLY_STATUS"] == "Discharging"
    assert parse(b"libudev\0\xfe\xed\xca\xfe" + bytes(32)) is None


def synthetic_change() -> None:
    if os.geteuid() != 0 or not os.access(LOOPBACK_UEVENT, os.W_OK):
        pytest.skip("a synthetic uevent needs root and a writable /sys")
    with open(LOOPBACK_UEVENT, "w") as f:
        f.write("change")


def test_real_kernel_a_uevent_of_a_followed_subsystem_is_told_at_once_and_others_are_not():
    heard, others = threading.Event(), threading.Event()
    told: list[str | None] = []

    def hear(subsystem: str | None) -> None:
        told.append(subsystem)
        heard.set()

    net, supplies = Uevents(hear, {"net"}), Uevents(lambda _: others.set())  # the second: supplies and thermal
    try:
        if not net.listening:
            pytest.skip("no netlink uevent socket here")
        sent = time.monotonic()
        synthetic_change()
        assert heard.wait(5.0) and time.monotonic() - sent < 1.0
        assert told[0] == "net"  # the subsystem comes with it
        assert not others.wait(0.2)
    finally:
        net.close()
        supplies.close()
    assert net._thread is not None and not net._thread.is_alive()  # close ends its thread
