"""`daop-agent estimate` and `calibrate` as a user runs them: real processes, real onnxruntime."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from agent import calibration_store
from agent.simulation.trees import intel_laptop
from monitors.graphs.importer import load_graph
from tests.conftest import LIGHT_MODELS
from tests.models import absent_weights_model, mlp, weightless_mlp

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def daop(*args: str, state_dir: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", *args, "--state-dir", str(state_dir)],
                          capture_output=True, text=True, timeout=timeout)


def test_estimate_json_has_tier_latency_device_and_kernels(state_dir):
    r = daop("estimate", str(LIGHT_MODELS / "light_squeezenet.onnx"), "--json", "--at-rest", state_dir=state_dir)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tier"] in ("excellent", "good") and out["device"] == "cpu"
    assert 0.3 < out["latency_ms"] < 100 and out["kernels"] > 20


def test_estimate_now_takes_a_real_warm_refresh_and_adds_its_handoff_extra_per_mb_written(state_dir, estimator):

    model = str(LIGHT_MODELS / "light_squeezenet.onnx")
    at_rest = json.loads(daop("estimate", model, "--json", "--at-rest", state_dir=state_dir).stdout)
    r = daop("estimate", model, "--json", state_dir=state_dir)
    assert r.returncode == 0, r.stderr
    now = json.loads(r.stdout)
    assert now["slowdown"] >= 0.8 and now["handoff_ms_per_mb"] >= 0.0
    written = estimator.plan(load_graph(model), "cpu").written_mb
    assert written > 10  # SqueezeNet's activations: about 21 MB
    expected = at_rest["latency_ms"] * now["slowdown"] + written * now["handoff_ms_per_mb"]
    assert now["latency_ms"] == pytest.approx(expected, rel=2e-3, abs=2e-3)


def test_estimate_now_charges_a_model_that_streams_its_weights_the_memory_multiplier_on_that_time_alone(
        state_dir, estimator, tmp_path):
    """256 MB of weights read from memory each run: the real stream probe's multiplier stretches that time."""
    path = tmp_path / "streams.onnx"
    path.write_bytes(weightless_mlp(4096, 4, 1))
    at_rest = json.loads(daop("estimate", str(path), "--json", "--at-rest", state_dir=state_dir).stdout)
    r = daop("estimate", str(path), "--json", state_dir=state_dir)
    assert r.returncode == 0, r.stderr
    now = json.loads(r.stdout)
    assert 0.5 <= now["memory"] <= 8.0
    plan = estimator.plan(load_graph(str(path)), "cpu")
    stream = estimator.stream_ms(plan)
    assert stream > 0.5 * at_rest["latency_ms"]  # nearly all of a one-row product over weights beyond the cache
    gemm = estimator.gemm_ms(plan)
    assert gemm < 0.1 * stream  # it waits on its reads, not on its computing
    expected = (at_rest["latency_ms"] + stream * (now["memory"] - 1.0) + gemm * (now["gemm"] - 1.0)) * now["slowdown"] \
        + plan.written_mb * now["handoff_ms_per_mb"]
    assert now["latency_ms"] == pytest.approx(expected, rel=2e-3, abs=2e-3)


