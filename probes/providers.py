"""The onnxruntime execution providers installed here (CUDA, ROCm, MIGraphX, OpenVINO, ...).

onnxruntime lists the providers its build carries; one being listed does not mean
its device is present (a CUDA build on a machine without a driver lists CUDA):
monitors/placement.py matches them to the accelerators the probes found.
"""

from __future__ import annotations

import functools


@functools.cache
def installed() -> tuple[str, ...]:
    """The providers this process's onnxruntime offers, in its order of preference."""
    import onnxruntime as ort  # noqa: PLC0415 - ~0.1 s to import: only where a provider list is wanted

    return tuple(ort.get_available_providers())
