"""A Python client for apps: estimate, meets, and monitors whose change events arrive as an async iterator.

    async with DaopClient("mqtt://localhost:1883", device_id="laptop") as daop:
        tier = await daop.estimate("model.onnx")
        ok = await daop.meets("model.onnx", "good")
        monitor = await daop.create_monitor("model.onnx", "good")
        async for event in monitor:
            print(event.meets, event.seq)

It speaks MQTT v5: each request carries a ResponseTopic of its own under
`daop/<device>/response/client/<client id>` and CorrelationData, so answers
never mix up between concurrent requests. Monitor events are subscribed with
QoS 1 before the monitor is created, so the first change is not missed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.config import Broker, check_device_id, default_device_id, parse_broker_url


class DaopError(Exception):
    """An error answer from the agent (or no answer in time)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class MonitorEvent:
    monitor: str
    meets: bool
    seq: int
    ts: str | None = None


def model_fields(model: str | os.PathLike[str] | bytes | Mapping[str, Any]) -> dict[str, Any]:
    """The request's model field: a path (.onnx/.webnn/.json), ONNX bytes, or a webnn-graph-json dict."""
    if isinstance(model, (bytes, bytearray)):
        return {"onnx": base64.b64encode(bytes(model)).decode("ascii")}
    if isinstance(model, Mapping):
        return {"graph": dict(model)}
    path = Path(model)
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return {"onnx": base64.b64encode(path.read_bytes()).decode("ascii")}
    if suffix == ".webnn":
        return {"webnn": path.read_text(encoding="utf-8")}
    if suffix == ".json":
        return {"graph": json.loads(path.read_text(encoding="utf-8"))}
    raise ValueError(f"{path}: a model is .onnx, .webnn or .json")


def inputs_field(inputs: Mapping[str, Any] | None) -> dict[str, Any]:
    """{"name": (shape, dtype) | InputSpec | {"shape":..., "dataType":...}} -> the request's "inputs"."""
    if not inputs:
        return {}
    out: dict[str, Any] = {}
    for name, spec in inputs.items():
        if isinstance(spec, Mapping):
            out[name] = dict(spec)
        elif hasattr(spec, "shape"):
            out[name] = {"shape": list(spec.shape), **({"dataType": spec.dtype} if spec.dtype else {})}
        else:
            shape, dtype = spec
            out[name] = {"shape": list(shape), **({"dataType": dtype} if dtype else {})}
    return {"inputs": out}


class Monitor:
    """A monitor on the agent; iterate it for change events (until the client closes)."""

    def __init__(self, client: "DaopClient", monitor: str, meets: bool, queue: asyncio.Queue[MonitorEvent | None]):
        self.client = client
        self.id = monitor
        self.meets = meets
        self._queue = queue

    def __aiter__(self) -> AsyncIterator[MonitorEvent]:
        return self

    async def __anext__(self) -> MonitorEvent:
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        self.meets = event.meets
        return event

    def drain(self) -> list[MonitorEvent]:
        """The events that have arrived and not been read yet, without waiting (updates `meets`)."""
        events = []
        while not self._queue.empty():
            event = self._queue.get_nowait()
            if event is None:
                self._queue.put_nowait(None)  # keep the end marker for the iterator
                break
            self.meets = event.meets
            events.append(event)
        return events

    async def delete(self) -> None:
        await self.client.delete_monitor(self.id)


