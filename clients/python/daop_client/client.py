"""The client of one device's agent: estimate, meets, and monitors whose change events arrive as an async iterator.

    async with DaopClient() as daop:          # ./run.sh's broker, device id = this host's name
        tier = await daop.estimate("model.onnx")
        monitor = await daop.create_monitor("model.onnx", "good")
        async for event in monitor:
            print(event.meets, event.seq)

It speaks MQTT v5: each request carries a ResponseTopic of its own under
`daop/<device>/response/client/<client id>` and CorrelationData, so answers never mix up between
concurrent requests. A request waits until the agent's retained `status` says `online`, so an agent that is
starting is waited for and a wrong device id is named at once (`no_agent`). Monitor events are subscribed with
QoS 1 before the monitor is created, so the first change is not missed. A lost broker is reconnected to with
backoff; the broker keeps the session meanwhile (`session_expiry_s`), and each monitor's retained state is read
again on reconnect, so a change made while away still arrives once (events are told apart by `seq`).

With an `owner` (the app's broker user name, or its client id, as the broker's ACL allows), every request,
answer and monitor topic lives under the app's own scope `daop/<device>/client/<owner>/`: its monitors are its
own, listed, replaced and deleted by it only, and its request budget its own (docs/mqtt.md "Owners").

Its monitors live while it runs: each is created with a lease (`lease_s`, 60 s by default) that the client
renews every third of it; once it stops, by any means, the agent deletes them a lease later (docs/mqtt.md
"Leases"). `lease_s=None` keeps them until deleted (a backend that outlives its own restarts).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daop_client.address import check_device_id, default_broker, default_device_id, parse_broker_url
from daop_client.bodies import (
    Context,
    Model,
    Workload,
    generation_field,
    inputs_field,
    model_fields,
    requirement_fields,
)
from daop_client.connection import Backoff, Credentials, open_client

STATUS_WAIT_S = 3.0  # after connecting: how long a device's retained status may take to arrive
SURVEY_S = 1.0  # how long the device ids on the broker are gathered for a `no_agent` error
_OWN_PID = object()  # running()'s default: this process
DEFAULT_LEASE_S = 60.0  # a monitor lives this long after its client last renewed it (docs/mqtt.md "Leases")
MAX_RENEW = 1000  # monitors renewed by one request (the agent's limit)


class DaopError(Exception):
    """An error answer from the agent, or none: `timeout`, `no_agent`, `offline`, `disconnected`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class MonitorEvent:
    """A change of a monitor's answer; `workloads` is a group's answer per workload (None for one model);
    `ts` is None for a change read from the retained state after a reconnect."""

    monitor: str
    meets: bool
    seq: int
    ts: str | None = None
    workloads: dict[str, bool] | None = None


@dataclass(frozen=True)
class GroupAnswer:
    meets: bool
    workloads: dict[str, bool]


