"""A fleet on one machine: many real agent processes (simulated devices: fixture /sys trees) on one Mosquitto
and on a 3-node RabbitMQ cluster, with a backend (daop_client.Fleet, a persistent session) consuming every event.

Each agent: `daop-agent run` on its own fixture tree (agent/simulation/trees.py desktop), one estimator worker,
`--sample-interval` S (default 5), policy power_saver on, one monitor. Every `--flip-every` seconds the bench
flips every device's platform profile (low-power <-> balanced): each monitor changes once, and its event goes
through the broker to the backend. Printed, per broker:

- start: seconds until every agent is connected; memory per agent: RSS and PSS of each agent's process tree
  (agent, forkserver, estimator worker), median and max; CPU per agent over the flipping phase;
- events: sent (one per device and flip), received by the backend, lost; end-to-end latency from the flip to
  the backend's hand, p50/p95 (it includes the wait for the agent's next sample: up to S seconds);
- the cluster only: node 0, where the agents are, is SIGKILLed at the middle flip; the agents fail over;
  `lost` counts events the backend never got;
- burst: `--burst` synthetic events published with QoS 1 by one client, consumed by one Fleet: events/s through
  broker and backend (the backend's own per-event cost);
- the broker's memory (RSS) at the end.

    .venv/bin/python -m bench.fleet --agents 20 --brokers mosquitto,cluster
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiomqtt
import psutil

from agent import calibration_store
from agent.simulation.trees import desktop
from daop_client import Fleet, FleetEvent

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the tests' real brokers and models: modules there, not a package
from broker import Mosquitto  # noqa: E402 - after the tests' path
from cluster import RabbitCluster  # noqa: E402 - after the tests' path
from models import mlp  # noqa: E402 - after the tests' path

CONFIG = """
[agent]
estimate_workers = 1

[monitors]
min_dwell_s = 0.2
max_events_per_minute = 60

[policy]
power_saver = true
"""


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def tree_of(pid: int) -> list:
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of a process tree in MiB."""
    rss = pss = 0
    for p in tree_of(pid):
        try:
            info = p.memory_full_info()
            rss += info.rss
            pss += info.pss
        except Exception:  # noqa: BLE001 - a worker that just went away
            pass
    return rss / 2**20, pss / 2**20


