"""The JS client (clients/js/daop.js) and the blur demo page in a real browser, against the real agent.

Headless Chromium (tests/browser.py) loads pages served from clients/js; they reach the agent's own local
broker (`daop-agent run --local-broker`, its WebSockets listener) with the credentials the agent made. The load
is real: busy processes on this machine's cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import psutil
import pytest
from agent_harness import AgentProcess
from browser import REPO
from test_agent_contract import SMALL
from test_local_broker_web import two_ports

from agent.local_broker import read_web_credentials
from daop_client import DaopClient
from monitors.speed.prediction import contention_factor

DEV = "dev1"
BUSY = 4  # on the 2-core development machine, four made the README's example monitor say NOT met
REST_WAIT_S = 180
TURN_BOUND_S = 4.0  # load started -> the page says cloud
BUSY_MACHINE_PERCENT = 30  # a machine this busy with other work (one busy process is 50 %) is not at rest
DEMO_MODEL = REPO / "examples" / "blur_segmenter.webnn"
# The demo page's frame (clients/js/demo/index.html; its #frame= sets another), then smaller ones for a slower host
DEMO_FRAMES = ((512, 288), (384, 216), (256, 144))
DEMO_BOUND_MS = 16.0  # the demo page's tier, excellent, and the explainer test's
REST_SHARE = 0.4  # at rest a frame takes at most this share of the bound: the parallel tests' load leaves it met
MISS_MARGIN = 1.25  # the load predicted to slow the demo's model to this many times its bound


def at_rest_ms(state_dir: Path, frame: tuple[int, int]) -> float:
    """The agent's estimate for the demo's model on `frame` (width, height), at rest."""
    out = subprocess.run([sys.executable, "-m", "agent", "estimate", str(DEMO_MODEL), "--input",
                          f"image=1x{frame[1]}x{frame[0]}x3", "--at-rest", "--json", "--state-dir", str(state_dir)],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return float(json.loads(out)["latency_ms"])


def demo_frame(state_dir: Path) -> tuple[tuple[int, int], float]:
    """The largest of DEMO_FRAMES that this machine's calibration runs at rest within REST_SHARE of the bound, and
    its time: the demo's own frame on a fast host (2.7 ms), a smaller one where the quick calibration prices it at
    13 ms (an AVX2 host without VNNI), which the other tests' load on the CPUs would push over the bound."""
    for frame in DEMO_FRAMES:
        ms = at_rest_ms(state_dir, frame)
        if ms <= REST_SHARE * DEMO_BOUND_MS:
            return frame, ms
    return frame, ms


def busy_to_miss(at_rest: float) -> int:
    """Busy processes enough (BUSY at least) for a model that takes `at_rest` ms to miss the demo's tier on this
    host, by MISS_MARGIN in the agent's own contention model: the demo's model takes 2.7 ms at rest on a fast host,
    where four busy processes on two cores (4.8x) left it under its 16 ms."""
    cores = len(os.sched_getaffinity(0))
    count = BUSY
    while at_rest * contention_factor(cores, count, cores, count) < MISS_MARGIN * DEMO_BOUND_MS and count < 64:
        count += 1
    return count


def start_web_agent(state_dir: Path, procfs_root: Path | None = None) -> AgentProcess:
    port, web = two_ports()
    agent = AgentProcess(state_dir, "mqtt://127.0.0.1:1", device_id=DEV, procfs_root=procfs_root,
                         extra=["--local-broker", str(port), "--web-port", str(web)]).start(timeout=60)
    agent.mqtt_url = f"mqtt://127.0.0.1:{port}"
    agent.credentials = read_web_credentials(state_dir)
    return agent


@pytest.fixture
def web_agent(state_dir: Path):
    agent = start_web_agent(state_dir)
    yield agent
    agent.stop()


@pytest.fixture
def web_agent_on_device_proc(state_dir: Path, device_proc):
    """The agent on a device /proc (device_proc.py): the tests of load read the busy processes they start, not
    the host's other work."""
    agent = start_web_agent(state_dir, device_proc.root)
    yield agent
    agent.stop()


