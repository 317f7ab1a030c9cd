"""Following many devices at once: a backend that hears every device's status and every monitor's changes.

    async with Fleet("mqtts://broker.example", client_id="backend-1") as fleet:
        async for item in fleet:           # DeviceStatus or FleetEvent, in the broker's order
            store(item)                    # handled before the next is asked for

A cluster: give every node's URL (`Fleet([url1, url2, url3], ...)`); after a loss the next one is connected to,
and the session (queued on the cluster) goes on there. `protocol="3.1.1"` for brokers without v5 (RabbitMQ
3.x). Several consumers sharing the load: `group="backends"` subscribes with `$share/backends/...`, so the
broker hands each message to one member of the group (MQTT 5 shared subscriptions; Mosquitto, EMQX and HiveMQ
have them, RabbitMQ 3.x has not: docs/fleet.md).

Nothing is missed while the backend is away or restarts: it connects with a fixed client id, without clean
start, with a session expiry above 0, and subscribes with QoS 1, so the broker keeps what arrives meanwhile.
aiomqtt (through paho) acknowledges a message as soon as it is queued, so a message queued but not yet handled
when the process stops would be lost: here each message is acknowledged only when the loop asks for the next
one, after the previous was handled. A message can so come twice (QoS 1 is at least once): an event repeats
a (device, monitor, seq) already seen, and is dropped by the caller.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiomqtt

from daop_client.address import check_device_id, default_broker, parse_broker_url
from daop_client.client import MonitorEvent, _json, event_of
from daop_client.connection import PROTOCOLS, Backoff, Credentials, acknowledge, acknowledge_manually, open_client

SHARE_GROUP_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # matched whole
FLEET_TOPICS = ("daop/{device}/status", "daop/{device}/monitors/+/events")


@dataclass(frozen=True)
class DeviceStatus:
    device: str
    online: bool


@dataclass(frozen=True)
class FleetEvent:
    device: str
    event: MonitorEvent


class Fleet:
    """`devices`: the device ids to follow (default: every one, `+`); `client_id`: fixed, the session's name on
    the broker; `session_expiry_s`: how long the broker keeps what arrives while the backend is away."""

    def __init__(self, broker: str | Sequence[str] | None = None, *, client_id: str, devices: Sequence[str] = ("+",),
                 username: str | None = None, password: str | None = None, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None, session_expiry_s: int = 86400,
                 protocol: str = "5", group: str | None = None) -> None:
        if not client_id:
            raise ValueError("a fleet follower needs a fixed client id: its session on the broker")
        if not session_expiry_s > 0:
            raise ValueError("session_expiry_s must be above 0, or the broker keeps nothing while away")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be {' or '.join(PROTOCOLS)}, not {protocol!r}")
        if group is not None and not SHARE_GROUP_RE.fullmatch(group):
            raise ValueError(f"a share group is 1 to 64 of A-Z a-z 0-9 _ -, not {group!r}")
        urls = [broker or default_broker()] if broker is None or isinstance(broker, str) else list(broker)
        if not urls:
            raise ValueError("no broker URL given")
        self.addresses = [parse_broker_url(url) for url in urls]
        self._next = 0  # which address the next connect tries
        self.address = self.addresses[0]  # the one connected to, or last tried
        self.credentials = Credentials(username, password, ca_file, cert_file, key_file)
        self.client_id = client_id
        self.devices = [d if d == "+" else check_device_id(d) for d in devices]
        self.session_expiry_s = session_expiry_s
        self.protocol = protocol
        share = f"$share/{group}/" if group is not None else ""
        self.topics = [share + t.format(device=d) for d in self.devices for t in FLEET_TOPICS]
        self._client: aiomqtt.Client | None = None

    async def __aenter__(self) -> Fleet:
        """Connect (an unreachable broker raises here); later losses are reconnected to while iterating."""
        self._client = await self._connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._client is not None:
            try:
                await self._client.__aexit__(None, None, None)
            except aiomqtt.MqttError:
                pass
            self._client = None

    async def _connect(self) -> aiomqtt.Client:
        """Connect to the next address in turn (a cluster's next node after a loss)."""
        self.address = self.addresses[self._next]
        self._next = (self._next + 1) % len(self.addresses)
        client = open_client(self.address, self.credentials, self.client_id, clean_start=False,
                             session_expiry_s=self.session_expiry_s, protocol=self.protocol)
        acknowledge_manually(client)
        await client.__aenter__()
        try:
            await client.subscribe([(t, 1) for t in self.topics])
        except BaseException:
            await client.__aexit__(None, None, None)
            raise
        return client

    async def __aiter__(self) -> AsyncIterator[DeviceStatus | FleetEvent]:
        backoff = Backoff()
        while True:
            client = self._client
            if client is None:
                await asyncio.sleep(backoff.next())
                try:
                    self._client = client = await self._connect()
                except (aiomqtt.MqttError, OSError):
                    continue
                backoff.reset()
            try:
                async for message in client.messages:
                    item = parse(message.topic.value, message.payload)
                    if item is not None:
                        yield item  # handled by the caller before it asks for the next
                    acknowledge(client, message)
            except aiomqtt.MqttError:
                try:
                    await client.__aexit__(None, None, None)
                except aiomqtt.MqttError:
                    pass
                self._client = None


def parse(topic: str, payload: Any) -> DeviceStatus | FleetEvent | None:
    """A fleet message as what it says (None for one that is not the agent's: a cleared state, garbage)."""
    parts = topic.split("/")
    body = _json(payload)
    if body is None or len(parts) < 3 or parts[0] != "daop":
        return None
    if len(parts) == 3 and parts[2] == "status" and body.get("state") in ("online", "offline"):
        return DeviceStatus(parts[1], body["state"] == "online")
    if len(parts) == 5 and parts[2] == "monitors" and parts[4] == "events":
        event = event_of(parts[3], body)
        return FleetEvent(parts[1], event) if event is not None else None
    return None
