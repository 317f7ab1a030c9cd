"""A real Mosquitto for the tests: its own config in tmp_path, a free loopback port.

Import the fixtures into a test module (`from broker import mosquitto`).
Variants: persistence on or off (a broker restarted without persistence loses
every retained message), and a password file plus an ACL.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent.mosquitto import Mosquitto as Runner
from agent.mosquitto import free_port

MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"


def make_tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for localhost / 127.0.0.1 (openssl)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt"))
    run = lambda *args: subprocess.run(args, check=True, capture_output=True, cwd=folder)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=daop test CA")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return ca, cert, key


class Mosquitto:
    """A test broker: the agent's own Mosquitto runner (agent/mosquitto.py) with the tests' options."""

    def __init__(self, folder: Path, *, port: int | None = None, persistence: bool = False,
                 passwords: dict[str, str] | None = None, acl: str | None = None,
                 tls: tuple[Path, Path, Path] | None = None, max_packet_size: int | None = None,
                 max_queued_messages: int = 10000) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.persistence = persistence
        self.tls = tls is not None
        lines = [f"listener {self.port} 127.0.0.1"]
        if tls is not None:  # (ca, cert, key)
            lines += [f"cafile {tls[0]}", f"certfile {tls[1]}", f"keyfile {tls[2]}"]
        lines += [f"persistence {'true' if persistence else 'false'}",
                  f"persistence_location {self.folder}/", "log_dest stderr", "log_type error",
                  "log_type warning", f"max_queued_messages {max_queued_messages}", "set_tcp_nodelay true"]
        if max_packet_size is not None:
            lines.append(f"max_packet_size {max_packet_size}")
        if passwords:
            pw = self.folder / "passwd"
            pw.write_text("")
            for user, password in passwords.items():
                subprocess.run([MOSQUITTO_PASSWD, "-b", str(pw), user, password], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            lines += ["allow_anonymous false", f"password_file {pw}"]
        else:
            lines.append("allow_anonymous true")
        if acl is not None:
            (self.folder / "acl").write_text(acl)
            lines.append(f"acl_file {self.folder / 'acl'}")
        self.process = Runner(self.folder, lines, (self.port,))

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{'localhost' if self.tls else '127.0.0.1'}:{self.port}"

    def start(self) -> Mosquitto:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


@pytest.fixture
def mosquitto(tmp_path: Path):
    broker = Mosquitto(tmp_path / "broker").start()
    yield broker
    broker.stop()


@pytest.fixture
def mosquitto_factory(tmp_path: Path):
    """Build brokers with options; every one is stopped at the end."""
    made: list[Mosquitto] = []

    def make(name: str = "broker", **options) -> Mosquitto:
        broker = Mosquitto(tmp_path / name, **options)
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.stop()
