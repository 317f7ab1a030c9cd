"""One MQTT connection to the broker (v5; 3.1.1 where asked, for brokers without v5), opened again after a loss
with jittered exponential backoff.

A session is kept on the broker for `session_expiry_s` after a loss (clean start only where asked; on 3.1.1,
clean_session false and the broker's own expiry), so the QoS 1 messages of a subscription that arrive while the
client is away wait for it there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daop_client.address import Address

BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 10.0


@dataclass(frozen=True)
class Credentials:
    """What a URL does not carry: credentials and TLS files (the URL's own credentials win)."""

    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


PROTOCOLS = ("5", "3.1.1")


def open_client(address: Address, credentials: Credentials, client_id: str, *, clean_start: bool,
                session_expiry_s: int, protocol: str = "5") -> aiomqtt.Client:
    """An aiomqtt client (not connected yet: `async with` it)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be {' or '.join(PROTOCOLS)}, not {protocol!r}")
    c = credentials
    tls = aiomqtt.TLSParameters(ca_certs=c.ca_file, certfile=c.cert_file, keyfile=c.key_file) if address.tls else None
    session: dict[str, Any] = {"clean_session": clean_start}
    if protocol == "5":
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = session_expiry_s
        session = {"clean_start": clean_start, "properties": props}
    return aiomqtt.Client(address.host, address.port, username=address.username or c.username,
                          password=address.password or c.password, identifier=client_id,
                          protocol=aiomqtt.ProtocolVersion.V5 if protocol == "5" else aiomqtt.ProtocolVersion.V311,
                          tls_params=tls, timeout=10, **session)


class Backoff:
    """Delays between tries: doubling from BACKOFF_MIN_S to BACKOFF_MAX_S, each within +-20 %."""

    def __init__(self) -> None:
        self.delay = BACKOFF_MIN_S

    def next(self) -> float:
        delay = self.delay * random.uniform(0.8, 1.2)
        self.delay = min(BACKOFF_MAX_S, self.delay * 2)
        return delay

    def reset(self) -> None:
        self.delay = BACKOFF_MIN_S


def acknowledge_manually(client: aiomqtt.Client) -> None:
    """QoS 1 messages acknowledged only by `acknowledge`: aiomqtt (through paho) acknowledges a message as soon
    as it is queued, so one queued and not yet handled when the process stops would be lost."""
    client._client.manual_ack_set(True)


def acknowledge(client: aiomqtt.Client, message: aiomqtt.Message) -> None:
    if message.qos > 0:
        client._client.ack(message.mid, message.qos)