class DaopClient:
    def __init__(self, broker: str = "mqtt://localhost:1883", device_id: str | None = None, *,
                 username: str | None = None, password: str | None = None, client_id: str | None = None,
                 ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                 timeout_s: float = 60.0) -> None:
        self.broker: Broker = parse_broker_url(broker, Broker(username=username, password=password, ca_file=ca_file,
                                                             cert_file=cert_file, key_file=key_file))
        self.device_id = check_device_id(device_id or default_device_id())
        self.base = f"daop/{self.device_id}/"
        self.client_id = client_id or f"daop-client-{secrets.token_hex(6)}"
        self.response_topic = f"{self.base}response/client/{self.client_id}"
        self.timeout_s = timeout_s
        self._client: aiomqtt.Client | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[bytes, asyncio.Future[dict[str, Any]]] = {}
        self._monitors: dict[str, asyncio.Queue[MonitorEvent | None]] = {}

    async def __aenter__(self) -> "DaopClient":
        b = self.broker
        tls = aiomqtt.TLSParameters(ca_certs=b.ca_file, certfile=b.cert_file, keyfile=b.key_file) if b.tls else None
        self._client = aiomqtt.Client(b.host, b.port, username=b.username, password=b.password,
                                      identifier=self.client_id, protocol=aiomqtt.ProtocolVersion.V5,
                                      tls_params=tls, timeout=10)
        await self._client.__aenter__()
        await self._client.subscribe(self.response_topic, qos=1)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, aiomqtt.MqttError):
                pass
        for queue in self._monitors.values():
            queue.put_nowait(None)
        if self._client is not None:
            await self._client.__aexit__(None, None, None)
            self._client = None

    async def _read(self) -> None:
        assert self._client is not None
        try:
            async for message in self._client.messages:
                self._route(message)
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(DaopError("disconnected", "lost the broker connection"))
            for queue in self._monitors.values():
                queue.put_nowait(None)

    def _route(self, message: aiomqtt.Message) -> None:
        topic = message.topic.value
        try:
            body = json.loads(message.payload)
        except (ValueError, TypeError):
            return
        if topic == self.response_topic:
            corr = getattr(message.properties, "CorrelationData", None) if message.properties else None
            future = self._pending.pop(bytes(corr), None) if corr is not None else None
            if future is not None and not future.done():
                future.set_result(body)
            return
        parts = topic[len(self.base):].split("/")
        if len(parts) == 3 and parts[0] == "monitors" and parts[2] == "events" and parts[1] in self._monitors:
            if isinstance(body, dict) and isinstance(body.get("meetsRequirement"), bool):
                self._monitors[parts[1]].put_nowait(
                    MonitorEvent(parts[1], body["meetsRequirement"], int(body.get("seq", 0)), body.get("ts")))

    async def request(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send one request; the answer's `data`, or DaopError."""
        if self._client is None:
            raise RuntimeError("use `async with DaopClient(...)`")
        correlation = secrets.token_bytes(8)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[correlation] = future
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.response_topic
        props.CorrelationData = correlation
        try:
            await self._client.publish(f"{self.base}request/{method}", json.dumps(body).encode(), qos=1,
                                       properties=props)
            answer = await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            raise DaopError("timeout", f"no answer from device {self.device_id} within {self.timeout_s:g} s "
                                       f"(is the agent running?)") from None
        finally:
            self._pending.pop(correlation, None)
        if answer.get("status") != "ok":
            err = answer.get("error") or {}
            raise DaopError(str(err.get("code", "error")), str(err.get("message", "")))
        return answer.get("data") or {}

    async def estimate(self, model: Any, inputs: Mapping[str, Any] | None = None) -> str:
        data = await self.request("estimate", {**model_fields(model), **inputs_field(inputs)})
        return str(data["performanceTier"])

    async def meets(self, model: Any, required_tier: str, inputs: Mapping[str, Any] | None = None) -> bool:
        body = {**model_fields(model), **inputs_field(inputs), "requiredTier": required_tier}
        return bool((await self.request("meets", body))["meetsRequirement"])

    async def create_monitor(self, model: Any, required_tier: str, monitor: str | None = None,
                             inputs: Mapping[str, Any] | None = None) -> Monitor:
        """Register a monitor; its events are subscribed first so that none is missed."""
        assert self._client is not None
        monitor = monitor or secrets.token_hex(8)
        queue: asyncio.Queue[MonitorEvent | None] = asyncio.Queue()
        self._monitors[monitor] = queue
        await self._client.subscribe(f"{self.base}monitors/{monitor}/events", qos=1)
        body = {**model_fields(model), **inputs_field(inputs), "requiredTier": required_tier, "monitor": monitor}
        try:
            data = await self.request("monitors/create", body)
        except BaseException:
            self._monitors.pop(monitor, None)
            raise
        return Monitor(self, data["monitor"], bool(data["meetsRequirement"]), queue)

    async def delete_monitor(self, monitor: str) -> None:
        await self.request("monitors/delete", {"monitor": monitor})
        queue = self._monitors.pop(monitor, None)
        if queue is not None:
            queue.put_nowait(None)
            if self._client is not None:
                await self._client.unsubscribe(f"{self.base}monitors/{monitor}/events")

    async def list_monitors(self) -> list[dict[str, Any]]:
        return list((await self.request("monitors/list", {}))["monitors"])
