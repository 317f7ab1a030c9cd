"""GPUs and NPUs by the kernel's own accounting, on fixture trees (no such hardware here): DRM client usage in
fdinfo, amdgpu / i915 / xe / intel_vpu / amdxdna sysfs, NVML's GPUs through the stand-in; garbage and vanishing
files."""

from __future__ import annotations

import json
import os

import pytest

from agent.simulation.nvml import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_NOT_SUPPORTED, NvmlStandin, StandinGpu
from agent.simulation.trees import (
    AGENT_PID,
    BROWSER_PID,
    amd_laptop,
    amdgpu_fdinfo,
    amdxdna_fdinfo,
    desktop,
    i915_fdinfo,
    intel_laptop,
    nvidia_desktop,
    server,
    vm,
    xe_fdinfo,
)
from probes.accelerators import AcceleratorProbe, parse_dpm_clocks, parse_uevent
from probes.drm import DrmClients, compute_share, is_compute_engine, parse_fdinfo
from probes.gpu import GpuProbe, pci_slot
from probes.process_tree import ProcessTree, parse_ppid
from probes.state import Sampler
from probes.sysfs import KernelFiles


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def probe(tree, clock, own_root=AGENT_PID, own_pids=None, discovery_s=10.0):
    """The accelerator probe on a fixture tree, with the agent at `own_root` in it and a clock the test moves."""
    proc = KernelFiles(tree.proc)
    drm = DrmClients(proc, ProcessTree(proc, own_root, own_pids), discovery_s=discovery_s, clock=clock)
    return AcceleratorProbe(KernelFiles(tree.sys), drm, clock=clock)


def by_id(accelerators):
    return {a.id: a for a in accelerators}


# -- parsing --

def test_fdinfo_of_each_driver_parses_to_engines_and_memory():
    i915 = parse_fdinfo("pos:\t0\nflags:\t02100002\n" + i915_fdinfo(7, render_ns=123, video_ns=5))
    assert (i915.client_id, i915.driver, i915.pdev) == (7, "i915", "0000:00:02.0")
    assert i915.engine_ns == {"render": 123, "copy": 0, "video": 5, "video-enhance": 0}
    assert i915.capacity == {"video": 2} and i915.memory_bytes == 55160 * 1024  # drm-total-*, not resident as well
    xe = parse_fdinfo(xe_fdinfo(3, rcs_cycles=28_257_900, total_cycles=7_655_183_225, ccs_cycles=10))
    assert xe.cycles["rcs"] == 28_257_900 and xe.total_cycles["ccs"] == 7_655_183_225 and xe.capacity["ccs"] == 4
    assert xe.engine_ns == {} and xe.memory_bytes == 192 * 1024  # drm-total-cycles-* is no memory region
    amd = parse_fdinfo(amdgpu_fdinfo(13, gfx_ns=5, vram_kib=25040))
    assert amd.engine_ns["gfx"] == 5 and amd.memory_bytes == (25040 + 2048) * 1024  # drm-memory-*, the older keys
    npu = parse_fdinfo(amdxdna_fdinfo(2, npu_ns=9))
    assert npu.engine_ns == {"npu-amdxdna": 9} and npu.memory_bytes == 4096 * 1024


@pytest.mark.parametrize("text", ["", "pos:\t0\nflags:\t02\n", "drm-driver:\ti915\n", "drm-client-id:\tseven\n",
                                  "drm-client-id: -3\n", "\x00\x01garbage"])
def test_fdinfo_that_is_no_drm_client_is_none(text):
    assert parse_fdinfo(text) is None


def test_fdinfo_garbage_values_are_skipped_not_fatal():
    info = parse_fdinfo("drm-client-id:\t4\ndrm-engine-render:\tlots ns\ndrm-engine-copy:\t12 parsecs\n"
                        "drm-memory-vram:\t12 furlongs\ndrm-engine-capacity-video:\t0\n"
                        f"drm-engine-gfx:\t{2**70} ns\ndrm-total-vram0:\t3 MiB\n")
    assert info.client_id == 4 and info.engine_ns == {} and info.capacity == {}
    assert info.memory_bytes == 3 << 20


