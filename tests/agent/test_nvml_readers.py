"""The NVML readers and NvmlGpuSource, run through real pynvml on the simulated library."""

from __future__ import annotations

import dataclasses
import threading

import pynvml
import pytest

from agent.nvml.readers import READERS, Reader
from agent.nvml.source import NvmlGpuSource
from agent.sample import GPU_METRIC_FIELDS, GpuSample
from agent.sim.gpu import SimNode
from agent.sim.libnvml import PRE_535_DRIVER, SimNvmlLib
from agent.sim.models import H100_SXM5_80GB, MiB

KIB = 1024


def test_every_field_populated_for_a_busy_h100(source, sim):
    _, node = sim
    first = source.read(0.0)
    # GPM metrics come from two samples: nothing to compare with on the first cycle.
    assert [s.tensor_active_pct for s in first] == [None] * 8
    node.advance(10.0)
    samples = source.read(10.0)
    assert [s.index for s in samples] == list(range(8))
    for s, g in zip(samples, node.gpus):
        assert not s.lost
        missing = [f for f in GPU_METRIC_FIELDS if getattr(s, f) is None]
        assert missing == [], f"GPU {s.index} left {missing} None"
        assert s.uuid == g.uuid and s.uuid.startswith("GPU-")
        assert s.model == "NVIDIA H100 80GB HBM3"
        assert s.pci_bus_id == g.pci_bus_id
        assert s.xids == []
    assert sum(source.reader_errors.values()) == 0
    static = {r.name for r in READERS if r.static}
    assert static == {"identity", "clock_limits", "pcie_limits", "nvlink_count"}
    # Static facts are read once per GPU, the rest on every cycle.
    assert {name: n for name, n in source.reader_runs.items() if name in static} == dict.fromkeys(static, 8)
    assert all(n == 16 for name, n in source.reader_runs.items() if name not in static)
    assert all(sec > 0 for sec in source.reader_seconds.values())


def test_static_facts_are_read_once_and_copied_into_every_sample(source, sim):
    lib, node = sim
    first = source.read(0.0)[2]
    # Failing now would show if they were read again: they are copied instead.
    for name in ("nvmlDeviceGetName", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMaxClockInfo",
                 "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"):
        node.gpus[2].call_errors[name] = pynvml.NVML_ERROR_NO_PERMISSION
    node.advance(1.0)
    again = source.read(1.0)[2]
    facts = ("uuid", "model", "pci_bus_id", "sm_clock_max_mhz", "mem_clock_max_mhz", "pcie_gen_max",
             "pcie_width_max", "nvlink_links_total")
    assert [getattr(again, f) for f in facts] == [getattr(first, f) for f in facts]
    assert None not in [getattr(again, f) for f in facts]
    assert sum(source.reader_errors.values()) == 0


def test_static_facts_read_again_after_the_gpu_comes_back(source, sim):
    _, node = sim
    source.read(0.0)
    node.inject(4, "lost")
    node.advance(1.0)
    assert source.read(1.0)[4].lost
    node.clear(4, "lost")
    node.gpus[4].call_errors["nvmlDeviceGetMaxClockInfo"] = pynvml.NVML_ERROR_NO_PERMISSION
    node.advance(2.0)
    back = source.read(2.0)[4]
    # Read afresh (so this time the failing call shows), not copied from before the loss.
    assert not back.lost and back.sm_clock_max_mhz is None and back.model is not None
    assert source.reader_errors["clock_limits"] == 1
    del node.gpus[4].call_errors["nvmlDeviceGetMaxClockInfo"]
    node.advance(3.0)
    # A fact that failed is not kept as missing: the next cycle reads it again.
    assert source.read(3.0)[4].sm_clock_max_mhz == 1980


