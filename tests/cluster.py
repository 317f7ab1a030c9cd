"""A real clustered MQTT broker for the tests and bench/fleet.py: three RabbitMQ nodes with the MQTT plugin on
this machine, each on free loopback ports, with its own node name, files and Erlang cookie (a system RabbitMQ
and Mosquitto may run beside it; they are never touched).

RabbitMQ 3.10 (Debian's) speaks MQTT 3.1.1 only. Its MQTT sessions (clean_session false) are queues; declared
as quorum queues (`mqtt.durable_queue_type = quorum`) they are replicated on every node and survive a node's
loss. Retained messages are kept per node, not across the cluster (docs/fleet.md).

    cluster = RabbitCluster(tmp_path / "rabbit").start()   # ~20-40 s on 2 cores
    cluster.urls          # one mqtt:// URL per node
    cluster.kill(0)       # SIGKILL node 0's Erlang VM: a node lost, as in a crash
    cluster.stop()
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from broker import free_port

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
SERVER = RABBIT_BIN / "rabbitmq-server"
CTL = RABBIT_BIN / "rabbitmqctl"


def available() -> str | None:
    """None where RabbitMQ can run here, else why not."""
    if not SERVER.exists() or not CTL.exists():
        return "rabbitmq-server is not installed (scripts/ensure-rabbitmq.sh installs it)"
    plugins = list(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/plugins/rabbitmq_mqtt-*"))
    if not plugins:
        return "RabbitMQ's MQTT plugin is missing"
    return None


class RabbitNode:
    def __init__(self, folder: Path, name: str, home: Path) -> None:
        self.folder = folder
        self.name = name
        self.home = home
        folder.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.configure()

    def configure(self) -> None:
        """Fresh free ports, and the node's files for them (its database and log from an earlier try set aside)."""
        folder = self.folder
        shutil.rmtree(folder / "mnesia", ignore_errors=True)
        if (folder / "server.log").exists():
            (folder / "server.log").replace(folder / "server.log.failed")
        (folder / "pid").unlink(missing_ok=True)
        self.amqp_port, self.dist_port, self.mqtt_port = free_port(), free_port(), free_port()
        (folder / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        (folder / "rabbitmq.conf").write_text("\n".join([
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}",
            f"mqtt.listeners.tcp.default = 127.0.0.1:{self.mqtt_port}",
            "mqtt.allow_anonymous = true",
            "mqtt.durable_queue_type = quorum",  # sessions replicated on every node: they outlive a node
            "loopback_users = none",
            "log.console = false",
            "log.file.level = warning",
        ]) + "\n")
        self.env = {**os.environ, "HOME": str(self.home), "RABBITMQ_NODENAME": self.name,
                    "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.amqp_port),
                    "RABBITMQ_DIST_PORT": str(self.dist_port), "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
                    "RABBITMQ_LOG_BASE": str(folder / "log"), "RABBITMQ_PID_FILE": str(folder / "pid"),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
                    "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
                    "RABBITMQ_ADVANCED_CONFIG_FILE": str(folder / "advanced.config"),
                    "RABBITMQ_PLUGINS_EXPAND_DIR": str(folder / "plugins-expand")}

    def lost_a_port(self) -> bool:
        """Whether its last boot failed because another process took one of its ports first (a free port is free
        only until someone binds it: the parallel tests pick theirs too)."""
        try:
            return "eaddrinuse" in (self.folder / "server.log").read_text(errors="replace")
        except OSError:
            return False

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.mqtt_port}"

    @property
    def pid(self) -> int | None:
        """The Erlang VM's process id (RabbitMQ writes it at boot)."""
        try:
            return int((self.folder / "pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def start(self) -> None:
        with open(self.folder / "server.log", "ab") as log:
            self.proc = subprocess.Popen([str(SERVER)], env=self.env, stdout=log, stderr=log, cwd=self.folder,
                                         start_new_session=True)

    def ctl(self, *args: str, timeout: float = 120) -> str:
        result = subprocess.run([str(CTL), "-n", self.name, *args], env=self.env, capture_output=True, text=True,
                                timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.name}: {result.stderr[-1500:]}")
        return result.stdout

    def wait_mqtt(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {(self.folder / 'server.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.mqtt_port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{self.name}: MQTT listener not up within {timeout} s")

    def kill(self) -> None:
        """SIGKILL the VM: no goodbye to the clients or the other nodes."""
        pid = self.pid
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.ctl("stop", timeout=30)
            self.proc.wait(15)
        except (RuntimeError, subprocess.TimeoutExpired):
            self.kill()


class RabbitCluster:
    def __init__(self, folder: Path, size: int = 3) -> None:
        self.folder = Path(folder)
        home = self.folder / "home"  # one Erlang cookie for the nodes and rabbitmqctl
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        tag = secrets.token_hex(3)
        self.nodes = [RabbitNode(self.folder / f"n{i}", f"daop{tag}n{i}@localhost", home) for i in range(size)]

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def start(self, tries: int = 3) -> RabbitCluster:
        """Start the nodes and cluster them; again on fresh ports where a node lost one of its ports to another
        process before it bound it."""
        for attempt in range(tries):
            try:
                return self._start()
            except RuntimeError:
                if attempt == tries - 1 or not any(n.lost_a_port() for n in self.nodes):
                    raise
                for node in self.nodes:
                    node.configure()
        raise AssertionError("unreachable")

    def _start(self) -> RabbitCluster:
        try:
            for node in self.nodes:
                node.start()
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda n: n.ctl("wait", str(n.folder / "pid"), "--timeout", "120", timeout=150),
                              self.nodes))
            seed = self.nodes[0]
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", seed.name)
                node.ctl("start_app")
            for node in self.nodes:
                node.wait_mqtt()
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, index: int) -> None:
        self.nodes[index].kill()

    def stop(self) -> None:
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.stop(), self.nodes))


@pytest.fixture(scope="session")
def rabbit_cluster(tmp_path_factory):
    """Three clustered RabbitMQ nodes, for the whole session. Skipped only where RabbitMQ is not installed and
    the run is not CI's (under CI=1 a missing RabbitMQ fails: scripts/ensure-rabbitmq.sh installs it)."""
    why = available()
    if why is not None:
        if os.environ.get("CI") == "1":
            pytest.fail(why)
        pytest.skip(why)
    cluster = RabbitCluster(tmp_path_factory.mktemp("rabbit")).start()
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.folder, ignore_errors=True)
