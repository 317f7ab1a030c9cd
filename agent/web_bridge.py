"""The browser extension's native messaging host: a page's DAOP calls, asked of the local agent under the page's
origin.

The browser starts `daop-agent web-bridge host` for the extension (clients/js/extension/) and talks to it on
stdin/stdout: JSON messages, each after its length as a 32-bit native-order integer. The extension tags every
call with the origin the browser gives for the page's frame; this host asks the agent under that origin's own
owner scope (`daop/<id>/client/web-<hash of the origin>/`, docs/mqtt.md "Owners"), so that each origin has its
own monitors, privacy jitter and request budget, and forwards each monitor's change events to the extension
with the origin that owns it. No password reaches a page: the host talks to the agent's local broker.

    extension -> host  {"id": 7, "origin": "https://meet.example", "method": "estimate", "body": {...}}
    host -> extension  {"id": 7, "status": "ok", "data": {"performanceTier": "good"}}
                       {"id": 8, "status": "error", "error": {"code": "unreachable", "message": "agent not ..."}}
                       {"event": {"origin": "https://meet.example", "monitor": "m1",  (the page's id)
                                  "doc": {"meetsRequirement": false, "seq": 3, "ts": "..."}}}
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

import aiomqtt

from daop_client import DaopClient, DaopError

NAME = "org.daop.agent"  # the host's name in the browser's native messaging registry
MAX_IN_BYTES = 16 << 20  # a call from the extension (the browser allows 64 MiB; the agent refuses far less)
MAX_OUT_BYTES = 1 << 20  # the browser's limit on a message from the host
MAX_ORIGIN_CHARS = 2048
MAX_ORIGINS = 256  # origins with an open connection to the agent at once (the oldest idle one is closed)
METHODS = ("hello", "estimate", "meets", "monitors/create", "monitors/delete", "monitors/list",
           "monitors/running", "monitors/report")
_LENGTH = struct.Struct("=I")  # native byte order, as the browser writes it


def owner_of(origin: str) -> str:
    """The agent-side owner of a page origin: one topic level, the same for the origin at every visit."""
    return "web-" + hashlib.sha256(origin.encode()).hexdigest()[:32]


MONITOR_PREFIX_CHARS = 13  # a monitor id on the agent: 12 hex characters of its origin, '-', the page's id
MAX_PAGE_MONITOR_CHARS = 64 - MONITOR_PREFIX_CHARS
_PAGE_MONITOR_RE = re.compile(f"[A-Za-z0-9_-]{{1,{MAX_PAGE_MONITOR_CHARS}}}")


def agent_monitor_id(origin: str, monitor: Any) -> str:
    """The agent's id of a page's monitor. Monitor ids are one namespace on the agent (an id another owner holds
    is `monitor_taken`); prefixed with its origin's, a page's ids neither collide with another origin's nor tell
    it which ids that one uses."""
    if not isinstance(monitor, str) or not _PAGE_MONITOR_RE.fullmatch(monitor):
        raise DaopError("bad_monitor_id", f"a monitor id through the extension is 1 to {MAX_PAGE_MONITOR_CHARS} "
                                          f"of A-Z a-z 0-9 _ -, not {str(monitor)[:80]!r}")
    return f"{hashlib.sha256(origin.encode()).hexdigest()[:MONITOR_PREFIX_CHARS - 1]}-{monitor}"


def read_message(stream: BinaryIO) -> Any:
    """One message from the browser; None at the end of the stream (the browser closed the port)."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    if length > MAX_IN_BYTES:
        raise ValueError(f"a message of {length} bytes, more than {MAX_IN_BYTES}")
    body = stream.read(length)
    if len(body) < length:
        return None
    return json.loads(body)


def write_message(stream: BinaryIO, message: dict[str, Any]) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_OUT_BYTES:  # never more than the browser takes: an error answer says so instead
        body = json.dumps({"id": message.get("id"), "status": "error", "error": {
            "code": "too_large", "message": "the answer is larger than a browser takes from its host"}}).encode()
    stream.write(_LENGTH.pack(len(body)) + body)
    stream.flush()


def _error(call_id: Any, code: str, message: str) -> dict[str, Any]:
    return {"id": call_id, "status": "error", "error": {"code": code, "message": message}}


