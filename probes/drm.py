"""DRM client usage: what each client of a GPU or NPU uses, from `/proc/<pid>/fdinfo/<fd>`.

The kernel's DRM client usage stats (Documentation/gpu/drm-usage-stats.rst), which i915, xe, amdgpu,
msm, panfrost, panthor, v3d, ivpu, amdxdna and others write and nvtop and gputop read: per open DRM
file (a client), busy time per engine class (`drm-engine-render: 123456789 ns`), or busy cycles against
elapsed cycles (`drm-cycles-rcs` / `drm-total-cycles-rcs`, xe), the engines in a class
(`drm-engine-capacity-vcs: 2`), memory per region (`drm-total-vram0: 23992 KiB`, or the older
`drm-memory-vram`), and `drm-client-id`: one client can sit behind several fds and processes, and is
counted once.

Busy time is a delta between samples, like CPU load: a client's first sample has none. Clients of the
agent's own process tree (probes/process_tree.py) are not others' load; that tree is small, and its fds
are read at every sample. Finding the clients of others means reading every process's fd links (about
3 us of CPU per fd, and a desktop has 10 000 or more), so that is done every DISCOVERY_S; in between
only the fds already known to be clients are read, and a client of others that opens the device after a
discovery is seen at the next one (the device-wide counters of probes/accelerators.py see its load at
once). Processes of other users can be read by root only: their clients are missed, and counted in
`hidden_processes`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from probes.process_tree import ProcessTree
from probes.sysfs import INT_LIMIT, KernelFiles

DISCOVERY_S = 30.0
DEVICE_DIRS = ("/dev/dri/", "/dev/accel/")
_FDINFO_BYTES = 16384
_MEMORY_UNITS = {"": 1, "B": 1, "KiB": 1024, "kB": 1024, "KB": 1024, "MiB": 1 << 20, "MB": 1 << 20, "GiB": 1 << 30}
# Engine classes that do not run shaders or NPU kernels: copy, video, media, display helpers.
_NOT_COMPUTE = ("copy", "video", "bcs", "vcs", "vecs", "dma", "sdma", "dec", "enc", "jpeg", "vpe", "vcn", "uvd",
                "vce", "tfu", "cache_clean", "other")


@dataclass(frozen=True)
class ClientInfo:
    """One fdinfo file of a DRM client, parsed."""

    client_id: int
    driver: str | None
    pdev: str | None
    engine_ns: dict[str, int] = field(default_factory=dict)
    cycles: dict[str, int] = field(default_factory=dict)
    total_cycles: dict[str, int] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    memory_bytes: int | None = None  # over all regions

    @property
    def engines(self) -> set[str]:
        return set(self.engine_ns) | set(self.cycles)


def is_compute_engine(name: str) -> bool:
    """Render, compute, gfx, a whole GPU or an NPU: engines an inference's kernels run on."""
    return not any(name == n or name.startswith((n + "-", n + "_")) for n in _NOT_COMPUTE)


def compute_share(engines: dict[str, float] | None) -> float | None:
    """The share of the device's shader or NPU time in use: the sum over compute engines (render and compute
    engines share the same execution units), at most 1."""
    if engines is None:
        return None
    return min(1.0, sum((v for e, v in engines.items() if is_compute_engine(e)), 0.0))


def _uint(text: str, units: dict[str, int] | None = None) -> int | None:
    """`123`, `123 ns`, `1024 KiB` -> an integer (bytes for memory); None for garbage."""
    parts = text.split()
    if not parts or len(parts) > 2 or not parts[0].isdigit():
        return None
    value = int(parts[0])
    unit = parts[1] if len(parts) == 2 else ""
    if units is None:
        if unit not in ("", "ns"):
            return None
    else:
        if unit not in units:
            return None
        value *= units[unit]
    return value if value < INT_LIMIT else None