def others_busy(device_proc, count: int = BUSY) -> list[subprocess.Popen]:
    """`count` busy processes of others on the device /proc's device."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    device_proc.adopt([p.pid for p in busy])
    return busy


def monitors_on(agent) -> list[str]:
    async def ids() -> list[str]:
        async with DaopClient(agent.mqtt_url, DEV, timeout_s=30) as daop:
            return [m["monitor"] for m in await daop.list_monitors()]
    return asyncio.run(ids())


def page_with_client(browser, site: str, agent) -> None:
    """A page that has the client and the credentials: `connect`, `DaopError`, `TIERS` and `creds` on window."""
    browser.goto(f"{site}/demo/")  # the demo's import map; without credentials in its URL it only waits
    browser.evaluate(f"""(async () => {{
        Object.assign(window, await import('../daop.js'));
        window.creds = {json.dumps(agent.credentials.__dict__)};
    }})()""")


def test_client_answers_estimate_meets_and_monitors_and_rejects_errors(browser, client_site, web_agent):
    page_with_client(browser, client_site, web_agent)
    webnn = (REPO / "examples" / "blur_segmenter.webnn").read_text()
    mlp = json.loads((REPO / "examples" / "mlp.json").read_text())
    result = browser.evaluate(f"""(async () => {{
        const context = await connect(creds);
        const frame = {{inputs: {{image: [1, 288, 512, 3]}}}};
        const webnn = {json.dumps(webnn)};
        const onnx = Uint8Array.from(atob({json.dumps(SMALL)}), (c) => c.charCodeAt(0));
        const error = (promise) => promise.then(() => 'no error', (e) => [e.name, e.code, e instanceof DaopError]);
        const out = {{
            online: context.agentOnline,
            tier: (await context.estimateQoS(webnn, frame)).performanceTier,
            tierOld: [String(await context.estimateQoS(webnn, frame)), await context.estimateTier(webnn, frame)],
            tierJson: (await context.estimateQoS({json.dumps(mlp)},
                {{inputDescriptors: {{features: {{shape: [8, 256], dataType: 'float32'}}}}}})).performanceTier,
            tierOnnx: (await context.estimateQoS(onnx.buffer)).performanceTier,
            meetsPoor: await context.meetsRequirement(webnn, 'poor', frame),
            badTier: await error(context.meetsRequirement(webnn, 'best', frame)),
            noInputs: await error(context.estimateQoS(webnn)),
            badGraph: await error(context.estimateQoS('webnn_graph "x" v2 {{ nodes {{ y = nosuchop(x); }} }}')),
            wrongPassword: await error(connect({{...creds, password: 'guess', timeoutMs: 10000}})),
        }};
        const monitor = await context.createQoSMonitor(webnn, 'poor', {{...frame, monitor: 'web-test'}}).ready;
        window.monitor = monitor;
        window.context = context;
        out.monitor = [monitor.id, monitor.requiredTier, monitor.meetsRequirement, monitor instanceof EventTarget];
        return out;
    }})()""")
    assert result["online"] is True
    assert result["tier"] in ("excellent", "good", "fair") and result["tierJson"] in ("excellent", "good", "fair")
    assert result["tierOnnx"] in ("excellent", "good")
    assert result["meetsPoor"] is True
    assert result["badTier"] == ["DaopError", "bad_tier", True]
    # the first client's calls keep working (each its own estimate: near a boundary, the present speed between
    # the calls may move it a tier)
    assert all(t in ("excellent", "good", "fair") for t in result["tierOld"]), result["tierOld"]
    assert result["noInputs"] == ["DaopError", "bad_inputs", True]
    assert result["badGraph"][1] in ("bad_graph", "unknown_operator") and result["badGraph"][2] is True
    assert result["wrongPassword"] == ["DaopError", "not_authorized", True]
    assert result["monitor"] == ["web-test", "poor", True, True]
    assert monitors_on(web_agent) == ["web-test"]

    assert browser.evaluate("monitor.close().then(() => monitor.close()).then(() => 'closed')") == "closed"
    assert monitors_on(web_agent) == []
    # A page that goes away takes its monitors with it.
    browser.evaluate("context.createQoSMonitor(" + json.dumps(webnn) + ", 'good', "
                     "{inputs: {image: [1, 288, 512, 3]}, monitor: 'left-behind'}).ready.then((m) => m.id)")
    assert monitors_on(web_agent) == ["left-behind"]
    browser.goto("about:blank")
    deadline = time.monotonic() + 10
    while monitors_on(web_agent) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert monitors_on(web_agent) == []


def decisions(browser) -> list[dict]:
    return browser.evaluate("window.daopDemo ? window.daopDemo.decisions : []")


def wait_for_decision(browser, decision: str, timeout: float, held_s: float = 0.0,
                      most_in_a_minute: int = 1000) -> dict:
    """The page's latest decision once it is `decision`, has held `held_s`, and the page changed its mind at
    most `most_in_a_minute` times in the last 60 s. Times are the page's clock, ms since the epoch."""
    return browser.wait_for(f"""(() => {{
        const all = window.daopDemo?.decisions ?? [];
        const last = all.at(-1);
        const recent = all.filter((d) => Date.now() - d.at < 60000).length;
        return last?.decision === {json.dumps(decision)} && Date.now() - last.at >= {held_s * 1000}
            && recent <= {most_in_a_minute} && last;
    }})()""", timeout)


