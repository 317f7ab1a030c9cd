"""`daop-agent calibrate [--quick]`: cold micro-benchmark calibration, saved in the state dir."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent import calibration_store
from agent.config import STATE_DIR_HELP, default_state_dir
from agent.progress import ProgressBar

HELP = "Calibrate the cost model with micro-benchmarks on this device (saved in the state dir)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a coarser grid (within about 15 s)")
    p.add_argument("--device", choices=("cpu", "gpu", "auto"), default="cpu",
                   help="cpu (default), gpu (needs onnxruntime's CUDA provider), auto: every device present")
    p.add_argument("--state-dir", type=Path, default=None, help=f"where calibrations are kept ({STATE_DIR_HELP})")


def run(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    devices = ["cpu"]
    if args.device == "gpu":
        devices = ["gpu"]
    elif args.device == "auto" and calibration_store.gpu_available():
        devices.append("gpu")
    for dev in devices:
        cal = calibration_store.run_calibration(state_dir, dev, quick=args.quick,
                                                progress=ProgressBar(f"calibrating {dev}"))
        points = sum(len(t.points) for t in cal.tables.values())
        saved = calibration_store.calibration_path(state_dir, dev)
        print(f"calibrated {dev}: {points} points in {cal.seconds:.1f} s; "
              f"dispatch {cal.per_kernel_s * 1e6:.1f} us/kernel; saved {saved}")
    return 0
