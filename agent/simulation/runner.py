"""Run a scenario: the real agent, in-process, on the simulated device, talked to over MQTT as an app would."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiomqtt

from agent import calibration_store
from agent.config import load_config, parse_broker_url
from agent.local_broker import LocalBroker
from agent.mosquitto import free_port
from agent.service import Agent
from agent.simulation.app import AppProcess, Workload
from agent.simulation.device import (
    SimulatedDevice,
    SimulatedRefresh,
    simulated_probe,
)
from agent.simulation.report import Outcome, Timeline, _seen, check
from agent.simulation.scenario import MonitorSpec, Scenario
from agent.simulation.speed import Scales, scaled, scales
from daop_client import DaopClient, DaopError, Monitor
from daop_client import Workload as Member
from monitors.errors import BadInput
from monitors.speed.present import speed_from_state
from probes.refresh import WarmRefresh


def prepare_state_dir(state_dir: Path, calibration_from: Path, bench: WarmRefresh, scenario: Scenario,
                      device: SimulatedDevice, announce: Any = sys.stderr) -> tuple[dict[str, float], Scales]:
    """The agent's private state dir: the CPU calibration of this host scaled to the simulated device's speed,
    with a reference refresh taken now by `bench` (the simulated device at rest, see SimulatedRefresh).
    Returns that reference and the device's scales against the host."""
    cal = calibration_store.load(calibration_from, "cpu")
    if cal is None:
        if announce is not None:
            print(f"daop-agent: no CPU calibration in {calibration_from}: calibrating now (quick)...", file=announce)
        cal = calibration_store.run_calibration(calibration_from, "cpu", quick=True)
    device_scales = scales(scenario.speed, cal, device.cpus, bool(scenario.apps))
    reference = bench.reference()
    calibration_store.save(state_dir, replace(scaled(cal, device_scales.calibration), refresh_reference=reference))
    return reference, device_scales


Emit = Callable[[dict[str, Any]], None]
# How often the simulated /proc is rewritten. A kernel's counters move every tick; here they move in steps, and a
# reader whose two files straddle a step sees one interval's share of a process in one and not in the other
# (at a 0.5 s sample interval, a step of 0.1 s read an app's own run as a fifth smaller than its load).
PROC_EVERY_S = 0.05


