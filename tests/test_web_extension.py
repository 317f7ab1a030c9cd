"""The browser extension in a real browser: headless Chromium loads it unpacked (as `daop-agent web-bridge install`
writes it), starts its native messaging host (registered in the profile's NativeMessagingHosts), and pages run
the explainer's example with the names the extension gives them (`navigator.ml`, `MLGraphBuilder`: Chromium here
has no WebNN) against the real agent, with no broker and no password in the page. Each origin is its own owner.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from browser import Browser, skip_without_browser
from test_web_client import DEV
from test_web_client import web_agent as web_agent  # the fixture: an agent with its local broker
from test_web_explainer import EXAMPLE, MONITOR, RUNNER

from agent.web_bridge import agent_monitor_id, owner_of
from daop_client import DaopClient


def install(tmp_path: Path, broker: str) -> tuple[Path, Path]:
    profile, extension = tmp_path / "profile", tmp_path / "data" / "webextension"
    r = subprocess.run([sys.executable, "-m", "agent", "web-bridge", "install", "--hosts-dir",
                        str(profile / "NativeMessagingHosts"), "--extension-dir", str(extension), "--broker", broker,
                        "--device-id", DEV], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return profile, extension


def extension_browser(tmp_path: Path, broker: str) -> Browser:
    skip_without_browser()
    profile, extension = install(tmp_path, broker)
    return Browser(profile, tmp_path / "browser.log", extension)


def owned(agent, origin: str) -> list[str]:
    async def ids() -> list[str]:
        async with DaopClient(agent.mqtt_url, DEV, owner=owner_of(origin), timeout_s=30) as daop:
            return [m["monitor"] for m in await daop.list_monitors()]
    return asyncio.run(ids())


def test_the_explainers_example_runs_as_written_through_the_extension(tmp_path, client_site, web_agent):
    browser = extension_browser(tmp_path, web_agent.mqtt_url)
    try:
        port = client_site.rsplit(":", 1)[1]
        a, b = f"http://127.0.0.1:{port}", f"http://localhost:{port}"  # two origins
        browser.goto(f"{a}/demo/")
        assert browser.evaluate("[typeof navigator.ml.createContext, typeof MLGraphBuilder, typeof window.daop]") \
            == ["function", "function", "object"]
        browser.evaluate(f"(() => {{ {RUNNER} }})()")
        result = browser.evaluate(f"""(async () => {{
            const out = await runExample({json.dumps(EXAMPLE + MONITOR)} + 'return {{context, graph, qos, monitor}};',
                                         [], []);
            const {{context, graph, qos, monitor}} = out;
            window.example = out;
            await monitor.ready;
            const atBuilt = await context.estimateQoS(graph);
            const poor = context.createQoSMonitor(graph, 'poor', {{monitor: 'blur'}});
            const first = await new Promise((resolve) => {{
                poor.onchange = (e) => resolve([e.type, e.meetsRequirement]);
            }});
            return {{tier: qos.performanceTier, tierAtBuilt: atBuilt.performanceTier, first, id: monitor.id}};
        }})()""", timeout=120)
        tiers = ["excellent", "good", "fair", "moderate", "slow", "very-slow", "poor"]
        assert tiers.index(result["tier"]) > tiers.index(result["tierAtBuilt"]), result
        assert result["first"] == ["change", True]
        assert sorted(owned(web_agent, a)) == sorted([agent_monitor_id(a, "blur"), agent_monitor_id(a, result["id"])])

        # A second origin: its own owner, its own monitors; the first's are not there for it.
        other = browser.new_page()
        browser.goto(f"{b}/demo/", page=other)
        created = browser.evaluate("""(async () => {
            const context = await window.daop.ml.createContext({deviceType: 'cpu'});
            const graph = {format: 'webnn-graph-json', inputs: {x: {dataType: 'float32', shape: [1, 64]}},
                           nodes: [{id: 'y', op: 'relu', inputs: ['x']}], outputs: {y: 'y'}};
            const mine = await context.createQoSMonitor(graph, 'poor', {monitor: 'blur'}).ready;
            return [mine.id, mine.meetsRequirement];
        })()""", page=other)
        assert created == ["blur", True]
        assert owned(web_agent, b) == [agent_monitor_id(b, "blur")]
        assert agent_monitor_id(a, "blur") in owned(web_agent, a)
        assert web_agent_shared(web_agent) == []  # nothing in the shared, unscoped scope

        # A page that goes away takes its monitors with it; the other origin's stay.
        browser.goto("about:blank")
        deadline = time.monotonic() + 15
        while owned(web_agent, a) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert owned(web_agent, a) == [] and owned(web_agent, b) == [agent_monitor_id(b, "blur")]
    finally:
        browser.close()


def web_agent_shared(agent) -> list[str]:
    async def ids() -> list[str]:
        async with DaopClient(agent.mqtt_url, DEV, timeout_s=30) as daop:
            return [m["monitor"] for m in await daop.list_monitors()]
    return asyncio.run(ids())


def test_with_the_extension_but_no_agent_the_page_hears_agent_not_reachable(tmp_path, client_site):
    browser = extension_browser(tmp_path, "mqtt://127.0.0.1:1")
    try:
        browser.goto(f"{client_site}/demo/")
        error = browser.evaluate("navigator.ml.createContext().then(() => 'no error', "
                                 "(e) => [e.name, e.code, e.message])")
        assert error[:2] == ["DaopError", "unreachable"]
        assert error[2].startswith("agent not reachable: cannot reach the broker mqtt://127.0.0.1:1")
    finally:
        browser.close()


def test_without_the_extension_the_page_hears_agent_not_reachable(browser, client_site):
    browser.goto(f"{client_site}/demo/")
    error = browser.evaluate("""import('../bridge.js').then((m) => {
        try { m.extensionML(); return 'no error'; } catch (e) { return [e.name, e.code, e.message]; }
    })""")
    assert error[:2] == ["DaopError", "unreachable"]
    assert error[2].startswith("agent not reachable: the DAOP browser extension is not installed")
    assert browser.evaluate("typeof window.daop") == "undefined"

