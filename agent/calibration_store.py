"""Keep calibrations in the state dir, and redo one when the device it was made on has changed."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from monitors.errors import BadInput
from probes.calibration import Calibration

if TYPE_CHECKING:  # the estimator and its importers: never in the agent's main process (agent/analysis.py)
    from monitors.pricing.estimator import Estimator

log = logging.getLogger(__name__)


def calibration_path(state_dir: str | os.PathLike, device: str) -> Path:
    return Path(state_dir) / f"calibration-{device}.json"


def gpu_available() -> bool:
    """onnxruntime can run on a GPU here: its CUDA provider is installed."""
    from probes import providers  # noqa: PLC0415 - loads onnxruntime: only where a calibration is made or checked

    return "CUDAExecutionProvider" in providers.installed()


def load(state_dir: str | os.PathLike, device: str) -> Calibration | None:
    """The saved calibration if it is readable and still matches this device; else None."""
    from probes.microbench import fingerprint  # noqa: PLC0415 - loads onnxruntime: only where a calibration is made or checked

    path = calibration_path(state_dir, device)
    try:
        cal = Calibration.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        aside = path.with_suffix(".corrupt")
        log.warning("calibration %s is unreadable (%s); set aside as %s", path, exc, aside.name)
        os.replace(path, aside)
        return None
    current = fingerprint(device)
    if cal.fingerprint != current:
        changed = sorted(k for k in current if cal.fingerprint.get(k) != current[k])
        log.info("calibration %s was made for another device (%s changed): calibrating again", path, ", ".join(changed))
        return None
    return cal


def save(state_dir: str | os.PathLike, cal: Calibration) -> Path:
    """Atomically: a crash leaves the old file or the new one, never half of one."""
    path = calibration_path(state_dir, cal.device)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(cal.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def run_calibration(state_dir: str | os.PathLike, device: str = "cpu", quick: bool = False,
                    progress=None) -> Calibration:
    from probes import microbench  # noqa: PLC0415 - loads onnxruntime: only where a calibration is made or checked

    if device == "gpu" and not gpu_available():
        raise BadInput("no GPU: onnxruntime's CUDA execution provider is not available on this device")
    cal = microbench.calibrate(quick=quick, device=device, progress=progress)  # with the warm refresh's reference
    save(state_dir, cal)
    return cal


def load_estimator(state_dir: str | os.PathLike, device: str = "cpu", quick: bool = False,
                   progress=None, announce=sys.stderr) -> Estimator:
    """An estimator for `device` ('cpu', 'gpu' or 'auto'), calibrating first where needed."""
    from monitors.pricing.estimator import Estimator  # noqa: PLC0415 - the estimator and its importers: never in the agent's main process (agent/analysis.py)

    wanted = ["cpu"]
    if device == "gpu" or (device == "auto" and gpu_available()):
        wanted.append("gpu")
    cals: dict[str, Calibration] = {}
    for dev in wanted:
        cal = load(state_dir, dev)
        if cal is None:
            if dev == "gpu" and not gpu_available():
                raise BadInput("no GPU: onnxruntime's CUDA execution provider is not available on this device")
            if announce is not None:
                print(f"daop-agent: no {dev.upper()} calibration in {state_dir}: calibrating now"
                      f"{' (quick)' if quick else ''}...", file=announce)
            cal = run_calibration(state_dir, dev, quick=quick, progress=progress)
        cals[dev] = cal
    return Estimator(cals)


# -- upgrading a quick calibration in full ------------------------------------------------------------------

UPGRADE_LOCK = "calibrating-in-full.lock"  # held by the one process upgrading; it holds its pid
UPGRADE_LOG = "calibrating-in-full.log"


@contextlib.contextmanager
def upgrade_lock(state_dir: str | os.PathLike, wait: bool = False) -> Iterator[bool]:
    """Whether this process holds the state dir's upgrade lock (False: another upgrade is under way; with
    `wait`, once it has ended). The lock is the kernel's (flock): it goes with the process that held it,
    however that ends. Two calibrations at once would each read the other as a slow device."""
    path = Path(state_dir) / UPGRADE_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        yield True


def quick_devices(state_dir: str | os.PathLike) -> list[str]:
    """The devices whose saved calibration (still valid here) is quick."""
    return [d for d in ("cpu", "gpu") if calibration_path(state_dir, d).exists()
            and (cal := load(state_dir, d)) is not None and cal.quick]


def upgrade_in_full(state_dir: str | os.PathLike, progress_for=None, wait: bool = False) -> list[str] | None:
    """Redo every quick calibration in the state dir in full; the devices redone, or None when another upgrade
    holds the lock (with `wait`: once it has ended, whatever it left quick)."""
    with upgrade_lock(state_dir, wait) as held:
        if not held:
            return None
        redone = quick_devices(state_dir)
        for dev in redone:
            run_calibration(state_dir, dev, quick=False, progress=progress_for(dev) if progress_for else None)
        return redone


def start_upgrade(state_dir: str | os.PathLike) -> int:
    """Start `daop-agent calibrate --if-quick` on its own, in the background, for the state dir; its pid. It
    outlives this process (a session of its own) and writes its progress to the state dir's log."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / UPGRADE_LOG, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "agent", "calibrate", "--if-quick", "--state-dir",
                                 str(state_dir)], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    return proc.pid
