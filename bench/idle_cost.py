"""Benchmark: the agent's CPU and memory at idle with 100 monitors.

    .venv/bin/python -m bench.idle_cost [--monitors 100] [--seconds 60] [--settle 75] [--sample-interval 1.0]

Starts the real agent (`daop-agent run --local-broker`) on this machine's
real /sys and /proc with a private copy of the calibration, registers
`--monitors` monitors (the blur segmenter at a range of frame sizes, each
its own graph), lets it settle (past `agent.estimate_idle_s`, after which the estimator's workers leave), then
measures for `--seconds`: CPU time of
the agent's process tree (the private Mosquitto left out; processes that
come and go counted, and those that ended through their parent's children
times) as a share of one core, its resident memory (RSS and PSS), and its
wakeups (context switches of its threads) per second, with the threads that
make the most of them and those that use the most CPU (`agent/main` runs the event loop,
`agent/daop-sampler` samples). The idle cost
includes the device sampling every sample interval, the monitors'
re-evaluation on each sample and the periodic warm refresh. Last, one
`estimate` request is timed (the first after the quiet period) and a second
right after it.
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
from agent.config import Config, default_state_dir
from bench.support import start_agent, stop_agent, wait_online
from daop_client import DaopClient

REPO = Path(__file__).resolve().parent.parent


def agent_processes(pid: int) -> list:
    """The agent and its children, Mosquitto excepted."""

    root = psutil.Process(pid)
    return [root] + [c for c in root.children(recursive=True) if "mosquitto" not in c.name()]


def cpu_seconds(procs: list) -> float:
    """CPU time of the processes and of their children that have ended (an estimator worker that left is
    in its parent's children times; Mosquitto runs to the end, so it is in none)."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except Exception:  # noqa: BLE001 - a worker that just went away
            pass
    return total


def memory_mb(procs: list, pss: bool = False) -> float:
    """The processes' resident memory: RSS (shared pages counted in each) or PSS (shared pages split)."""
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss if pss else p.memory_info().rss
        except Exception:  # noqa: BLE001 - a worker that just went away
            pass
    return total / 2**20


def per_thread(procs: list) -> dict[tuple[int, int], tuple[int, int]]:
    """Of every thread of the processes, by (pid, tid): its context switches so far (each one a wakeup) and its
    nanoseconds on a CPU so far (schedstat)."""
    out = {}
    for p in procs:
        try:
            for tid in os.listdir(f"/proc/{p.pid}/task"):
                with open(f"/proc/{p.pid}/task/{tid}/status") as f:
                    n = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
                with open(f"/proc/{p.pid}/task/{tid}/schedstat") as f:
                    ns = int(f.read().split()[0])
                out[(p.pid, int(tid))] = (n, ns)
        except OSError:  # a process or thread that just went away
            pass
    return out


def add_window(into: dict[tuple[int, int], list[int]], before: dict[tuple[int, int], tuple[int, int]],
               after: dict[tuple[int, int], tuple[int, int]]) -> None:
    """Adds each thread's switches and CPU nanoseconds between two readings; a thread born meanwhile counts
    whole, one gone loses its last part."""
    for key, (n, ns) in after.items():
        n0, ns0 = before.get(key, (0, 0))
        total = into.setdefault(key, [0, 0])
        total[0] += n - n0
        total[1] += ns - ns0


def thread_name(key: tuple[int, int], agent_pid: int) -> str:
    """"agent/main" for the agent's event loop, else "<process>/<thread's name>" ("agent/daop-sampler")."""
    pid, tid = key
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = str(tid)
    return f"{'agent' if pid == agent_pid else pid}/{'main' if tid == pid else comm}"


async def time_estimates(port: int) -> tuple[float, float]:
    """Seconds to the answer of one `estimate` (the first after the quiet period), and of a second right after."""
    model = REPO / "examples" / "blur_segmenter.webnn"
    async with DaopClient(f"mqtt://127.0.0.1:{port}", "idle", timeout_s=120) as daop:
        times = []
        for _ in range(2):
            t0 = time.monotonic()
            await daop.estimate(model, inputs={"image": ((1, 480, 640, 3), None)})
            times.append(time.monotonic() - t0)
    return times[0], times[1]


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
    ap.add_argument("--settle", type=float, default=Config.estimate_idle_s + 15.0,
                    help="seconds to wait after registering (default: past the estimator workers' idle period)")
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
            cpu0, wall0, seen = cpu_seconds(procs), time.monotonic(), per_thread(procs)
            threads: dict[tuple[int, int], list[int]] = {}  # by thread, over the window: switches, CPU ns
            peak = memory_mb(procs)
            while time.monotonic() - wall0 < args.seconds:
                time.sleep(1.0)
                procs = agent_processes(agent.pid)  # a process born meanwhile: all its CPU time is in the window
                after = per_thread(procs)
                add_window(threads, seen, after)
                seen = after
                peak = max(peak, memory_mb(procs))
            cpu = cpu_seconds(procs) - cpu0
            wall = time.monotonic() - wall0
            busiest = sorted(threads, key=lambda k: threads[k][0], reverse=True)[:4]
            costliest = sorted(threads, key=lambda k: threads[k][1], reverse=True)[:4]
            elsewhere = cpu - sum(ns for _, ns in threads.values()) / 1e9  # processes that came and went

            own = psutil.Process(agent.pid).memory_info().rss / 2**20
            print(f"idle with {args.monitors} monitors, sample interval {args.sample_interval:g} s, over {wall:.0f} s: "
                  f"CPU {100 * cpu / wall:.2f} % of one core; "
                  f"{sum(n for n, _ in threads.values()) / wall:.1f} wakeups/s (the most: "
                  + ", ".join(f"{thread_name(key, agent.pid)} {threads[key][0] / wall:.1f}" for key in busiest) + "); "
                  f"memory {own:.0f} MB RSS (agent), {memory_mb(procs):.0f} MB RSS / "
                  f"{memory_mb(procs, pss=True):.0f} MB PSS "
                  f"(its {len(procs)} processes), peak {peak:.0f} MB RSS")
            print("CPU in ms a second: " + ", ".join(
                f"{thread_name(key, agent.pid)} {threads[key][1] / 1e6 / wall:.2f}" for key in costliest)
                  + f"; processes that came and went (warm refreshes) {1e3 * max(0.0, elsewhere) / wall:.2f}")
            first, second = asyncio.run(time_estimates(port))
            print(f"estimate after the quiet period: {first:.2f} s; a second one right after: {second:.2f} s "
                  f"({len(agent_processes(agent.pid))} processes now)")
        finally:
            stop_agent(agent)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