@pytest.mark.slow
def test_demo_page_on_device_proc_blurs_locally_at_rest_in_the_cloud_under_load_and_locally_again(
        browser, client_site, web_agent_on_device_proc, device_proc, state_dir):
    web_agent = web_agent_on_device_proc
    (width, height), at_rest = demo_frame(state_dir)
    count = busy_to_miss(at_rest)
    browser.goto(f"{client_site}/demo/#{urlencode({**web_agent.credentials.__dict__, 'frame': f'{width}x{height}'})}")
    # At rest, for longer than the monitor's minimum dwell (2 s), and with room under its cap of 6 changes a
    # minute for two more, so that neither holds the next change back. Generous: on a shared machine, other
    # work can hold the rest off for minutes; a machine that never comes to rest cannot run this test.
    opened = time.monotonic()
    psutil.cpu_percent()
    try:
        wait_for_decision(browser, "local", timeout=REST_WAIT_S, held_s=3.0, most_in_a_minute=4)
    except AssertionError:
        busy_percent = psutil.cpu_percent()  # the whole machine's, over the wait
        if busy_percent < BUSY_MACHINE_PERCENT or os.environ.get("CI"):  # CI's machine is its own: fail
            raise
        pytest.skip(f"this machine was not at rest in {REST_WAIT_S} s: its CPUs were {busy_percent:.0f} % busy "
                    f"with other work; the page's decisions: {decisions(browser)}")
    at_rest_s = time.monotonic() - opened
    assert browser.evaluate("document.getElementById('decision').textContent") == "blur: local"

    busy: list[subprocess.Popen] = []
    try:
        started_ms = browser.evaluate("Date.now()")  # the load's start, on the page's clock
        busy = others_busy(device_proc, count)
        cloud = wait_for_decision(browser, "cloud", timeout=30)
        to_cloud_s = (cloud["at"] - started_ms) / 1000
        assert browser.evaluate("document.getElementById('decision').textContent") == "blur: cloud"
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()
    stopped_ms = time.time() * 1000
    local = wait_for_decision(browser, "local", timeout=120)
    print(f"\npage open -> local for 3 s: {at_rest_s:.1f} s ({len(decisions(browser))} decisions); {count} busy; "
          f"load started -> page says cloud: {to_cloud_s:.2f} s; "
          f"load stopped -> page says local: {(local['at'] - stopped_ms) / 1000:.2f} s")
    # An honest margin, not the target: the parallel test workers share the host's CPUs with the agent, the page
    # and the busy processes, and stretch the turn to about twice what it takes alone. The latency itself is
    # bench.event_latency's figure.
    assert to_cloud_s <= TURN_BOUND_S, f"the page said cloud {to_cloud_s:.2f} s after the load started"

    # The agent stops: its status says offline and the page falls back to the cloud.
    assert web_agent.stop() == 0
    wait_for_decision(browser, "cloud", timeout=15)
    assert "offline" in browser.evaluate("document.getElementById('status').textContent")