def test_compute_engines_exclude_copy_and_media():
    engines = ("render", "gfx", "compute", "rcs", "ccs", "gpu", "npu-amdxdna", "fragment")
    assert all(is_compute_engine(e) for e in engines)
    assert not any(is_compute_engine(e) for e in ("copy", "video", "video-enhance", "bcs", "vcs", "vecs", "dma",
                                                  "dec", "enc", "enc_1", "jpeg", "vpe"))
    assert compute_share({"gfx": 0.7, "compute": 0.6, "dec": 0.9}) == 1.0
    assert compute_share({}) == 0.0 and compute_share(None) is None


def test_small_parsers():
    assert parse_ppid("1234 (a (weird) name) S 77 1234 1234") == 77 and parse_ppid("garbage") is None
    uevent = parse_uevent("DRIVER=i915\nPCI_SLOT_NAME=0000:00:02.0\n")
    assert uevent == {"DRIVER": "i915", "PCI_SLOT_NAME": "0000:00:02.0"}
    assert parse_dpm_clocks("0: 800Mhz\n1: 1500Mhz *\n2: 2700Mhz\n") == (1500.0, 2700.0)
    assert parse_dpm_clocks("0: 800Mhz\n1: 1500Mhz\n") is None  # no current level
    assert parse_dpm_clocks("0: fastMhz *\n") is None
    assert pci_slot("00000000:01:00.0") == "0000:01:00.0" and pci_slot("0000000A:C1:00.0") == "000a:c1:00.0"
    assert pci_slot("garbage") is None


def test_process_tree_descendants_and_garbage_parents(tmp_path):
    tree = intel_laptop(tmp_path)
    tree.process(5000, 5001, "loop-a")  # a parent chain that loops (garbage): not the agent's, and no hang
    tree.process(5001, 5000, "loop-b")
    proc = KernelFiles(tree.proc)
    processes = ProcessTree(proc, AGENT_PID)
    assert processes.members() == {AGENT_PID, AGENT_PID + 1}
    owns = processes.snapshot()
    assert owns(AGENT_PID + 1) and owns(AGENT_PID) and not owns(BROWSER_PID) and not owns(5000)
    assert not owns(99999)  # no such process
    assert ProcessTree(proc, None).members() == set()


# -- DRM clients: busy share of others, the agent's own, deltas --

def test_intel_laptop_fixture_tree_i915_busy_of_others_and_own_from_fdinfo_deltas(tmp_path):
    tree, clock = intel_laptop(tmp_path, "i915"), Clock()
    p = probe(tree, clock)
    first = by_id(p.sample()[0])
    assert first["gpu0"].busy is None and first["gpu0"].others_busy is None  # a delta: none on the first sample
    assert first["gpu0"].clients == 1 and first["gpu0"].own_clients == 1  # pid 4001 descends from the agent
    clock.now += 2.0
    tree.drm_client(BROWSER_PID, 30, "dri/renderD128", i915_fdinfo(7, render_ns=11_000_000_000, video_ns=1_900_000_000))
    tree.drm_client(AGENT_PID + 1, 5, "dri/renderD128", i915_fdinfo(9, render_ns=1_400_000_000))
    tree.set("devices/pci0000:00/0000:00:02.0/drm/card0/gt/gt0/rc6_residency_ms", str(800_000 + 600))
    gpu = by_id(p.sample()[0])["gpu0"]
    assert gpu.engines == {"copy": 0.0, "render": 0.5, "video": 0.475, "video-enhance": 0.0}  # video: 2 engines
    assert gpu.others_busy == 0.5 and gpu.own_busy == 0.2  # video decoding is no compute
    assert gpu.busy == 0.7 and gpu.busy_source == "rc6"  # in RC6 600 of 2000 ms
    assert gpu.others_memory_bytes == 55160 * 1024 and gpu.shares_system_memory is True


def test_xe_busy_cycles_against_total_cycles_with_capacity(tmp_path):
    tree, clock = intel_laptop(tmp_path, "xe"), Clock()
    p = probe(tree, clock)
    p.sample()
    clock.now += 1.0
    tree.drm_client(BROWSER_PID, 30, "dri/renderD128",
                    xe_fdinfo(3, rcs_cycles=28_257_900 + 3_000_000, total_cycles=7_655_183_225 + 10_000_000,
                              ccs_cycles=8_000_000))
    tree.set("devices/pci0000:00/0000:00:02.0/tile0/gt0/gtidle/idle_residency_ms", str(500_000 + 600))
    gpu = by_id(p.sample()[0])["gpu0"]
    assert gpu.engines["rcs"] == 0.3 and gpu.engines["ccs"] == 0.2  # 8M of 10M cycles over 4 compute engines
    assert gpu.busy == 0.4 and gpu.busy_source == "gtidle"  # idle 600 ms of 1000
    assert gpu.others_busy == 0.5  # fdinfo sees more than the device-wide reading less the agent's own


