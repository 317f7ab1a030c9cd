"""Power mode probe: platform profile on fixture trees, power-profiles-daemon cache, the real bus."""

from __future__ import annotations

import threading
import time

from agent.simulation.trees import desktop, laptop, vm
from probes.power_mode import PowerModeProbe
from probes.power_profiles import PpdAnswer, PpdWatcher, query_ppd
from probes.sysfs import KernelFiles


def test_laptop_fixture_tree_platform_profile_and_epp(tmp_path):
    state = PowerModeProbe(KernelFiles(laptop(tmp_path).sys)).sample()
    assert state.power_mode == "low-power" and state.platform_profile == "low-power"
    assert state.platform_profile_choices == ("low-power", "balanced", "performance")
    assert state.governor == "powersave" and state.epp == "power"


def test_laptop_fixture_tree_profile_not_in_choices_is_garbage(tmp_path):
    tree = laptop(tmp_path)
    tree.set("firmware/acpi/platform_profile", "turbo-9000")
    assert PowerModeProbe(KernelFiles(tree.sys)).sample().power_mode is None


def test_desktop_fixture_tree_ppd_profile_when_no_platform_profile(tmp_path):
    watcher = PpdWatcher(query=lambda: PpdAnswer("power-saver", "high-operating-temperature"))
    watcher.wait(2.0)
    state = PowerModeProbe(KernelFiles(desktop(tmp_path).sys), watcher).sample()
    assert state.platform_profile is None
    assert state.power_mode == "power-saver" and state.ppd_degraded == "high-operating-temperature"
    assert state.governor == "performance"


def test_laptop_fixture_tree_platform_profile_wins_over_ppd(tmp_path):
    watcher = PpdWatcher(query=lambda: PpdAnswer("performance", ""))
    watcher.wait(2.0)
    state = PowerModeProbe(KernelFiles(laptop(tmp_path).sys), watcher).sample()
    assert state.power_mode == "low-power" and state.ppd_profile == "performance"


def test_vm_fixture_tree_no_power_mode_is_null(tmp_path):
    state = PowerModeProbe(KernelFiles(vm(tmp_path).sys)).sample()
    assert state.power_mode is None and state.governor is None and state.epp is None


def test_ppd_watcher_never_makes_a_tick_wait():
    """A D-Bus query that hangs does not block `current()`; the answer arrives on a later tick."""
    release = threading.Event()

    def slow_query() -> PpdAnswer:
        release.wait(5)
        return PpdAnswer("balanced", "")

    watcher = PpdWatcher(interval_s=30, query=slow_query)
    start = time.monotonic()
    assert watcher.current() is None
    assert watcher.current() is None  # no second query while one runs
    assert time.monotonic() - start < 0.1
    release.set()
    watcher._thread.join(5)
    assert watcher.current() == PpdAnswer("balanced", "")


def test_ppd_watcher_survives_a_failing_query():
    def broken() -> PpdAnswer:
        raise RuntimeError("bus went away")

    watcher = PpdWatcher(query=broken)
    assert watcher.wait(2.0) is None


def test_query_ppd_on_this_machine_answers_quickly():
    """This machine (a VM without power-profiles-daemon) answers None; either way within the timeout."""
    start = time.monotonic()
    answer = query_ppd(timeout=2.0)
    assert time.monotonic() - start < 5.0
    assert answer is None or isinstance(answer.active_profile, str)