class Bridge:
    """The calls of every origin, each asked under its own owner; `send` writes a message to the extension."""

    def __init__(self, broker: str, device_id: str, send: Callable[[dict[str, Any]], None],
                 timeout_s: float = 30.0) -> None:
        self.broker = broker
        self.device_id = device_id
        self.send = send
        self.timeout_s = timeout_s
        self._clients: dict[str, tuple[DaopClient, contextlib.AsyncExitStack]] = {}
        self._watchers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()

    async def handle(self, message: Any) -> None:
        """Answer one call of the extension; never raises."""
        call_id = message.get("id") if isinstance(message, dict) else None
        try:
            self.send({"id": call_id, "status": "ok", "data": await self._answer(message)})
        except DaopError as exc:
            code = "unreachable" if exc.code in ("disconnected", "no_agent", "offline") else exc.code
            prefix = "agent not reachable: " if code == "unreachable" else ""
            self.send(_error(call_id, code, prefix + exc.message))
        except (aiomqtt.MqttError, OSError) as exc:
            self.send(_error(call_id, "unreachable", f"agent not reachable: cannot reach the broker {self.broker}: "
                                                     f"{exc}"))

    async def _answer(self, message: Any) -> dict[str, Any]:
        if not isinstance(message, dict):
            raise DaopError("bad_request", "a call is an object")
        origin, method, body = message.get("origin"), message.get("method"), message.get("body", {})
        if not isinstance(origin, str) or not origin or len(origin) > MAX_ORIGIN_CHARS:
            raise DaopError("bad_request", "a call carries the page's origin")
        if method not in METHODS:
            raise DaopError("unknown_method", f"unknown method {method!r}; methods: {', '.join(METHODS)}")
        if not isinstance(body, dict):
            raise DaopError("bad_request", "a call's body is an object")
        client = await self._client(origin)
        if method == "hello":  # the agent answers this origin: it is reachable
            await client.request("monitors/list", {})
            return {}
        if method == "monitors/create":
            return await self._create(origin, client, body)
        if method == "monitors/list":
            prefix = agent_monitor_id(origin, "x")[:-1]
            monitors = (await client.request(method, body)).get("monitors", [])
            return {"monitors": [{**m, "monitor": m["monitor"][len(prefix):]} for m in monitors
                                 if isinstance(m, dict) and str(m.get("monitor", "")).startswith(prefix)]}
        if method.startswith("monitors/"):  # delete, running, report: of this origin's monitor
            monitor = agent_monitor_id(origin, body.get("monitor"))
            page_id = monitor[MONITOR_PREFIX_CHARS:]
            if method == "monitors/delete":
                self._stop_watching(origin, page_id)
                await client.delete_monitor(monitor)
                return {}
            return await client.request(method, {**body, "monitor": monitor})
        return await client.request(method, body)

    async def _client(self, origin: str) -> DaopClient:
        async with self._lock:
            if origin in self._clients:
                return self._clients[origin][0]
            if len(self._clients) >= MAX_ORIGINS:
                idle = next((o for o in self._clients if not any(k[0] == o for k in self._watchers)), None)
                if idle is None:
                    raise DaopError("too_many_origins", f"more than {MAX_ORIGINS} origins follow monitors at once")
                await self._close(idle)
            stack = contextlib.AsyncExitStack()
            client = await stack.enter_async_context(DaopClient(self.broker, self.device_id, owner=owner_of(origin),
                                                                timeout_s=self.timeout_s))
            self._clients[origin] = (client, stack)
            return client

    async def _create(self, origin: str, client: DaopClient, body: dict[str, Any]) -> dict[str, Any]:
        agent_id = agent_monitor_id(origin, body.get("monitor"))
        page_id = agent_id[MONITOR_PREFIX_CHARS:]
        fields = {k: v for k, v in body.items() if k != "monitor"}
        monitor = await client.create_from_body(fields, agent_id)
        self._stop_watching(origin, page_id)

        async def forward() -> None:
            async for event in monitor:
                self.send({"event": {"origin": origin, "monitor": page_id, "doc": {
                    "meetsRequirement": event.meets, "seq": event.seq, "ts": event.ts}}})

        self._watchers[(origin, page_id)] = asyncio.get_running_loop().create_task(forward())
        data: dict[str, Any] = {"monitor": page_id, "meetsRequirement": monitor.meets}
        if monitor.workloads is not None:
            data["workloads"] = monitor.workloads
        return data

    def _stop_watching(self, origin: str, monitor: str) -> None:
        task = self._watchers.pop((origin, monitor), None)
        if task is not None:
            task.cancel()

    async def _close(self, origin: str) -> None:
        client, stack = self._clients.pop(origin)
        for key in [k for k in self._watchers if k[0] == origin]:
            self._stop_watching(*key)
            with contextlib.suppress(DaopError, aiomqtt.MqttError, OSError):
                await client.delete_monitor(agent_monitor_id(*key))
        await stack.aclose()

    async def close(self) -> None:
        """The browser closed the port (the extension went away): its monitors go too."""
        for origin in list(self._clients):
            with contextlib.suppress(Exception):  # closing what is left, whatever state each is in
                await asyncio.wait_for(self._close(origin), 5)


async def serve(broker: str, device_id: str, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answer the extension's calls until the browser closes the port."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    write_lock = threading.Lock()

    def send(message: dict[str, Any]) -> None:
        with write_lock:
            write_message(stdout, message)

    def reader() -> None:  # blocking reads off the event loop
        while True:
            try:
                message = read_message(stdin)
            except (ValueError, OSError) as exc:
                print(f"daop-agent web-bridge: {exc}", file=sys.stderr)
                message = None
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message is None:
                return

    threading.Thread(target=reader, daemon=True).start()
    bridge = Bridge(broker, device_id, send)
    tasks: set[asyncio.Task[None]] = set()
    try:
        while (message := await inbox.get()) is not None:
            task = loop.create_task(bridge.handle(message))  # a slow estimate holds no other call back
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
        await bridge.close()
