"""The agent's memory with its own calibration: what the systemd unit's MemoryMax= must leave room for.

Starts `daop-agent run --local-broker` on an empty state dir (so it calibrates in full, in a process of its
own, beside its estimator workers) and samples its whole process tree twice a second until the estimator is
ready, then for `--after` seconds more with a monitor's worth of requests. Prints the peak of the tree's
summed PSS (what the cgroup is charged, shared pages counted once) and RSS (shared pages counted in each
process), and the tree's PSS once it has settled.

    .venv/bin/python -m bench.service_memory [--quick] [--after 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def tree_memory(root: psutil.Process) -> tuple[int, int, int]:
    """(PSS, RSS, processes) summed over the tree."""
    pss = rss = n = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss += getattr(info, "pss", info.rss)
        rss += info.rss
        n += 1
    return pss, rss, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a quick calibration instead of the full one")
    ap.add_argument("--after", type=float, default=10.0, help="seconds sampled once the estimator is ready")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="daop-mem-") as tmp:
        log_path = Path(tmp) / "agent.log"
        port = 20000 + os.getpid() % 20000
        cmd = [sys.executable, "-m", "agent", "run", "--local-broker", str(port), "--web-port", "0",
               "--state-dir", str(Path(tmp) / "state"), "--device-id", "mem",
               "--calibration", "quick" if args.quick else "full"]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log)
        root = psutil.Process(proc.pid)
        peak_pss = peak_rss = peak_n = 0
        ready_at = None
        started = time.monotonic()
        try:
            while proc.poll() is None:
                pss, rss, n = tree_memory(root)
                if pss > peak_pss:
                    peak_pss, peak_rss, peak_n = pss, rss, n
                if ready_at is None and "estimator ready" in log_path.read_text(errors="replace"):
                    ready_at = time.monotonic()
                if ready_at is not None and time.monotonic() - ready_at > args.after:
                    break
                if time.monotonic() - started > 600:
                    print("the agent was not ready within 600 s", file=sys.stderr)
                    return 1
                time.sleep(0.5)
            settled, _, settled_n = tree_memory(root)
        finally:
            proc.terminate()
            proc.wait(15)
        print(f"calibration: {'quick' if args.quick else 'full'}; ready after {ready_at - started:.0f} s"
              if ready_at else "never ready")
        print(f"peak: PSS {peak_pss / 2**20:.0f} MiB, RSS {peak_rss / 2**20:.0f} MiB over {peak_n} processes")
        print(f"settled: PSS {settled / 2**20:.0f} MiB over {settled_n} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
