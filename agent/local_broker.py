"""A private Mosquitto for `daop-agent run --local-broker`: a new user sees the agent work in one command.

It listens on loopback only, keeps its files in `<state dir>/broker/`, and is
stopped when the agent stops. Nothing here is for production: point the agent
at a real broker with `--broker` (docs/security.md).

Besides plain MQTT (anonymous: only local programs can speak it), it can serve
MQTT over WebSockets for web pages (docs/web.md). Any page the user visits can
open a WebSocket to loopback, so that listener takes only the user `web` with
a random password the agent keeps in `<state dir>/broker/web-credentials.json`
(0600; `daop-agent web-credentials` prints it), and its ACL lets that user only
send requests and read answers, status and monitors of this device.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.mosquitto import Mosquitto, MosquittoError, port_in_use
from agent.store import atomic_write
from monitors.errors import BadInput

DEFAULT_PORT = 18830  # plain MQTT; the WebSockets listener defaults to the next port
WEB_USERNAME = "web"
WEB_CREDENTIALS = "web-credentials.json"
PASSWORD_ITERATIONS = 101  # mosquitto_passwd's own default for its $7$ (PBKDF2-SHA512) hashes


@dataclass(frozen=True)
class WebCredentials:
    """What a web page needs to reach the agent; the JSON keys are the JS client's `connect()` options."""

    url: str
    deviceId: str
    username: str
    password: str


def web_credentials_path(state_dir: Path) -> Path:
    return Path(state_dir) / "broker" / WEB_CREDENTIALS


def read_web_credentials(state_dir: Path) -> WebCredentials:
    path = web_credentials_path(state_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return WebCredentials(**{k: str(data[k]) for k in ("url", "deviceId", "username", "password")})
    except FileNotFoundError:
        raise BadInput(f"no web credentials in {path.parent}: start the agent with --local-broker "
                       f"(./run.sh) and this state dir first") from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError):
        raise BadInput(f"{path} is not a web credentials file; delete it and restart the agent for a new one") \
            from None


def password_file_line(username: str, password: str, salt: bytes | None = None) -> str:
    """One line of a Mosquitto password file, as `mosquitto_passwd` writes it (no password on a command line)."""
    salt = salt if salt is not None else secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, PASSWORD_ITERATIONS)
    return f"{username}:$7${PASSWORD_ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def _free_or_refuse(port: int, what: str, flag: str) -> None:
    if not 0 < port < 65536:
        raise BadInput(f"local broker {what} port must be 1 to 65535, not {port}")
    if port_in_use(port):
        raise BadInput(f"local broker: port {port} on 127.0.0.1 ({what}) is already in use; pick another with {flag}")


class LocalBroker:
    def __init__(self, state_dir: Path, port: int = DEFAULT_PORT, *, web_port: int | None = None,
                 device_id: str | None = None, max_packet: int | None = None) -> None:
        """`web_port`: also serve MQTT over WebSockets there, for `device_id`'s web clients (None: not at all);
        `max_packet`: the largest MQTT packet it accepts from anyone (mqtt_link.max_packet_bytes)."""
        self.folder = Path(state_dir) / "broker"
        self.max_packet = max_packet
        self.port = port
        self.web_port = web_port
        self.device_id = device_id
        self.process: Mosquitto | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str | None:
        return f"ws://127.0.0.1:{self.web_port}" if self.web_port else None

    def _web_credentials(self) -> WebCredentials:
        """This start's credentials: the password already handed out is kept, so that web apps keep working."""
        assert self.web_url is not None and self.device_id is not None
        try:
            password = read_web_credentials(self.folder.parent).password
        except BadInput:
            password = secrets.token_urlsafe(24)
        return WebCredentials(self.web_url, self.device_id, WEB_USERNAME, password)

    def _web_listener(self) -> list[str]:
        creds = self._web_credentials()
        passwd, acl = self.folder / "web-passwd", self.folder / "web-acl"
        atomic_write(passwd, (password_file_line(creds.username, creds.password) + "\n").encode())
        base = f"daop/{creds.deviceId}"
        atomic_write(acl, (f"user {creds.username}\n"
                           f"topic write {base}/request/#\n"
                           f"topic read {base}/response/#\n"
                           f"topic read {base}/status\n"
                           f"topic read {base}/monitors/#\n").encode())
        atomic_write(web_credentials_path(self.folder.parent), (json.dumps(asdict(creds), indent=1) + "\n").encode())
        # Mosquitto 2.0's websockets listener binds every address unless told the socket domain.
        return [f"listener {self.web_port} 127.0.0.1", "socket_domain ipv4", "protocol websockets",
                "allow_anonymous false", f"password_file {passwd}", f"acl_file {acl}"]

    def start(self, timeout_s: float = 10.0) -> None:
        _free_or_refuse(self.port, "MQTT", "--local-broker PORT")
        if self.web_port is not None:
            if self.device_id is None:
                raise ValueError("a WebSockets listener needs the device id for its ACL")
            if self.web_port == self.port:
                raise BadInput(f"local broker: the WebSockets port cannot be the MQTT port {self.port}")
            _free_or_refuse(self.web_port, "WebSockets", "--web-port PORT")
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        lines = ["per_listener_settings true", "persistence true", f"persistence_location {self.folder}/",
                 "log_dest stderr", "log_type error", "log_type warning",
                 "set_tcp_nodelay true",  # answers are small packets: no Nagle delay on them
                 f"listener {self.port} 127.0.0.1", "allow_anonymous true"]
        if self.max_packet is not None:  # a larger message is refused at the broker, never held by anyone
            lines.insert(0, f"max_packet_size {self.max_packet}")
        if self.web_port is not None:
            lines += self._web_listener()
        else:  # no page may be handed credentials for a listener that is not there
            for name in (WEB_CREDENTIALS, "web-passwd", "web-acl"):
                (self.folder / name).unlink(missing_ok=True)
        ports = (self.port, self.web_port) if self.web_port else (self.port,)
        self.process = Mosquitto(self.folder, lines, ports, with_parent=True)
        try:
            self.process.start(timeout_s)
        except MosquittoError as exc:
            raise BadInput(f"local broker: {exc}") from None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.process = None