def parse_fdinfo(text: str) -> ClientInfo | None:
    """A DRM client's fdinfo; None for a file that is not a DRM client's (a plain file, a socket) or garbage."""
    client = driver = pdev = None
    engine_ns: dict[str, int] = {}
    cycles: dict[str, int] = {}
    total_cycles: dict[str, int] = {}
    capacity: dict[str, int] = {}
    totals: list[int] = []
    legacy: list[int] = []
    for line in text.splitlines():
        if not line.startswith("drm-"):
            continue
        key, _, value = line.partition(":")
        kind, _, name = key[4:].partition("-")  # drm-engine-render -> engine, render
        value = value.strip()
        if kind == "engine":
            if name.startswith("capacity-"):
                number = _uint(value)
                if number:
                    capacity[name[len("capacity-"):]] = number
            elif (number := _uint(value)) is not None:
                engine_ns[name] = number
        elif kind == "cycles":
            if (number := _uint(value)) is not None:
                cycles[name] = number
        elif kind == "total":
            if name.startswith("cycles-"):
                if (number := _uint(value)) is not None:
                    total_cycles[name[len("cycles-"):]] = number
            elif (number := _uint(value, _MEMORY_UNITS)) is not None:
                totals.append(number)
        elif kind == "memory":
            if (number := _uint(value, _MEMORY_UNITS)) is not None:
                legacy.append(number)
        elif key == "drm-client-id":
            client = value
        elif key == "drm-driver":
            driver = value or None
        elif key == "drm-pdev":
            pdev = value or None
    if client is None or not client.isdigit():
        return None
    memory = totals or legacy
    return ClientInfo(client_id=int(client), driver=driver, pdev=pdev, engine_ns=engine_ns, cycles=cycles,
                      total_cycles=total_cycles, capacity=capacity, memory_bytes=sum(memory) if memory else None)


@dataclass(frozen=True)
class DeviceUsage:
    """The clients of one device over the last interval, split into the agent's own and others'."""

    others_clients: int
    own_clients: int
    # Engine class -> share of its time busy over the interval (capacity counted). None: no interval yet
    # (the first sample, or only clients seen for the first time).
    others_engines: dict[str, float] | None
    own_engines: dict[str, float] | None
    others_memory_bytes: int | None
    own_memory_bytes: int | None

    @property
    def others_busy(self) -> float | None:
        return compute_share(self.others_engines)

    @property
    def own_busy(self) -> float | None:
        return compute_share(self.own_engines)


@dataclass(frozen=True)
class DrmReport:
    devices: dict[str, DeviceUsage]  # device key (see DrmClients.sample) -> usage
    hidden_processes: int  # processes whose fds could not be read at the last discovery (other users')


def _share(now: ClientInfo, before: ClientInfo, engine: str, interval_s: float) -> float | None:
    """One client's busy share of one engine class between two readings (capacity counted)."""
    capacity = now.capacity.get(engine, 1)
    if all(engine in counts for counts in (now.cycles, now.total_cycles, before.cycles, before.total_cycles)):
        elapsed = now.total_cycles[engine] - before.total_cycles[engine]
        if elapsed <= 0:
            return None
        return max(0, now.cycles[engine] - before.cycles[engine]) / elapsed / capacity
    if engine in now.engine_ns and engine in before.engine_ns and interval_s > 0:
        return max(0, now.engine_ns[engine] - before.engine_ns[engine]) / (interval_s * 1e9) / capacity
    return None


def _monotonic(now: ClientInfo, before: ClientInfo | None) -> ClientInfo:
    """The kernel may report a counter lower than before for a while; stay with the larger one meanwhile."""
    if before is None:
        return now

    def keep(new: dict[str, int], old: dict[str, int]) -> dict[str, int]:
        return {k: max(v, old.get(k, v)) for k, v in new.items()}

    return ClientInfo(now.client_id, now.driver, now.pdev, keep(now.engine_ns, before.engine_ns),
                      keep(now.cycles, before.cycles), keep(now.total_cycles, before.total_cycles),
                      now.capacity, now.memory_bytes)


