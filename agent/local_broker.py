"""A private Mosquitto for `daop-agent run --local-broker`: a new user sees the agent work in one command.

It listens on loopback only, keeps its files in `<state dir>/broker/`, and is
stopped when the agent stops. Nothing here is for production: point the agent
at a real broker with `--broker` (docs/security.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from monitors.errors import BadInput

DEFAULT_PORT = 18830


def find_mosquitto() -> str:
    for candidate in (shutil.which("mosquitto"), "/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BadInput("--local-broker needs mosquitto (Debian/Ubuntu: apt-get install mosquitto)")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the agent dies, even by SIGKILL (Linux prctl)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class LocalBroker:
    def __init__(self, state_dir: Path, port: int = DEFAULT_PORT) -> None:
        self.folder = Path(state_dir) / "broker"
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        binary = find_mosquitto()
        if not 0 < self.port < 65536:
            raise BadInput(f"local broker port must be 1 to 65535, not {self.port}")
        if _port_in_use(self.port):
            raise BadInput(f"local broker: port {self.port} on 127.0.0.1 is already in use; "
                           f"pick another with --local-broker PORT")
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "persistence true",
                 f"persistence_location {self.folder}/", "log_dest stderr", "log_type error", "log_type warning"]
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to 'mosquitto', which cannot read a private state dir
        config = self.folder / "mosquitto.conf"
        config.write_text("\n".join(lines) + "\n")
        log = open(self.folder / "mosquitto.log", "ab")
        self.proc = subprocess.Popen([binary, "-c", str(config)], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BadInput(f"local broker exited at start; see {self.folder / 'mosquitto.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BadInput(f"local broker did not start listening on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
