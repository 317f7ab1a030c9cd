"""`daop-agent calibrate [--quick]`: cold micro-benchmark calibration, saved in the state dir."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent import calibration_store
from agent.config import STATE_DIR_HELP, default_state_dir
from agent.progress import ProgressBar
from monitors.errors import BadInput

HELP = "Calibrate the cost model with micro-benchmarks on this device (saved in the state dir)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a coarser grid (within about 15 s)")
    p.add_argument("--device", choices=("cpu", "gpu", "auto"), default="cpu",
                   help="cpu (default), gpu (needs onnxruntime's CUDA provider), auto: every device present")
    p.add_argument("--state-dir", type=Path, default=None, help=f"where calibrations are kept ({STATE_DIR_HELP})")
    p.add_argument("--if-quick", action="store_true",
                   help="redo in full the quick calibrations in the state dir, and nothing else (what `estimate` "
                        "starts in the background after a first, quick calibration)")


def run(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    if args.if_quick:
        if args.quick:
            raise BadInput("--if-quick redoes quick calibrations in full: it does not go with --quick")
        redone = calibration_store.upgrade_in_full(state_dir, lambda dev: ProgressBar(f"calibrating {dev} in full"))
        if redone is None:
            print(f"a calibration in full is already under way in {state_dir}")
        elif not redone:
            print(f"no quick calibration in {state_dir}: nothing to redo")
        for dev in redone or ():
            _report(state_dir, dev)
        return 0
    devices = ["cpu"]
    if args.device == "gpu":
        devices = ["gpu"]
    elif args.device == "auto" and calibration_store.gpu_available():
        devices.append("gpu")
    for dev in devices:
        calibration_store.run_calibration(state_dir, dev, quick=args.quick, progress=ProgressBar(f"calibrating {dev}"))
        _report(state_dir, dev)
    return 0


def _report(state_dir: Path, dev: str) -> None:
    cal = calibration_store.load(state_dir, dev)
    if cal is None:  # replaced meanwhile by something unreadable: nothing to say of it
        return
    points = sum(len(t.points) for t in cal.tables.values())
    saved = calibration_store.calibration_path(state_dir, dev)
    print(f"calibrated {dev}{' (quick)' if cal.quick else ''}: {points} points in {cal.seconds:.1f} s; "
          f"dispatch {cal.per_kernel_s * 1e6:.1f} us/kernel; memory read at {cal.stream_bytes_per_s / 1e9:.1f} GB/s "
          f"for the largest working set; saved {saved}")