class _Feed:
    """One monitor's events as this client received them: duplicates (same or older seq) dropped."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[MonitorEvent | None] = asyncio.Queue()
        self.seq = -1
        self.meets: bool | None = None

    def event(self, event: MonitorEvent) -> None:
        if event.seq <= self.seq:
            return
        self.seq = event.seq
        self.meets = event.meets
        self.queue.put_nowait(event)

    def state(self, event: MonitorEvent) -> None:
        """The retained state, read again after a reconnect: a change only where it differs."""
        if event.seq <= self.seq:
            return
        if event.meets == self.meets:
            self.seq = event.seq
            return
        self.event(event)


class Monitor:
    """A monitor on the agent; iterate it for change events (until the client closes)."""

    def __init__(self, client: DaopClient, monitor: str, meets: bool, workloads: dict[str, bool] | None,
                 feed: _Feed) -> None:
        self.client = client
        self.id = monitor
        self.meets = meets
        self.workloads = workloads
        self._feed = feed

    def __aiter__(self) -> AsyncIterator[MonitorEvent]:
        return self

    async def __anext__(self) -> MonitorEvent:
        event = await self._feed.queue.get()
        if event is None:
            self._feed.queue.put_nowait(None)  # the end stays the end
            raise StopAsyncIteration
        self._take(event)
        return event

    def _take(self, event: MonitorEvent) -> None:
        self.meets = event.meets
        if event.workloads is not None:
            self.workloads = event.workloads

    def drain(self) -> list[MonitorEvent]:
        """The events that have arrived and not been read yet, without waiting (updates `meets`)."""
        events = []
        while not self._feed.queue.empty():
            event = self._feed.queue.get_nowait()
            if event is None:
                self._feed.queue.put_nowait(None)
                break
            self._take(event)
            events.append(event)
        return events

    async def running(self, rate_hz: float | None = None, pid: Any = _OWN_PID) -> bool:
        """Say that the app runs this monitor's workloads here now (at `rate_hz` runs a second, in process `pid`:
        this one by default, None for none), so that its own run is not read as contention against it."""
        body: dict[str, Any] = {"monitor": self.id, "running": True}
        if rate_hz is not None:
            body["rateHz"] = rate_hz
        pid = os.getpid() if pid is _OWN_PID else pid
        if pid is not None:
            body["pid"] = pid
        return bool((await self.client.request("monitors/running", body))["running"])

    async def stopped(self) -> None:
        """Say that the app no longer runs this monitor's workloads here."""
        await self.client.request("monitors/running", {"monitor": self.id, "running": False})

    async def report(self, latencies_ms: Sequence[float], workload: str | None = None) -> None:
        """Latencies the app measured running the workload here (a group's: name it); the agent learns a
        bounded correction of its estimate from them, on the device."""
        body: dict[str, Any] = {"monitor": self.id, "latenciesMs": [float(x) for x in latencies_ms]}
        if workload is not None:
            body["workload"] = workload
        await self.client.request("monitors/report", body)

    async def delete(self) -> None:
        await self.client.delete_monitor(self.id)


