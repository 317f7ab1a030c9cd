"""`daop-agent run`: the long-running service.

One asyncio TaskGroup holds the agent's tasks:

- sampling: the device state every sample interval (the Sampler runs in a
  thread: NVML or a battery read may block), turned into a present speed;
- warm refresh: a few micro-benchmarks when due (RefreshPolicy), in a thread;
- evaluation: every monitor re-evaluated on each new state (vectorised);
- MQTT: connection with reconnect and backoff; on each connect the retained
  status and every monitor's retained state are published again (a broker
  restarted without persistence gets them back);
- estimator start (calibration the first time) and request handling: graph
  import and planning in worker processes with a time limit;
- the systemd watchdog, fed from the event loop itself.

Nothing here blocks the loop: files are written in threads, graphs are
planned in processes. Monitors are written to disk before a request is
answered and before an event is published.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import secrets
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import aiomqtt
import numpy as np
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.analysis import Analysis, AnalysisPool, EngineError
from agent.config import Config
from agent.notify import Notifier, watchdog_interval_s
from agent.policy import PolicyGate, PowerFacts
from agent.protocol import Request, error, ok, parse_request, transaction_of
from agent.store import MonitorStore, StoredMonitor
from monitors.errors import BadInput
from monitors.monitor import DEVICE_INDEX, MonitorTable, initial_meets
from monitors.tiers import bound_ms, tier_for
from probes.refresh import default_threads
from probes.state import TICKS_PER_SAMPLE

log = logging.getLogger("daop-agent")

ONLINE = json.dumps({"state": "online"}).encode()
OFFLINE = json.dumps({"state": "offline"}).encode()
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 15.0
MAX_OUTBOX = 200_000          # messages kept while the broker is away (oldest dropped beyond)
PUBLISH_BATCH = 256
MAX_CONCURRENT_REQUESTS = 64
MAX_PENDING_REQUESTS = 2000   # beyond this many requests in hand, answer 'busy' at once
CALIBRATION_WAIT_S = 180.0
MIN_TICK_S, MAX_TICK_S = 0.02, 0.25  # run-queue snapshots: at most 50 and at least 4 per second


@dataclass(frozen=True)
class Outgoing:
    topic: str
    payload: bytes
    retain: bool
    qos: int = 1


class _CleanStop(Exception):
    """Raised inside the connection when the agent stops on purpose."""


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Agent:
    def __init__(self, cfg: Config, *, sampler: Any = None, notifier: Notifier | None = None,
                 measure: Any = None) -> None:
        self.cfg = cfg
        self.base = cfg.base_topic
        self.store = MonitorStore(cfg.state_dir)
        self.table = MonitorTable(cfg.rules)
        self.records: dict[str, StoredMonitor] = {}
        self.pool = AnalysisPool(cfg.state_dir, cfg.estimate_workers, cfg.limits.estimate_timeout_s,
                                 quick=cfg.calibration == "quick")
        self.policy = PolicyGate(cfg.policy)
        self.notifier = notifier or Notifier()
        self._sampler = sampler
        self._measure = measure  # warm refresh: () -> dict of probe seconds (probes.refresh.measure)
        self._reference: dict[str, float] | None = None
        self._refresh_policy: Any = None
        self._measured: float | None = None
        self._measured_predicted: float | None = None  # the prediction when _measured was taken
        self._measured_contention = 1.0  # ... and its share from time slicing (monitors.speed.cpu_contention)
        self._handoff: float | None = None  # the latest warm refresh's handoff extra, ms per MB written
        self._refresh_busy = False  # a warm refresh is due, running, or its measurement not yet taken
        # slowdown, handoff extra, at, CPU s
        self._pending_measurement: tuple[float | None, float | None, float, float] | None = None
        self._cores = default_threads()  # onnxruntime's intra-op threads
        self._factors = np.array([1.0, math.inf])
        self._handoffs = np.zeros(2)  # ms per MB written, by device (the GPU's: none measured)
        self._gpu_free: float | None = None
        self._veto: str | None = None
        self._state_seen = asyncio.Event()
        self._refresh_due = asyncio.Event()
        self._last_state: Any = None
        self._reasons: tuple[str, ...] = ()
        self._outbox: collections.deque[Outgoing] = collections.deque()
        self._outbox_ready = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._stop = asyncio.Event()
        self._mutate = asyncio.Lock()   # table + disk + outbox change together, in seq order
        self._requests = asyncio.Semaphore(MAX_CONCURRENT_REQUESTS)
        self._handlers: set[asyncio.Task[None]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self.engine_error: str | None = None

    # -- topics ---------------------------------------------------------------------

    def topic(self, suffix: str) -> str:
        return self.base + suffix

    def _state_message(self, monitor: str) -> Outgoing:
        rec = self.records[monitor]
        body = {"monitor": monitor, "requiredTier": rec.required_tier, "meetsRequirement": rec.meets, "seq": rec.seq}
        return Outgoing(self.topic(f"monitors/{monitor}/state"), json.dumps(body).encode(), retain=True)

    def _event_message(self, monitor: str, meets: bool, seq: int) -> Outgoing:
        body = {"monitor": monitor, "meetsRequirement": meets, "seq": seq, "ts": utc_now()}
        return Outgoing(self.topic(f"monitors/{monitor}/events"), json.dumps(body).encode(), retain=False)

    def _send(self, *messages: Outgoing) -> None:
        self._outbox.extend(messages)
        while len(self._outbox) > MAX_OUTBOX:
            dropped = self._outbox.popleft()
            log.warning("broker away too long: dropped a queued message for %s", dropped.topic)
        self._outbox_ready.set()

    # -- start and stop ---------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def load_monitors(self) -> None:
        monitors, last_seq = self.store.load()
        for m in monitors:
            self.records[m.monitor] = m
            self.table.add(m.monitor, m.base_ms[m.device], m.device, bound_ms(m.required_tier), m.meets, m.seq,
                           m.memory_bytes, m.written_mb)
        self.table.last_seq = max(self.table.last_seq, last_seq)
        if monitors:
            log.info("loaded %d monitor(s) from %s", len(monitors), self.store.folder)

    def _resend_last_events(self) -> None:
        """Each monitor's last change event again, same seq: at least once, even across a SIGKILL.

        A change is stored before its event is published, so an agent killed
        while the broker was away (events queued in memory) would otherwise
        never send it. A subscriber that has it already sees a duplicate seq,
        as with any QoS 1 duplicate, and drops it.
        """
        for rec in self.records.values():
            if rec.seq > rec.created_seq >= 0:
                self._send(self._event_message(rec.monitor, rec.meets, rec.seq))

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await asyncio.to_thread(self.load_monitors)
        self._resend_last_events()
        if self._sampler is None:
            self._sampler = await asyncio.to_thread(_make_sampler, self.cfg)
        self.notifier.ready(f"started: {len(self.records)} monitor(s); connecting to {self.cfg.broker.url}")
        log.info("agent %s started; broker %s; state in %s", self.cfg.device_id, self.cfg.broker.url,
                 self.cfg.state_dir)
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                background = [tg.create_task(coro) for coro in (
                    self._engine_task(), self._sample_task(), self._tick_task(), self._refresh_task(),
                    self._evaluate_task(), self._watchdog_task())]
                mqtt = tg.create_task(self._mqtt_task())
                await self._stop.wait()
                self.notifier.stopping()
                log.info("stopping")
                try:
                    await asyncio.wait_for(asyncio.shield(mqtt), 5.0)
                except TimeoutError:
                    mqtt.cancel()
                for task in background + list(self._handlers):
                    task.cancel()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            self.pool.close()
            close = getattr(self._sampler, "close", None)
            if close is not None:
                close()
            self.notifier.close()
        return 0

    # -- estimator ----------------------------------------------------------------------

    async def _engine_task(self) -> None:
        try:
            await self.pool.start()
        except Exception as exc:  # noqa: BLE001 - keep serving monitors, answer requests with an error
            self.engine_error = f"{type(exc).__name__}: {exc}"
            log.error("the estimator cannot start: %s", self.engine_error)
            self.notifier.status(f"estimator unavailable: {self.engine_error}")
            return
        log.info("estimator ready (devices: %s)", ", ".join(self.pool.devices))
        await self._start_refresh()
        await self._rebase_all()
        if self.cfg.calibration == "full":
            await self._calibrate_in_full()

    async def _calibrate_in_full(self) -> None:
        """A quick calibration (left by `daop-agent estimate`) serves until a full one replaces it.
        The device is busy meanwhile (about a minute), and the monitors say so."""
        try:
            redone = await self.pool.calibrate_in_full()
        except Exception as exc:  # noqa: BLE001 - the quick calibration goes on serving
            log.warning("full calibration failed, the quick one stays: %s", exc)
            return
        if redone:
            log.info("full calibration ready (%s): monitors re-priced", ", ".join(redone))
            self._measured = self._handoff = None  # measured against the quick calibration's reference
            await self._start_refresh()
            await self._rebase_all()

    async def _rebase_all(self) -> None:
        """Stored plans priced again with the present calibration (it may have been redone)."""
        ids = list(self.records)
        for start in range(0, len(ids), 500):
            chunk = [i for i in ids[start:start + 500] if i in self.records]
            try:
                bases = await self.pool.rebase([self.records[i].plans for i in chunk])
            except (BadInput, EngineError) as exc:
                log.warning("could not re-price stored monitors: %s", exc)
                return
            for monitor, base in zip(chunk, bases):
                rec = self.records.get(monitor)
                if rec is not None and rec.device in base:
                    rec.base_ms = base
                    self.table.set_base(monitor, base[rec.device])
        self._state_seen.set()

    async def _start_refresh(self) -> None:
        try:
            from agent.calibration_store import load as load_calibration
            from probes.refresh import RefreshPolicy, measure
        except ImportError as exc:
            log.info("warm refresh unavailable: %s", exc)
            return
        cal = await asyncio.to_thread(load_calibration, self.cfg.state_dir, "cpu")
        if cal is None or not cal.refresh_reference:
            log.info("warm refresh off: the calibration has no reference measurement")
            return
        self._reference = dict(cal.refresh_reference)
        self._refresh_policy = RefreshPolicy(period_s=self.cfg.refresh_interval_s)
        if self._measure is None:
            self._measure = measure

    async def _refresh_task(self) -> None:
        """Warm refresh when RefreshPolicy says so, beside sampling (a refresh under load is slow)."""
        from probes.refresh import handoff_ms_per_mb, slowdown

        while True:
            await self._refresh_due.wait()
            self._refresh_due.clear()
            policy, state = self._refresh_policy, self._last_state
            if policy is None or state is None or self._measure is None:
                self._refresh_busy = False
                continue
            started = time.monotonic()
            cpu0 = time.process_time()
            try:
                result = await asyncio.to_thread(self._measure)
            except Exception as exc:  # noqa: BLE001 - a failed probe is a missing reading, not a crash
                log.warning("warm refresh failed: %s", exc)
                policy.refreshed(state, started, 0.05)
                self._refresh_busy = False
                continue
            reference = self._reference or {}
            self._pending_measurement = (slowdown(result, reference), handoff_ms_per_mb(result, reference), started,
                                         time.process_time() - cpu0)

    # -- sampling and evaluation ----------------------------------------------------------

    async def _sample_task(self) -> None:
        interval = self.cfg.sample_interval_s
        veto_logged: str | None = None
        while True:
            started = time.monotonic()
            try:
                state = await asyncio.to_thread(self._sampler.sample)
            except Exception as exc:  # noqa: BLE001 - a probe bug must not stop the monitors
                log.warning("sampling failed: %s", exc)
                await asyncio.sleep(interval)
                continue
            self._last_state = state
            policy = self._refresh_policy
            if policy is not None:
                if self._pending_measurement is not None:
                    self._take_measurement(state, *self._pending_measurement)
                policy.observe(state, started)
                if policy.due(started) and not self._refresh_busy:
                    self._refresh_busy = True  # until its measurement is taken: one refresh at a time
                    self._refresh_due.set()
            self._veto = self.policy.veto(power_facts(state))
            if self._veto != veto_logged:
                log.info("policy: %s", f"nothing runs locally ({self._veto})" if self._veto else "lifted")
                veto_logged = self._veto
            self._update_speed()
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, interval - elapsed))

    def _take_measurement(self, state: Any, measured: float | None, handoff: float | None, at: float,
                          cpu_s: float) -> None:
        """A warm refresh's slowdown, paired with the first sample taken after it: that sample's
        interval holds the refresh, so both describe the same load (the sample before it may
        predate a load that had just started or stopped)."""
        from monitors.speed import cpu_contention, predict_cpu

        self._pending_measurement = None
        self._refresh_busy = False
        self._refresh_policy.refreshed(state, at, cpu_s)
        self._measured, self._handoff = measured, handoff
        self._measured_predicted = predict_cpu(state, self._cores)[0]
        self._measured_contention = cpu_contention(state, self._cores)[0]

    async def _tick_task(self) -> None:
        """Run-queue snapshots between samples (Sampler.tick), TICKS_PER_SAMPLE per interval: on the
        loop, because one is a read of /proc/loadavg, far cheaper than a hop to a thread."""
        tick = getattr(self._sampler, "tick", None)
        if tick is None:
            return
        period = min(MAX_TICK_S, max(MIN_TICK_S, self.cfg.sample_interval_s / TICKS_PER_SAMPLE))
        while True:
            await asyncio.sleep(period)
            tick()

    def _update_speed(self) -> None:
        """The present speed from the latest state and measurement; wakes the evaluation."""
        from monitors.speed import speed_from_state

        state = self._last_state
        if state is None:
            return
        current = bool(self._refresh_policy and self._refresh_policy.measurement_current())
        speed = speed_from_state(state, self._measured, self._cores, measured_current=current,
                                 predicted_then=self._measured_predicted, contention_then=self._measured_contention,
                                 handoff_ms_per_mb=self._handoff)
        self._factors = np.array([speed.cpu, math.inf if speed.gpu is None else speed.gpu])
        self._handoffs = np.array([speed.handoff_ms_per_mb, 0.0])
        self._gpu_free = speed.gpu_free_bytes
        if speed.reasons != self._reasons:
            self._reasons = speed.reasons
            log.debug("speed cpu %.2fx gpu %s: %s", speed.cpu, speed.gpu, "; ".join(speed.reasons) or "quiet")
        self._state_seen.set()

    def present_latency(self, base_ms: dict[str, float], memory_bytes: int,
                        written_mb: float = 0.0) -> tuple[float, str]:
        """The fastest device's latency now, and that device (as MonitorTable.latencies prices it)."""
        best, best_device = math.inf, "cpu"
        for device, base in base_ms.items():
            factor = float(self._factors[DEVICE_INDEX[device]])
            if device == "gpu" and self._gpu_free is not None and memory_bytes > self._gpu_free:
                factor = math.inf
            latency = base * factor + written_mb * float(self._handoffs[DEVICE_INDEX[device]])
            if latency < best or (device == "cpu" and not math.isfinite(best)):
                best, best_device = latency, device
        return best, best_device

    async def _evaluate_task(self) -> None:
        while True:
            await self._state_seen.wait()
            self._state_seen.clear()
            await self.evaluate_once()

    async def evaluate_once(self) -> int:
        async with self._mutate:
            changes = self.table.evaluate(time.monotonic(), self._factors, self._veto is not None, self._gpu_free,
                                          self._handoffs)
            if not changes:
                return 0
            for c in changes:
                rec = self.records[c.monitor]
                rec.seq, rec.meets = c.seq, c.meets
            await self._persist_seq()
            for c in changes:
                self._send(self._event_message(c.monitor, c.meets, c.seq), self._state_message(c.monitor))
        log.debug("%d monitor(s) changed", len(changes))
        return len(changes)

    async def _persist_seq(self) -> None:
        await asyncio.to_thread(self.store.save_seq, self.table.last_seq, self.table.snapshot())

    # -- watchdog -------------------------------------------------------------------------

    async def _watchdog_task(self) -> None:
        interval = watchdog_interval_s()
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    # -- MQTT -----------------------------------------------------------------------------

    def _make_client(self) -> aiomqtt.Client:
        b = self.cfg.broker
        tls = None
        if b.tls:
            tls = aiomqtt.TLSParameters(ca_certs=b.ca_file, certfile=b.cert_file, keyfile=b.key_file)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 0  # requests sent while the agent was away are stale: not kept
        return aiomqtt.Client(
            b.host, b.port, username=b.username, password=b.password, identifier=self.cfg.client_id,
            protocol=aiomqtt.ProtocolVersion.V5, will=aiomqtt.Will(self.topic("status"), OFFLINE, qos=1, retain=True),
            keepalive=b.keepalive_s, clean_start=True, properties=props, tls_params=tls, timeout=10)

    async def _mqtt_task(self) -> None:
        delay = BACKOFF_MIN_S
        stopped = False
        while not self._stop.is_set() and not stopped:
            try:
                async with self._make_client() as client:
                    await self._on_connect(client)
                    delay = BACKOFF_MIN_S
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self._receive(client))
                        tg.create_task(self._publish_loop(client))
                        tg.create_task(self._stop_when_asked(client))
            except* _CleanStop:
                stopped = True
            except* (aiomqtt.MqttError, OSError) as group:
                self._lost_connection(group.exceptions[0], delay)
            finally:
                self._client = None
                self._connected.clear()
            if stopped:
                break
            try:
                await asyncio.wait_for(self._stop.wait(), delay * (0.8 + 0.4 * secrets.randbelow(1000) / 1000))
            except TimeoutError:
                pass
            delay = min(BACKOFF_MAX_S, delay * 2)

    def _lost_connection(self, exc: BaseException, delay: float) -> None:
        log.warning("broker %s: %s; retrying in about %.1f s", self.cfg.broker.url, exc or type(exc).__name__, delay)
        self.notifier.status(f"broker {self.cfg.broker.url} unreachable; {len(self.records)} monitor(s); retrying")

    async def _on_connect(self, client: aiomqtt.Client) -> None:
        # Subscribed before 'online': a client that waits for 'online' is never lost.
        await client.subscribe(self.topic("request/#"), qos=1)
        # Everything retained again: a broker restarted without persistence has lost it.
        states = [self._state_message(m) for m in list(self.records)]
        for start in range(0, len(states), PUBLISH_BATCH):
            await asyncio.gather(*(client.publish(s.topic, s.payload, qos=1, retain=True)
                                   for s in states[start:start + PUBLISH_BATCH]))
        await client.publish(self.topic("status"), ONLINE, qos=1, retain=True)
        self._client = client
        self._connected.set()
        log.info("connected to %s as %s; %d retained state(s) published", self.cfg.broker.url,
                 self.cfg.client_id, len(states))
        self.notifier.status(f"connected to {self.cfg.broker.url}; {len(self.records)} monitor(s)")

    async def _stop_when_asked(self, client: aiomqtt.Client) -> None:
        await self._stop.wait()
        try:
            await asyncio.wait_for(client.publish(self.topic("status"), OFFLINE, qos=1, retain=True), 3.0)
        except (aiomqtt.MqttError, TimeoutError) as exc:
            log.warning("could not publish offline status: %s", exc)
        raise _CleanStop

    async def _publish_loop(self, client: aiomqtt.Client) -> None:
        while True:
            await self._outbox_ready.wait()
            while self._outbox:
                batch = [self._outbox[i] for i in range(min(len(self._outbox), PUBLISH_BATCH))]
                await asyncio.gather(*(client.publish(m.topic, m.payload, qos=m.qos, retain=m.retain)
                                       for m in batch))
                for _ in batch:  # only once the broker has them; else they go again after reconnect
                    self._outbox.popleft()
            self._outbox_ready.clear()

    async def _receive(self, client: aiomqtt.Client) -> None:
        prefix = self.topic("request/")
        async for message in client.messages:
            topic = message.topic.value
            if not topic.startswith(prefix):
                continue
            method = topic[len(prefix):]
            if len(self._handlers) >= MAX_PENDING_REQUESTS:
                handler = self._busy(method, message)  # a flood: answer at once, keep nothing
            else:
                handler = self._handle(method, message)
            task = asyncio.get_running_loop().create_task(handler)
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    # -- requests -------------------------------------------------------------------------

    async def _handle(self, method: str, message: aiomqtt.Message) -> None:
        async with self._requests:
            payload = message.payload if isinstance(message.payload, bytes) else str(message.payload).encode()
            props = message.properties
            response_topic = getattr(props, "ResponseTopic", None) if props is not None else None
            correlation = getattr(props, "CorrelationData", None) if props is not None else None
            transaction = None
            try:
                request = parse_request(method, payload, self.cfg.limits.max_request_bytes)
                transaction = request.transaction
                answer = ok(await self.dispatch(request), transaction)
            except BadInput as exc:
                if transaction is None and len(payload) <= self.cfg.limits.max_request_bytes:
                    transaction = transaction_of(payload)
                answer = error(exc.code, str(exc), transaction)
            except EngineError as exc:
                answer = error("estimator_error", str(exc), transaction)
            except Exception:  # noqa: BLE001 - one bad request must not stop the others
                log.exception("request %s failed", method)
                answer = error("internal", "internal error; see the agent's log", transaction)
            await self._answer(method, answer, response_topic, correlation)

    async def _busy(self, method: str, message: aiomqtt.Message) -> None:
        props = message.properties
        payload = message.payload if isinstance(message.payload, bytes) else b""
        transaction = transaction_of(payload) if len(payload) <= 65536 else None
        await self._answer(method, error("busy", f"more than {MAX_PENDING_REQUESTS} requests pending; retry later",
                                         transaction),
                           getattr(props, "ResponseTopic", None) if props is not None else None,
                           getattr(props, "CorrelationData", None) if props is not None else None)

    def _answer_topic(self, method: str, response_topic: str | None) -> str:
        if response_topic:
            inside = response_topic.startswith(self.base)
            if "+" in response_topic or "#" in response_topic or "\0" in response_topic or (
                    inside and not response_topic.startswith(self.topic("response/"))):
                log.warning("ignoring ResponseTopic %r: answering on response/%s", response_topic, method)
            else:
                return response_topic
        return self.topic(f"response/{method}")

    async def _answer(self, method: str, answer: bytes, response_topic: str | None, correlation: Any) -> None:
        topic = self._answer_topic(method, response_topic)
        props = None
        if correlation is not None:
            props = Properties(PacketTypes.PUBLISH)
            props.CorrelationData = correlation
        client = self._client
        if client is None:
            log.info("broker away: answer on %s dropped", topic)
            return
        try:
            await client.publish(topic, answer, qos=1, properties=props)
        except aiomqtt.MqttError as exc:
            log.info("answer on %s not sent: %s", topic, exc)

    async def _analysis(self, request: Request) -> Analysis:
        if self.engine_error is not None:
            raise EngineError(f"the estimator is unavailable: {self.engine_error}")
        await self.pool.wait_ready(CALIBRATION_WAIT_S)
        assert request.model is not None
        return await self.pool.analyse(request.model.fmt, request.model.source, request.inputs,
                                       self.cfg.limits.graph)

    async def dispatch(self, request: Request) -> dict[str, Any]:
        method = request.method
        if method == "estimate":
            analysis = await self._analysis(request)
            latency, _ = self.present_latency(analysis.base_ms, analysis.memory_bytes, analysis.written_mb)
            return {"performanceTier": tier_for(latency)}
        if method == "meets":
            analysis = await self._analysis(request)
            latency, _ = self.present_latency(analysis.base_ms, analysis.memory_bytes, analysis.written_mb)
            assert request.required_tier is not None
            return {"meetsRequirement": initial_meets(latency, bound_ms(request.required_tier), self._veto is not None)}
        if method == "monitors/create":
            return await self._create(request)
        if method == "monitors/delete":
            return await self._delete(request)
        if method == "monitors/list":
            return {"monitors": [
                {"monitor": r.monitor, "requiredTier": r.required_tier, "meetsRequirement": r.meets, "seq": r.seq}
                for r in sorted(self.records.values(), key=lambda r: r.monitor)]}
        raise BadInput(f"unknown method {method!r}", "unknown_method")

    def _check_room(self, monitor: str) -> None:
        if monitor not in self.records and len(self.records) >= self.cfg.limits.max_monitors:
            raise BadInput(f"this device already has {len(self.records)} monitors, the limit", "too_many_monitors")

    async def _create(self, request: Request) -> dict[str, Any]:
        monitor = request.monitor or secrets.token_hex(8)
        self._check_room(monitor)
        analysis = await self._analysis(request)
        assert request.required_tier is not None
        bound = bound_ms(request.required_tier)
        async with self._mutate:
            self._check_room(monitor)
            latency, device = self.present_latency(analysis.base_ms, analysis.memory_bytes, analysis.written_mb)
            meets = initial_meets(latency, bound, self._veto is not None)
            seq = self.table.next_seq()
            rec = StoredMonitor(monitor, request.required_tier, device, analysis.plans, analysis.base_ms,
                                analysis.memory_bytes, seq, meets)
            previous = self.records.get(monitor)
            try:
                await asyncio.to_thread(self.store.save_monitor, rec)
                self.records[monitor] = rec
                self.table.add(monitor, analysis.base_ms[device], device, bound, meets, seq, analysis.memory_bytes,
                               analysis.written_mb)
                await self._persist_seq()
            except OSError as exc:
                self._forget(monitor)
                if previous is not None:  # a failed replace leaves the old monitor as it was
                    self.records[monitor] = previous
                    self.table.add(monitor, previous.base_ms[previous.device], previous.device,
                                   bound_ms(previous.required_tier), previous.meets, previous.seq,
                                   previous.memory_bytes, previous.written_mb)
                    await asyncio.to_thread(self.store.save_monitor, previous)
                else:
                    await asyncio.to_thread(self.store.delete_monitor, monitor)
                raise BadInput(f"cannot store the monitor: {exc.strerror or exc}", "storage") from None
            self._send(self._state_message(monitor))
        log.info("monitor %s created (%s on %s)%s", monitor, request.required_tier, device,
                 " replacing the previous one" if previous else "")
        return {"monitor": monitor, "meetsRequirement": meets}

    def _forget(self, monitor: str) -> None:
        self.records.pop(monitor, None)
        if monitor in self.table:
            self.table.remove(monitor)

    async def _delete(self, request: Request) -> dict[str, Any]:
        monitor = request.monitor
        assert monitor is not None
        async with self._mutate:
            if monitor not in self.records:
                raise BadInput(f"no monitor {monitor!r} on this device", "unknown_monitor")
            await asyncio.to_thread(self.store.delete_monitor, monitor)
            self._forget(monitor)
            await self._persist_seq()
            # an empty retained message clears the retained state
            self._send(Outgoing(self.topic(f"monitors/{monitor}/state"), b"", retain=True))
        log.info("monitor %s deleted", monitor)
        return {}


def power_facts(state: Any) -> PowerFacts:
    """What the policy needs from a DeviceState: battery level, on battery or not, power profile."""
    b = state.battery
    on_battery = None if b.plugged is None else bool(b.present and not b.plugged)
    return PowerFacts(b.percent, on_battery, state.power_mode)


def _make_sampler(cfg: Config) -> Any:
    from probes.state import Sampler

    return Sampler(cfg.sysfs_root, cfg.procfs_root)


async def run_agent(cfg: Config) -> int:
    agent = Agent(cfg)
    return await agent.run()