def test_amd_laptop_fixture_tree_dup_fds_are_one_client_and_the_agent_is_not_others(tmp_path):
    tree, clock = amd_laptop(tmp_path), Clock()
    p = probe(tree, clock)
    first = by_id(p.sample()[0])
    gpu = first["gpu0"]
    assert gpu.clients == 1 and gpu.own_clients == 1  # fds 30 and 31 of the browser: one client (id 13)
    assert gpu.busy == 0.35 and gpu.busy_source == "gpu_busy_percent"  # an instant reading: there on the first sample
    assert gpu.others_busy == 0.35 and gpu.own_busy is None  # the agent's share is a delta: not yet known
    clock.now += 1.0
    tree.drm_client(AGENT_PID + 1, 5, "dri/renderD128", amdgpu_fdinfo(14, gfx_ns=300_000_000, vram_kib=1024))
    gpu = by_id(p.sample()[0])["gpu0"]
    assert gpu.own_busy == 0.3 and gpu.others_busy == pytest.approx(0.05)  # 35 % busy, 30 % of it the agent's
    assert gpu.engines["gfx"] == 0.0  # the browser's client did not move


def test_injected_own_pids_count_as_the_agents(tmp_path):
    tree, clock = amd_laptop(tmp_path), Clock()
    p = probe(tree, clock, own_root=None, own_pids=lambda: {BROWSER_PID})
    gpu = by_id(p.sample()[0])["gpu0"]
    assert gpu.own_clients == 1 and gpu.clients == 1  # the browser is the agent's now, its worker 4001 is not
    p = probe(tree, Clock(), own_root=None)
    assert by_id(p.sample()[0])["gpu0"].clients == 2  # nobody is the agent's


def test_npu_busy_from_its_counter_and_its_clients(tmp_path):
    tree, clock = intel_laptop(tmp_path), Clock()
    p = probe(tree, clock)
    assert by_id(p.sample()[0])["npu0"].busy is None
    clock.now += 2.0
    npu = "devices/pci0000:00/0000:00:0b.0"
    tree.set(f"{npu}/npu_busy_time_us", str(1_000_000 + 500_000))
    tree.set(f"{npu}/npu_current_frequency_mhz", "1950")
    tree.set(f"{npu}/npu_memory_utilization", str(300 << 20))
    n = by_id(p.sample()[0])["npu0"]
    assert (n.kind, n.vendor, n.driver) == ("npu", "intel", "intel_vpu")
    assert n.busy == 0.25 and n.others_busy == 0.25 and n.busy_source == "npu_busy_time"
    assert n.clock_mhz == 1950.0 and n.clock_max_mhz == 1950.0 and n.memory_used_bytes == 300 << 20
    tree, clock = amd_laptop(tmp_path / "amd"), Clock()
    p = probe(tree, clock)
    p.sample()
    clock.now += 1.0
    tree.drm_client(2100, 7, "accel/accel0", amdxdna_fdinfo(2, npu_ns=3_000_000_000 + 800_000_000))
    n = by_id(p.sample()[0])["npu0"]
    assert (n.name, n.vendor) == ("RyzenAI-npu1", "amd") and n.others_busy == 0.8 and n.busy_source == "fdinfo"


def test_i915_busy_from_fdinfo_where_there_is_no_rc6_counter(tmp_path):
    tree, clock = intel_laptop(tmp_path, "i915"), Clock()
    card = tree.sys / "devices/pci0000:00/0000:00:02.0/drm/card0"
    (card / "gt/gt0/rc6_residency_ms").unlink()
    (card / "power/rc6_residency_ms").unlink()
    p = probe(tree, clock)
    p.sample()
    clock.now += 1.0
    tree.drm_client(BROWSER_PID, 30, "dri/renderD128", i915_fdinfo(7, render_ns=10_400_000_000))
    gpu = by_id(p.sample()[0])["gpu0"]
    assert gpu.busy == 0.4 and gpu.others_busy == 0.4 and gpu.busy_source == "fdinfo"


