"""Benchmark: the agent's CPU and memory at idle with 100 monitors.

    .venv/bin/python -m bench.idle_cost [--monitors 100] [--seconds 60] [--sample-interval 1.0]

Starts the real agent (`daop-agent run --local-broker`) on this machine's
real /sys and /proc with a private copy of the calibration, registers
`--monitors` monitors (the blur segmenter at a range of frame sizes, each
its own graph), lets it settle, then measures for `--seconds`: CPU time of
the agent and its estimator workers (the private Mosquitto left out) as a
share of one core, their resident and proportional memory (RSS, PSS), and
their wakeups: context switches of all their threads, voluntary and not, per
second, with the threads that make the most of them (the agent's main thread
runs the event loop). The idle cost includes the device sampling every sample
interval, the monitors' re-evaluation on each sample and the periodic warm
refresh.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil

from agent import calibration_store
from agent.config import default_state_dir
from bench.support import start_agent, stop_agent, wait_online
from daop_client import DaopClient

REPO = Path(__file__).resolve().parent.parent


def agent_processes(pid: int) -> list:
    """The agent and its children, Mosquitto excepted."""

    root = psutil.Process(pid)
    return [root] + [c for c in root.children(recursive=True) if "mosquitto" not in c.name()]


def cpu_seconds(procs: list) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # noqa: BLE001 - a worker that just went away
            pass
    return total


def pss_mb(procs: list) -> float:
    total = 0
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def switches(procs: list) -> dict[str, int]:
    """Context switches so far of each thread of `procs`, keyed "<process>/<tid>" (the main thread: "/main")."""
    out = {}
    for n, p in enumerate(procs):
        name = "agent" if n == 0 else f"child{n}"
        try:
            tids = os.listdir(f"/proc/{p.pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p.pid}/task/{tid}/status") as f:
                    count = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
            except OSError:
                continue
            out[f"{name}/{'main' if int(tid) == p.pid else tid}"] = count
    return out


def rss_mb(procs: list) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except Exception:  # noqa: BLE001
            pass
    return total / 2**20


async def register(port: int, count: int) -> None:

    model = REPO / "examples" / "blur_segmenter.webnn"
    # without a lease, as a backend's: the monitors stay once this client is gone (with one, they would go a lease
    # later, and the agent measured would have none)
    async with DaopClient(f"mqtt://127.0.0.1:{port}", "idle", timeout_s=120, lease_s=None) as daop:
        for i in range(count):
            h, w = 8 * (20 + i), 8 * (32 + i)  # a different graph each: 160x256 up to 952x1048
            await daop.create_monitor(model, "good", monitor=f"blur{i:03d}", inputs={"image": ((1, h, w, 3), None)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--monitors", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds to wait after registering")
    ap.add_argument("--sample-interval", type=float, default=1.0)
    ap.add_argument("--state-dir", type=Path, default=None, help="calibration to copy (default: the agent's)")
    args = ap.parse_args()


    source = args.state_dir or default_state_dir()
    calibration_store.load_estimator(source, quick=True)  # calibrate once if there is none
    with tempfile.TemporaryDirectory(prefix="daop-idle-") as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        shutil.copy(calibration_store.calibration_path(source, "cpu"), state)
        agent, port = start_agent(state, "idle", "--sample-interval", str(args.sample_interval),
                                  log=Path(tmp) / "agent.log")
        try:
            asyncio.run(wait_online(port, "idle"))
            t0 = time.monotonic()
            asyncio.run(register(port, args.monitors))
            print(f"{args.monitors} monitors registered in {time.monotonic() - t0:.1f} s; settling {args.settle:g} s")
            time.sleep(args.settle)
            procs = agent_processes(agent.pid)
            cpu0, woken0, wall0 = cpu_seconds(procs), switches(procs), time.monotonic()
            peak = rss_mb(procs)
            while time.monotonic() - wall0 < args.seconds:
                time.sleep(1.0)
                peak = max(peak, rss_mb(procs))
            cpu, woken = cpu_seconds(procs) - cpu0, switches(procs)
            wall = time.monotonic() - wall0
            per_thread = sorted(((woken[k] - woken0.get(k, 0)) / wall, k) for k in woken)[::-1]

            own = psutil.Process(agent.pid).memory_info().rss / 2**20
            print(f"idle with {args.monitors} monitors, sample interval {args.sample_interval:g} s, over {wall:.0f} s: "
                  f"CPU {100 * cpu / wall:.2f} % of one core ({len(procs)} processes: agent + estimator workers); "
                  f"memory {own:.0f} MB (agent), {rss_mb(procs):.0f} MB with workers, peak {peak:.0f} MB, "
                  f"PSS {pss_mb(procs):.0f} MB; wakeups {sum(r for r, _ in per_thread):.1f}/s (the most: "
                  + ", ".join(f"{k} {r:.1f}" for r, k in per_thread[:4]) + ")")
        finally:
            stop_agent(agent)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
