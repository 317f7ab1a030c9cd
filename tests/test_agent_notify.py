"""systemd notify protocol through a fake NOTIFY_SOCKET: READY before the broker answers, WATCHDOG, STATUS, STOPPING."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_harness import AgentProcess
from broker import free_port

from agent.notify import Notifier, watchdog_interval_s


@pytest.fixture
def notify_socket(tmp_path: Path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    yield str(path), sock
    sock.close()


def receive_all(sock: socket.socket, until: float,
                enough: Callable[[list[str]], bool] = lambda got: False) -> list[str]:
    """The datagrams until monotonic `until`, or until what came is `enough`."""
    got: list[str] = []
    while time.monotonic() < until and not enough(got):
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            continue
    return got


def test_notifier_sends_datagrams_to_a_path_socket(notify_socket):
    path, sock = notify_socket
    n = Notifier(path)
    assert n.enabled
    assert n.ready("started")
    assert sock.recv(4096).decode().split("\n")[:2] == ["READY=1", "STATUS=started"]
    assert n.watchdog() and sock.recv(4096) == b"WATCHDOG=1"
    assert n.stopping("bye") and sock.recv(4096) == b"STOPPING=1\nSTATUS=bye"
    n.close()


def test_notifier_supports_the_abstract_namespace():
    name = f"daop-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2)
    try:
        n = Notifier("@" + name)
        assert n.status("hello")
        assert sock.recv(4096) == b"STATUS=hello"
    finally:
        sock.close()


def test_notifier_outside_systemd_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert Notifier().enabled is False and Notifier().ready("x") is False


def test_notifier_with_a_dead_socket_reports_false_without_raising(tmp_path: Path):
    assert Notifier(str(tmp_path / "nobody-listens")).watchdog() is False


def test_watchdog_interval_is_half_of_watchdog_usec_and_only_for_this_pid(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval_s() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval_s() == 15.0
    monkeypatch.setenv("WATCHDOG_USEC", "garbage")
    assert watchdog_interval_s() is None


def test_agent_is_ready_before_the_broker_answers_feeds_the_watchdog_and_says_stopping(
        notify_socket, state_dir: Path):
    path, sock = notify_socket
    dead = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens here
    agent = AgentProcess(state_dir, dead, env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    agent.start(wait_for="")
    try:
        # ready, then fed: however long its start-up takes on a busy host
        messages = receive_all(sock, time.monotonic() + 60.0,
                               lambda got: any(m.startswith("READY=1") for m in got)
                               and sum(m == "WATCHDOG=1" for m in got) >= 10)
        assert agent.proc.poll() is None
        ready = [m for m in messages if m.startswith("READY=1")]
        assert len(ready) == 1 and f"MAINPID={agent.proc.pid}" in ready[0]
        assert sum(m == "WATCHDOG=1" for m in messages) >= 10  # every 0.1 s from the event loop
        statuses = [line for m in messages for line in m.split("\n") if line.startswith("STATUS=")]
        assert any("unreachable" in s for s in statuses), statuses
    finally:
        assert agent.stop() == 0
    after = receive_all(sock, time.monotonic() + 0.5)
    assert any(m.startswith("STOPPING=1") for m in messages + after)