class DaopClient:
    """`broker`: a URL (default `$DAOP_BROKER`, else `./run.sh`'s mqtt://127.0.0.1:18830); `device_id`: the
    agent's (default: this host's name, as the agent's own default); `on_connection(what, detail)` hears of
    `lost`, `reconnected`, `online` and `offline` (the agent's status) as they happen; `owner`: ask under this
    client's own scope (default: the shared, unscoped topics)."""

    def __init__(self, broker: str | None = None, device_id: str | None = None, *,
                 username: str | None = None, password: str | None = None, client_id: str | None = None,
                 ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                 timeout_s: float = 60.0, session_expiry_s: int = 300,
                 on_connection: Callable[[str, str], None] | None = None, owner: str | None = None,
                 lease_s: float | None = DEFAULT_LEASE_S) -> None:
        self.address = parse_broker_url(broker or default_broker())
        self.credentials = Credentials(username, password, ca_file, cert_file, key_file)
        self.device_id = check_device_id(device_id or default_device_id())
        self.base = f"daop/{self.device_id}/"
        self.owner = check_owner(owner) if owner else None
        self.scope = f"{self.base}client/{self.owner}/" if self.owner else self.base  # requests, answers, monitors
        self.client_id = client_id or f"daop-client-{secrets.token_hex(6)}"
        self.response_topic = f"{self.scope}response/client/{self.client_id}"
        self.timeout_s = timeout_s
        self.session_expiry_s = session_expiry_s
        self.agent_state: str | None = None  # the agent's retained status: 'online', 'offline', None (none seen)
        self._on_connection = on_connection
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._connected_at = 0.0
        self._online = asyncio.Event()
        self._closing = False
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[bytes, asyncio.Future[dict[str, Any]]] = {}
        self._feeds: dict[str, _Feed] = {}
        self._survey: set[str] | None = None
        self._reconnects = 0
        self.lease_s = lease_s  # its monitors' lease, renewed while it runs (None: they live until deleted)
        self._renewer: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def __aenter__(self) -> DaopClient:
        """Connect (an unreachable broker raises aiomqtt.MqttError or OSError here), then stay connected."""
        client = open_client(self.address, self.credentials, self.client_id, clean_start=True,
                             session_expiry_s=self.session_expiry_s)
        await client.__aenter__()
        try:
            await self._subscribe_all(client)
        except BaseException:
            await client.__aexit__(None, None, None)
            raise
        self._reader = asyncio.get_running_loop().create_task(self._run(client))
        if self.lease_s is not None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_leases(self.lease_s))
        return self

    async def _renew_leases(self, lease_s: float) -> None:
        """This client's monitors live while it runs: renewed every third of their lease (docs/mqtt.md "Leases").
        Once it stops (a clean exit, Ctrl-C, a crash) nobody renews them, and the agent deletes them."""
        while True:
            await asyncio.sleep(lease_s / 3)
            if self._feeds and self.connected:
                try:
                    await self.request("monitors/renew", {"monitors": list(self._feeds)[:MAX_RENEW]})
                except DaopError:
                    pass  # tried again a third of a lease later

    async def __aexit__(self, *exc: Any) -> None:
        self._closing = True
        if self._renewer is not None:
            self._renewer.cancel()
        client = self._client
        if client is not None:
            try:  # nothing left for the broker to keep for this session
                await asyncio.wait_for(client.unsubscribe(self._topics(), timeout=2), 3)
            except (aiomqtt.MqttError, TimeoutError):
                pass
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, aiomqtt.MqttError):
                pass
        for feed in self._feeds.values():
            feed.queue.put_nowait(None)

    def _topics(self) -> list[str]:
        return [self.response_topic, self.base + "status",
                *(f"{self.scope}monitors/{m}/{kind}" for m in self._feeds for kind in ("events", "state"))]

    async def _subscribe_all(self, client: aiomqtt.Client) -> None:
        """The answers, the agent's status, and each monitor's events; after a reconnect its retained state
        too, read for a change made while away."""
        topics = [self.response_topic, self.base + "status",
                  *(f"{self.scope}monitors/{m}/events" for m in self._feeds)]
        if self._reconnects:
            topics += [f"{self.scope}monitors/{m}/state" for m in self._feeds]
        await client.subscribe([(t, 1) for t in topics])
        self._client = client
        self._connected_at = asyncio.get_running_loop().time()
        self._connected.set()

    async def _run(self, client: aiomqtt.Client) -> None:
        """Read messages; after a loss, connect again (same client id, the session kept) until closed."""
        backoff = Backoff()
        try:
            while True:
                try:
                    async for message in client.messages:
                        self._route(message)
                except aiomqtt.MqttError as exc:
                    self._lost(str(exc))
                finally:
                    await self._close_quietly(client)
                while True:
                    await asyncio.sleep(backoff.next())
                    client = open_client(self.address, self.credentials, self.client_id, clean_start=False,
                                         session_expiry_s=self.session_expiry_s)
                    try:
                        await client.__aenter__()
                        self._reconnects += 1
                        await self._subscribe_all(client)
                    except (aiomqtt.MqttError, OSError):
                        await self._close_quietly(client)
                        continue
                    backoff.reset()
                    self._tell("reconnected", self.address.url)
                    break
        finally:
            await self._close_quietly(client)

    async def _close_quietly(self, client: aiomqtt.Client) -> None:
        if self._client is client:
            self._client = None
        try:
            await client.__aexit__(None, None, None)
        except aiomqtt.MqttError:
            pass

    def _lost(self, why: str) -> None:
        self._connected.clear()
        self._client = None
        for future in self._pending.values():
            if not future.done():
                future.set_exception(DaopError("disconnected", f"lost the broker {self.address.url}: {why}"))
        self._tell("lost", f"{self.address.url}: {why}")

    def _tell(self, what: str, detail: str) -> None:
        if self._on_connection is not None and not self._closing:
            self._on_connection(what, detail)

    def _route(self, message: aiomqtt.Message) -> None:
        topic = message.topic.value
        if topic == self.response_topic:
            corr = getattr(message.properties, "CorrelationData", None) if message.properties else None
            future = self._pending.pop(bytes(corr), None) if corr is not None else None
            if future is not None and not future.done():
                future.set_result(_json(message.payload) or {})
            return
        body = _json(message.payload)
        if self._survey is not None and topic.startswith("daop/") and topic.endswith("/status"):
            self._survey.add(topic.split("/")[1])
        if topic == self.base + "status":
            self._status(body.get("state") if body else None)
            return
        parts = topic[len(self.scope):].split("/") if topic.startswith(self.scope) else []
        if len(parts) == 3 and parts[0] == "monitors" and parts[1] in self._feeds and body is not None:
            event = event_of(parts[1], body)
            if event is not None:
                if parts[2] == "events":
                    self._feeds[parts[1]].event(event)
                else:
                    self._feeds[parts[1]].state(event)

    def _status(self, state: Any) -> None:
        state = state if state in ("online", "offline") else None
        changed = state != self.agent_state and self.agent_state is not None  # the first one is no news
        self.agent_state = state
        if state == "online":
            self._online.set()
        else:
            self._online.clear()
        if changed and state is not None:
            self._tell(state, self.device_id)

    async def _ready(self, deadline: float) -> aiomqtt.Client:
        """Connected, and the agent online; else the DaopError that says which is missing."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self._connected.wait(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise DaopError("disconnected", f"no connection to the broker {self.address.url} "
                                            f"within {self.timeout_s:g} s") from None
        if not self._online.is_set():
            if self.agent_state is None:  # a retained status comes at once, where an agent ever connected
                status_by = min(deadline, self._connected_at + STATUS_WAIT_S)
                try:
                    await asyncio.wait_for(self._online.wait(), max(0.0, status_by - loop.time()))
                except TimeoutError:
                    if self.agent_state is None:
                        raise DaopError("no_agent", await self._no_agent()) from None
            if not self._online.is_set():
                try:
                    await asyncio.wait_for(self._online.wait(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    raise DaopError("offline", f"the agent of device {self.device_id} on {self.address.url} "
                                               f"is offline (its status says so)") from None
        client = self._client
        if client is None:
            raise DaopError("disconnected", f"lost the broker {self.address.url}")
        return client

    async def _no_agent(self) -> str:
        """Why no agent answers: none has ever said it is online as this device here; the ids that have."""
        seen: set[str] = set()
        client = self._client
        if client is not None:
            self._survey = seen
            try:
                await client.subscribe("daop/+/status", qos=0)
                await asyncio.sleep(SURVEY_S)
                await client.unsubscribe("daop/+/status")
            except aiomqtt.MqttError:
                pass
            finally:
                self._survey = None
        seen.discard(self.device_id)
        hint = f"device ids seen there: {', '.join(sorted(seen))}" if seen else "no agent has announced itself there"
        return (f"no agent with device id {self.device_id!r} on {self.address.url} ({hint}; "
                f"the agent's default device id is its host name, its --device-id otherwise)")

    async def request(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send one request once the agent is online; the answer's `data`, or DaopError."""
        if self._reader is None:
            raise RuntimeError("use `async with DaopClient(...)`")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        client = await self._ready(deadline)
        correlation = secrets.token_bytes(8)
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[correlation] = future
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.response_topic
        props.CorrelationData = correlation
        try:
            await client.publish(f"{self.scope}request/{method}", json.dumps(body).encode(), qos=1, properties=props)
            answer = await asyncio.wait_for(future, max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise DaopError("timeout", f"no answer from device {self.device_id} within {self.timeout_s:g} s "
                                       f"(the agent is online but busy?)") from None
        except aiomqtt.MqttError as exc:
            raise DaopError("disconnected", f"lost the broker {self.address.url}: {exc}") from None
        finally:
            self._pending.pop(correlation, None)
        if answer.get("status") != "ok":
            err = answer.get("error") or {}
            raise DaopError(str(err.get("code", "error")), str(err.get("message", "")))
        return answer.get("data") or {}

    async def estimate(self, model: Model, inputs: Mapping[str, Any] | None = None,
                       generation: tuple[int, int] | None = None, *, context: Context | None = None) -> str:
        """The tier of one inference on the device now, or of an LLM's whole generation (prompt tokens, output
        tokens); `context`: WebNN's context options, where to run it."""
        data = await self.request("estimate", {**model_fields(model), **inputs_field(inputs),
                                               **generation_field(generation), **(context or Context()).fields()})
        return str(data["performanceTier"])

    async def meets(self, model: Model, tier: str | None = None, inputs: Mapping[str, Any] | None = None,
                    generation: tuple[int, int] | None = None, *, rate: float | None = None,
                    deadline_ms: float | None = None, context: Context | None = None) -> bool:
        """Whether the device meets a tier, or a rate (Hz) and/or a deadline (ms), now."""
        body = {**model_fields(model), **inputs_field(inputs), **generation_field(generation),
                **requirement_fields(tier, rate, deadline_ms), **(context or Context()).fields()}
        return bool((await self.request("meets", body))["meetsRequirement"])

    async def meets_group(self, workloads: Sequence[Workload], context: Context | None = None) -> GroupAnswer:
        """Whether workloads that run together each meet their requirement, sharing the device."""
        data = await self.request("meets", {"workloads": [w.fields() for w in workloads],
                                            **(context or Context()).fields()})
        return GroupAnswer(bool(data["meetsRequirement"]), dict(data.get("workloads") or {}))

    async def create_monitor(self, model: Model, tier: str | None = None, monitor: str | None = None,
                             inputs: Mapping[str, Any] | None = None, *, rate: float | None = None,
                             deadline_ms: float | None = None, generation: tuple[int, int] | None = None,
                             context: Context | None = None) -> Monitor:
        """Register a monitor of one model; its events are subscribed first so that none is missed."""
        body = {**model_fields(model), **inputs_field(inputs), **generation_field(generation),
                **requirement_fields(tier, rate, deadline_ms), **(context or Context()).fields()}
        return await self._create(body, monitor)

    def _lease(self) -> dict[str, float]:
        return {} if self.lease_s is None else {"leaseS": self.lease_s}

    async def create_group(self, workloads: Sequence[Workload], monitor: str | None = None,
                           context: Context | None = None) -> Monitor:
        """Register a monitor of workloads that run together; its events carry each one's answer."""
        return await self._create({"workloads": [w.fields() for w in workloads], **(context or Context()).fields()},
                                  monitor)

    async def create_from_body(self, body: dict[str, Any], monitor: str | None = None) -> Monitor:
        """Register a monitor from a request body as the wire carries it (a bridge's: the browser extension's host),
        its events subscribed first."""
        return await self._create(body, monitor)

    async def _create(self, body: dict[str, Any], monitor: str | None) -> Monitor:
        monitor = monitor or secrets.token_hex(8)
        client = await self._ready(asyncio.get_running_loop().time() + self.timeout_s)
        feed = self._feeds.get(monitor) or _Feed()
        self._feeds[monitor] = feed
        try:
            await client.subscribe(f"{self.scope}monitors/{monitor}/events", qos=1)
            data = await self.request("monitors/create", {**body, **self._lease(), "monitor": monitor})
        except BaseException:
            self._feeds.pop(monitor, None)
            raise
        meets = bool(data["meetsRequirement"])
        if feed.meets is None:
            feed.meets = meets
        workloads = data.get("workloads")
        return Monitor(self, str(data["monitor"]), meets, dict(workloads) if workloads is not None else None, feed)

    async def delete_monitor(self, monitor: str) -> None:
        await self.request("monitors/delete", {"monitor": monitor})
        feed = self._feeds.pop(monitor, None)
        if feed is not None:
            feed.queue.put_nowait(None)
            client = self._client
            if client is not None:
                try:
                    await client.unsubscribe([f"{self.scope}monitors/{monitor}/{k}" for k in ("events", "state")])
                except aiomqtt.MqttError:
                    pass

    async def list_monitors(self) -> list[dict[str, Any]]:
        return list((await self.request("monitors/list", {}))["monitors"])


def _json(payload: Any) -> dict[str, Any] | None:
    try:
        body = json.loads(payload)
    except (ValueError, TypeError):
        return None
    return body if isinstance(body, dict) else None


def event_of(monitor: str, body: dict[str, Any]) -> MonitorEvent | None:
    """An event's or a retained state's payload as a MonitorEvent (None for one that is not)."""
    meets, seq = body.get("meetsRequirement"), body.get("seq")
    if not isinstance(meets, bool) or not isinstance(seq, int) or isinstance(seq, bool):
        return None
    workloads = body.get("workloads")
    answers: dict[str, bool] | None = None
    if isinstance(workloads, dict):  # an event's {name: bool}, a retained state's {name: {..., meetsRequirement}}
        answers = {}
        for name, v in workloads.items():
            ok = v.get("meetsRequirement") if isinstance(v, dict) else v
            if isinstance(ok, bool):
                answers[str(name)] = ok
    ts = body.get("ts")
    return MonitorEvent(monitor, meets, seq, ts if isinstance(ts, str) else None, answers)


def check_owner(value: str) -> str:
    """An owner is one topic level: 1 to 64 of A-Z a-z 0-9 _ - (as a device id)."""
    try:
        return check_device_id(value)
    except ValueError:
        raise ValueError(f"owner must be 1 to 64 of A-Z a-z 0-9 _ -, not {value!r}") from None
