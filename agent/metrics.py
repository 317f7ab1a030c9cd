"""Prometheus metrics of the agent's health, opt-in (`[metrics] port = 9464`), served on loopback by default.

Health only: monitors, requests and their latency, change events, the broker connection, calibration age,
probe faults, the process's own CPU and memory. The device's state (its slow-down, temperature, battery, load)
describes the hardware and would fingerprint it to whoever scrapes: served only with `device_state = true`.
The HTTP server is prometheus-client's, in a thread of its own; what it reads here is counters and a few
callbacks, so a scrape never waits on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server

from agent.analysis import AnalysisPool
from agent.book import MonitorBook
from agent.calibration_store import calibration_path
from agent.config import MetricsSettings
from agent.topics import Outgoing
from monitors.devices import DEVICES
from probes.state import DeviceState

REQUEST_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0)


class Metrics:
    """Read from the agent's own holders at each scrape: its monitors, its estimator, its broker link
    (`connected`: set while it is up) and the calibrations in its state dir."""

    def __init__(self, settings: MetricsSettings, monitors: MonitorBook, pool: AnalysisPool,
                 connected: asyncio.Event, state_dir: Path) -> None:
        self.settings = settings
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        Gauge("daop_monitors", "Monitors the agent holds", registry=r).set_function(monitors.__len__)
        Gauge("daop_monitors_running", "Monitors whose app says it runs their workloads here now",
              registry=r).set_function(lambda: len(monitors.running_pids()))
        Gauge("daop_broker_connected", "1 while the agent is connected to its broker",
              registry=r).set_function(lambda: float(connected.is_set()))
        Gauge("daop_calibrating", "1 while a calibration runs",
              registry=r).set_function(lambda: float(pool.calibrating))
        calibration_file = functools.partial(calibration_path, state_dir)
        age = Gauge("daop_calibration_age_seconds", "Age of each device's calibration (NaN: none)", ["device"],
                    registry=r)
        # Whether a GPU was calibrated tells that the device has one: the CPU's alone unless device_state is on.
        for device in DEVICES if settings.device_state else ("cpu",):
            age.labels(device).set_function(functools.partial(_age_s, calibration_file, device))
        self.requests = Counter("daop_requests", "Requests answered, by method and outcome (ok, or the error code)",
                                ["method", "outcome"], registry=r)
        self.latency = Histogram("daop_request_duration_seconds", "From a request's arrival to its answer",
                                 ["method"], buckets=REQUEST_BUCKETS_S, registry=r)
        self.events = Counter("daop_events", "Monitor change events published", registry=r)
        self.probe_errors = Counter("daop_probe_errors", "Device readings that failed: a whole sample or warm "
                                    "refresh, or one probe's reading (held at its last good value)", ["probe"],
                                    registry=r)
        self._device: dict[str, Gauge] = {}
        if settings.device_state:
            self._device = {name: Gauge(f"daop_device_{name}", text, registry=r) for name, text in (
                ("cpu_slowdown", "The present speed's CPU multiplier (1: the calibrated device at rest)"),
                ("cpu_load", "CPU busy fraction, others' work"),
                ("thermal_max_celsius", "The hottest thermal zone"),
                ("battery_percent", "Battery level"))}
        self._server: Any = None

    def start(self) -> None:
        """Serve /metrics (OSError when the port is taken: the agent says so and goes on without)."""
        self._server, _ = start_http_server(self.settings.port, self.settings.address, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def answered(self, method: str, outcome: str, seconds: float) -> None:
        self.requests.labels(method, outcome).inc()
        self.latency.labels(method).observe(seconds)

    def sent(self, messages: Iterable[Outgoing]) -> None:
        self.events.inc(sum(1 for m in messages if m.topic.endswith("/events")))

    def sampled(self, state: DeviceState, cpu_slowdown: float) -> None:
        """One device sample: its stale readings count as probe errors; the device gauges where configured."""
        for key in state.stale:
            self.probe_errors.labels(key.split(".", 1)[0]).inc()
        if self._device:
            self._set("cpu_slowdown", cpu_slowdown)
            self._set("cpu_load", state.cpu.load)
            self._set("thermal_max_celsius", state.thermal.max_temp_c)
            self._set("battery_percent", state.battery.percent if state.battery.present else None)

    def _set(self, name: str, value: float | None) -> None:
        self._device[name].set(math.nan if value is None else value)


def _age_s(calibration_file: Callable[[str], Path], device: str) -> float:
    try:
        return time.time() - calibration_file(device).stat().st_mtime
    except OSError:
        return math.nan