def test_the_agents_own_clients_are_found_at_every_sample(tmp_path):
    tree, clock = intel_laptop(tmp_path), Clock()
    p = probe(tree, clock, discovery_s=1000.0)
    assert by_id(p.sample()[0])["gpu0"].own_clients == 1
    tree.process(AGENT_PID + 2, AGENT_PID, "python3")  # a new worker, with a client, long before a discovery
    tree.drm_client(AGENT_PID + 2, 6, "dri/renderD128", i915_fdinfo(30, render_ns=0))
    clock.now += 1.0
    gpu = by_id(p.sample()[0])["gpu0"]
    assert gpu.own_clients == 2 and gpu.clients == 1


def test_a_client_opened_after_discovery_is_seen_at_the_next_one(tmp_path):
    tree, clock = intel_laptop(tmp_path), Clock()
    p = probe(tree, clock, discovery_s=10.0)
    p.sample()
    tree.process(2200, 1, "game")
    tree.drm_client(2200, 9, "dri/renderD128", i915_fdinfo(20, render_ns=0))
    clock.now += 1.0
    assert by_id(p.sample()[0])["gpu0"].clients == 1
    clock.now += 10.0
    assert by_id(p.sample()[0])["gpu0"].clients == 2
    (tree.proc / str(BROWSER_PID) / "fd" / "30").unlink()  # the browser closed its client
    (tree.proc / str(BROWSER_PID) / "fdinfo" / "30").unlink()
    clock.now += 1.0
    assert by_id(p.sample()[0])["gpu0"].clients == 1


def test_a_counter_that_goes_back_stays_at_its_larger_value(tmp_path):
    tree, clock = intel_laptop(tmp_path), Clock()
    rc6 = tree.sys / "devices/pci0000:00/0000:00:02.0/drm/card0/gt/gt0/rc6_residency_ms"

    def one_idle_second():
        clock.now += 1.0
        rc6.write_text(str(int(rc6.read_text()) + 1000))  # device-wide: idle

    p = probe(tree, clock)
    p.sample()
    one_idle_second()
    tree.drm_client(BROWSER_PID, 30, "dri/renderD128", i915_fdinfo(7, render_ns=9_000_000_000))  # went back 1 s
    assert by_id(p.sample()[0])["gpu0"].others_busy == 0.0
    one_idle_second()
    tree.drm_client(BROWSER_PID, 30, "dri/renderD128", i915_fdinfo(7, render_ns=10_500_000_000))
    assert by_id(p.sample()[0])["gpu0"].others_busy == 0.5  # from the larger 10 s, not from 9 s


# -- sysfs readings per driver --

def test_i915_clocks_cap_and_throttle_reasons(tmp_path):
    tree, clock = intel_laptop(tmp_path, "i915"), Clock()
    p = probe(tree, clock)
    gpu = by_id(p.sample()[0])["gpu0"]
    assert (gpu.clock_mhz, gpu.clock_max_mhz, gpu.clock_limit_mhz) == (1100.0, 1300.0, 1300.0)
    assert gpu.throttled is False and gpu.throttle_reasons == () and gpu.vendor == "intel"
    gt = "devices/pci0000:00/0000:00:02.0/drm/card0/gt/gt0"
    tree.set(f"{gt}/throttle_reason_status", "1")
    tree.set(f"{gt}/throttle_reason_pl1", "1")
    tree.set(f"{gt}/rps_act_freq_mhz", "600")
    gpu = by_id(p.sample()[0])["gpu0"]
    assert gpu.throttled is True and gpu.throttle_reasons == ("pl1",) and gpu.thermal_throttling is False
    assert gpu.clock_mhz == 600.0


def test_i915_without_per_gt_files_reads_the_cards_gt_files(tmp_path):
    tree = intel_laptop(tmp_path, "i915")
    card = tree.sys / "devices/pci0000:00/0000:00:02.0/drm/card0"
    for f in (card / "gt/gt0").iterdir():
        f.unlink()
    (card / "gt_act_freq_mhz").write_text("900\n")
    gpu = by_id(probe(tree, Clock()).sample()[0])["gpu0"]
    assert gpu.clock_mhz == 900.0 and gpu.clock_max_mhz == 1300.0 and gpu.throttled is None


def test_xe_throttle_reasons(tmp_path):
    tree = intel_laptop(tmp_path, "xe")
    throttle = "devices/pci0000:00/0000:00:02.0/tile0/gt0/freq0/throttle"
    tree.set(f"{throttle}/status", "1")
    tree.set(f"{throttle}/reason_thermal", "1")
    gpu = by_id(probe(tree, Clock()).sample()[0])["gpu0"]
    assert gpu.throttled and gpu.throttle_reasons == ("thermal",) and gpu.thermal_throttling is True


