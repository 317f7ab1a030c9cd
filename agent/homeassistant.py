"""Home Assistant MQTT discovery, opt-in (`[homeassistant] enabled = true`): each monitor a binary sensor.

The sensor "<monitor> can run locally" reads the monitor's retained state (`meetsRequirement`, its other fields
as attributes), is available while the agent's retained status says `online`, and belongs to one device per
agent. Its retained config goes out before the monitor's first state and on every (re)connect, is emptied
before a deleted monitor's state is cleared (Home Assistant then removes the entity), and goes out again when
Home Assistant says it is back (`<prefix>/status` = `online`). Nothing is published that the monitor's own
topics do not already say.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from agent.config import HomeAssistantSettings
from agent.topics import Outgoing, Topics

OBJECT_ID_BAD = re.compile(r"[^A-Za-z0-9_-]")


class HomeAssistant:
    def __init__(self, settings: HomeAssistantSettings, device_id: str, topics: Topics, version: str) -> None:
        self.settings = settings
        self.device_id = device_id
        self.topics = topics
        self.version = version
        self._announced: set[str] = set()  # the state topics whose config is out

    def follow(self, messages: Iterable[Outgoing]) -> list[Outgoing]:
        """The agent's outgoing messages with the discovery configs they call for, each in its place: a new
        monitor's config before its first state, a deleted one's removal before its state is cleared."""
        out: list[Outgoing] = []
        for m in messages:
            if self._is_state(m.topic):
                if not m.payload:
                    out.append(Outgoing(self.config_topic(m.topic), b"", retain=True))
                    self._announced.discard(m.topic)
                elif m.topic not in self._announced:
                    out.append(self.config(m.topic))
                    self._announced.add(m.topic)
            out.append(m)
        return out

    def announce(self, retained: Sequence[Outgoing]) -> list[Outgoing]:
        """Every monitor's config again: on each (re)connect (a broker restarted without persistence lost them)
        and when Home Assistant comes back."""
        configs = [self.config(m.topic) for m in retained if self._is_state(m.topic) and m.payload]
        self._announced |= {m.topic for m in retained if self._is_state(m.topic) and m.payload}
        return configs

    def asks_again(self, topic: str, payload: bytes) -> bool:
        """Whether a message from the broker is Home Assistant saying it is back."""
        return topic == self.settings.status_topic and payload.strip() == b"online"

    def _is_state(self, topic: str) -> bool:
        rest = topic[len(self.topics.base):] if topic.startswith(self.topics.base) else ""
        parts = rest.split("/")
        return len(parts) >= 3 and parts[-1] == "state" and parts[-3] == "monitors"

    def _object_id(self, state_topic: str) -> str:
        """The monitor's id, with its client scope's name where it has one (`client/<owner>/monitors/<id>`)."""
        parts = state_topic[len(self.topics.base):].split("/")[:-1]
        kept = [p for p in parts if p not in ("client", "monitors")]
        return OBJECT_ID_BAD.sub("_", "_".join(kept))

    def config_topic(self, state_topic: str) -> str:
        node = OBJECT_ID_BAD.sub("_", self.device_id)
        return f"{self.settings.discovery_prefix}/binary_sensor/daop_{node}/{self._object_id(state_topic)}/config"

    def config(self, state_topic: str) -> Outgoing:
        monitor = self._object_id(state_topic)
        node = OBJECT_ID_BAD.sub("_", self.device_id)
        body = {
            "name": f"{monitor} can run locally",
            "unique_id": f"daop_{node}_{monitor}",
            "state_topic": state_topic,
            "value_template": "{{ 'ON' if value_json.meetsRequirement else 'OFF' }}",
            "json_attributes_topic": state_topic,
            "availability_topic": self.topics.status,
            "availability_template": "{{ value_json.state }}",
            "payload_available": "online",
            "payload_not_available": "offline",
            "qos": 1,
            "device": {"identifiers": [f"daop_{node}"], "name": f"{self.device_id} (daop-agent)",
                       "model": "daop-agent", "sw_version": self.version},
            "origin": {"name": "daop-agent", "sw_version": self.version},
        }
        return Outgoing(self.config_topic(state_topic), json.dumps(body).encode(), retain=True)
