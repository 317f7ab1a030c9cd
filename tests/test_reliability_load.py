"""Reliability under load: 100 clients sending requests at once; a slow subscriber.

The real agent process, a real Mosquitto, real estimates; the device is a
fixture /sys tree (a desktop) whose platform profile the test flips (policy
`power_saver = true`) to make every monitor change at once.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import struct
import time
from pathlib import Path

import pytest
from agent_harness import agent_on, client, request_v5, write_config
from test_agent_contract import SMALL

DEV = "load1"
CONFIG = """
[monitors]
min_dwell_s = 0.1
max_events_per_minute = 100

[limits]
max_monitors = 100

[policy]
power_saver = true
"""


@pytest.fixture
def agent(state_dir: Path, mosquitto, device, tmp_path: Path):
    proc = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV).start()
    yield proc
    proc.stop()


async def test_a_hundred_clients_sending_requests_at_once_all_get_their_own_answers(agent, mosquitto):
    async def one(i: int) -> tuple[float, float]:
        async with client(mosquitto.port, identifier=f"app-{i}") as c:
            t0 = time.perf_counter()
            est, _ = await request_v5(c, DEV, "estimate", {"onnx": SMALL, "transaction": f"e{i}"}, timeout=120)
            t1 = time.perf_counter()
            meets, _ = await request_v5(c, DEV, "meets", {"onnx": SMALL, "requiredTier": "poor", "transaction": i},
                                        timeout=120)
            t2 = time.perf_counter()
        assert est["status"] == "ok" and est["transaction"] == f"e{i}", est
        assert meets == {"status": "ok", "data": {"meetsRequirement": True}, "transaction": i}, meets
        return t1 - t0, t2 - t1

    t0 = time.perf_counter()
    times = await asyncio.gather(*(one(i) for i in range(100)))
    wall = time.perf_counter() - t0
    latencies = sorted(t for pair in times for t in pair)
    p50, p95 = statistics.median(latencies), latencies[int(0.95 * len(latencies)) - 1]
    print(f"\n100 clients x 2 requests at once: all answered in {wall:.1f} s; latency p50 {p50 * 1000:.0f} ms, "
          f"p95 {p95 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms")
    assert agent.proc.poll() is None
    assert latencies[-1] < 60


def raw_slow_subscriber(port: int, topic: str) -> socket.socket:
    """An MQTT 3.1.1 client that subscribes with QoS 1 and then never reads nor acknowledges (a tiny receive
    buffer): past its in-flight window (20 in Mosquitto) the broker must queue everything else for it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    cid = b"slow-sub"
    var = b"\x00\x04MQTT\x04\x02\x00\x3c"  # protocol 4, clean session, keepalive 60 s
    body = var + struct.pack("!H", len(cid)) + cid
    s.sendall(bytes([0x10, len(body)]) + body)
    assert s.recv(4)[:1] == b"\x20"  # CONNACK
    t = topic.encode()
    body = struct.pack("!H", 1) + struct.pack("!H", len(t)) + t + b"\x01"
    s.sendall(bytes([0x82, len(body)]) + body)
    return s


async def test_a_slow_subscriber_does_not_hold_up_events_for_others_or_answers(agent, mosquitto, device):
    monitors = [f"m{i:02d}" for i in range(20)]
    async with client(mosquitto.port) as c:
        for name in monitors:
            answer, _ = await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": "poor",
                                                                     "monitor": name})
            assert answer["status"] == "ok", answer
    slow = raw_slow_subscriber(mosquitto.port, f"daop/{DEV}/#")
    received: dict[str, list[tuple[bool, int]]] = {m: [] for m in monitors}
    answer_times: list[float] = []
    try:
        async with client(mosquitto.port, identifier="fast-sub") as fast:
            await fast.subscribe(f"daop/{DEV}/monitors/+/events", qos=1)

            async def read() -> None:
                async for m in fast.messages:
                    body = json.loads(m.payload)
                    received[body["monitor"]].append((body["meetsRequirement"], body["seq"]))

            reader = asyncio.get_running_loop().create_task(read())
            async with client(mosquitto.port) as asker:
                for flip in range(10):
                    device.set("firmware/acpi/platform_profile", "low-power" if flip % 2 == 0 else "balanced")
                    deadline = time.monotonic() + 20
                    while not all(len(v) > flip for v in received.values()):
                        assert time.monotonic() < deadline, f"flip {flip}: {received}"
                        await asyncio.sleep(0.02)
                    t0 = time.perf_counter()
                    answer, _ = await request_v5(asker, DEV, "estimate", {"onnx": SMALL}, timeout=30)
                    answer_times.append(time.perf_counter() - t0)
                    assert answer["status"] == "ok"
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    finally:
        slow.close()
    for name, events in received.items():
        assert [m for m, _ in events] == [i % 2 == 1 for i in range(10)], (name, events)
        assert [s for _, s in events] == sorted(s for _, s in events)
    print(f"\nslow subscriber: 200 events reached the fast one in order; estimates meanwhile answered in at most "
          f"{max(answer_times) * 1000:.0f} ms")
    assert agent.proc.poll() is None
    assert max(answer_times) < 10