async def run_scenario(scenario: Scenario, *, emit: Emit, broker: str | None = None, speed: float = 1.0,
                       calibration_from: Path, status_every_s: float = 1.0) -> Outcome:
    """Run the scenario against the real agent; `emit` gets each timeline record as it happens."""

    if not speed > 0:
        raise BadInput(f"--speed must be positive, not {speed}")
    with tempfile.TemporaryDirectory(prefix="daop-sim-") as tmp_name:
        tmp = Path(tmp_name)
        device = SimulatedDevice(tmp / "device", scenario)
        private = None
        agent_task: asyncio.Task[int] | None = None
        agent: Agent | None = None
        try:
            state_dir = tmp / "state"
            state_dir.mkdir(mode=0o700)
            bench = await asyncio.to_thread(simulated_probe)
            # measured on the device at rest, before its [initial] load starts
            reference, device_scales = await asyncio.to_thread(prepare_state_dir, state_dir, calibration_from, bench,
                                                               scenario, device)
            device.app_speed = device_scales.apps
            device.apply(scenario.initial)
            if broker is None:
                private = LocalBroker(tmp, free_port())
                private.start()
                broker = private.url
            parse_broker_url(broker)
            config_path = tmp / "agent.toml"
            config_path.write_text(scenario.agent_config)
            device_id = "sim-" + "".join(ch if ch.isalnum() else "-" for ch in scenario.name.lower())[:40]
            cfg = load_config(config_path, {"broker": broker, "device_id": device_id, "state_dir": str(state_dir),
                                            "sysfs_root": str(device.sys), "procfs_root": str(device.proc),
                                            "sample_interval_s": scenario.sample_interval_s,
                                            "calibration": "quick"})
            if "privacy" not in tomllib.loads(scenario.agent_config):  # the device's own answers, unblurred
                cfg = replace(cfg, privacy=replace(cfg.privacy, enabled=False))
            refresh = SimulatedRefresh(device, reference, bench)
            agent = Agent(cfg, sampler=device.sampler(), measure=refresh.measure)
            agent_task = asyncio.get_running_loop().create_task(agent.run())
            deadline = time.monotonic() + 120
            while not agent.pool.ready:
                if agent_task.done():
                    raise BadInput(f"the agent stopped at start: {agent.pool.error or agent_task.result()}")
                if agent.pool.error:
                    raise BadInput(f"the agent's estimator cannot start: {agent.pool.error}")
                if time.monotonic() > deadline:
                    raise BadInput("the agent's estimator did not start within 120 s")
                await asyncio.sleep(0.05)
            emit({"kind": "start", "scenario": scenario.name, "device": scenario.device, "gpu": scenario.gpu,
                  "cores": device.cores, "broker": cfg.broker.url, "device_id": device_id,
                  "duration_s": scenario.duration_s / speed, **_speed_record(scenario, device_scales)})
            return await _drive(scenario, device, DaopClient(broker, device_id, timeout_s=60), emit, speed,
                                status_every_s, agent, agent_task)
        finally:
            if agent is not None:
                agent.request_stop()
            if agent_task is not None:
                try:
                    await asyncio.wait_for(agent_task, 15)
                except Exception:  # noqa: BLE001 - stopping; the run's outcome stands
                    agent_task.cancel()
            device.close()
            if private is not None:
                private.stop()
            elif agent is not None:
                await _clear_status(cfg.broker, agent.topics.status)


