"""One way to run a Mosquitto process: its config written into a folder of its own, started, waited on until
every listener accepts, stopped cleanly. The agent's private broker (agent/local_broker.py), the simulation
harness and the tests all run theirs through it, so that a fix to how Mosquitto is started is made once.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h


class MosquittoError(RuntimeError):
    """Mosquitto is missing, exited at start, or did not listen in time."""


def find_mosquitto() -> str:
    for candidate in (shutil.which("mosquitto"), "/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise MosquittoError("mosquitto is not installed (Debian/Ubuntu: apt-get install mosquitto)")


def free_port() -> int:
    """A loopback port free right now (another process may take it before it is used: fine for tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when its parent dies, even by SIGKILL (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class Mosquitto:
    """A Mosquitto process for `lines` of config (listeners included), kept in `folder`.

    `ports`: the loopback ports its listeners open, waited on at start. `with_parent`: it dies with the
    process that started it (the agent's private broker); tests leave it off so that they can restart it."""

    def __init__(self, folder: Path, lines: list[str], ports: tuple[int, ...], *, with_parent: bool = False) -> None:
        self.folder = Path(folder)
        self.lines = lines
        self.ports = ports
        self.with_parent = with_parent
        self.config = self.folder / "mosquitto.conf"
        self.log = self.folder / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        binary = find_mosquitto()
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        lines = list(self.lines)
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to 'mosquitto', which cannot read a private (0700) folder
        self.config.write_text("\n".join(lines) + "\n")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([binary, "-c", str(self.config)], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=self.with_parent,
                                         preexec_fn=_die_with_parent if self.with_parent else None)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise MosquittoError(f"mosquitto exited at start; see {self.log}: {self._log_tail()}")
            try:
                for port in self.ports:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        pass
                return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise MosquittoError(f"mosquitto did not start listening on {', '.join(map(str, self.ports))}")

    def stop(self) -> None:
        """A clean stop (SIGTERM): with persistence on, it saves its database first."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-500:].strip()
        except OSError:
            return ""
