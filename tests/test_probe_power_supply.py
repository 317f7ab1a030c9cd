"""Battery and adapter probe on fixture /sys trees: by type, not by name; peripherals ignored."""

from __future__ import annotations

import pytest

from agent.simulation.trees import desktop, laptop, server, vm
from probes.power_supply import Battery, PowerSupplyProbe, combined_percent
from probes.state import Sampler
from probes.sysfs import KernelFiles


def probe(tree) -> PowerSupplyProbe:
    return PowerSupplyProbe(KernelFiles(tree.sys))


def test_laptop_fixture_tree_two_batteries_combined_by_energy(tmp_path):
    state = probe(laptop(tmp_path)).sample()
    assert state.present is True
    assert [b.name for b in state.batteries] == ["BAT0", "CMB1"]  # the mouse (scope Device) is not ours
    assert state.percent == 37.0  # (22.2 + 7.4) / (50 + 30) Wh, not the mean of 44 % and 25 %
    assert state.charging == "discharging"
    assert state.plugged is False


def test_laptop_fixture_tree_adapter_not_named_ac_plugged_in(tmp_path):
    tree = laptop(tmp_path)
    tree.set("class/power_supply/ADP1/online", "1")
    tree.set("class/power_supply/BAT0/status", "Charging")
    state = probe(tree).sample()
    assert state.plugged is True and state.charging == "charging"
    assert {a.name: a.online for a in state.adapters} == {"ADP1": True, "ucsi-source-psy-USBC000:001": False}


def test_laptop_fixture_tree_usb_c_charger_counts_as_plugged(tmp_path):
    tree = laptop(tmp_path)
    tree.set("class/power_supply/ucsi-source-psy-USBC000:001/online", "1")
    assert probe(tree).sample().plugged is True


def test_laptop_fixture_tree_without_adapters_plugged_from_battery_status(tmp_path):
    tree = laptop(tmp_path)
    for name in ("ADP1", "ucsi-source-psy-USBC000:001"):
        tree.remove(f"class/power_supply/{name}/online")
        tree.remove(f"class/power_supply/{name}/type")
    assert probe(tree).sample().plugged is False  # discharging
    tree.set("class/power_supply/BAT0/status", "Full")
    tree.set("class/power_supply/CMB1/status", "Full")
    assert probe(tree).sample().plugged is True


def test_laptop_fixture_tree_empty_bay_is_not_a_battery(tmp_path):
    tree = laptop(tmp_path)
    tree.set("class/power_supply/CMB1/present", "0")
    state = probe(tree).sample()
    assert [b.name for b in state.batteries] == ["BAT0"] and state.percent == 44.4


def test_laptop_fixture_tree_energy_missing_falls_back_to_charge_then_capacity(tmp_path):
    tree = laptop(tmp_path)
    for name in ("BAT0", "CMB1"):
        tree.remove(f"class/power_supply/{name}/energy_now")
    assert probe(tree).sample().percent == 34.5  # mean of 44 and 25
    tree.supply("BAT0", charge_now=1_000_000, charge_full=4_000_000)
    tree.supply("CMB1", charge_now=3_000_000, charge_full=4_000_000)
    assert probe(tree).sample().percent == 50.0


def test_desktop_fixture_tree_no_battery_is_plugged(tmp_path):
    state = probe(desktop(tmp_path)).sample()
    assert state.present is False and state.percent is None and state.plugged is True


def test_server_and_vm_fixture_trees_have_no_battery(tmp_path):
    for build, sub in ((server, "s"), (vm, "v")):
        state = probe(build(tmp_path / sub)).sample()
        assert state.present is False and state.percent is None and state.batteries == ()


def test_laptop_fixture_tree_garbage_capacity_is_last_good(tmp_path):
    tree = laptop(tmp_path)
    for name in ("BAT0", "CMB1"):
        tree.remove(f"class/power_supply/{name}/energy_now")
    p = probe(tree)
    assert p.sample().percent == 34.5
    tree.set("class/power_supply/BAT0/capacity", "250")  # out of range
    state = p.sample()
    assert state.percent == 34.5 and "battery.batteries.BAT0.percent" in state.stale


def test_combined_percent_unknown_when_nothing_known():
    assert combined_percent([Battery("BAT0", None, None)]) is None
    assert combined_percent([]) is None


def test_laptop_fixture_tree_a_reading_stands_for_every_s_unless_a_uevent_says_a_supply_changed(tmp_path):
    tree = laptop(tmp_path)
    now = [0.0]
    supplies = PowerSupplyProbe(KernelFiles(tree.sys), every_s=30.0, clock=lambda: now[0])
    assert supplies.sample().plugged is False
    tree.set("class/power_supply/ADP1/online", "1")  # the charger goes in
    now[0] = 10.0
    assert supplies.sample().plugged is False  # not read again: no uevent said so
    assert supplies.sample(changed=True).plugged is True
    tree.set("class/power_supply/ADP1/online", "0")
    now[0] = 39.0
    assert supplies.sample().plugged is True  # 29 s after the last read
    now[0] = 41.0
    assert supplies.sample().plugged is False  # 31 s: read again without being told


def test_laptop_fixture_tree_sampler_rereads_supplies_on_a_power_supply_uevent_only(tmp_path):
    """The sampler's wiring: a power-supply uevent (or lost events) has the next sample read the supplies again;
    a thermal one does not. The uevent socket is the real kernel's, opened on a fixture tree (`uevents=True`)."""
    tree = laptop(tmp_path)
    sampler = Sampler(tree.sys, tree.proc, uevents=True)
    try:
        if sampler.uevents is None or not sampler.uevents.listening:
            pytest.skip("no netlink uevent socket here: the supplies are read at every sample")
        assert sampler.sample().battery.plugged is False
        tree.set("class/power_supply/ADP1/online", "1")
        assert sampler.sample().battery.plugged is False
        sampler.heard("thermal")
        assert sampler.changed.is_set() and sampler.sample().battery.plugged is False
        sampler.heard("power_supply")
        assert sampler.sample().battery.plugged is True
        tree.set("class/power_supply/ADP1/online", "0")
        sampler.heard(None)  # events were lost: any supply may have changed
        assert sampler.sample().battery.plugged is False
    finally:
        sampler.close()


def test_laptop_fixture_tree_without_uevents_supplies_are_read_at_every_sample(tmp_path):
    tree = laptop(tmp_path)
    sampler = Sampler(tree.sys, tree.proc)  # a fixture tree: no uevents
    try:
        assert sampler.uevents is None and sampler.sample().battery.plugged is False
        tree.set("class/power_supply/ADP1/online", "1")
        assert sampler.sample().battery.plugged is True
    finally:
        sampler.close()
