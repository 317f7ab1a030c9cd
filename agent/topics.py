"""The MQTT topics and payloads the agent publishes, built in one place (docs/mqtt.md, the contract).

Everything the agent sends goes under its own base `daop/<device_id>/`: a requester's v5 ResponseTopic is
used only when it lies under the base's `response/` or the owner's own (`answer_topic`).

A client that names itself asks under its own scope, `daop/<device_id>/client/<owner>/`: its requests,
default answers and monitors' topics live there, so a broker ACL (`pattern ... client/%u/#`) can give each
app its own and nobody else's (docs/mqtt.md "Owners"). The unscoped topics are the shared owner "".
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("daop-agent")

ONLINE = json.dumps({"state": "online"}).encode()
OFFLINE = json.dumps({"state": "offline"}).encode()
OWNER_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # an owner is one topic level, as a device id (fullmatch)


def topic_fault(topic: str) -> str | None:
    """Why a broker would refuse a PUBLISH to `topic` (None: it would not): MQTT's rules as Mosquitto applies
    them (empty, over 65535 bytes, a wildcard, U+0000, a control character, a surrogate or a non-character).
    Mosquitto answers such a publish by closing the connection, so the agent checks every topic it sends
    to and drops the one message instead of the connection every app shares."""
    if not topic:
        return "it is empty"
    if "+" in topic or "#" in topic:
        return "it has a wildcard"
    for ch in topic:
        cp = ord(ch)
        if cp < 0x20 or 0x7F <= cp <= 0x9F:
            return f"it has the control character U+{cp:04X}"
        if 0xD800 <= cp <= 0xDFFF or 0xFDD0 <= cp <= 0xFDEF or cp & 0xFFFE == 0xFFFE:
            return f"it has U+{cp:04X}, which MQTT does not allow"
    if len(topic.encode()) > 65535:
        return "it is longer than 65535 bytes"
    return None


def online(storage_ok: bool = True) -> bytes:
    """The retained status while the agent serves: `{"state": "online"}`, with `"storage": "failing"` while
    it cannot save its state dir (it keeps serving; monitors cannot be created, changes wait to be saved)."""
    return ONLINE if storage_ok else json.dumps({"state": "online", "storage": "failing"}).encode()


@dataclass(frozen=True)
class Outgoing:
    topic: str
    payload: bytes
    retain: bool
    qos: int = 1


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Topics:
    """The topics of one device (`base` = `daop/<device_id>/`)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.status = base + "status"
        self.requests = base + "request/#"  # the agent's subscription
        self.request_prefix = base + "request/"
        self.owner_requests = base + "client/+/request/#"  # the agent's subscription for owners' requests

    def scope(self, owner: str = "") -> str:
        """Where an owner's requests, answers and monitors live: its `client/<owner>/`, or the base for ""."""
        return f"{self.base}client/{owner}/" if owner else self.base

    def owner_request(self, topic: str) -> tuple[str, str] | None:
        """(owner, method) of a request under an owner's scope; None for any other topic or a bad owner."""
        prefix = self.base + "client/"
        if not topic.startswith(prefix):
            return None
        owner, sep, rest = topic[len(prefix):].partition("/request/")
        if not sep or not OWNER_RE.fullmatch(owner):
            return None
        return owner, rest

    def response(self, method: str, owner: str = "") -> str:
        return f"{self.scope(owner)}response/{method}"

    def monitor_state(self, monitor: str, owner: str = "") -> str:
        return f"{self.scope(owner)}monitors/{monitor}/state"

    def monitor_events(self, monitor: str, owner: str = "") -> str:
        return f"{self.scope(owner)}monitors/{monitor}/events"

    def state_message(self, monitor: str, meets: bool, seq: int, requirement: dict[str, Any],
                      workloads: dict[str, tuple[dict[str, Any], bool]] | None = None, owner: str = "") -> Outgoing:
        """A monitor's retained state: its requirement's fields (`requiredTier`, or `requiredRate` and/or
        `requiredDeadlineMs`) or, for a group, each workload's requirement and answer."""
        body: dict[str, Any] = {"monitor": monitor}
        if workloads is None:
            body.update(requirement)
        else:
            body["workloads"] = {name: {**req, "meetsRequirement": ok} for name, (req, ok) in workloads.items()}
        body |= {"meetsRequirement": meets, "seq": seq}
        return Outgoing(self.monitor_state(monitor, owner), json.dumps(body).encode(), retain=True)

    def cleared_state(self, monitor: str, owner: str = "") -> Outgoing:
        """An empty retained message: the broker forgets a deleted monitor's state."""
        return Outgoing(self.monitor_state(monitor, owner), b"", retain=True)

    def event_message(self, monitor: str, meets: bool, seq: int, workloads: dict[str, bool] | None = None,
                      owner: str = "") -> Outgoing:
        body: dict[str, Any] = {"monitor": monitor, "meetsRequirement": meets, "seq": seq, "ts": utc_now()}
        if workloads is not None:
            body["workloads"] = workloads
        return Outgoing(self.monitor_events(monitor, owner), json.dumps(body).encode(), retain=False)

    def answer_topic(self, method: str, response_topic: str | None, owner: str = "") -> str | None:
        """Where an answer goes: the owner's `response/<method>` when the request had no v5 ResponseTopic; the
        ResponseTopic when it lies under the asking scope's own `response/` (the owner's `client/<owner>/response/`,
        the base's for the shared owner: an owner never answers into the shared topics; docs/mqtt.md); the owner's
        `response/<method>` again for a wildcard or another topic inside this device's tree (a requester must not
        make the agent write its monitors' state, nor into another owner's scope); and nowhere (None, logged) for
        a topic outside `daop/<device_id>/`: the agent publishes under its own base only, whatever the broker's
        ACL allows."""
        if not response_topic:
            return self.response(method, owner)
        if not response_topic.startswith(self.base):
            log.warning("not answering: ResponseTopic %r is outside %s", _short(response_topic), self.base)
            return None
        allowed = self.scope(owner) + "response/"  # an owner's answers stay in its own scope
        if "+" in response_topic or "#" in response_topic or "\0" in response_topic or \
                not response_topic.startswith(allowed):
            log.warning("ignoring ResponseTopic %r: answering on response/%s", _short(response_topic), method)
            return self.response(method, owner)
        return response_topic


def _short(topic: str) -> str:
    text = topic.encode("ascii", "backslashreplace").decode()
    return text if len(text) <= 120 else text[:117] + "..."