async def _drive(scenario: Scenario, device: SimulatedDevice, daop: DaopClient, emit: Emit, speed: float,
                 status_every_s: float, agent: Agent, agent_task: asyncio.Task[int]) -> Outcome:
    loop = asyncio.get_running_loop()
    timeline = Timeline()
    observer = device.sampler()
    await asyncio.to_thread(observer.sample)  # the first sample has no load delta
    tiers: dict[str, str] = {}
    monitors: dict[str, Monitor] = {}
    running: dict[int, AppProcess] = {}  # by the index of its [[apps]] entry
    background: set[asyncio.Task[Any]] = set()

    async with daop:
        t0 = loop.time()
        now = lambda: loop.time() - t0  # noqa: E731

        async def follow(monitor: Monitor) -> None:
            async for event in monitor:
                t = now()
                timeline.events.setdefault(event.monitor, []).append((t, event.meets, event.seq))
                emit({"kind": "event", "t": round(t, 2), "monitor": event.monitor, "meetsRequirement": event.meets,
                      "seq": event.seq, **({"workloads": event.workloads} if event.workloads else {})})

        async def poll_tiers() -> None:
            for spec in scenario.monitors:
                if spec.id in timeline.created and not spec.group:
                    w = spec.workloads[0]
                    try:
                        tiers[spec.id] = await daop.estimate(w.model, w.inputs)
                    except DaopError as exc:
                        tiers[spec.id] = f"error ({exc})"

        async def ticker() -> None:
            while True:
                await asyncio.to_thread(device.update_proc)
                await asyncio.sleep(PROC_EVERY_S)

        def spawn(coro: Any) -> asyncio.Task[Any]:
            task = loop.create_task(coro)
            background.add(task)
            task.add_done_callback(background.discard)
            return task

        async def collect() -> None:
            """Each second: what the apps measured, into the timeline, and to the agent where they report."""
            while True:
                await asyncio.sleep(1.0 / speed)
                for i, app in list(running.items()):
                    spec = scenario.apps[i]
                    runs = app.take()
                    timeline.runs.setdefault(spec.monitor, []).append((now(), runs))
                    if spec.report and spec.monitor in monitors:
                        for name, values in runs.items():
                            if values:
                                await monitors[spec.monitor].report(values, workload=name or None)

        spawn(ticker())
        spawn(collect())
        plan: list[tuple[float, int, int]] = [(m.at / speed, 0, i) for i, m in enumerate(scenario.monitors)]
        plan += [(s.t / speed, 1, i) for i, s in enumerate(scenario.steps)]
        plan += [(a.start / speed, 2, i) for i, a in enumerate(scenario.apps)]
        plan += [(a.stop / speed, 3, i) for i, a in enumerate(scenario.apps)]
        plan.sort()
        end = scenario.duration_s / speed
        next_status = 0.0
        tier_task: asyncio.Task[None] | None = None
        i = 0
        while True:
            if agent_task.done():
                raise BadInput("the agent stopped during the scenario")
            t = now()
            while i < len(plan) and plan[i][0] <= t:
                _, kind, k = plan[i]
                i += 1
                if kind == 0:
                    spec = scenario.monitors[k]
                    m = await _register(daop, spec)
                    monitors[spec.id] = m
                    timeline.created.setdefault(spec.id, []).append((now(), m.meets))
                    emit({"kind": "monitor", "t": round(now(), 2), "monitor": spec.id, "required": spec.describe(),
                          "meetsRequirement": m.meets, **({"workloads": m.workloads} if m.workloads else {})})
                    spawn(follow(m))
                elif kind == 1:
                    step = scenario.steps[k]
                    await asyncio.to_thread(device.apply, step.conditions)
                    emit({"kind": "step", "t": round(now(), 2), "set": step.conditions, "note": step.note})
                elif kind == 2:
                    running[k] = await _start_app(scenario, k, device, monitors)
                    emit({"kind": "app", "t": round(now(), 2), "monitor": scenario.apps[k].monitor, "started": True,
                          "rates": scenario.apps[k].rates})
                elif k in running:
                    await _stop_app(scenario, k, running.pop(k), device, monitors)
                    emit({"kind": "app", "t": round(now(), 2), "monitor": scenario.apps[k].monitor, "started": False})
            if t >= next_status:
                state = await asyncio.to_thread(observer.sample)
                sp = speed_from_state(state, device.cores)
                emit({"kind": "status", "t": round(now(), 2), "sees": _seen(state), "predicted_slowdown":
                      round(sp.cpu, 2), "agent_slowdown": round(agent.speed.speed.cpu, 2), "reasons": list(sp.reasons),
                      "tiers": dict(tiers), "apps": {m: runs[-1][1] for m, runs in timeline.runs.items() if runs},
                      "estimates_ms": agent.book.estimates_ms(),
                      "monitor_slowdown": _monitor_slowdowns(agent), "measured": _measured(agent),
                      "meets": {m: timeline.value_at(m, now()) for m in timeline.created}})
                if tier_task is None or tier_task.done():
                    tier_task = spawn(poll_tiers())
                next_status += status_every_s
            if t >= end:
                break
            upcoming = min([end, next_status] + ([plan[i][0]] if i < len(plan) else []))
            await asyncio.sleep(max(0.0, min(0.5, upcoming - now())))
        await asyncio.sleep(0.2)  # events already on their way
        for k, app in list(running.items()):
            await _stop_app(scenario, k, app, device, monitors)
        for task in list(background):
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for monitor in timeline.created:  # leave no retained state behind on a shared broker
            try:
                await daop.delete_monitor(monitor)
            except DaopError:
                pass
    observer.close()
    results = []
    for e in scenario.expectations:
        ok, seen = check(e, timeline, speed, scenario)
        results.append((e, ok, seen))
        emit({"kind": "expect", "expectation": e.describe(speed), "passed": ok, "seen": seen})
    outcome = Outcome(results, timeline)
    emit({"kind": "result", "passed": outcome.passed,
          "failed": sum(1 for _, ok, _ in results if not ok), "total": len(results)})
    return outcome


