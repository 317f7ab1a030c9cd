"""At rest the agent evaluates its monitors only when a sample leaves the band its last evaluation left
(monitors/steady.py), and a load that leaves it is evaluated from the first sample that sees it.

An in-process agent on a fixture /sys and /proc tree (this machine's own load would move the band) with a real
broker; its warm refresh is a stand-in that reads the calibration's reference (the device as calibrated).
"""

from __future__ import annotations

import base64
import time

from agent_harness import client, request_v5
from models import weightless_mlp
from test_agent_refresh import until, vm_agent

from agent.calibration_store import load as load_calibration
from agent.sampling import Sampled
from agent.simulation.trees import vm


async def test_agent_on_a_vm_fixture_tree_skips_samples_inside_the_band_and_hands_over_the_first_load_at_once(
        state_dir, mosquitto, tmp_path):
    reference = load_calibration(state_dir, "cpu").refresh_reference
    tree = vm(tmp_path / "tree")
    small = base64.b64encode(weightless_mlp(64, 2, 1)).decode()
    async with vm_agent(state_dir, mosquitto, tree, "steady1", lambda stream=False: dict(reference)) as (agent, task):
        await until(task, lambda: agent.speed.measurement is not None)  # the estimator is ready
        async with client(mosquitto.port) as c:
            created, _ = await request_v5(c, "steady1", "monitors/create",
                                          {"onnx": small, "requiredTier": "moderate", "monitor": "m"})
            assert created["status"] == "ok", created
        await until(task, lambda: agent._sampling is not None and agent._sampling.skipped >= 10)
        thread = agent._sampling
        handed: list[Sampled] = []
        deliver = thread.deliver

        def recorded(sampled: Sampled) -> None:
            handed.append(sampled)
            deliver(sampled)

        thread.deliver = recorded
        loaded_at = time.monotonic()
        tree.set_stat(busy=5000, idle=14000, running=7)  # six other tasks want a CPU

        def loaded() -> list[Sampled]:
            return [s for s in handed if s.state is not None and (s.state.cpu.demand or 0.0) > 3.0]

        await until(task, lambda: loaded() and agent.speed.state.cpu.demand > 3.0)
        first = loaded()[0]
        assert first.since < loaded_at  # the sample before it predates the load: no sample that saw it was skipped
        assert agent.registry.book.table.meets("m")  # far from its edge: the load moves no answer
