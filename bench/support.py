"""What the benchmarks share: the calibration they score, and a real agent to run."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiomqtt

from agent import calibration_store

REPO = Path(__file__).resolve().parent.parent


def scored_estimator(state_dir: Path, device: str = "cpu") -> Any:
    """The estimator of the calibration in `state_dir` that a benchmark scores, made first where there is none.
    One there that this code cannot use (an older format, another device) ends the benchmark with status 2 and
    one line: the agent's own loading would calibrate again in its place, unasked, and score the new one."""
    from probes.calibration import Calibration  # noqa: PLC0415 - onnxruntime: only for the benchmarks that price
    from probes.microbench import fingerprint  # noqa: PLC0415

    path = calibration_store.calibration_path(state_dir, device)
    if path.exists():
        try:
            problem = None if Calibration.from_json(path.read_text()).fingerprint == fingerprint(device) else \
                "made for another device"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problem = str(exc)
        if problem:
            print(f"{path}: cannot score it ({problem}); calibrate again with daop-agent calibrate --state-dir "
                  f"{state_dir}", file=sys.stderr)
            raise SystemExit(2)
    return calibration_store.load_estimator(state_dir, device=device)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_online(port: int, device_id: str, timeout_s: float = 120.0) -> None:
    """Until the agent on the broker at 127.0.0.1:`port` says it is online (its retained status)."""

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            async with aiomqtt.Client("127.0.0.1", port) as c:
                await c.subscribe(f"daop/{device_id}/status", qos=1)
                async for m in c.messages:
                    if json.loads(m.payload) == {"state": "online"}:
                        return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def start_agent(state_dir: Path, device_id: str, *args: str, log: Path | None = None) -> tuple[subprocess.Popen, int]:
    """`daop-agent run` with a private broker on a free port, as its own process, on the calibration in
    `state_dir` as it is (a quick one is not redone in full); its output goes to
    `log` (default: agent.log in `state_dir`). Returns the process and the broker's port."""
    port = free_port()
    with open(log or state_dir / "agent.log", "w") as out:  # the child keeps its own copy
        proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--local-broker", str(port), "--state-dir",
                                 str(state_dir), "--device-id", device_id, "--calibration", "quick", *args],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    return proc, port


def stop_agent(proc: subprocess.Popen) -> None:
    """A clean stop (SIGTERM), then a kill if it does not come."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
