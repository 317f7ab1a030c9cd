"""`daop-agent run`: the long-running service, its lifecycle and its own tasks.

One asyncio TaskGroup holds them:

- sampling: the device state every sample interval (the Sampler runs in a thread of its own, agent/sampling.py:
  NVML or a battery read may block), turned into the present speed (monitors/speed/present.py);
- warm refresh: a few micro-benchmarks when the present speed says one is due, in a process of its own
  (onnxruntime never stays in the agent's memory);
- evaluation: one tick of every monitor on each new state (monitors/tick.py: each workload class's speed, then
  every answer, vectorised), stored and sent by the registry (agent/registry.py), except the states inside the
  band the last evaluation left, where no answer can move (monitors/steady.py);
- the estimator: calibration the first time (in a process of its own), then graph import and pricing in
  worker processes with a time limit, started by a request and gone after a quiet period (agent/analysis.py);
- MQTT (agent/mqtt_link.py), with requests handled by agent/requests.py;
- the systemd watchdog, fed from the event loop itself.

Nothing here blocks the loop: files are written in threads, graphs are priced in processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable

import aiomqtt

from agent import heap
from agent.analysis import AnalysisPool
from agent.cli import version
from agent.config import Config
from agent.homeassistant import HomeAssistant
from agent.metrics import Metrics
from agent.mqtt_link import MqttLink, max_packet_bytes
from agent.notify import Notifier, watchdog_interval_s
from agent.policy import PolicyGate, PowerFacts
from agent.registry import MonitorRegistry
from agent.requests import RequestHandler
from agent.sampling import Sampled, SamplingThread
from agent.topics import Outgoing, Topics, online
from monitors.speed.present import PresentSpeed
from monitors.speed.refresh_policy import REFRESH_BACKOFF, RefreshPolicy
from monitors.steady import Steady, band
from probes import refresh
from probes.state import TICKS_PER_SAMPLE, DeviceState, Sampler

log = logging.getLogger("daop-agent")

MIN_TICK_S, MAX_TICK_S = 0.02, 0.25  # run-queue snapshots: at most 50 and at least 4 per second
STREAM_SHARE = 0.1  # a monitor whose streamed time is this share of its latency has the refresh read memory's speed
STOP_GRACE_S = 5.0  # for the link to say offline and disconnect
STOP_DUMP_S = 8.0  # a stop still under way this long after SIGTERM dumps every thread's stack
STARTUP_HOLD_MAX_S = 15.0  # stored monitors keep their answers at most this long after a start without a full reading
REFRESH_GRAPHS_DIR = "refresh-graphs"  # in the state dir: the warm refresh's probe graphs (refresh.GraphCache)


class Agent:
    """The agent of one device. `sampler` and `measure` (a warm refresh: probe seconds, in a thread) stand in
    for the device's own in the simulation and the tests; without `measure`, each refresh runs in a process of its
    own (refresh.measured_apart)."""

    def __init__(self, cfg: Config, *, sampler: Sampler | None = None, notifier: Notifier | None = None,
                 measure: Callable[[bool], dict[str, float]] | None = None) -> None:
        self.cfg = cfg
        self._tick_s = min(MAX_TICK_S, max(MIN_TICK_S, cfg.sample_interval_s / TICKS_PER_SAMPLE))  # run-queue snapshots
        self.topics = Topics(cfg.base_topic)
        self.notifier = notifier or Notifier()
        self.pool = AnalysisPool(cfg.state_dir, cfg.estimate_workers, cfg.limits.estimate_timeout_s,
                                 quick=cfg.calibration == "quick", memory_mb=cfg.limits.worker_memory_mb,
                                 idle_s=cfg.estimate_idle_s)
        self.policy = PolicyGate(cfg.policy)
        self.speed = PresentSpeed(refresh.default_threads())  # onnxruntime's intra-op threads
        self.homeassistant = HomeAssistant(cfg.homeassistant, cfg.device_id, self.topics, version()) \
            if cfg.homeassistant.enabled else None
        self.registry = MonitorRegistry(cfg.state_dir, cfg.rules, cfg.limits.max_monitors, self.topics,
                                        self._send, str(cfg.procfs_root), cfg.limits.max_monitors_per_owner,
                                        on_storage=self._storage_changed, on_running=self._track,
                                        on_change=self._unsteady)
        self.book = self.registry.book  # the monitors in memory, and their table of answers
        self.link = MqttLink(cfg.brokers, cfg.client_id, self.topics, self.notifier, retained=self._retained,
                             on_request=self._on_request, monitors=self.registry.__len__,
                             subscriptions=(self.topics.owner_requests,
                                            *((cfg.homeassistant.status_topic,) if self.homeassistant else ())),
                             on_message=self._on_message, max_packet=max_packet_bytes(cfg.limits.max_request_bytes))
        self.metrics = Metrics(cfg.metrics, self.book, self.pool, self.link.connected, cfg.state_dir) \
            if cfg.metrics.port else None
        self.requests = RequestHandler(cfg, self.topics, self.registry, self.pool, self.speed, self.policy,
                                       self.link.answer,
                                       observe=self.metrics.answered if self.metrics is not None else None)
        self._sampler = sampler
        self._sampling: SamplingThread | None = None
        self._evaluating = 0  # the number of the sample the next evaluation prices (Sampled.number)
        self._changes = 0  # the monitors' changes outside a tick so far (MonitorRegistry.on_change)
        self._measure = measure
        self._reference: dict[str, float] = {}  # the calibration's reading of the quiet device
        self._state_seen = asyncio.Event()
        self._sampled = asyncio.Event()  # set at each sample handled (a refresh's process waits for one)
        self._refresh_due = asyncio.Event()
        self._reasons: tuple[str, ...] = ()
        self._stop = asyncio.Event()
        self._refresh_on: bool | None = None  # whether warm refresh runs (None: not known yet)
        self._holding = True  # the stored monitors keep their answers (MonitorTable.hold) until a full reading
        self._started_at = time.monotonic()

    def request_stop(self) -> None:
        self._stop.set()

    def _retained(self) -> list[Outgoing]:
        retained = self.registry.retained()
        return self.homeassistant.announce(retained) + retained if self.homeassistant else retained

    def _send(self, *messages: Outgoing) -> None:
        """The registry's messages to the broker, with what the integrations add to them or learn from them."""
        out = self.homeassistant.follow(messages) if self.homeassistant else list(messages)
        if self.metrics is not None:
            self.metrics.sent(out)
        self.link.send(*out)

    def _on_message(self, message: aiomqtt.Message) -> None:
        scoped = self.topics.owner_request(message.topic.value)
        if scoped is not None:  # a request under an owner's scope (agent/topics.py)
            owner, method = scoped
            self.requests.receive(method, message, owner)
            return
        payload = message.payload if isinstance(message.payload, bytes) else b""
        if self.homeassistant is not None and self.homeassistant.asks_again(message.topic.value, payload):
            log.info("Home Assistant is back: monitors announced again")
            self.link.send(*self.homeassistant.announce(self.registry.retained()))

    def _storage_changed(self, why: str | None) -> None:
        """The status says whether the agent can save its state (it serves either way)."""
        self.link.set_online(online(why is None))
        self.notifier.status(f"storage failing: {why}; {len(self.registry)} monitor(s)" if why else
                             f"storage works again; {len(self.registry)} monitor(s)")

    def _unsteady(self) -> None:
        """The monitors changed: the next sample is evaluated, whatever the band says."""
        self._changes += 1
        if self._sampling is not None:
            self._sampling.steady = None

    async def _track(self, pids: frozenset[int]) -> None:
        """An app that says it runs a monitored workload is read at once (Sampler.track), not at the next sample:
        its start-up is then measured as its own."""
        if self._sampler is not None:
            await asyncio.to_thread(self._sampler.track, pids)

    def _on_request(self, method: str, message: aiomqtt.Message) -> None:
        self.requests.receive(method, message)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        heap.bound()  # large requests' memory goes back to the system when they are done (agent/heap.py)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        self._started_at = time.monotonic()
        await asyncio.to_thread(self.registry.load)
        self.link.send(*self.registry.cleared_corrupt(), *self.registry.last_events())
        sampler = self._sampler
        if sampler is None:
            sampler = self._sampler = await asyncio.to_thread(Sampler, self.cfg.sysfs_root, self.cfg.procfs_root)
        self._start_metrics()
        self.notifier.ready(f"started: {len(self.registry)} monitor(s); connecting to {self.cfg.broker.url}")
        log.info("agent %s started; broker %s; state in %s", self.cfg.device_id, self.cfg.broker.url,
                 self.cfg.state_dir)
        try:
            async with asyncio.TaskGroup() as tg:
                background = [tg.create_task(coro) for coro in (
                    self._engine_task(), self._sample_task(sampler), self._refresh_task(),
                    self._evaluate_task(), self._watchdog_task())]
                mqtt = tg.create_task(self.link.run(self._stop))
                await self._stop.wait()
                self.notifier.stopping()
                log.info("stopping")
                # a stop that hangs says where: every thread's stack in the log (stderr), before systemd's
                # TimeoutStopSec (15 s) kills the agent
                faulthandler.dump_traceback_later(STOP_DUMP_S, exit=False)
                try:
                    await asyncio.wait_for(asyncio.shield(mqtt), STOP_GRACE_S)
                except TimeoutError:
                    mqtt.cancel()
                for task in background + list(self.requests.tasks):
                    task.cancel()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            self.pool.close()
            if self.metrics is not None:
                self.metrics.close()
            sampler.close()
            await self.registry.close()
            self.notifier.close()
            faulthandler.cancel_dump_traceback_later()
        return 0

    def _start_metrics(self) -> None:
        if self.metrics is None:
            return
        s = self.cfg.metrics
        try:
            self.metrics.start()
        except OSError as exc:  # a taken port: the agent serves its monitors all the same
            log.error("metrics: cannot serve on %s:%d: %s", s.address, s.port, exc.strerror or exc)
            return
        log.info("metrics on http://%s:%d/metrics%s", s.address, s.port,
                 " (with the device's state)" if s.device_state else "")

    # -- the estimator --------------------------------------------------------------------------------------------

    async def _engine_task(self) -> None:
        try:
            await self.pool.start()
        except Exception:  # noqa: BLE001 - keep serving monitors, answer requests with an error (pool.error)
            log.error("the estimator cannot start: %s", self.pool.error)
            self.notifier.status(f"estimator unavailable: {self.pool.error}")
            return
        log.info("estimator ready (devices: %s)", ", ".join(self.pool.devices))
        self._start_refresh()
        await self._rebase()
        if self.cfg.calibration == "full":
            await self._calibrate_in_full()

    async def _calibrate_in_full(self) -> None:
        """A quick calibration (left by `daop-agent estimate`) serves until a full one replaces it. Meanwhile
        (about a minute of every core) the present speed holds: that work is the agent's own."""
        try:
            redone = await self.pool.calibrate_in_full()
        except Exception as exc:  # noqa: BLE001 - the quick calibration goes on serving
            log.warning("full calibration failed, the quick one stays: %s", exc)
            return
        if redone:
            log.info("full calibration ready (%s): monitors re-priced", ", ".join(redone))
            self.speed.forget_measurement()  # measured against the quick calibration's reference
            self._start_refresh()
            await self._rebase()

    async def _rebase(self) -> None:
        await self.registry.rebase(self.pool.rebase)
        self._state_seen.set()

    # -- the present speed ----------------------------------------------------------------------------------------

    def _start_refresh(self) -> None:
        reference = self.pool.facts.refresh_reference  # read in the calibration's process (agent/analysis.py)
        if not reference:
            log.info("warm refresh off: the calibration has no reference measurement")
            self._refresh_on = False
            return
        self._refresh_on = True
        self._reference = dict(reference)
        self.speed.policy = RefreshPolicy(period_s=self.cfg.refresh_interval_s,
                                          max_period_s=REFRESH_BACKOFF * self.cfg.refresh_interval_s)

    async def _refresh_task(self) -> None:
        """Warm refresh when the present speed says one is due, beside sampling (a refresh under load is slow).
        A refresh that overlapped the agent's own work (a calibration, a graph priced in the workers) read
        that work, not the device's load: dropped."""
        while True:
            await self._refresh_due.wait()
            self._refresh_due.clear()
            started = time.monotonic()
            cpu0 = time.process_time()
            marker = self.pool.work_marker
            # the stream probe only while a monitor's model streams (its buffer is dropped when not asked for)
            stream = refresh.STREAM_KEY in self._reference and self.book.table.streams(STREAM_SHARE)
            try:
                async with self._measured(stream, cpu0) as (result, cpu_s):
                    if self.pool.busy or self.pool.work_marker != marker:
                        log.debug("warm refresh dropped: it overlapped the agent's own work")
                        self.speed.refresh_failed(started)
                        continue
                    slowdown = refresh.slowdown(result, self._reference)
                    self.speed.refreshed(slowdown, refresh.handoff_ms_per_mb(result, self._reference), started,
                                         cpu_s, refresh.memory_slowdown(result, self._reference),
                                         refresh.gemm_slowdown(result, self._reference))
                    log.debug("warm refresh: %s slower than calibrated, %.2f s of CPU",
                              "unknown" if slowdown is None else f"{slowdown:.2f}x", cpu_s)
                    await self._sampled_again()  # pairs the reading; the sampler reads the probe's threads
            except Exception as exc:  # noqa: BLE001 - a failed probe is a missing reading, not a crash
                log.warning("warm refresh failed: %s", exc)
                if self.metrics is not None:
                    self.metrics.probe_errors.labels("refresh").inc()
                self.speed.refresh_failed(started)

    @contextlib.asynccontextmanager
    async def _measured(self, stream: bool, cpu0: float) -> AsyncIterator[tuple[dict[str, float], float]]:
        """One refresh's measurement and its CPU seconds: in a process of its own, which stays until the block
        ends; or the stand-in `measure`, in a thread."""
        if self._measure is None:
            async with refresh.measured_apart(stream, graphs=self.cfg.state_dir / REFRESH_GRAPHS_DIR) as measured:
                yield measured
        else:
            result = await asyncio.to_thread(self._measure, stream)
            yield result, time.process_time() - cpu0

    async def _sampled_again(self) -> None:
        """Until the next sample has been handled (at most two intervals: sampling may be failing)."""
        self._sampled.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._sampled.wait(), 2 * self.cfg.sample_interval_s + 1.0)

    async def _sample_task(self, sampler: Sampler) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        newest: list[Sampled] = []  # a loop that fell behind goes on from the newest sample

        def arrived(sampled: Sampled) -> None:
            newest[:] = [sampled]
            ready.set()

        def hand_over(sampled: Sampled) -> None:  # in the sampler's thread
            loop.call_soon_threadsafe(arrived, sampled)

        thread = self._sampling = SamplingThread(sampler, self.cfg.sample_interval_s, self._tick_s,
                                                 hand_over).start()
        try:
            await self._on_samples(sampler, ready, newest)
        finally:
            thread.stop()

    async def _on_samples(self, sampler: Sampler, ready: asyncio.Event, newest: list[Sampled]) -> None:
        """Each sample, as the sampler's thread hands it over: the present speed, the apps' runs, the policy."""
        veto_logged: str | None = None
        while True:
            await ready.wait()
            ready.clear()
            sampled = newest[0]
            started, state = sampled.started, sampled.state
            if state is None:
                log.warning("sampling failed: %s", sampled.error)
                if self.metrics is not None:
                    self.metrics.probe_errors.labels("sample").inc()
                continue
            own_work = self.pool.own_work_since(sampled.since)
            speed = self.speed.observe(state, started, own_work)
            if self.metrics is not None:
                self.metrics.sampled(state, speed.cpu)
            await self.registry.end_gone_runs()
            await self.registry.expire(time.monotonic())
            sampler.track(self.book.running_pids())
            if self.speed.start_refresh(started, own_work or self.pool.busy):
                self._refresh_due.set()
            veto = self.policy.veto(power_facts(state))
            self._release_hold(started)
            if veto != veto_logged:
                log.info("policy: %s", f"nothing runs locally ({veto})" if veto else "lifted")
                veto_logged = veto
            if speed.reasons != self._reasons:
                self._reasons = speed.reasons
                log.debug("speed cpu %.2fx gpu %s: %s", speed.cpu, speed.gpu, "; ".join(speed.reasons) or "quiet")
            self._evaluating = sampled.number
            self._state_seen.set()
            self._sampled.set()

    def _release_hold(self, now: float) -> None:
        """The stored monitors follow the present speed again once it has a full reading (or after
        STARTUP_HOLD_MAX_S without one, or when the estimator cannot start). A policy veto (a power-saver
        profile, a low battery) is a reading of the device's own state, not a partial one: it releases them."""
        if not self._holding:
            return
        full = self._refresh_on is not None and self.speed.full_reading(self._refresh_on)
        if full or self.policy.vetoed is not None or self.pool.error is not None or \
                now - self._started_at >= STARTUP_HOLD_MAX_S:
            self._holding = False
            self.book.table.release()
            log.info("monitors follow the present speed (%s)", "a full reading" if full else "no full reading")

    async def _evaluate_task(self) -> None:
        while True:
            await self._state_seen.wait()
            self._state_seen.clear()
            number, changes = self._evaluating, self._changes
            await self.registry.evaluate(time.monotonic(), self.speed, self.policy.vetoed is not None)
            # no band from an evaluation that a newer state or a change of the monitors overtook
            if self._sampling is not None and not self._state_seen.is_set() and self._changes == changes:
                self._sampling.steady = self._band(number)

    def _band(self, number: int) -> Steady | None:
        """The band of states the evaluation of sample `number` leaves unchanged (monitors/steady.py), or None
        while something else may move an answer: the stored monitors held, saving failing (retried every tick),
        the agent's own work or a warm refresh under way."""
        present = self.speed
        if self._holding or self.registry.storage_error is not None or self.pool.busy or present.refreshing \
                or present.priced is None or present.held:
            return None
        return band(self.book.table, present.priced, present.speed, number, time.monotonic(),
                    self.cfg.sample_interval_s, self.book.next_expiry(), threads=present.threads,
                    measurement=present.measurement, current=present.measurement_current, policy=present.policy,
                    veto=self.policy.vetoed is not None)

    async def _watchdog_task(self) -> None:
        interval = watchdog_interval_s()
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)


def power_facts(state: DeviceState) -> PowerFacts:
    """What the policy needs from a DeviceState: battery level, on battery or not, power profile."""
    b = state.battery
    on_battery = None if b.plugged is None else bool(b.present and not b.plugged)
    return PowerFacts(b.percent, on_battery, state.power_mode)


async def run_agent(cfg: Config) -> int:
    """`daop-agent run`'s agent. The process exits after it: an exit that hangs (threads joined, workers reaped)
    dumps every thread's stack too."""
    code = await Agent(cfg).run()
    faulthandler.dump_traceback_later(STOP_DUMP_S, exit=False)
    return code
