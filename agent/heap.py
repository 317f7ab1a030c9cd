"""The agent process's own heap: what a large request took is given back to the system when it is done.

glibc serves a large allocation (a request's payload, its pickled copy to a worker) from its own mmap and
returns it on free, but after the first such free it raises that threshold, up to 32 MB, so that the next
large buffers come from the heap, where fragmentation keeps them: repeated large requests would leave the
agent's RSS grown for good. The threshold is fixed here (which also ends glibc's adjusting it), and the heap
is trimmed after each large request. Elsewhere than glibc both are no-ops.

Before the trim, the request's garbage is collected: a request that failed in a worker leaves its exception's
traceback in a cycle with the frames that raised it (a future holds the exception, a frame the future), and
those frames hold the request and its payload. The agent at rest allocates too little for Python's collector
to come round to them for minutes: four 15 MB graphs refused that way kept 60-130 MB in the agent.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging

log = logging.getLogger("daop-agent")

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 * 1024  # an allocation this large or larger gets its own mapping, returned on free
TRIM_THRESHOLD = 1 << 20  # free memory at the top of the heap beyond this goes back at once


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt  # noqa: B018 - present in glibc (and musl lacks malloc_trim)
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def bound() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (at start); whether it could."""
    libc = _libc()
    if libc is None:
        log.debug("heap: not glibc; thresholds left as they are")
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD,
                                                                                      TRIM_THRESHOLD))


def trim() -> None:
    """Give what a large request took back to the system: its garbage collected, the heap's free pages returned."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