def test_amdgpu_memory_clocks_power(tmp_path):
    tree = amd_laptop(tmp_path)
    gpu = by_id(probe(tree, Clock()).sample()[0])["gpu0"]
    assert (gpu.vendor, gpu.driver, gpu.node, gpu.pci_slot) == ("amd", "amdgpu", "card1", "0000:c4:00.0")
    assert gpu.memory_total_bytes == 512 << 20 and gpu.memory_free_bytes == 312 << 20
    assert gpu.gtt_total_bytes == 8 << 30 and gpu.gtt_used_bytes == 300 << 20
    assert (gpu.clock_mhz, gpu.clock_max_mhz) == (1500.0, 2700.0)
    assert (gpu.power_w, gpu.power_limit_w, gpu.temp_c) == (9.0, 15.0, 52.0) and gpu.throttled is False
    tree.set("devices/pci0000:00/0000:c4:00.0/hwmon/hwmon5/power1_input", "14900000")
    gpu = by_id(probe(tree, Clock()).sample()[0])["gpu0"]
    assert gpu.throttled is True and gpu.throttle_reasons == ("power",)


# -- NVIDIA: NVML's readings on the DRM card --

def test_nvidia_desktop_fixture_tree_nvml_standin_merged_with_its_card(tmp_path):
    tree = nvidia_desktop(tmp_path)
    nvml = NvmlStandin([StandinGpu(util=60, used=20 * 2**30, reasons=0x04, sm_mhz=1500)])
    report = GpuProbe(nvml).sample()
    accs, notes = probe(tree, Clock()).sample(report.gpus)
    (gpu,) = accs
    assert (gpu.id, gpu.vendor, gpu.driver, gpu.node, gpu.nvml_index) == ("gpu0", "nvidia", "nvidia", "card0", 0)
    assert gpu.name == "NVIDIA Stand-in 24GB" and gpu.busy_source == "nvml"
    assert gpu.busy == 0.6 and gpu.others_busy == 0.6
    assert gpu.memory_free_bytes == 4 * 2**30 and gpu.shares_system_memory is False
    assert gpu.throttled is True and gpu.throttle_reasons == ("power",) and gpu.clock_mhz == 1500.0
    assert notes == []


def test_nvidia_desktop_fixture_tree_nvml_standin_the_agent_s_own_gpu_work_is_not_others_load(tmp_path):
    """NVML says which processes used the GPU (nvmlDeviceGetProcessUtilization): the agent's (a worker of its
    tree) is its own; the rest is others'. A driver that does not say leaves the whole reading as others'."""
    tree = nvidia_desktop(tmp_path)
    nvml = NvmlStandin([StandinGpu(util=60, processes={AGENT_PID + 1: 35, BROWSER_PID: 25})])
    gpu_probe = GpuProbe(nvml)
    accs, _ = probe(tree, Clock()).sample(gpu_probe.sample().gpus)
    (gpu,) = accs
    assert (gpu.busy, gpu.own_busy, gpu.others_busy) == (0.6, 0.35, 0.25)
    nvml.gpus[0].processes = {}  # nobody since the last read
    assert gpu_probe.sample().gpus[0].process_busy == {}
    nvml.fail["nvmlDeviceGetProcessUtilization"] = NVML_ERROR_NOT_SUPPORTED
    state = gpu_probe.sample().gpus[0]
    assert state.process_busy is None
    (gpu,) = probe(tree, Clock()).sample((state,))[0]
    assert (gpu.own_busy, gpu.others_busy) == (None, 0.6)


def test_server_fixture_tree_nvml_gpus_without_drm_cards_are_accelerators_too(tmp_path):
    tree = server(tmp_path)
    nvml = NvmlStandin([StandinGpu(), StandinGpu(name="second", bus_id="00000000:41:00.0")])
    sampler = Sampler(tree.sys, tree.proc, nvml)
    state = sampler.sample()
    assert [(a.id, a.nvml_index, a.pci_slot, a.node) for a in state.accelerators] == \
        [("gpu0", 0, "0000:01:00.0", None), ("gpu1", 1, "0000:41:00.0", None)]
    nvml.fail["nvmlDeviceGetUtilizationRates"] = NVML_ERROR_GPU_IS_LOST
    state = sampler.sample()
    assert state.accelerators[0].busy == 0.0  # the last good value, said to be one
    assert "accelerators.gpu0.util" in state.stale


