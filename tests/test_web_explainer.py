"""The explainer's example, as a web developer writes it, in a real browser against the real agent.

The page runs the calls of the DAOP explainer's "Adaptive Background Blur" example and of its QoS change
events (webmachinelearning/daop, explainer.md) with the same arguments: `navigator.ml.createContext({deviceType:
"npu"})`, `new MLGraphBuilder(context)`, a weightless `builder.constant({shape, dataType, label})`,
`builder.input`, `builder.conv2d`, `builder.build()`, `context.estimateQoS(graph, {inputDescriptors})` and
`qos.performanceTier`, `context.createQoSMonitor(graph, "excellent")` without await and `monitor.onchange = (e)
=> e.meetsRequirement ...`. Here `navigator.ml` is the direct WebSocket client's (`createML(credentials)`);
tests/test_web_extension.py runs the same code through the browser extension.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import psutil
import pytest
from browser import REPO
from test_web_client import BUSY_MACHINE_PERCENT, REST_WAIT_S, busy_to_miss, demo_frame, monitors_on, others_busy
from test_web_client import web_agent as web_agent  # the fixtures: an agent with its local broker's WebSockets
from test_web_client import web_agent_on_device_proc as web_agent_on_device_proc

# The example's code, with its calls and values; `navigator`, `MLGraphBuilder`, `switchToCloud` and
# `switchToLocal` are whatever the page gives it.
EXAMPLE = """
const context = await navigator.ml.createContext({ deviceType: "npu" });
const builder = new MLGraphBuilder(context);
const weights = builder.constant({ shape: [3, 3, 64, 64], dataType: "float32", label: "modelWeights" });
const input = builder.input("input", { shape: [1, 3, 224, 224], dataType: "float32" });
const output = builder.conv2d(input, weights);
const graph = builder.build();
const qos = await context.estimateQoS(graph, {
  inputDescriptors: { input: { shape: [1, 3, 720, 1280], dataType: "float32" } },
});
const acceptable = ["excellent", "good", "fair", "moderate"];
"""

MONITOR = """
const monitor = context.createQoSMonitor(graph, "excellent");
monitor.onchange = (e) => {
  if (!e.meetsRequirement) {
    switchToCloud();
  } else {
    switchToLocal();
  }
};
"""

# Runs `code` as an async function of the names the page injects; the switches it makes go to window.switches.
RUNNER = """
window.switches = [];
window.runExample = (code, names, values) => {
  const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
  const switchToCloud = () => window.switches.push({to: 'cloud', at: Date.now()});
  const switchToLocal = () => window.switches.push({to: 'local', at: Date.now()});
  return new AsyncFunction(...names, 'switchToCloud', 'switchToLocal', code)(...values, switchToCloud, switchToLocal);
};
"""


def page_with_ml(browser, site: str, agent) -> None:
    """A page whose `ml` is the direct client's navigator.ml part, with the agent's credentials."""
    browser.goto(f"{site}/demo/")  # the demo's import map; without credentials in its URL it only waits
    browser.evaluate(f"""(async () => {{
        Object.assign(window, await import('../daop.js'));
        window.ml = createML({json.dumps(agent.credentials.__dict__)});
        {RUNNER}
    }})()""")


def test_the_explainers_example_answers_through_the_websocket_client(browser, client_site, web_agent):
    page_with_ml(browser, client_site, web_agent)
    result = browser.evaluate(f"""(async () => {{
        const out = await runExample({json.dumps(EXAMPLE + MONITOR)} +
                                     'return {{context, graph, qos, acceptable, monitor}};',
                                     ['navigator'], [{{ml}}]);
        const {{context, graph, qos, monitor}} = out;
        window.example = out;
        const created = monitor instanceof EventTarget && monitor.requiredTier;  // at once, before the agent answers
        await monitor.ready;
        const atBuilt = await context.estimateQoS(graph);  // the size the graph was built at
        const poor = context.createQoSMonitor(graph, 'poor');
        const firstEvent = await new Promise((resolve) => {{ poor.onchange = (e) => resolve(
            [e instanceof Event, e.type, e.meetsRequirement, e.detail.meetsRequirement]); }});
        return {{
            tier: qos.performanceTier, tierAtBuilt: atBuilt.performanceTier, report: JSON.stringify(qos),
            meets: await context.meetsRequirement(graph, 'poor', {{inputDescriptors: {{
                input: {{shape: [1, 3, 720, 1280], dataType: 'float32'}}}}}}),
            created, monitorId: monitor.id, firstEvent, poorMeets: poor.meetsRequirement,
            graphJson: graph.toJSON(),
        }};
    }})()""", timeout=120)
    tiers = ["excellent", "good", "fair", "moderate", "slow", "very-slow", "poor"]
    # 30 times the work of the size it was built at: a worse tier (steps are at most 10x apart)
    assert result["tier"] in tiers and result["tierAtBuilt"] in tiers
    assert tiers.index(result["tier"]) > tiers.index(result["tierAtBuilt"]), result
    assert json.loads(result["report"]) == {"performanceTier": result["tier"]}
    assert result["meets"] is True
    assert result["created"] == "excellent"
    assert result["firstEvent"] == [True, "change", True, True] and result["poorMeets"] is True
    assert result["graphJson"]["consts"]["modelWeights"] == {"dataType": "float32", "shape": [3, 3, 64, 64],
                                                             "label": "modelWeights"}
    assert result["monitorId"] in monitors_on(web_agent)


def test_an_error_is_surfaced_on_the_monitor_created_without_await(browser, client_site, web_agent):
    page_with_ml(browser, client_site, web_agent)
    result = browser.evaluate("""(async () => {
        const context = await ml.createContext();
        const monitor = context.createQoSMonitor('webnn_graph "x" v2 { nodes { y = nosuchop(x); } }', 'good');
        const event = new Promise((resolve) => { monitor.onerror = () => resolve(monitor.error.code); });
        const ready = await monitor.ready.then(() => 'no error', (e) => [e.name, e.code]);
        const badDevice = await ml.createContext({deviceType: 'tpu'}).then(() => 'no error', (e) => e.name);
        return {ready, event: await event, error: monitor.error.code, badDevice};
    })()""")
    assert result["ready"][0] == "DaopError" and result["ready"][1] in ("bad_graph", "unknown_operator")
    assert result["event"] == result["error"] == result["ready"][1]
    assert result["badDevice"] == "TypeError"
    assert monitors_on(web_agent) == []


@pytest.mark.slow
def test_the_explainers_monitor_on_device_proc_switches_to_the_cloud_under_load_and_back(
        browser, client_site, web_agent_on_device_proc, device_proc, state_dir):
    """The example's monitor code, on the blur segmenter at the demo's frame, 512x288, or a smaller one on a slower
    host (excellent at rest, not with the busy processes of busy_to_miss): `e.meetsRequirement` false under load,
    true after."""
    web_agent = web_agent_on_device_proc
    (width, height), at_rest = demo_frame(state_dir)
    count = busy_to_miss(at_rest)
    page_with_ml(browser, client_site, web_agent)
    blur = (REPO / "examples" / "blur_segmenter.webnn").read_text()
    blur = blur.replace('dyn("height", 1080)', str(height)).replace('dyn("width", 1920)', str(width))
    browser.evaluate(f"""(async () => {{
        const context = await ml.createContext();
        window.example = await runExample({json.dumps(MONITOR)} + 'return {{monitor}};', ['context', 'graph'],
                                          [context, {json.dumps(blur)}]);
        await window.example.monitor.ready;
    }})()""")

    def last_switch(to: str, timeout: float, held_s: float = 0.0) -> dict:
        return browser.wait_for(f"""(() => {{
            const last = window.switches.at(-1);
            return last?.to === {json.dumps(to)} && Date.now() - last.at >= {held_s * 1000} && last;
        }})()""", timeout)

    psutil.cpu_percent()
    try:
        last_switch("local", REST_WAIT_S, held_s=3.0)
    except AssertionError:
        busy_percent = psutil.cpu_percent()
        if busy_percent < BUSY_MACHINE_PERCENT or os.environ.get("CI"):
            raise
        pytest.skip(f"this machine was not at rest in {REST_WAIT_S} s: its CPUs were {busy_percent:.0f} % busy "
                    "with other work")
    busy: list[subprocess.Popen] = []
    try:
        started_ms = browser.evaluate("Date.now()")
        busy = others_busy(device_proc, count)
        cloud = last_switch("cloud", timeout=30)
        assert browser.evaluate("window.example.monitor.meetsRequirement") is False
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()
    stopped_ms = time.time() * 1000
    local = last_switch("local", timeout=120)
    assert browser.evaluate("window.example.monitor.meetsRequirement") is True
    print(f"\nload started -> switchToCloud: {(cloud['at'] - started_ms) / 1000:.2f} s; "
          f"load stopped -> switchToLocal: {(local['at'] - stopped_ms) / 1000:.2f} s")