def test_estimate_plain_output_is_one_readable_line(state_dir):
    r = daop("estimate", str(LIGHT_MODELS / "light_squeezenet.onnx"), state_dir=state_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and " ms on cpu" in r.stdout


def test_symbolic_input_is_bound_by_input_flag_and_bigger_batch_is_slower(state_dir, tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp([512, 1024, 1024, 10]), str(path))
    small = daop("estimate", str(path), "--input", "x=1x512", "--json", "--at-rest", state_dir=state_dir)
    big = daop("estimate", str(path), "--input", "x=256x512:float32", "--json", "--at-rest", state_dir=state_dir)
    assert small.returncode == 0 and big.returncode == 0, small.stderr + big.stderr
    assert json.loads(big.stdout)["latency_ms"] > 5 * json.loads(small.stdout)["latency_ms"]


def test_absent_external_weights_are_estimated(state_dir, tmp_path):
    path = tmp_path / "big.onnx"
    onnx.save(absent_weights_model(40 * 2 ** 20), str(path))
    r = daop("estimate", str(path), "--input", "x=1x256", "--json", "--at-rest", state_dir=state_dir)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("case,needle", [
    ("missing", "cannot read"),
    ("not_a_model", "not an ONNX model"),
    ("unbound", "symbolic dimension"),
    ("bad_input_flag", "--input"),
    ("suffix", "cannot tell the format"),
])
def test_bad_input_exits_2_with_one_line_and_no_traceback(case, needle, state_dir, tmp_path):
    args = {
        "missing": [str(tmp_path / "nope.onnx")],
        "not_a_model": [str(_write(tmp_path / "bad.onnx", b"not a model"))],
        "unbound": [str(_mlp(tmp_path))],
        "bad_input_flag": [str(_mlp(tmp_path)), "--input", "x=1xabc"],
        "suffix": [str(_write(tmp_path / "model.txt", b"hello"))],
    }[case]
    r = daop("estimate", *args, state_dir=state_dir)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle.lower() in lines[0].lower(), lines[0]


def test_gpu_without_cuda_provider_is_a_clear_error(state_dir):

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has onnxruntime's CUDA provider")
    r = daop("estimate", str(LIGHT_MODELS / "light_squeezenet.onnx"), "--device", "gpu", state_dir=state_dir)
    assert r.returncode == 2 and "no GPU" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_estimate_calibrates_first_when_there_is_no_calibration_and_says_so(tmp_path):
    r = daop("estimate", str(EXAMPLES / "mlp.json"), "--input", "features=1x256", "--json", "--at-rest",
             state_dir=tmp_path / "fresh", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "calibrating" in r.stderr
    assert (tmp_path / "fresh" / "calibration-cpu.json").exists()
    # it answered on the quick calibration it made, says so, and left the full one running on its own
    assert json.loads(r.stdout)["calibration"] == "quick"
    upgrade = re.search(r"the full one is under way in the background \(pid (\d+)", r.stderr)
    assert upgrade, r.stderr
    pid = int(upgrade.group(1))
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"--if-quick" in cmdline and str(tmp_path / "fresh").encode() in cmdline
        again = daop("estimate", str(EXAMPLES / "mlp.json"), "--input", "features=1x256", "--json", "--at-rest",
                     state_dir=tmp_path / "fresh")
        assert "calibrating" not in again.stderr and "background" not in again.stderr  # one upgrade, not two
        assert json.loads(again.stdout)["calibration"] == "quick"  # until the full one is saved
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # the test's own: a full calibration is a benchmark's time, not a test's
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes():
                break
            time.sleep(0.1)


def test_calibrate_if_quick_redoes_only_quick_calibrations_and_only_once_at_a_time(state_dir):
    path = calibration_store.calibration_path(state_dir, "cpu")
    before = path.read_bytes()
    with calibration_store.upgrade_lock(state_dir) as held:  # as an upgrade under way holds it
        assert held
        busy = daop("calibrate", "--if-quick", state_dir=state_dir)
    assert busy.returncode == 0 and "already under way" in busy.stdout
    assert path.read_bytes() == before
    doc = json.loads(before)
    doc["quick"] = False  # the saved calibration is a full one: nothing to redo, and estimate says which answered
    path.write_text(json.dumps(doc))
    done = daop("calibrate", "--if-quick", state_dir=state_dir)
    assert done.returncode == 0 and "nothing to redo" in done.stdout
    assert json.loads(path.read_text())["quick"] is False
    r = daop("estimate", str(EXAMPLES / "mlp.json"), "--input", "features=1x256", "--json", "--at-rest",
             state_dir=state_dir)
    assert json.loads(r.stdout)["calibration"] == "full" and "background" not in r.stderr
    plain = daop("estimate", str(EXAMPLES / "mlp.json"), "--input", "features=1x256", "--at-rest",
                 state_dir=state_dir)
    assert plain.stdout.strip().endswith("kernels, full calibration)")
    bad = daop("calibrate", "--if-quick", "--quick", state_dir=state_dir)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_an_upgrade_that_finds_another_under_way_waits_for_it_rather_than_measure_beside_it(state_dir):
    doc = json.loads(calibration_store.calibration_path(state_dir, "cpu").read_text())
    doc["quick"] = False  # what the other upgrade leaves: nothing quick to redo once it has ended
    calibration_store.calibration_path(state_dir, "cpu").write_text(json.dumps(doc))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom agent import calibration_store\n"
        f"with calibration_store.upgrade_lock({str(state_dir)!r}) as held:\n"
        "    print(held, flush=True)\n    time.sleep(0.5)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "True"
        held_at = time.monotonic()
        assert calibration_store.upgrade_in_full(state_dir) is None  # not waiting: says another is under way
        assert calibration_store.upgrade_in_full(state_dir, wait=True) == []  # waiting: after it, nothing left
        assert time.monotonic() - held_at >= 0.4
    finally:
        holder.wait(timeout=30)


def test_calibration_made_on_another_device_is_redone(state_dir):

    path = calibration_store.calibration_path(state_dir, "cpu")
    doc = json.loads(path.read_text())
    doc["fingerprint"]["cpu_model"] = "some other CPU"
    path.write_text(json.dumps(doc))
    assert calibration_store.load(state_dir, "cpu") is None
    path.write_text("{ truncated")
    assert calibration_store.load(state_dir, "cpu") is None
    assert path.with_suffix(".corrupt").exists() and not path.exists()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mlp(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp([16, 8]), str(path))
    return path


def test_npu_without_a_calibrated_provider_is_one_clear_line(state_dir, tmp_path):
    tree = intel_laptop(tmp_path / "laptop")
    r = daop("estimate", str(LIGHT_MODELS / "light_squeezenet.onnx"), "--device", "npu", "--at-rest",
             "--sysfs-root", str(tree.sys), "--procfs-root", str(tree.proc), state_dir=state_dir)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "npu0" in r.stderr and "OpenVINOExecutionProvider" in r.stderr


def test_low_power_hint_on_intel_laptop_fixture_tree_runs_on_the_cpu_and_says_why(state_dir, tmp_path):
    tree = intel_laptop(tmp_path / "laptop")
    r = daop("estimate", str(LIGHT_MODELS / "light_squeezenet.onnx"), "--power-preference", "low-power", "--json",
             "--at-rest", "--sysfs-root", str(tree.sys), "--procfs-root", str(tree.proc), state_dir=state_dir)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["device"] == "cpu"
    notes = [line for line in r.stderr.splitlines() if "no calibrated onnxruntime execution provider" in line]
    assert [n.split(": ", 1)[1].split(" ", 1)[0] for n in notes] == ["npu0", "gpu0"]  # preferred first, in order


def test_fallback_hint_and_contradictions(state_dir):
    model = str(LIGHT_MODELS / "light_squeezenet.onnx")
    r = daop("estimate", model, "--power-preference", "fallback", "--json", "--at-rest", state_dir=state_dir)
    assert r.returncode == 0 and json.loads(r.stdout)["device"] == "cpu", r.stderr
    r = daop("estimate", model, "--device", "gpu", "--no-accelerated", state_dir=state_dir)
    assert r.returncode == 2 and "contradicts" in r.stderr and len(r.stderr.strip().splitlines()) == 1
