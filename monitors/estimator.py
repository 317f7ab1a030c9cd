"""Estimate one inference: graph -> kernel plan -> calibrated latency -> scaled by device state -> tier."""

from __future__ import annotations

import math
from dataclasses import dataclass
from os import PathLike
from typing import TYPE_CHECKING

from monitors import planner
from monitors.calibration import Calibration
from monitors.costmodel import CostModel
from monitors.errors import BadInput
from monitors.graph import Graph
from monitors.kernels import Plan
from monitors.tiers import tier_for

if TYPE_CHECKING:
    from monitors.speed import Speed

DEVICES = ("cpu", "gpu")


@dataclass(frozen=True)
class Estimate:
    latency_ms: float  # inf when the model cannot run on the device now (does not fit)
    tier: str
    device: str
    kernels: int

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.latency_ms)


class Estimator:
    """Holds one cost model per calibrated device ('cpu', 'gpu')."""

    def __init__(self, calibrations: dict[str, Calibration]) -> None:
        if "cpu" not in calibrations:
            raise ValueError("an estimator needs a CPU calibration")
        self.calibrations = dict(calibrations)
        self.models = {dev: CostModel(cal) for dev, cal in calibrations.items()}

    @classmethod
    def load(cls, state_dir: str | PathLike, device: str = "cpu", **kwargs) -> "Estimator":
        """Load (or first run) the calibrations in `state_dir`; see agent.calibration_store."""
        from agent.calibration_store import load_estimator

        return load_estimator(state_dir, device=device, **kwargs)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for d in DEVICES if d in self.models)

    def plan(self, graph: Graph, device: str = "cpu") -> Plan:
        cal = self.calibrations.get(device, self.calibrations["cpu"])
        return planner.plan(graph, nchwc_block=int(cal.fingerprint.get("nchwc_block", planner.DEFAULT_NCHWC_BLOCK)))

    def base_latency_ms(self, plan: Plan, device: str = "cpu") -> float:
        """Latency on the calibrated device at rest."""
        return 1000.0 * self._model(device).seconds(plan)

    def estimate(self, graph: Graph | Plan, device: str = "auto", speed: "Speed | None" = None) -> Estimate:
        """The estimate now: `speed` (from the device state) scales the calibrated latency, and adds the handoff
        extra for the bytes the plan writes (monitors/speed.py)."""
        candidates = self.devices if device == "auto" else (device,)
        best: Estimate | None = None
        for dev in candidates:
            model = self._model(dev)
            plan = graph if isinstance(graph, Plan) else self.plan(graph, dev)
            latency = 1000.0 * model.seconds(plan) * _factor(speed, dev, plan) + _handoff_ms(speed, dev, plan)
            est = Estimate(latency, tier_for(latency), dev, len(plan.kernels))
            if best is None or est.latency_ms < best.latency_ms:
                best = est
        assert best is not None
        return best

    def _model(self, device: str) -> CostModel:
        if device not in DEVICES:
            raise BadInput(f"unknown device {device!r}; expected cpu, gpu or auto")
        model = self.models.get(device)
        if model is None:
            raise BadInput(f"no calibration for device {device!r} on this machine")
        return model


def _handoff_ms(speed: "Speed | None", device: str, plan: Plan) -> float:
    return plan.written_mb * speed.handoff_ms_per_mb if speed is not None and device == "cpu" else 0.0


def _factor(speed: "Speed | None", device: str, plan: Plan) -> float:
    if speed is None:
        return 1.0
    if device == "gpu":
        if speed.gpu is None:
            return math.inf
        if speed.gpu_free_bytes is not None and plan.memory_bytes > speed.gpu_free_bytes:
            return math.inf
        return speed.gpu
    return speed.cpu