def _monitor_slowdowns(agent: Agent) -> dict[str, float]:
    """The CPU slowdown each monitor is priced at (an app's own run left out of its own monitor's)."""
    table = agent.book.table
    return {monitor: round(table.speed_of(monitor).cpu, 2) for monitor in agent.book.records}


def _measured(agent: Agent) -> dict[str, float | None] | None:
    """The latest warm refresh's reading and the prediction of the state it was taken in."""
    m = agent.speed.measurement
    if m is None:
        return None
    return {"slowdown": None if m.slowdown is None else round(m.slowdown, 2), "predicted": round(m.predicted, 2)}


def _speed_record(scenario: Scenario, s: Scales) -> dict[str, Any]:
    """The start record's account of the device's speed against the host's (local output: figures)."""
    if scenario.speed is None:
        return {"speed": None}
    ref = scenario.speed
    return {"speed": {"reference": ref.model.name, "inputs": {k: "x".join(map(str, v.shape)) for k, v in
                                                              ref.inputs.items()},
                      "at_rest_ms": ref.at_rest_ms, "host_estimate_ms": round(s.host_estimate_ms or 0.0, 2),
                      "calibration_scale": round(s.calibration, 3),
                      **({"host_run_ms": round(s.host_run_ms, 2), "apps_scale": round(s.apps, 3)}
                         if s.host_run_ms else {})}}


async def _register(daop: DaopClient, spec: MonitorSpec) -> Monitor:
    if not spec.group:
        w = spec.workloads[0]
        r = w.requirement
        return await daop.create_monitor(w.model, r.tier, spec.id, w.inputs, rate=r.rate_hz, deadline_ms=r.deadline)
    return await daop.create_group([Member(w.name, w.model, w.inputs, w.requirement.tier, w.requirement.rate_hz,
                                           w.requirement.deadline) for w in spec.workloads], spec.id)


async def _start_app(scenario: Scenario, k: int, device: SimulatedDevice, monitors: dict[str, Monitor]) -> AppProcess:
    """The [[apps]] entry's real process; it tells the agent it runs the monitor's workloads (with its pid)."""
    spec = scenario.apps[k]
    monitor = next(m for m in scenario.monitors if m.id == spec.monitor)
    workloads = [Workload(w.name, w.model, w.inputs, spec.rates[w.name]) for w in monitor.workloads]
    device.hidden_slowdown = spec.hidden_slowdown
    device.update_scale()
    app = AppProcess(workloads, device.scale_file, device.cpus)
    device.start_app(app)  # its process is on the device (under /proc) from now: the agent can look it up
    if spec.declare and spec.monitor in monitors:
        rate = spec.rates[""] if list(spec.rates) == [""] else None
        await monitors[spec.monitor].running(rate_hz=rate, pid=app.pid)
    await asyncio.to_thread(app.go)
    return app


async def _stop_app(scenario: Scenario, k: int, app: AppProcess, device: SimulatedDevice,
                    monitors: dict[str, Monitor]) -> None:
    spec = scenario.apps[k]
    await asyncio.to_thread(device.stop_app, app)  # it stops running, then says so (as it said it ran first)
    if spec.declare and spec.monitor in monitors:
        try:
            await monitors[spec.monitor].stopped()
        except DaopError:
            pass
    device.hidden_slowdown = 1.0
    device.update_scale()


async def _clear_status(broker: Any, topic: str) -> None:
    """The simulated agent's retained status removed from a shared broker (best effort)."""
    try:
        async with aiomqtt.Client(broker.host, broker.port, username=broker.username, password=broker.password,
                                  timeout=5) as c:
            await c.publish(topic, b"", qos=1, retain=True)
    except (aiomqtt.MqttError, OSError):
        pass


