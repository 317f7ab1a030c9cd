"""Thermal probe on fixture /sys trees: zones, trip points, cooling devices, throttle counters, hwmon."""

from __future__ import annotations

from agent.simulation.trees import desktop, laptop, server, vm
from probes.sysfs import KernelFiles
from probes.thermal import ThermalProbe


def probe(tree) -> ThermalProbe:
    return ThermalProbe(KernelFiles(tree.sys))


def test_laptop_fixture_tree_max_temp_and_lowest_passive_trip(tmp_path):
    state = probe(laptop(tmp_path)).sample()
    assert state.max_temp_c == 71.5
    assert state.throttling is False
    assert state.source == "thermal_zone"
    by_name = {z.name: z for z in state.zones}
    assert set(by_name) == {"thermal_zone0", "thermal_zone1"}  # the disabled zone is skipped
    assert by_name["thermal_zone1"].passive_c == 85.0  # the lowest of two passive trips
    assert by_name["thermal_zone0"].trips == {"critical": 105.0, "passive": 95.0, "active": 60.0}
    assert [c.type for c in state.cooling] == ["Processor", "Fan", "intel_powerclamp"]


def test_laptop_fixture_tree_zone_at_passive_trip_is_throttling(tmp_path):
    tree = laptop(tmp_path)
    p = probe(tree)
    tree.set("class/thermal/thermal_zone1/temp", "85000")
    state = p.sample()
    assert state.throttling is True and state.max_temp_c == 85.0


def test_laptop_fixture_tree_cooling_device_above_zero_is_throttling(tmp_path):
    tree = laptop(tmp_path)
    tree.set("class/thermal/cooling_device0/cur_state", "3")
    state = probe(tree).sample()
    assert state.throttling is True and state.cpu_throttling is True


def test_laptop_fixture_tree_fan_on_is_throttling_per_contract_not_cpu_throttling(tmp_path):
    tree = laptop(tmp_path)
    tree.set("class/thermal/cooling_device1/cur_state", "1")
    state = probe(tree).sample()
    assert state.throttling is True and state.cpu_throttling is False


def test_laptop_fixture_tree_throttle_counter_moving_is_throttling(tmp_path):
    tree = laptop(tmp_path)
    p = probe(tree)
    first = p.sample()
    assert first.throttle_count == 12 and first.throttle_events is None and first.throttling is False
    for i in range(tree.cores):
        tree.set(f"devices/system/cpu/cpu{i}/thermal_throttle/package_throttle_count", "15")
    second = p.sample()
    assert second.throttle_count == 15 and second.throttle_events == 3 and second.throttling is True
    third = p.sample()
    assert third.throttle_events == 0 and third.throttling is False


def test_desktop_fixture_tree_falls_back_to_hwmon(tmp_path):
    state = probe(desktop(tmp_path)).sample()
    assert state.source == "hwmon"
    assert state.max_temp_c == 49.0
    assert state.throttling is False
    assert {z.type for z in state.zones} == {"coretemp Package id 0", "coretemp Core 0", "coretemp Core 1"}
    assert all(z.passive_c == 80.0 for z in state.zones)


def test_desktop_fixture_tree_hwmon_at_max_is_throttling(tmp_path):
    tree = desktop(tmp_path)
    tree.set("class/hwmon/hwmon2/temp2_input", "81000")
    assert probe(tree).sample().throttling is True


def test_server_fixture_tree_one_package_counter(tmp_path):
    state = probe(server(tmp_path)).sample()
    assert state.max_temp_c == 58.0 and state.throttle_count == 12  # one package, counted once


def test_vm_fixture_tree_nothing_to_tell_is_null_not_false(tmp_path):
    state = probe(vm(tmp_path)).sample()
    assert state.max_temp_c is None and state.throttling is None and state.source is None
    assert state.zones == () and state.cooling == () and state.throttle_count is None


def test_laptop_fixture_tree_implausible_temperature_is_last_good(tmp_path):
    tree = laptop(tmp_path)
    p = probe(tree)
    p.sample()
    tree.set("class/thermal/thermal_zone1/temp", "-274000")  # a sensor fault value
    state = p.sample()
    zone = next(z for z in state.zones if z.name == "thermal_zone1")
    assert zone.temp_c == 71.5
    assert "thermal.zones.thermal_zone1.temp_c" in state.stale


def test_laptop_fixture_tree_integer_wider_than_64_bits_is_last_good_not_a_crash(tmp_path):
    """Found by the vandalising property test: 400 nines overflowed the float conversion."""
    tree = laptop(tmp_path)
    p = probe(tree)
    p.sample()
    tree.set("class/thermal/thermal_zone1/temp", "9" * 400)
    state = p.sample()
    zone = next(z for z in state.zones if z.name == "thermal_zone1")
    assert zone.temp_c == 71.5
    assert "thermal.zones.thermal_zone1.temp_c" in state.stale


def test_laptop_fixture_tree_zone_vanishing_midway(tmp_path):
    tree = laptop(tmp_path)
    p = probe(tree)
    p.sample()
    tree.remove("class/thermal/thermal_zone1/temp")
    state = p.sample()
    assert state.max_temp_c == 71.5  # last good value, with its age
    assert state.stale["thermal.zones.thermal_zone1.temp_c"] >= 0
