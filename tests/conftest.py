"""Shared fixtures. One real quick calibration per test session: every estimate-based test uses it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

LIGHT_MODELS = Path(__import__("onnx").__file__).parent / "backend" / "test" / "data" / "light"


@pytest.fixture(scope="session")
def calibrated_dir(tmp_path_factory) -> Path:
    """A state dir holding a real quick CPU calibration of this machine (read-only: copy before changing)."""
    from agent import calibration_store

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
    from monitors.estimator import Estimator

    return Estimator.load(calibrated_dir)