class DrmClients:
    """Per-device usage by DRM clients; one instance per sampler (it keeps the previous readings)."""

    def __init__(self, proc_files: KernelFiles, tree: ProcessTree, *, discovery_s: float = DISCOVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc_files
        self.tree = tree
        self.discovery_s = discovery_s
        self.clock = clock
        self._fds: list[tuple[int, str, str]] | None = None  # pid, fd, device node name
        self._discovered_at = 0.0
        self._hidden = 0
        self._prev: dict[tuple[str, int], ClientInfo] = {}
        self._prev_at: float | None = None
        self._parsed: dict[tuple[int, str], tuple[str, ClientInfo | None]] = {}  # an idle client's text repeats

    def sample(self, nodes: dict[str, str], pdevs: dict[str, str] | None = None) -> DrmReport:
        """`nodes`: device node name (`card0`, `renderD128`, `accel0`) -> device key; `pdevs`: `drm-pdev`
        (a PCI slot) -> device key, for a client whose node is not known. Clients of no known device are skipped."""
        now = self.clock()
        if self._fds is None or now - self._discovered_at >= self.discovery_s:
            self._fds, self._hidden = self._scan(self._pids())
            self._discovered_at = now
        members = self.tree.members()
        own, _ = self._scan(sorted(members))
        owns = self.tree.snapshot()
        clients: dict[tuple[str, int], tuple[ClientInfo, bool]] = {}
        live: list[tuple[int, str, str]] = []
        parsed: dict[tuple[int, str], tuple[str, ClientInfo | None]] = {}
        for pid, fd, node in dict.fromkeys((self._fds or []) + own):
            text = self.proc.read_raw(f"{pid}/fdinfo/{fd}", _FDINFO_BYTES)
            info = None
            if text:
                held = self._parsed.get((pid, fd))
                info = held[1] if held is not None and held[0] == text else parse_fdinfo(text)
                parsed[(pid, fd)] = (text, info)
            if info is None:
                continue  # closed, or the number now holds another file
            if pid not in members:
                live.append((pid, fd, node))  # the agent's tree is scanned again at every sample
            key = nodes.get(node) or (pdevs or {}).get(info.pdev or "")
            if key is None:
                continue
            seen = clients.get((key, info.client_id))
            clients[(key, info.client_id)] = (info, owns(pid) or (seen is not None and seen[1]))
        self._fds = live
        self._parsed = parsed

        interval = None if self._prev_at is None else now - self._prev_at
        usage = self._usage(clients, interval, set(nodes.values()) | set((pdevs or {}).values()))
        self._prev = {ck: _monotonic(info, self._prev.get(ck)) for ck, (info, _) in clients.items()}
        self._prev_at = now
        return DrmReport(usage, self._hidden)

    def _usage(self, clients: dict[tuple[str, int], tuple[ClientInfo, bool]], interval: float | None,
               keys: set[str]) -> dict[str, DeviceUsage]:
        counts = {key: [0, 0] for key in keys}  # others, own
        engines: dict[str, list[dict[str, float] | None]] = {key: [{}, {}] for key in keys}
        timed = {key: [False, False] for key in keys}  # a client of this side had a previous reading
        memory: dict[str, list[int | None]] = {key: [None, None] for key in keys}
        for (key, cid), (info, own) in clients.items():
            side = 1 if own else 0
            counts[key][side] += 1
            if info.memory_bytes is not None:
                memory[key][side] = (memory[key][side] or 0) + info.memory_bytes
            before = self._prev.get((key, cid))
            if interval is None or before is None:
                continue
            timed[key][side] = True
            sums = engines[key][side]
            assert sums is not None
            for engine in info.engines:
                share = _share(info, before, engine, interval)
                if share is not None:
                    sums[engine] = sums.get(engine, 0.0) + share
        out: dict[str, DeviceUsage] = {}
        for key in keys:
            sides: list[dict[str, float] | None] = []
            for side in (0, 1):
                if interval is None or (counts[key][side] and not timed[key][side]):
                    sides.append(None)  # nothing to take a delta of yet: unknown, not idle
                else:
                    sides.append({e: round(min(1.0, v), 4) for e, v in sorted((engines[key][side] or {}).items())})
            out[key] = DeviceUsage(others_clients=counts[key][0], own_clients=counts[key][1],
                                   others_engines=sides[0], own_engines=sides[1],
                                   others_memory_bytes=memory[key][0], own_memory_bytes=memory[key][1])
        return out

    def _pids(self) -> list[int]:
        try:
            return [int(name) for name in os.listdir(self.proc.root) if name.isdigit()]
        except OSError:
            return []

    def _scan(self, pids: list[int]) -> tuple[list[tuple[int, str, str]], int]:
        """The fds of these processes that are DRM or accel device nodes, and how many processes could not be
        read (other users')."""
        fds: list[tuple[int, str, str]] = []
        hidden = 0
        for pid in pids:
            try:
                entries = os.listdir(self.proc.path(f"{pid}/fd"))
            except PermissionError:
                hidden += 1
                continue
            except OSError:  # the process ended
                continue
            for fd in entries:
                target = self.proc.readlink(f"{pid}/fd/{fd}")
                if target is not None and target.startswith(DEVICE_DIRS):
                    fds.append((pid, fd, os.path.basename(target)))
        return fds, hidden
