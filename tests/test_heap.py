"""agent/heap.py: what a large request took goes back once it is done, reference cycles included."""

from __future__ import annotations

import gc
import weakref

from agent import heap


class Payload:
    """Stands for a request's payload."""


def _fail(payload: Payload) -> list[BaseException]:
    """The shape a worker's error leaves: a future (here `box`) holds the exception, the exception's traceback the
    frame, and the frame the future and the payload."""
    box: list[BaseException] = []
    try:
        raise ValueError("a worker's error")
    except ValueError as exc:
        box.append(exc)
    return box


def test_trim_collects_a_failed_requests_cycle_that_holds_its_payload():
    gc.disable()  # as at rest, where the collector does not come round to it for minutes
    try:
        payload = Payload()
        _fail(payload)
        gone = weakref.ref(payload)
        del payload
        assert gone() is not None  # only a collection frees it
        heap.trim()
        assert gone() is None
    finally:
        gc.enable()
