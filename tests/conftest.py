"""Shared fixtures. One real quick calibration per test session: every estimate-based test uses it.

The fixtures of the test helpers (a real Mosquitto, the device fixture tree, a real browser) are made
available to every test module here, not imported module by module."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest
from agent_harness import device, device_proc
from broker import mosquitto, mosquitto_factory
from browser import browser, client_site
from cluster import rabbit_cluster
from dbus_bus import bus_address  # noqa: F401 - a fixture of the tests

from agent import calibration_store
from agent.simulation.trees import laptop
from probes.state import DeviceState, Sampler

# the fixtures every test module may use
__all__ = ["browser", "client_site", "device", "device_proc", "mosquitto", "mosquitto_factory", "rabbit_cluster"]

LIGHT_MODELS = Path(__import__("onnx").__file__).parent / "backend" / "test" / "data" / "light"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In parallel workers (pytest-xdist), the slow tests first (marked `slow`: tens of seconds each), the rest in
    their order: the workers then end together, rather than three waiting on one that drew a slow test last. A run
    in one process keeps the files' order."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)

@pytest.fixture(scope="session")
def calibrated_dir(tmp_path_factory, worker_id: str) -> Path:
    """A state dir holding a real quick CPU calibration of this machine (read-only: copy before changing).

    One for the whole run: the parallel workers of a run (pytest-xdist), and test.sh's two phases (its
    DAOP_TEST_SHARED_DIR), share the first one's, under a lock, rather than each measure the CPUs while the
    others load them."""
    if os.environ.get("DAOP_TEST_SHARED_DIR"):
        shared = Path(os.environ["DAOP_TEST_SHARED_DIR"])
    elif worker_id != "master":
        shared = tmp_path_factory.getbasetemp().parent  # the run's folder, above each worker's own
    else:
        shared = tmp_path_factory.mktemp("shared")
    d = shared / "calibrated"
    with open(shared / "calibrated.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "calibrated.done").exists():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            calibration_store.run_calibration(d, "cpu", quick=True)
            (shared / "calibrated.done").touch()
    return d


@pytest.fixture
def state_dir(calibrated_dir, tmp_path) -> Path:
    """A private, writable state dir that already holds the session's calibration."""
    d = tmp_path / "state"
    shutil.copytree(calibrated_dir, d)
    return d


@pytest.fixture
def quiet_laptop(tmp_path) -> DeviceState:
    """A quiet laptop fixture tree's state (its CPU sampled twice: load is a delta)."""
    tree = laptop(tmp_path)
    tree.set_stat(busy=1000, idle=9000)
    sampler = Sampler(tree.sys, tree.proc)
    sampler.sample()
    tree.set_stat(busy=1000, idle=9100)
    return sampler.sample()


@pytest.fixture(scope="session")
def estimator(calibrated_dir):
    return calibration_store.load_estimator(calibrated_dir)
