"""Shared fixtures. One real quick calibration per test session: every estimate-based test uses it.

The fixtures of the test helpers (a real Mosquitto, the device fixture tree, a real browser) are made
available to every test module here, not imported module by module."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from agent_harness import device
from broker import mosquitto, mosquitto_factory
from browser import browser, client_site
from cluster import rabbit_cluster

from agent import calibration_store

# the fixtures every test module may use
__all__ = ["browser", "client_site", "device", "mosquitto", "mosquitto_factory", "rabbit_cluster"]

LIGHT_MODELS = Path(__import__("onnx").__file__).parent / "backend" / "test" / "data" / "light"


@pytest.fixture(scope="session")
def calibrated_dir(tmp_path_factory) -> Path:
    """A state dir holding a real quick CPU calibration of this machine (read-only: copy before changing)."""
    d = tmp_path_factory.mktemp("calibrated")
    calibration_store.run_calibration(d, "cpu", quick=True)
    return d


@pytest.fixture
def state_dir(calibrated_dir, tmp_path) -> Path:
    """A private, writable state dir that already holds the session's calibration."""
    d = tmp_path / "state"
    shutil.copytree(calibrated_dir, d)
    return d


@pytest.fixture(scope="session")
def estimator(calibrated_dir):
    return calibration_store.load_estimator(calibrated_dir)