# -- whole samplers: JSON, a machine with none, garbage, vanishing --

def test_machines_with_no_accelerator_list_none(tmp_path):
    for build in (vm, desktop):
        tree = build(tmp_path / build.__name__)
        state = Sampler(tree.sys, tree.proc).sample()
        assert state.accelerators == () and state.to_json()["accelerators"] == []
        assert not any(n.startswith("drm") for n in state.notes)


def test_state_json_lists_every_accelerator_with_kind_and_vendor(tmp_path):
    tree = amd_laptop(tmp_path)
    doc = Sampler(tree.sys, tree.proc).sample().to_json()
    json.dumps(doc)
    assert [(a["id"], a["kind"], a["vendor"], a["driver"]) for a in doc["accelerators"]] == \
        [("gpu0", "gpu", "amd", "amdgpu"), ("npu0", "npu", "amd", "amdxdna")]
    assert doc["gpus"] == []  # NVML's list, the contract's: none here


GARBAGE = ["", "garbage", "12abc", "99999999999999999999999999", "\x00\xff"]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_in_each_reading_leaves_that_reading_none_and_the_others_go_on(tmp_path, garbage):
    tree = amd_laptop(tmp_path)
    gpu_dir = tree.sys / "devices/pci0000:00/0000:c4:00.0"
    for name in ("gpu_busy_percent", "mem_info_vram_used", "pp_dpm_sclk", "hwmon/hwmon5/temp1_input"):
        (gpu_dir / name).write_bytes(garbage.encode("latin-1"))
    (tree.proc / str(BROWSER_PID) / "fdinfo" / "30").write_bytes(garbage.encode("latin-1"))
    gpu = by_id(probe(tree, Clock()).sample()[0])["gpu0"]
    assert gpu.busy is None and gpu.memory_used_bytes is None and gpu.clock_mhz is None and gpu.temp_c is None
    assert gpu.memory_total_bytes == 512 << 20 and gpu.power_w == 9.0  # the other readings go on
    assert gpu.clients == 1  # fd 31 of the same client still reads


def test_out_of_range_readings_are_none(tmp_path):
    tree = amd_laptop(tmp_path)
    gpu_dir = "devices/pci0000:00/0000:c4:00.0"
    tree.set(f"{gpu_dir}/gpu_busy_percent", "150")
    tree.set(f"{gpu_dir}/mem_info_vram_used", "-5")
    tree.set(f"{gpu_dir}/hwmon/hwmon5/temp1_input", "999999")
    tree.set(f"{gpu_dir}/pp_dpm_sclk", "0: 800Mhz\n1: 0Mhz *")
    gpu = by_id(probe(tree, Clock()).sample()[0])["gpu0"]
    assert gpu.busy is None and gpu.memory_used_bytes is None and gpu.temp_c is None and gpu.clock_mhz is None


def test_vanishing_files_and_devices(tmp_path):
    tree, clock = intel_laptop(tmp_path), Clock()
    p = probe(tree, clock)
    assert [a.id for a in p.sample()[0]] == ["gpu0", "npu0"]
    gt = tree.sys / "devices/pci0000:00/0000:00:02.0/drm/card0/gt/gt0"
    (gt / "rps_act_freq_mhz").unlink()
    (tree.sys / "devices/pci0000:00/0000:00:02.0/drm/card0/gt_act_freq_mhz").unlink()
    clock.now += 1
    gpu = by_id(p.sample()[0])["gpu0"]
    assert gpu.clock_mhz is None and gpu.clock_max_mhz == 1300.0
    os.unlink(tree.sys / "class/accel/accel0")  # the NPU went away (driver unbound)
    clock.now += 1
    assert [a.id for a in p.sample()[0]] == ["gpu0"]


def test_sampler_keeps_going_when_proc_has_no_pid_dirs(tmp_path):
    tree = intel_laptop(tmp_path)
    for pid in (1, BROWSER_PID, AGENT_PID, AGENT_PID + 1):
        for sub in ("fd", "fdinfo"):
            d = tree.proc / str(pid) / sub
            for f in d.iterdir():
                f.unlink()
    state = Sampler(tree.sys, tree.proc).sample()
    assert state.accelerators[0].clients == 0 and state.thermal.max_temp_c == 71.5
