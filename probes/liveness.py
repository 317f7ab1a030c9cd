"""Whether an app's process still runs, even where /proc hides it.

Under a `hidepid=invisible` proc mount, or systemd's `ProtectProc=invisible`, another user's `/proc/<pid>`
is absent while the process runs: its absence alone is no proof that the app is gone. On the real /proc the
kernel is asked (`kill(pid, 0)`: ESRCH only when no such process exists; EPERM when it runs under another
user). A fixture procfs root (the tests, the simulation) is read as it is: its pids are not the host's.
"""

from __future__ import annotations

import os

REAL_PROC = "/proc"


def process_runs(pid: int, procfs_root: str = REAL_PROC) -> bool:
    """True while process `pid` exists (as far as this agent can tell)."""
    if os.path.exists(os.path.join(procfs_root, str(pid))):
        return True
    if os.path.realpath(procfs_root) != REAL_PROC:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs, under another user, hidden from this one's /proc
    return True