@pytest.mark.parametrize(("model", "first_cycle", "later_cycle"), [
    ("h100", list(range(18)) + [18] + list(range(18)), list(range(18))),  # probe past the end once
    # No NVLink: link 0 answers NOT_SUPPORTED (asked again each cycle: a failed count looks the same).
    ("rtx4090", [0, 0], [0]),
])
def test_nvlink_states_asked_only_for_links_that_exist(install, monkeypatch, model, first_cycle, later_cycle):
    node = SimNode("n", model, 1)
    install(SimNvmlLib(node))
    asked: list[int] = []
    real = pynvml.nvmlDeviceGetNvLinkState

    def state(handle, link):
        asked.append(link)
        return real(handle, link)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", state)
    with NvmlGpuSource() as src:
        src.read(0.0)
        assert asked == first_cycle
        asked.clear()
        node.advance(1.0)
        sample = src.read(1.0)[0]
        assert asked == later_cycle
    expected = (18, 18) if model == "h100" else (None, None)
    assert (sample.nvlink_links_up, sample.nvlink_links_total) == expected


def test_units_match_the_simulated_truth(source, sim):
    _, node = sim
    node.advance(5.0)
    s = source.read(5.0)[0]
    st, c = node.gpus[0].state, node.gpus[0].counters
    assert s.power_w == round(st.power_w * 1000) / 1000  # mW -> W
    assert s.power_limit_w == 700.0
    assert s.mem_total_bytes == 81559 * MiB  # bytes, not MiB
    assert s.mem_used_bytes == st.mem_used_bytes
    assert s.pcie_tx_bytes_per_s == int(st.pcie_tx_bps / KIB) * KIB  # KB/s -> bytes/s
    assert s.pcie_rx_bytes_per_s == int(st.pcie_rx_bps / KIB) * KIB
    assert s.nvlink_tx_bytes_total == int(c.nvlink_tx_bytes / KIB) * KIB  # KiB -> bytes
    assert s.nvlink_tx_bytes_total > 10**10  # ~150 GB/s for 5 s
    assert s.sm_clock_max_mhz == 1980 and s.mem_clock_max_mhz == 2619
    assert (s.pcie_gen_max, s.pcie_width_max, s.nvlink_links_total) == (5, 16, 18)
    assert s.temp_c == round(st.temp_c) and s.mem_temp_c == round(st.mem_temp_c)
    assert isinstance(s.remapped_rows_pending, bool)


def test_driver_and_cuda_version(source):
    assert source.driver_version() == "535.183.01"
    assert source.cuda_version() == "12.2"
    assert source.gpu_count == 8


def test_not_supported_leaves_none_and_is_not_an_error(install):
    node = SimNode("gaming", "rtx4090", 2, workload="busy")
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        src.read(0.0)
        node.advance(10.0)  # a second cycle, where GPM would have had its two samples
        s = src.read(10.0)[0]
        errors = dict(src.reader_errors)
    unsupported = {f for f in GPU_METRIC_FIELDS if f.startswith("nvlink_")} | {
        "mem_temp_c",
        "ecc_corrected_total",
        "ecc_uncorrected_total",
        "remapped_rows_pending",
        "remapped_rows_correctable_total",
        "remapped_rows_uncorrectable_total",
        "remapped_rows_failure",
        "tensor_active_pct",  # GPM: Hopper and newer datacenter parts only
        "gr_engine_active_pct",
        "dram_active_pct",
    }
    for f in GPU_METRIC_FIELDS:
        assert (getattr(s, f) is None) == (f in unsupported), f
    assert sum(errors.values()) == 0


def test_memory_temperature_unsupported_on_a_model_variant(install):
    no_hbm_sensor = dataclasses.replace(H100_SXM5_80GB, mem_temp_offset_c=None)
    install(SimNvmlLib(SimNode("n", no_hbm_sensor, 1)))
    with NvmlGpuSource() as src:
        s = src.read(0.0)[0]
    assert s.mem_temp_c is None
    assert s.temp_c is not None  # same reader, other metric still there


def test_old_driver_falls_back_to_deprecated_functions(install):
    node = SimNode("old", "h100", 2, workload="idle")
    lib = install(SimNvmlLib(node, omit=PRE_535_DRIVER))
    assert not hasattr(lib, "nvmlDeviceGetCurrentClocksEventReasons")
    with NvmlGpuSource() as src:
        s = src.read(0.0)[0]
        assert sum(src.reader_errors.values()) == 0
    assert s.clocks_event_reasons == pynvml.nvmlClocksThrottleReasonGpuIdle  # via ...ThrottleReasons
    assert s.temp_c is not None  # via nvmlDeviceGetTemperature


