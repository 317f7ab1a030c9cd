"""KernelFiles: fallible reads with last good values, on real files in a fixture tree."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probes.sysfs import KernelFiles, LastGood, parse_float, parse_int, parse_word


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fixture_tree_fresh_read_has_age_zero(tmp_path):
    (tmp_path / "temp").write_text("45000\n")
    files = KernelFiles(tmp_path)
    reading = files.read_int("temp")
    assert reading.value == 45000 and reading.age_s == 0.0 and not reading.stale


def test_fixture_tree_never_read_is_none_not_zero(tmp_path):
    files = KernelFiles(tmp_path)
    reading = files.read_int("missing")
    assert reading.value is None and reading.age_s is None


def test_fixture_tree_vanished_file_gives_last_good_with_age_then_none(tmp_path):
    clock = Clock()
    path = tmp_path / "capacity"
    path.write_text("37\n")
    files = KernelFiles(tmp_path, stale_after_s=60, clock=clock)
    assert files.read_int("capacity").value == 37
    path.unlink()
    clock.now += 5
    reading = files.read_int("capacity")
    assert reading.value == 37 and reading.age_s == pytest.approx(5) and reading.stale
    clock.now += 56
    assert files.read_int("capacity").value is None  # too old to stand in


def test_fixture_tree_garbage_gives_last_good(tmp_path):
    clock = Clock()
    path = tmp_path / "temp"
    path.write_text("50000\n")
    files = KernelFiles(tmp_path, clock=clock)
    files.read_int("temp")
    path.write_bytes(b"\xff\xfe garbage")
    clock.now += 1
    reading = files.read_int("temp")
    assert reading.value == 50000 and reading.age_s == pytest.approx(1)
    path.write_text("")  # an empty read, as some drivers give on EAGAIN
    assert files.read_int("temp").value == 50000


def test_fixture_tree_directory_in_place_of_file_is_no_reading(tmp_path):
    (tmp_path / "temp").mkdir()
    assert KernelFiles(tmp_path).read_int("temp").value is None


def test_fixture_tree_fifo_never_blocks(tmp_path):
    """A file whose driver would block (a FIFO) reads as no value at once, with or without a writer."""
    fifo = tmp_path / "temp"
    os.mkfifo(fifo)
    files = KernelFiles(tmp_path)
    start = time.monotonic()
    assert files.read_int("temp").value is None  # no writer: a blocking open would wait forever
    holder = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer that never writes: reads get EAGAIN
    try:
        assert files.read_int("temp").value is None
        os.write(holder, b"42000\n")
        assert files.read_int("temp").value == 42000  # and it still reads when there is something
    finally:
        os.close(holder)
    assert time.monotonic() - start < 1.0


def test_fixture_tree_slow_read_backs_off(tmp_path):
    """A read slower than slow_read_s (an embedded-controller battery) is not repeated for slow_backoff_s."""
    clock = Clock()
    (tmp_path / "energy_now").write_text("1000\n")
    files = KernelFiles(tmp_path, clock=clock, slow_read_s=0.05, slow_backoff_s=30)
    reads = []
    real_read_raw = files.read_raw

    def slow_read_raw(rel, max_bytes=4096):
        reads.append(rel)
        clock.now += 0.2  # the read took 200 ms
        return real_read_raw(rel, max_bytes)

    files.read_raw = slow_read_raw
    assert files.read_int("energy_now").value == 1000
    clock.now += 1
    reading = files.read_int("energy_now")
    assert reading.value == 1000 and reading.stale and len(reads) == 1
    clock.now += 30
    assert files.read_int("energy_now").age_s == 0.0 and len(reads) == 2


def test_fixture_tree_ttl_caches_static_attributes(tmp_path):
    clock = Clock()
    path = tmp_path / "type"
    path.write_text("acpitz\n")
    files = KernelFiles(tmp_path, clock=clock)
    assert files.read_word("type", ttl_s=60).value == "acpitz"
    path.write_text("changed\n")
    assert files.read_word("type", ttl_s=60).value == "acpitz"
    clock.now += 61
    assert files.read_word("type", ttl_s=60).value == "changed"


def test_fixture_tree_ttl_caches_a_listing_of_devices_and_reads_their_values_each_time(tmp_path):
    """A listing of hardware is taken once a minute (a zone that comes later is seen within it); what a device
    says is read every time."""
    clock = Clock()
    (tmp_path / "thermal_zone0").mkdir()
    (tmp_path / "thermal_zone0" / "temp").write_text("50000\n")
    files = KernelFiles(tmp_path, clock=clock)
    assert files.listdir(".", "thermal_zone", ttl_s=60) == ["thermal_zone0"]
    (tmp_path / "thermal_zone1").mkdir()
    (tmp_path / "thermal_zone0" / "temp").write_text("90000\n")
    assert files.listdir(".", "thermal_zone", ttl_s=60) == ["thermal_zone0"]
    assert files.listdir(".", "thermal_zone") == ["thermal_zone0", "thermal_zone1"]  # without a ttl: now
    assert files.read_int("thermal_zone0/temp").value == 90000
    clock.now += 61
    assert files.listdir(".", "thermal_zone", ttl_s=60) == ["thermal_zone0", "thermal_zone1"]
    assert files.listdir(".", "cooling", ttl_s=60) == []  # the same listing, another prefix


def test_fixture_tree_listdir_natural_order_and_missing_dir(tmp_path):
    for i in (10, 2, 1):
        (tmp_path / f"thermal_zone{i}").mkdir()
    (tmp_path / "cooling_device0").mkdir()
    files = KernelFiles(tmp_path)
    assert files.listdir(".", "thermal_zone") == ["thermal_zone1", "thermal_zone2", "thermal_zone10"]
    assert files.listdir("nowhere") == []


def test_parsers_reject_garbage():
    assert parse_int(" 42\n") == 42 and parse_int("4 2") is None and parse_int("") is None
    assert parse_int(str(2**64 - 1)) == 2**64 - 1 and parse_int(str(-(2**63))) == -(2**63)
    assert parse_int("9" * 400) is None and parse_int(str(2**64)) is None  # wider than the kernel writes
    assert parse_float("nan") is None and parse_float("inf") is None and parse_float("1.5") == 1.5
    assert parse_word("low-power\n") == "low-power" and parse_word("\x00\x01") is None and parse_word("x" * 100) is None


def test_last_good_forget_drops_a_removed_device():
    clock = Clock()
    store = LastGood(60, clock)
    store.good("BAT1.capacity", 50)
    store.forget("BAT1.")
    assert store.failed("BAT1.capacity").value is None


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.binary(max_size=64))
def test_fixture_tree_random_bytes_never_crash(tmp_path, data):
    path = tmp_path / "value"
    path.write_bytes(data)
    files = KernelFiles(tmp_path)
    for read in (files.read_int, files.read_float, files.read_word):
        reading = read("value")
        assert reading.value is None or reading.age_s == 0.0
