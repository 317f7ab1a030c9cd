"""Estimate one inference: graph -> kernel plan -> calibrated latency -> scaled by device state -> tier."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from monitors.devices import DEVICES
from monitors.errors import BadInput
from monitors.graphs.decoder import Decoder
from monitors.graphs.graph import Graph, InputSpec
from monitors.pricing import planner
from monitors.pricing.costmodel import CostModel
from monitors.pricing.generation import (
    GenerationPlan,
    GenerationSpec,
    GenerationTimes,
    generation_times,
    plan_generation,
)
from monitors.pricing.kernels import Plan
from monitors.pricing.tiers import tier_for
from monitors.speed.present import AT_REST, Speed, fastest, memory_shortfall
from probes.calibration import Calibration


@dataclass(frozen=True)
class Estimate:
    latency_ms: float  # inf when the model cannot run on the device now (does not fit)
    tier: str
    device: str
    kernels: int

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.latency_ms)


@dataclass(frozen=True)
class GenerationEstimate:
    times: GenerationTimes  # inf when the model cannot run on the device now
    device: str
    kernels: int  # of one prefill
    memory_bytes: int  # weights + KV cache at the full context + peak activations
    why_not: str | None = None  # why it cannot run now, for the log


class Estimator:
    """Holds one cost model per calibrated device ('cpu', 'gpu')."""

    def __init__(self, calibrations: dict[str, Calibration]) -> None:
        if "cpu" not in calibrations:
            raise ValueError("an estimator needs a CPU calibration")
        self.calibrations = dict(calibrations)
        self.models = {dev: CostModel(cal) for dev, cal in calibrations.items()}

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for d in DEVICES if d in self.models)

    def plan(self, graph: Graph, device: str = "cpu") -> Plan:
        if device == "gpu":
            return planner.plan(graph, planner.CUDA)
        cal = self.calibrations["cpu"]
        block = int(cal.fingerprint.get("nchwc_block", planner.DEFAULT_NCHWC_BLOCK))
        return planner.plan(graph, planner.Provider(nchwc_block=block))

    def base_latency_ms(self, plan: Plan | GenerationPlan, device: str = "cpu") -> float:
        """Latency on the calibrated device at rest (of a whole generation, for a GenerationPlan)."""
        model = self._model(device)
        if isinstance(plan, GenerationPlan):
            return generation_times(plan, lambda p: 1000.0 * model.seconds(p)).total_ms
        return 1000.0 * model.seconds(plan)

    def stream_ms(self, plan: Plan | GenerationPlan, device: str = "cpu") -> float:
        """What the latency at rest gains per unit of memory slowdown (CostModel.stream_seconds)."""
        return self._per_unit_ms(plan, device, CostModel.stream_seconds)

    def gemm_ms(self, plan: Plan | GenerationPlan, device: str = "cpu") -> float:
        """What the latency at rest gains per unit of gemm slowdown (CostModel.gemm_seconds)."""
        return self._per_unit_ms(plan, device, CostModel.gemm_seconds)

    def _per_unit_ms(self, plan: Plan | GenerationPlan, device: str,
                     seconds: Callable[[CostModel, Plan], float]) -> float:
        """A CostModel secant in ms, of a whole generation for a GenerationPlan; 0 on the GPU, whose memory and
        products no probe reads."""
        if device != "cpu":
            return 0.0
        model = self._model(device)
        if isinstance(plan, GenerationPlan):
            return generation_times(plan, lambda p: 1000.0 * seconds(model, p)).total_ms
        return 1000.0 * seconds(model, plan)

    def estimate(self, graph: Graph | Plan, device: str = "auto", speed: Speed = AT_REST) -> Estimate:
        """The estimate at `speed` (the device's present speed; at rest by default), priced as the agent
        prices its monitors (monitors/speed/present.py)."""
        candidates = self.devices if device == "auto" else (device,)
        best: Estimate | None = None
        for dev in candidates:
            plan = graph if isinstance(graph, Plan) else self.plan(graph, dev)
            stream, gemm = _moved_ms(dev, self._model(dev), speed, plan)
            latency, _ = fastest({dev: self.base_latency_ms(plan, dev)}, speed, plan.memory_bytes, plan.written_mb,
                                 stream, gemm)
            est = Estimate(latency, tier_for(latency), dev, len(plan.kernels))
            if best is None or est.latency_ms < best.latency_ms:
                best = est
        assert best is not None
        return best

    def plan_generation(self, decoder: Decoder, spec: GenerationSpec,
                        graph_of: Callable[[Mapping[str, InputSpec]], Graph], device: str = "cpu") -> GenerationPlan:
        """The plans of a generation on `device`; `graph_of` binds the decoder's inputs and infers the shapes."""
        self._model(device)
        return plan_generation(decoder, spec, graph_of, lambda graph: self.plan(graph, device))

    def estimate_generation(self, plans: Mapping[str, GenerationPlan], device: str = "auto",
                            speed: Speed = AT_REST) -> GenerationEstimate:
        """TTFT, time per output token and the whole generation at `speed`, on the device that runs it fastest
        (`plans` by device: plan_generation), each phase priced as monitors are (monitors/speed/present.py).
        One that does not fit in memory now: inf, and why."""
        candidates = self.devices if device == "auto" else (device,)
        best: GenerationEstimate | None = None
        for dev in candidates:
            model = self._model(dev)
            plan = plans[dev]
            why = memory_shortfall(plan.memory_bytes, speed, dev)
            if why is None:
                times = generation_times(plan, _present_ms(dev, model, speed))
            else:
                times = GenerationTimes(math.inf, math.inf, math.inf)
            est = GenerationEstimate(times, dev, plan.kernels, plan.memory_bytes, why)
            if best is None or est.times.total_ms < best.times.total_ms:
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


def _present_ms(device: str, model: CostModel, speed: Speed) -> Callable[[Plan], float]:
    """A plan's present latency on `device` (its own closure, not the caller's loop variables)."""
    def price(p: Plan) -> float:
        stream, gemm = _moved_ms(device, model, speed, p)
        return fastest({device: 1000.0 * model.seconds(p)}, speed, 0, p.written_mb, stream, gemm)[0]
    return price


def _moved_ms(device: str, model: CostModel, speed: Speed, plan: Plan) -> tuple[float, float]:
    """The plan's stream_ms and gemm_ms on `device`, each only where `speed`'s multiplier moves it (at 1 it moves
    nothing, and its secant is not priced); 0 on the GPU, whose memory and products no probe reads."""
    if device != "cpu":
        return 0.0, 0.0
    return (1000.0 * model.stream_seconds(plan) if speed.memory != 1.0 else 0.0,
            1000.0 * model.gemm_seconds(plan) if speed.gemm != 1.0 else 0.0)
