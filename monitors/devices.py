"""Where a model can run: the devices the estimator prices and the present speed scales, in one order."""

from __future__ import annotations

DEVICES: tuple[str, ...] = ("cpu", "gpu")
DEVICE_INDEX: dict[str, int] = {name: i for i, name in enumerate(DEVICES)}
