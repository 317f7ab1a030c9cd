"""Benchmark: how fast a client reads the device's speed through the tiers, with `[privacy]` off and on.

    .venv/bin/python -m bench.probing [--identities 12] [--periods 12] [--period-s 12] [--state-dir DIR]

Runs the real agent (`daop-agent run --local-broker`, its own Mosquitto) on a fixture /sys and /proc tree
with the warm refresh off (its calibration's reference measurement dropped): the device's speed is the
fixture's, steady, and does not move with this machine's other work under the attacker. An attacker client
binary-searches the rows `m` of a MatMul [m, 256] x [256, 256] across the excellent/good boundary (16 ms),
until it has the flip point to +-5 % (its search interval within a factor 1.10). The flip point is the
device's throughput: FLOPs per 16 ms.

1. Privacy off: the requests and seconds one search takes, and the flip point (searched to +-0.25 %).
2. Defaults (jitter, hysteresis, budgets), with the jitter's period shortened to `--period-s` so that many
   periods fit in a run: each of `--identities` attackers (owners) searches once per period to +-0.25 %,
   `--periods` periods. Within a period a second search finds exactly the same (jittered) flip point, so
   asking again averages nothing out; across periods an attacker combines its flip points (the midrange,
   best for a uniform jitter). The truth here is the geometric mean of every flip point of the run (the
   jitter is symmetric; printed beside the privacy-off one: the device's speed between the two runs may
   differ on a busy machine). Printed: how far one search is off the truth, and how many periods, requests,
   and days at the default period it takes until an attacker's estimate is within +-5 % of the truth and
   stays there (median and worst over the identities). Then the same for a Sybil attacker: all the
   identities' flip points of one period combined (many client names at once, on a broker that does not
   authenticate them).
3. The budget: a client asking as fast as it can, how many of its requests are answered in a minute.
4. An honest app (three estimates, one monitor created, listed and deleted): whether it ever meets the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import aiomqtt
import onnx
import onnx.helper as h
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent import calibration_store
from agent.calibration_store import run_calibration
from agent.config import PrivacySettings
from agent.simulation.trees import desktop
from bench.support import start_agent, stop_agent, wait_online
from monitors.privacy import PrivacyRules

REPO = Path(__file__).resolve().parent.parent

K = 256  # the MatMul's inner and output width
DEVICE = "probe"
WITHIN = 1.10  # a search stops when hi / lo <= this: the flip point to +-5 %
FINE = 1.005  # ... to +-0.25 %
REPEATS = 3  # periods in which the first attacker searches twice


def matmul_b64() -> str:

    graph = h.make_graph([h.make_node("MatMul", ["a", "b"], ["y"])], "probe",
                         [h.make_tensor_value_info("a", onnx.TensorProto.FLOAT, ["m", K]),
                          h.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [K, K])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["m", K])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    return base64.b64encode(model.SerializeToString()).decode()


@dataclass
class Tally:
    requests: int = 0
    limited: int = 0  # answers `rate_limited`
    waited_s: float = 0.0  # slept on retryAfterS


class Asker:
    """One client asking under its own scope; a `rate_limited` answer is waited out and asked again."""

    def __init__(self, client, owner: str, model: str) -> None:
        self.client, self.owner, self.model = client, owner, model
        self.scope = f"daop/{DEVICE}/client/{owner}/"
        self.response = f"{self.scope}response/{uuid.uuid4().hex[:8]}"
        self.pending: dict[bytes, asyncio.Future] = {}
        self.tally = Tally()

    async def start(self) -> None:
        await self.client.subscribe(self.response, qos=1)

    def deliver(self, message) -> bool:
        if message.topic.value != self.response:
            return False
        future = self.pending.pop(bytes(message.properties.CorrelationData), None)
        if future is not None and not future.done():
            future.set_result(json.loads(message.payload))
        return True

    async def ask(self, method: str, body: dict, wait_out: bool = True) -> dict:

        while True:
            corr = uuid.uuid4().bytes
            future = asyncio.get_running_loop().create_future()
            self.pending[corr] = future
            props = Properties(PacketTypes.PUBLISH)
            props.ResponseTopic, props.CorrelationData = self.response, corr
            self.tally.requests += 1
            await self.client.publish(f"{self.scope}request/{method}", json.dumps(body).encode(), qos=1,
                                      properties=props)
            answer = await asyncio.wait_for(future, 120)
            if answer["status"] == "error" and answer["error"]["code"] == "rate_limited":
                self.tally.limited += 1
                if not wait_out:
                    return answer
                self.tally.waited_s += answer["error"]["retryAfterS"]
                await asyncio.sleep(answer["error"]["retryAfterS"])
                continue
            return answer

    async def excellent(self, m: int) -> bool:
        answer = await self.ask("estimate", {"onnx": self.model, "inputs": {"a": {"shape": [m, K]}}})
        assert answer["status"] == "ok", answer
        return answer["data"]["performanceTier"] == "excellent"

    async def search(self, within: float = WITHIN) -> float:
        """The flip point (rows) as this client sees it, to within a factor `within`."""
        lo, hi = 1, 2
        while await self.excellent(hi):
            lo, hi = hi, hi * 2
        while hi / lo > within and hi - lo > 1:
            mid = round(math.sqrt(lo * hi))
            if await self.excellent(mid):
                lo = mid
            else:
                hi = mid
        return math.sqrt(lo * hi)


async def with_agent(state_dir: Path, config: str, tree, work) -> object:

    (state_dir / "probing.toml").write_text(config)
    agent, port = start_agent(state_dir, DEVICE, "--config", str(state_dir / "probing.toml"), "--sysfs-root",
                              str(tree.sys), "--procfs-root", str(tree.proc), "--sample-interval", "0.5")
    try:
        await wait_online(port, DEVICE, 180.0)
        client = aiomqtt.Client("127.0.0.1", port, protocol=aiomqtt.ProtocolVersion.V5)
        client.pending_calls_threshold = 1000  # a dozen attackers at once: not a warning's worth
        async with client:
            askers: list[Asker] = []

            async def route() -> None:
                async for message in client.messages:
                    any(a.deliver(message) for a in askers)

            reader = asyncio.get_running_loop().create_task(route())
            try:
                return await work(client, askers)
            finally:
                reader.cancel()
    finally:
        stop_agent(agent)


async def make_asker(client, askers: list[Asker], owner: str, model: str) -> Asker:
    asker = Asker(client, owner, model)
    askers.append(asker)
    await asker.start()
    return asker


async def privacy_off(state_dir: Path, tree, model: str) -> tuple[float, Tally, float, float]:
    async def work(client, askers):
        attacker = await make_asker(client, askers, "attacker", model)
        t0 = time.perf_counter()
        found = await attacker.search()
        took = time.perf_counter() - t0
        fine = await (await make_asker(client, askers, "truth", model)).search(FINE)
        return found, attacker.tally, took, fine

    return await with_agent(state_dir, "[privacy]\nenabled = false\n", tree, work)


async def privacy_on(state_dir: Path, tree, model: str, identities: int, periods: int, period_s: float):
    async def work(client, askers):
        attackers = [await make_asker(client, askers, f"attacker{i}", model) for i in range(identities)]
        seen: list[list[float]] = [[] for _ in attackers]
        repeats_equal = 0
        for p in range(periods):
            await asyncio.sleep(period_s - time.time() % period_s + 0.05)  # the start of a period
            started = time.time()
            found = await asyncio.gather(*(a.search(FINE) for a in attackers))
            if p < REPEATS:  # the same client, the same period: the same answer
                repeats_equal += await attackers[0].search(FINE) == found[0]
            if time.time() // period_s != started // period_s:
                print(f"  period {p + 1}: the searches spilled into the next period; raise --period-s", flush=True)
            for s, f in zip(seen, found, strict=True):
                s.append(f)
        return seen, [a.tally for a in attackers], repeats_equal

    config = f"[privacy]\nperiod_s = {period_s}\n"
    return await with_agent(state_dir, config, tree, work)


async def budget(state_dir: Path, tree, model: str) -> tuple[int, int, Tally]:
    async def work(client, askers):
        flood = await make_asker(client, askers, "flood", model)
        answered, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 60:
            answer = await flood.ask("estimate", {"onnx": model, "inputs": {"a": {"shape": [8, K]}}}, wait_out=False)
            if answer["status"] == "ok":
                answered += 1
            else:
                await asyncio.sleep(0.2)
        honest = await make_asker(client, askers, "honest", model)
        for m in (8, 64, 512):
            assert (await honest.ask("estimate", {"onnx": model, "inputs": {"a": {"shape": [m, K]}}},
                                     wait_out=False))["status"] == "ok"
        created = await honest.ask("monitors/create", {"onnx": model, "inputs": {"a": {"shape": [64, K]}},
                                                       "requiredTier": "good", "monitor": "honest"}, wait_out=False)
        listed = await honest.ask("monitors/list", {}, wait_out=False)
        deleted = await honest.ask("monitors/delete", {"monitor": "honest"}, wait_out=False)
        assert all(a["status"] == "ok" for a in (created, listed, deleted)), (created, listed, deleted)
        return answered, flood.tally.requests, honest.tally

    return await with_agent(state_dir, "", tree, work)


def periods_to_locate(seen: list[float], truth: float, tolerance: float = 0.05) -> int | None:
    """The first k from which the midrange (in log) of the first k flip points stays within +-tolerance."""
    ok_from = None
    for k in range(1, len(seen) + 1):
        lo, hi = min(seen[:k]), max(seen[:k])
        estimate = math.sqrt(lo * hi)
        if abs(estimate / truth - 1) <= tolerance:
            ok_from = ok_from or k
        else:
            ok_from = None
    return ok_from


async def run(args: argparse.Namespace, state_dir: Path, tree) -> None:

    defaults = PrivacySettings()
    model = matmul_b64()
    found, tally, took, truth_off = await privacy_off(state_dir, tree, model)
    print(f"privacy off: one search located the flip point to +-5 % in {tally.requests} requests, {took:.2f} s: "
          f"{found:.0f} rows (searched to +-0.25 %: {truth_off:.1f} rows, {K * K * 2 * truth_off / 16e6:.1f} "
          f"GFLOP/s; the +-5 % search off it by {100 * abs(found / truth_off - 1):.1f} %)", flush=True)

    seen, tallies, repeats = await privacy_on(state_dir, tree, model, args.identities, args.periods, args.period_s)
    every = [f for s in seen for f in s]
    truth = math.exp(statistics.fmean(math.log(f) for f in every))
    print(f"privacy on: the flip points spread from {100 * (min(every) / truth - 1):+.1f} % to "
          f"{100 * (max(every) / truth - 1):+.1f} % around their mean {truth:.1f} rows (privacy off: "
          f"{100 * (truth_off / truth - 1):+.1f} % from it)")
    errors = [abs(s[0] / truth - 1) for s in seen]
    print(f"privacy on (jitter +-{100 * PrivacyRules.jitter:.0f} %, period shortened to {args.period_s:g} s): "
          f"{args.identities} attackers x {args.periods} periods; a repeated search in the same period found the "
          f"same flip point {repeats}/{REPEATS} times", flush=True)
    print(f"  one search: off the truth by median {100 * statistics.median(errors):.1f} %, max "
          f"{100 * max(errors):.1f} %; within +-5 % for {sum(e <= 0.05 for e in errors)}/{len(errors)} attackers")
    for k in sorted({1, 2, 3, 5, args.periods} & set(range(1, args.periods + 1))):
        within = sum(abs(math.sqrt(min(s[:k]) * max(s[:k])) / truth - 1) <= 0.05 for s in seen)
        print(f"  after {k} period(s): {within}/{len(seen)} attackers' estimates within +-5 %")
    needed = [periods_to_locate(s, truth) for s in seen]
    located = sorted(k for k in needed if k is not None)
    per_search = statistics.median(t.requests for t in tallies[1:] or tallies) / args.periods
    if located:
        k50, kmax = statistics.median(located), located[-1]
        days = defaults.rules.period_s / 86400
        print(f"  to +-5 % (and staying there): median {k50:g} periods ({k50 * per_search:.0f} requests, "
              f"{k50 * days:g} days at the default period of {defaults.rules.period_s:g} s), worst {kmax} periods; "
              f"{len(seen) - len(located)}/{len(seen)} attackers never got there in {args.periods} periods")
    else:
        print(f"  no attacker located it to +-5 % in {args.periods} periods")
    print(f"  per search: about {per_search:.0f} requests; rate-limited answers met by the attackers: "
          f"{sum(t.limited for t in tallies)}", flush=True)
    sybil = [[s[p] for s in seen] for p in range(args.periods)]  # one period's flip points, all names
    sybil_needed = periods_to_locate([f for period in sybil for f in period], truth)
    one_period = [abs(math.sqrt(min(p) * max(p)) / truth - 1) for p in sybil]
    print(f"  Sybil, {args.identities} names at once: one period's combined estimate is off the truth by median "
          f"{100 * statistics.median(one_period):.1f} %, max {100 * max(one_period):.1f} %; within +-5 % from "
          f"the {'never' if sybil_needed is None else math.ceil(sybil_needed / args.identities)}. period on")

    answered, sent, honest = await budget(state_dir, tree, model)
    print(f"budget (burst {defaults.burst}, {defaults.per_minute:g} a minute): a client asking as fast as it can "
          f"had {answered} of {sent} requests answered in its first minute")
    print(f"honest app (3 estimates, a monitor created, listed, deleted): {honest.requests} requests, "
          f"{honest.limited} rate-limited")


def steady(state_dir: Path) -> None:
    """The calibration without its warm-refresh reference: the agent then prices at the signals' speed only."""

    cal = calibration_store.load(state_dir, "cpu")
    assert cal is not None, "no calibration in the state dir"
    calibration_store.save(state_dir, replace(cal, refresh_reference={}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--identities", type=int, default=12)
    ap.add_argument("--periods", type=int, default=12)
    ap.add_argument("--period-s", type=float, default=12.0, help="the jitter's period in this run (default 12 s)")
    ap.add_argument("--state-dir", type=Path, help="a state dir with a calibration (default: a temporary one)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="daop-bench-"))
    state_dir = tmp / "state"
    tree = desktop(tmp / "tree")
    if args.state_dir is not None:
        shutil.copytree(args.state_dir, state_dir, ignore=shutil.ignore_patterns("monitors", "monitor-seq.json*",
                                                                                  "broker"))
    else:

        state_dir.mkdir(parents=True)
        print("calibrating (quick) ...", flush=True)
        run_calibration(state_dir, "cpu", quick=True)
    steady(state_dir)
    try:
        asyncio.run(run(args, state_dir, tree))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