def test_no_clock_reason_function_at_all_is_none(install):
    omit = {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"}
    install(SimNvmlLib(SimNode("older", "h100", 1), omit=omit))
    with NvmlGpuSource() as src:
        s = src.read(0.0)[0]
        assert src.reader_errors["clock_events"] == 0
    assert s.clocks_event_reasons is None
    assert s.sm_clock_mhz is not None


def test_one_failing_call_costs_only_its_reader(source, sim):
    _, node = sim
    node.gpus[2].call_errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NO_PERMISSION
    samples = source.read(0.0)
    broken = samples[2]
    assert broken.power_w is None
    assert not broken.lost
    # (the GPM metrics are None on every GPU on the first cycle: GPM needs two samples; the
    # energy counter is read by the failing reader, after the call that failed)
    gpm = ("tensor_active_pct", "gr_engine_active_pct", "dram_active_pct")
    others = [f for f in GPU_METRIC_FIELDS if f not in ("power_w", "power_limit_w", "energy_mj_total", *gpm)]
    assert all(getattr(broken, f) is not None for f in others)
    assert all(s.power_w is not None for i, s in enumerate(samples) if i != 2)
    assert source.reader_errors["power"] == 1
    assert sum(source.reader_errors.values()) == 1


def test_a_reader_that_crashes_does_not_stop_the_others(sim):
    def crash(handle, gpu):
        raise RuntimeError("bug")

    readers = [READERS[0], Reader("crash", crash), *READERS[1:]]
    with NvmlGpuSource(readers) as src:
        samples = src.read(0.0)
        assert src.reader_errors["crash"] == 8
        assert src.reader_errors["power"] == 0
    assert all(s.power_w is not None and s.remapped_rows_pending is not None for s in samples)


def test_lost_gpu_reported_lost_while_others_read(source, sim):
    _, node = sim
    uuid5 = node.gpus[5].uuid
    node.inject(5, "lost")
    node.advance(1.0)
    samples = source.read(1.0)
    lost = samples[5]
    assert lost.lost and lost.uuid == uuid5 and lost.index == 5
    assert all(getattr(lost, f) is None for f in GPU_METRIC_FIELDS)
    assert lost.model is None
    assert [s.index for s in samples if s.lost] == [5]
    assert all(s.power_w is not None for s in samples if not s.lost)
    assert source.gpus_lost == 1
    node.clear(5, "lost")  # back on the bus: the source looks it up again
    node.advance(2.0)
    again = source.read(2.0)[5]
    assert not again.lost and again.uuid == uuid5 and again.power_w is not None


def test_gpu_lost_before_start_has_unknown_uuid(install):
    node = SimNode("n", "h100", 3)
    node.inject(1, "lost")
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        samples = src.read(0.0)
    assert samples[1].lost and samples[1].uuid == "GPU-unknown-1"
    assert not samples[0].lost and not samples[2].lost


def test_gpu_answering_only_unknown_errors_is_unreachable(source, sim):
    lib, node = sim
    gpu = node.gpus[3]
    uuid3 = gpu.uuid
    for name in lib.functions:
        gpu.call_errors[name] = pynvml.NVML_ERROR_UNKNOWN
    samples = source.read(0.0)
    assert samples[3].lost and samples[3].uuid == uuid3
    assert not any(s.lost for i, s in enumerate(samples) if i != 3)


def test_xid_delivered_once_to_the_right_gpu(source, sim):
    _, node = sim
    node.inject(4, "xid", 79)
    node.inject(1, "xid", 48)
    node.inject(1, "xid", 94)
    node.advance(1.0)  # faults take effect at the next step of the clock
    samples = source.read(1.0)
    assert [(x.xid, x.ts) for x in samples[4].xids] == [(79, 1.0)]
    assert [x.xid for x in samples[1].xids] == [48, 94]
    assert all(not s.xids for s in samples if s.index not in (1, 4))
    node.advance(2.0)
    assert all(not s.xids for s in source.read(2.0))
    assert source.xid.events_total == 3


def test_xid_before_any_registration_is_not_seen(install):
    node = SimNode("n", "h100", 2)
    install(SimNvmlLib(node))
    node.inject(0, "xid", 79)
    node.advance(0.0)  # emitted with nobody listening, like a real event before nvmlInit
    with NvmlGpuSource() as src:
        node.advance(1.0)
        assert all(not s.xids for s in src.read(1.0))


def test_two_nodes_in_two_threads_do_not_mix(install):
    lib = install(SimNvmlLib())  # no default node: every thread names its own
    nodes = [SimNode("alpha", "h100", 8, seed=1), SimNode("beta", "a100", 4, seed=2)]
    results: dict[str, list[list[GpuSample]]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(node: SimNode) -> None:
        try:
            with lib.node(node):
                src = NvmlGpuSource()
            out = []
            for step in range(5):
                barrier.wait()  # interleave the two nodes' calls
                with lib.node(node, at=float(step)):
                    out.append(src.read(float(step)))
            with lib.node(node):
                src.close()
            results[node.name] = out
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=run, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    for node in nodes:
        uuids = [g.uuid for g in node.gpus]
        for samples in results[node.name]:
            assert [s.uuid for s in samples] == uuids
            assert {s.model for s in samples} == {node.model.name}
    assert lib.init_count(nodes[0]) == lib.init_count(nodes[1]) == 0


def test_per_node_calls_need_an_active_node(install):
    install(SimNvmlLib())
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


def test_counters_monotonic_and_rates_match_elapsed_time(source, sim):
    _, node = sim
    node.inject(0, "pcie_replays", 3)
    node.inject(0, "nvlink_errors", 10)
    prev = source.read(0.0)[0]
    for ts in (10.0, 20.0, 35.0):
        node.advance(ts)
        cur = source.read(ts)[0]
        for f in ("pcie_replay_total", "nvlink_tx_bytes_total", "nvlink_rx_bytes_total",
                  "nvlink_crc_errors_total", "nvlink_replay_errors_total", "ecc_corrected_total"):
            assert getattr(cur, f) >= getattr(prev, f), f
        prev = cur
    # over the last 15 s: rate from counter deltas matches the simulated instantaneous rate
    node.advance(50.0)
    last = source.read(50.0)[0]
    st = node.gpus[0].state
    nvlink_rate = (last.nvlink_tx_bytes_total - prev.nvlink_tx_bytes_total) / 15.0
    assert nvlink_rate == pytest.approx(st.nvlink_bps, rel=1e-6)
    assert (last.pcie_replay_total - prev.pcie_replay_total) == pytest.approx(3 * 15, abs=1)
    assert (last.nvlink_crc_errors_total - prev.nvlink_crc_errors_total) == pytest.approx(10 * 15, abs=2)


def test_xid_after_recovery_arrives_once(source, sim):
    _, node = sim
    node.inject(2, "lost")
    node.advance(1.0)
    assert source.read(1.0)[2].lost
    node.clear(2, "lost")  # recovered GPU: new handle, registered again by the source
    node.advance(2.0)
    assert not source.read(2.0)[2].lost
    node.inject(2, "xid", 31)
    node.advance(3.0)
    assert [x.xid for x in source.read(3.0)[2].xids] == [31]


def test_static_facts_read_again_after_the_refresh_period(source, sim, monkeypatch):
    import agent.nvml.source as source_module

    _, node = sim
    assert source.read(0.0)[1].pcie_width_max == 16
    node.gpus[1].call_errors["nvmlDeviceGetMaxPcieLinkWidth"] = pynvml.NVML_ERROR_NO_PERMISSION
    node.advance(1.0)
    assert source.read(1.0)[1].pcie_width_max == 16  # copied
    monkeypatch.setattr(source_module, "STATIC_REFRESH_S", 0.0)
    node.advance(2.0)
    assert source.read(2.0)[1].pcie_width_max is None  # read again, and now it fails
    assert source.reader_errors["pcie_limits"] == 1
