"""The agent's one MQTT connection, apart from what the agent does with it.

Connects to the first of its brokers (a cluster's nodes) and, after each loss, to the next one in turn; speaks
MQTT 5 or 3.1.1 (for brokers without v5, e.g. RabbitMQ 3.x: answers then go to `response/<method>`); keeps its
session on the broker where `session_expiry_s` asks (clean_session false with the stable client id on 3.1.1).
Connects with a Will (`status` offline), reconnects with jittered exponential backoff, subscribes to the
device's requests before it says `online`, publishes every retained state again on each connect (a broker
restarted without persistence has lost them), publishes the outbox in order and only drops a message once
the broker has it, hands each request to the agent, and publishes `offline` itself on a clean stop (the
Will fires only on an unclean loss).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import socket
from collections.abc import Callable, Sequence
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from agent.config import Broker
from agent.notify import Notifier
from agent.topics import OFFLINE, ONLINE, Outgoing, Topics, topic_fault

log = logging.getLogger("daop-agent")

BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 15.0
MAX_OUTBOX = 200_000  # messages kept while the broker is away (oldest dropped beyond)
PUBLISH_BATCH = 256
PACKET_HEADROOM = 128 * 1024  # a request's topic and properties, beside its payload (max_request_bytes)
MAX_QUEUED_INCOMING = 4096  # messages read off the socket and not yet handed on (aiomqtt drops beyond, logged)


def max_packet_bytes(max_request_bytes: int) -> int:
    """The MQTT v5 Maximum Packet Size the agent asks of the broker: twice `max_request_bytes` and room for the
    topic and properties. A request up to that is still answered `too_large` (the agent drops its payload at
    once); a larger one is never sent to the agent (the broker drops it, unanswered), so no message, however
    large, is held by the agent. The local broker's `max_packet_size` and examples/mosquitto.conf match it."""
    return 2 * max_request_bytes + PACKET_HEADROOM


class _CleanStop(Exception):
    """Raised inside the connection when the agent stops on purpose."""


