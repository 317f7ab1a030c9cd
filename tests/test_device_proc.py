"""The real-agent tests' device /proc (tests/device_proc.py) against the real processes it mirrors."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time

from device_proc import DeviceProc

from agent.simulation.trees import write_atomic
from probes.process_tree import ProcessTree
from probes.sysfs import KernelFiles
from probes.tree_cpu import TreeCpu

# A parent that starts a child busy for 0.6 s of CPU, reaps it, then idles: the shape of the agent's
# calibration and estimator processes, which come and go.
CHILD = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"
PARENT = f"""
import subprocess, sys, time
time.sleep(0.3)
subprocess.run([sys.executable, "-c", "{CHILD}"])
time.sleep(30)
"""


def test_device_proc_of_real_processes_keeps_an_ended_child_s_time_in_its_parent_s_cutime(tmp_path):
    """On the real /proc a reaped child's CPU time moves to its parent's cutime, so the tree's total goes on
    without a drop; the device /proc must do the same, or the agent reads its own work as others' load the moment
    one of its processes ends."""
    with DeviceProc(tmp_path / "proc") as proc:
        parent = subprocess.Popen([sys.executable, "-c", PARENT])
        try:
            files = KernelFiles(proc.root)
            tree = TreeCpu(files, ProcessTree(files, parent.pid))
            tree.read()
            used, deadline = 0.0, time.monotonic() + 20
            while time.monotonic() < deadline and used < 0.2:  # the child half-way through its work
                time.sleep(0.05)
                usage = tree.read()
                used += usage.cpu_s if usage is not None else 0.0
            assert usage is not None and usage.processes == 2, usage
            parent_files = proc.root / str(parent.pid) / "task"
            while time.monotonic() < deadline and any(
                    (t / "children").exists() and (t / "children").read_text().strip() for t in parent_files.iterdir()):
                time.sleep(0.05)
            time.sleep(0.3)  # ended and reaped, and the device /proc updated since
            usage = tree.read()
            assert usage is not None and usage.processes == 1, usage
            used += usage.cpu_s
        finally:
            parent.kill()
            parent.wait()
    # the child's 0.6 s (on the device: at least the host's time, where tenants took some) all counted
    assert used >= 0.5, used
    stat = (proc.root / str(parent.pid) / "stat").read_text().rpartition(")")[2].split()
    assert int(stat[13]) > 0  # cutime


def test_a_simulated_kernel_file_written_from_two_threads_at_once_is_always_whole(tmp_path):
    """The simulated device writes one file from two threads (a step's conditions, the load's ticks): each write
    lands whole, and neither fails for the other's temporary file."""
    path = tmp_path / "device" / "app-scale"
    values = {b"1.0000 1.0000", b"2.0185 1.0467"}

    def write(data: bytes) -> None:
        for _ in range(2000):
            write_atomic(path, data)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(write, data) for data in values]:
            done.result()  # raised FileNotFoundError with one temporary file for both
    assert path.read_bytes() in values
    assert [p.name for p in path.parent.iterdir()] == ["app-scale"]