def cpu_s(pid: int) -> float:
    total = 0.0
    for p in tree_of(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # noqa: BLE001
            pass
    return total


class Agent:
    def __init__(self, folder: Path, name: str, urls: list[str], protocol: str, calibration: Path,
                 sample_interval: float) -> None:
        self.name = name
        self.tree = desktop(folder / "tree")
        self.tree.set("firmware/acpi/platform_profile", "balanced")
        state = folder / "state"
        shutil.copytree(calibration, state)
        (folder / "agent.toml").write_text(CONFIG)
        self.log = folder / "agent.log"
        self.args = [sys.executable, "-m", "agent", "run", "--device-id", name, "--state-dir", str(state),
                     "--config", str(folder / "agent.toml"), "--sysfs-root", str(self.tree.sys),
                     "--procfs-root", str(self.tree.proc), "--sample-interval", str(sample_interval),
                     "--calibration", "quick", "--protocol", protocol, "--session-expiry", "3600",
                     *[f for u in urls for f in ("--broker", u)]]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def wait(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log.read_text(errors="replace"):
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.name} exited: {self.log.read_text()[-1500:]}")
            time.sleep(0.2)
        raise RuntimeError(f"agent {self.name}: no {text!r} within {timeout} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def create_monitors(host_port: int, names: list[str]) -> None:
    """One monitor per device, over MQTT 3.1.1 (every broker here speaks it); answers on response/<method>."""
    small = base64.b64encode(mlp([64, 128, 10], batch=1).SerializeToString()).decode()
    async with aiomqtt.Client("127.0.0.1", host_port, protocol=aiomqtt.ProtocolVersion.V311, timeout=30) as c:
        await c.subscribe("daop/+/response/monitors/create", qos=1)
        for name in names:
            body = {"onnx": small, "requiredTier": "poor", "monitor": "m", "transaction": name}
            await c.publish(f"daop/{name}/request/monitors/create", json.dumps(body), qos=1)
        pending = set(names)

        async def answers() -> None:
            async for m in c.messages:
                answer = json.loads(m.payload)
                if answer.get("status") != "ok":
                    raise RuntimeError(f"monitor not created: {answer}")
                pending.discard(answer.get("transaction"))
                if not pending:
                    return

        await asyncio.wait_for(answers(), 60 + 2 * len(names))


async def burst(publish_port: int, follow_urls: list[str], protocol: str, count: int) -> float:
    """Events/s of `count` synthetic events from one QoS 1 publisher through the broker to one Fleet."""
    got = 0
    done = asyncio.Event()
    async with Fleet(follow_urls, client_id=f"bench-burst-{os.getpid()}", protocol=protocol,
                     devices=[f"burst{i}" for i in range(10)], session_expiry_s=60) as fleet:
        async def follow() -> None:
            nonlocal got
            async for item in fleet:
                if isinstance(item, FleetEvent):
                    got += 1
                    if got >= count:
                        done.set()
                        return

        task = asyncio.create_task(follow())
        start = time.monotonic()
        quiet = logging.getLogger("bench.fleet.burst")  # not one warning per queued publish
        quiet.setLevel(logging.ERROR)
        async with aiomqtt.Client("127.0.0.1", publish_port, protocol=aiomqtt.ProtocolVersion.V311, timeout=30,
                                  max_inflight_messages=256, logger=quiet) as c:
            for start_i in range(0, count, 256):  # 256 in flight, as the agent's outbox sends them
                await asyncio.gather(*(c.publish(
                    f"daop/burst{i % 10}/monitors/m/events",
                    json.dumps({"monitor": "m", "meetsRequirement": i % 2 == 0, "seq": i,
                                "ts": "2026-01-01T00:00:00Z"}),
                    qos=1) for i in range(start_i, min(count, start_i + 256))))
        try:
            await asyncio.wait_for(done.wait(), 120)
        finally:
            task.cancel()
        return got / (time.monotonic() - start)


async def run_fleet(kind: str, args: argparse.Namespace, calibration: Path, work: Path) -> dict:
    folder = work / kind
    if kind == "mosquitto":
        mosq = Mosquitto(folder / "broker", max_queued_messages=100_000)
        mosq.start()
        agent_urls, backend_urls, protocol = [mosq.url], [mosq.url], "5"
        request_port, publish_port = mosq.port, mosq.port
        broker_pids = lambda: [mosq.proc.pid]  # noqa: E731
        stop_broker, kill_node = mosq.stop, None
    else:
        t = time.monotonic()
        cluster = RabbitCluster(folder / "rabbit").start()
        print(f"[{kind}] 3 nodes up in {time.monotonic() - t:.0f} s", flush=True)
        n0, n1, n2 = cluster.nodes
        agent_urls, backend_urls, protocol = [n0.url, n1.url, n2.url], [n2.url, n1.url], "3.1.1"
        request_port, publish_port = n1.mqtt_port, n1.mqtt_port
        broker_pids = lambda: [n.pid for n in cluster.nodes if n.proc and n.proc.poll() is None]  # noqa: E731
        stop_broker, kill_node = cluster.stop, lambda: cluster.kill(0)
    names = [f"bench{i:04d}" for i in range(args.agents)]
    agents = [Agent(folder / n, n, agent_urls, protocol, calibration, args.sample_interval) for n in names]
    received: dict[str, list[tuple[int, bool, float]]] = {n: [] for n in names}
    result: dict = {"broker": kind, "agents": args.agents, "sample_interval_s": args.sample_interval}
    try:
        t = time.monotonic()
        with ThreadPoolExecutor(args.start_parallel) as pool:
            def start(a: Agent) -> None:
                a.start()
                a.wait(f"connected to {agent_urls[0]}", 600)
            list(pool.map(start, agents))
        result["start_s"] = round(time.monotonic() - t, 1)
        print(f"[{kind}] {args.agents} agents connected in {result['start_s']} s", flush=True)

        async with Fleet(backend_urls, client_id=f"bench-backend-{kind}", protocol=protocol, devices=names) as fleet:
            async def follow() -> None:
                async for item in fleet:
                    if isinstance(item, FleetEvent):
                        received[item.device].append((item.event.seq, item.event.meets, time.monotonic()))

            task = asyncio.create_task(follow())
            await create_monitors(request_port, names)
            await asyncio.sleep(args.sample_interval + 1)
            cpu0 = {a.name: cpu_s(a.proc.pid) for a in agents}
            t_cpu = time.monotonic()
            flips: list[float] = []
            killed_at = None
            for k in range(args.flips):
                profile = "low-power" if k % 2 == 0 else "balanced"
                for a in agents:
                    a.tree.set("firmware/acpi/platform_profile", profile)
                flips.append(time.monotonic())
                if kill_node is not None and k == args.flips // 2:
                    kill_node()
                    killed_at = k
                    print(f"[{kind}] node 0 killed at flip {k}", flush=True)
                await asyncio.sleep(args.flip_every)
            cpu_elapsed = time.monotonic() - t_cpu
            cpu1 = {a.name: cpu_s(a.proc.pid) for a in agents}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and sum(len({s for s, _, _ in v}) for v in received.values()) \
                    < args.agents * args.flips:
                await asyncio.sleep(0.5)
            task.cancel()
        mem = [memory_mb(a.proc.pid) for a in agents]
        latencies, lost = [], 0
        for n in names:
            seen: dict[int, float] = {}
            for seq, _, at in received[n]:
                seen.setdefault(seq, at)
            seqs = sorted(seen)
            first = seqs[0] if seqs else 0
            for k in range(args.flips):
                if first + k in seen:
                    latencies.append(seen[first + k] - flips[k])
                else:
                    lost += 1
        sent = args.agents * args.flips
        result |= {
            "events_sent": sent, "events_received": sent - lost, "events_lost": lost,
            "duplicates": sum(len(v) for v in received.values()) - (sent - lost),
            "node_killed_at_flip": killed_at,
            "event_rate_per_s": round(sent / (args.flips * args.flip_every), 2),
            "latency_p50_s": round(pct(latencies, 0.5), 3), "latency_p95_s": round(pct(latencies, 0.95), 3),
            "latency_max_s": round(max(latencies, default=float("nan")), 3),
            "rss_mb_median": round(statistics.median(m[0] for m in mem), 1),
            "rss_mb_max": round(max(m[0] for m in mem), 1),
            "pss_mb_median": round(statistics.median(m[1] for m in mem), 1),
            "cpu_pct_of_core_median": round(100 * statistics.median(
                (cpu1[a.name] - cpu0[a.name]) / cpu_elapsed for a in agents), 2),
            "failed_over": sum(agent_urls[1] in a.log.read_text(errors="replace") for a in agents)
            if kill_node else None,
        }
        if args.burst:
            result["burst_events_per_s"] = round(await burst(publish_port, backend_urls, protocol, args.burst), 0)
        result["broker_rss_mb"] = round(sum(memory_mb(p)[0] for p in broker_pids()), 1)
        return result
    finally:
        for a in agents:
            a.stop()
        for a in agents:
            a.reap()
        stop_broker()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--brokers", default="mosquitto,cluster", help="mosquitto, cluster, or both (comma-separated)")
    ap.add_argument("--sample-interval", type=float, default=5.0)
    ap.add_argument("--flips", type=int, default=6)
    ap.add_argument("--flip-every", type=float, default=12.0, help="seconds between flips (above the interval)")
    ap.add_argument("--start-parallel", type=int, default=2, help="agents starting at once")
    ap.add_argument("--burst", type=int, default=5000, help="synthetic events for the throughput figure (0: none)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="daop-fleet-") as tmp:
        work = Path(tmp)
        calibration = work / "calibration"
        calibration_store.run_calibration(calibration, "cpu", quick=True)
        for kind in args.brokers.split(","):
            result = asyncio.run(run_fleet(kind, args, calibration, work))
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