class MqttLink:
    """`retained()`: every monitor's retained state, published again on each connect; `on_request(method,
    message)`: called for each request, on the event loop (it must not block); `monitors()`: how many there
    are, for the systemd status line; `subscriptions`, `on_message(message)`: further topics (an integration's)
    and what to do with their messages, on the event loop."""

    def __init__(self, brokers: Sequence[Broker], client_id: str, topics: Topics, notifier: Notifier, *,
                 retained: Callable[[], list[Outgoing]], on_request: Callable[[str, aiomqtt.Message], None],
                 monitors: Callable[[], int], subscriptions: tuple[str, ...] = (),
                 on_message: Callable[[aiomqtt.Message], None] | None = None,
                 max_packet: int | None = None) -> None:
        self.brokers = tuple(brokers)
        self._next = 0  # which broker the next connect tries
        self.broker = self.brokers[0]  # the one connected to, or last tried
        self.max_packet = max_packet
        self.client_id = client_id
        self.topics = topics
        self.notifier = notifier
        self._retained = retained
        self._on_request = on_request
        self._monitors = monitors
        self._subscriptions = subscriptions
        self._on_message = on_message
        self._outbox: collections.deque[Outgoing] = collections.deque()
        self._outbox_ready = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self.connected = asyncio.Event()
        self.online = ONLINE  # the retained status while connected (topics.online)

    def set_online(self, payload: bytes) -> None:
        """A new retained status while online (published now if connected, and on every connect)."""
        if payload != self.online:
            self.online = payload
            if self.connected.is_set():
                self.send(Outgoing(self.topics.status, payload, retain=True))

    def send(self, *messages: Outgoing) -> None:
        """Queue messages for the broker, in order; kept while it is away (up to MAX_OUTBOX). A message the broker
        would refuse (topics.topic_fault) is dropped here, logged: it costs that one message, never the
        connection."""
        self._outbox.extend(publishable(messages))
        while len(self._outbox) > MAX_OUTBOX:
            dropped = self._outbox.popleft()
            log.warning("broker away too long: dropped a queued message for %s", dropped.topic)
        self._outbox_ready.set()

    async def answer(self, topic: str, payload: bytes, correlation: Any = None) -> None:
        """An answer to a request, at once; dropped when the broker is away (the requester has gone too)."""
        props = None
        if correlation is not None and self.broker.protocol == "5":
            props = Properties(PacketTypes.PUBLISH)
            props.CorrelationData = correlation
        client = self._client
        why = topic_fault(topic)
        if why is not None:
            log.warning("answer not sent: the broker would refuse topic %r (%s)", topic, why)
            return
        if client is None:
            log.info("broker away: answer on %s dropped", topic)
            return
        try:
            await client.publish(topic, payload, qos=1, properties=props)
        except aiomqtt.MqttError as exc:
            log.info("answer on %s not sent: %s", topic, exc)

    def _make_client(self) -> aiomqtt.Client:
        """A client for the next broker in turn."""
        b = self.broker = self.brokers[self._next]
        self._next = (self._next + 1) % len(self.brokers)
        tls = None
        if b.tls:
            tls = aiomqtt.TLSParameters(ca_certs=b.ca_file, certfile=b.cert_file, keyfile=b.key_file)
        # By default requests sent while the agent was away are stale: not kept (session expiry 0, clean).
        clean = b.session_expiry_s == 0
        session: dict[str, Any] = {"clean_session": clean}
        if b.protocol == "5":
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = b.session_expiry_s
            if self.max_packet is not None:  # (3.1.1 cannot say it: the broker's max_packet_size must)
                props.MaximumPacketSize = self.max_packet
            session = {"clean_start": clean, "properties": props}
        return aiomqtt.Client(
            b.host, b.port, username=b.username, password=b.password, identifier=self.client_id,
            protocol=aiomqtt.ProtocolVersion.V5 if b.protocol == "5" else aiomqtt.ProtocolVersion.V311,
            will=aiomqtt.Will(self.topics.status, OFFLINE, qos=1, retain=True),
            keepalive=b.keepalive_s, tls_params=tls, timeout=10, max_queued_incoming_messages=MAX_QUEUED_INCOMING,
            **session)

    async def run(self, stop: asyncio.Event) -> None:
        """Stay connected until `stop` is set; then say offline and disconnect."""
        delay = BACKOFF_MIN_S
        stopped = False
        while not stop.is_set() and not stopped:
            try:
                async with self._make_client() as client:
                    await self._on_connect(client)
                    delay = BACKOFF_MIN_S
                    try:
                        async with asyncio.TaskGroup() as tg:
                            tg.create_task(self._receive(client))
                            tg.create_task(self._publish_loop(client))
                            tg.create_task(self._stop_when_asked(client, stop))
                    except asyncio.CancelledError:
                        # The agent goes down other than by a clean stop (a fault elsewhere): the disconnect
                        # that follows is clean, so the broker would not send the Will: say offline first.
                        await self._say_offline(client)
                        raise
            except* _CleanStop:
                stopped = True
            except* (aiomqtt.MqttError, OSError) as group:
                self._lost(group.exceptions[0], delay)
            finally:
                self._client = None
                self.connected.clear()
            if stopped:
                break
            try:
                await asyncio.wait_for(stop.wait(), delay * (0.8 + 0.4 * secrets.randbelow(1000) / 1000))
            except TimeoutError:
                pass
            delay = min(BACKOFF_MAX_S, delay * 2)

    def _lost(self, exc: BaseException, delay: float) -> None:
        log.warning("broker %s: %s; retrying in about %.1f s", self.broker.url, exc or type(exc).__name__, delay)
        self.notifier.status(f"broker {self.broker.url} unreachable; {self._monitors()} monitor(s); retrying")

    async def _on_connect(self, client: aiomqtt.Client) -> None:
        _no_delay(client)
        # Subscribed before 'online': a client that waits for 'online' is never lost. Retain As Published (v5): a
        # request published with retain keeps its flag even live, so that it is ignored every time, not run
        # once live and then again at every reconnect. MQTT 3.1.1 has no such option: there a live retained
        # request arrives without its flag (it runs once), a replayed one with it (ignored).
        for topic in (self.topics.requests, *self._subscriptions):  # (owners' requests among them)
            if self.broker.protocol == "5":
                await client.subscribe(topic, options=SubscribeOptions(qos=1, retainAsPublished=True))
            else:
                await client.subscribe(topic, qos=1)
        states = publishable(self._retained())
        # The queue's retained states for these topics are older than these (queued while the broker was away):
        # dropped, so that a retained state never goes back (10 -> 5 -> 10). Its events stay, in order.
        fresh = {s.topic for s in states}
        self._outbox = collections.deque(m for m in self._outbox if not (m.retain and m.topic in fresh))
        for start in range(0, len(states), PUBLISH_BATCH):
            await asyncio.gather(*(client.publish(s.topic, s.payload, qos=1, retain=True)
                                   for s in states[start:start + PUBLISH_BATCH]))
        await client.publish(self.topics.status, self.online, qos=1, retain=True)
        self._client = client
        self.connected.set()
        log.info("connected to %s as %s; %d retained state(s) published", self.broker.url, self.client_id,
                 len(states))
        self.notifier.status(f"connected to {self.broker.url}; {self._monitors()} monitor(s)")

    async def _stop_when_asked(self, client: aiomqtt.Client, stop: asyncio.Event) -> None:
        await stop.wait()
        await self._say_offline(client)
        raise _CleanStop

    async def _say_offline(self, client: aiomqtt.Client) -> None:
        try:
            await asyncio.wait_for(client.publish(self.topics.status, OFFLINE, qos=1, retain=True), 3.0)
        except (aiomqtt.MqttError, TimeoutError, asyncio.CancelledError) as exc:
            log.warning("could not publish offline status: %s", exc or type(exc).__name__)

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
        prefix = self.topics.request_prefix
        async for message in client.messages:
            topic = message.topic.value
            if topic.startswith(prefix):
                self._on_request(topic[len(prefix):], message)
            elif self._on_message is not None:
                self._on_message(message)
            del message  # not held while the next one is awaited (a large request's payload with it)


def publishable(messages: Sequence[Outgoing]) -> list[Outgoing]:
    """The messages whose topic the broker accepts; each other one logged and dropped."""
    out = []
    for m in messages:
        why = topic_fault(m.topic)
        if why is None:
            out.append(m)
        else:
            log.warning("not published: the broker would refuse topic %r (%s)", m.topic, why)
    return out


def _no_delay(client: aiomqtt.Client) -> None:
    """TCP_NODELAY on the connection: an answer is one small packet, and Nagle's algorithm would hold it
    back until the broker's delayed ACK (about 40 ms a round trip)."""
    sock = client._client.socket()
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            log.debug("TCP_NODELAY not set: %s", exc)
