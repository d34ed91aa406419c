from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.sim.infiniband import SimIbTree, is_ib_fault, parse_ib_fault
from agent.sysfs.infiniband import parse_counter, parse_rate, parse_state, read_ib_ports

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "mixed"


def by_device(nics):
    return {n.device: n for n in nics}


def test_fixture_ports_sorted_and_complete():
    nics = read_ib_ports(FIXTURE)
    assert [(n.device, n.port) for n in nics] == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1), ("mlx5_3", 1)]


def test_active_ndr_port_units_are_bytes():
    nic = by_device(read_ib_ports(FIXTURE))["mlx5_0"]
    assert nic.state == "ACTIVE"
    assert nic.rate_gbps == 400.0
    # port_xmit_data / port_rcv_data count 4-byte words on disk
    assert nic.tx_bytes_total == 123456789012 * 4
    assert nic.rx_bytes_total == 98765432109 * 4
    assert nic.symbol_errors_total == 3
    assert nic.link_downed_total == 1
    assert nic.rcv_errors_total == 2
    assert nic.xmit_discards_total == 5
    assert nic.xmit_wait_total == 7340032  # wait is in ticks, not scaled


def test_down_port():
    nic = by_device(read_ib_ports(FIXTURE))["mlx5_1"]
    assert nic.state == "DOWN"
    assert nic.rate_gbps == 10.0
    assert nic.link_downed_total == 4
    assert nic.tx_bytes_total == 0  # a real zero stays zero


def test_roce_port_with_na_counter():
    nic = by_device(read_ib_ports(FIXTURE))["mlx5_2"]
    assert nic.state == "ACTIVE"
    assert nic.rate_gbps == 200.0
    assert nic.tx_bytes_total == 2500000000 * 4
    assert nic.xmit_wait_total is None  # "N/A (no PMA)"


def test_missing_counter_file_is_none_not_zero():
    nic = by_device(read_ib_ports(FIXTURE))["mlx5_3"]
    assert nic.symbol_errors_total is None
    assert nic.xmit_wait_total is None
    assert nic.tx_bytes_total == 4000
    assert nic.rcv_errors_total == 0


def test_no_infiniband_class_gives_empty_list(tmp_path):
    assert read_ib_ports(tmp_path) == []
    assert read_ib_ports(tmp_path / "does-not-exist") == []


def test_bad_port_does_not_stop_others(tmp_path):
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    ports = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports"
    (ports / "README").write_text("not a port\n")  # non-numeric entries are skipped
    (ports / "1" / "state").unlink()
    (ports / "1" / "rate").write_text("garbage\n")
    (ports / "1" / "counters" / "port_rcv_data").write_text("\n")
    # a device whose ports entry is a file, not a directory
    odd = tmp_path / "class" / "infiniband" / "mlx5_9"
    odd.mkdir()
    (odd / "ports").write_text("")
    nics = by_device(read_ib_ports(tmp_path))
    assert set(nics) == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
    bad = nics["mlx5_0"]
    assert bad.state is None and bad.rate_gbps is None and bad.rx_bytes_total is None
    assert bad.tx_bytes_total == 123456789012 * 4


def test_unreadable_counter_is_none(tmp_path):
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error"
    # A read that fails with an OSError (as a counter the driver refuses to read does); a
    # directory in its place fails for root too, where a chmod would not.
    path.unlink()
    path.mkdir()
    nic = by_device(read_ib_ports(tmp_path))["mlx5_0"]
    assert nic.symbol_errors_total is None
    assert nic.tx_bytes_total is not None


@pytest.mark.parametrize(
    "text,expected",
    [("4: ACTIVE", "ACTIVE"), ("1: DOWN", "DOWN"), ("2: INIT", "INIT"), ("ACTIVE", "ACTIVE"), ("", None), (None, None)],
)
def test_parse_state(text, expected):
    assert parse_state(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [("400 Gb/sec (4X NDR)", 400.0), ("2.5 Gb/sec (1X SDR)", 2.5), ("200 Gb/sec (2X NDR)", 200.0),
     ("garbage", None), ("", None), (None, None)],
)
def test_parse_rate(text, expected):
    assert parse_rate(text) == expected


def test_parse_counter():
    assert parse_counter("18446744073709551615") == 2**64 - 1
    assert parse_counter("N/A (no PMA)") is None
    assert parse_counter("-1") is None


# --- the simulated tree -----------------------------------------------------------


def test_sim_tree_reads_like_real_hardware(tmp_path):
    sim = SimIbTree(tmp_path, devices=8, seed=7, start_ts=100.0)
    before = read_ib_ports(tmp_path)
    assert [n.device for n in before] == [f"mlx5_{i}" for i in range(8)]
    assert all(n.state == "ACTIVE" and n.rate_gbps == 400.0 for n in before)
    assert (tmp_path / "class/infiniband/mlx5_0/ports/1/phys_state").read_text() == "5: LinkUp\n"
    raw0 = int((tmp_path / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").read_text())
    assert before[0].tx_bytes_total == raw0 * 4
    sim.advance(101.0)
    after = read_ib_ports(tmp_path)
    for a, b in zip(before, after):
        rate = (b.tx_bytes_total - a.tx_bytes_total) / 1.0
        assert 10e9 < rate < 50e9  # busy: tens of GB/s, under NDR line rate
        assert b.symbol_errors_total == 0


def test_sim_faults(tmp_path):
    sim = SimIbTree(tmp_path, devices=4, seed=3, start_ts=0.0)
    for spec in ("ib0:down", "mlx5_1:degraded", "ib2:errors", "ib3:congestion"):
        sim.inject(spec)
    before = by_device(read_ib_ports(tmp_path))
    sim.advance(10.0)
    after = by_device(read_ib_ports(tmp_path))
    down = after["mlx5_0"]
    assert down.state == "DOWN" and down.link_downed_total == 1
    assert down.tx_bytes_total == before["mlx5_0"].tx_bytes_total
    assert after["mlx5_1"].rate_gbps == 200.0
    assert (after["mlx5_1"].tx_bytes_total - before["mlx5_1"].tx_bytes_total) / 10 < 25e9
    assert after["mlx5_2"].symbol_errors_total > 0 and after["mlx5_2"].rcv_errors_total > 0
    wait = after["mlx5_3"].xmit_wait_total - before["mlx5_3"].xmit_wait_total
    assert wait > 1e8
    sim.clear("ib0")
    sim.advance(11.0)
    assert by_device(read_ib_ports(tmp_path))["mlx5_0"].state == "ACTIVE"
    sim.inject("ib*:degraded=100")
    assert {n.rate_gbps for n in read_ib_ports(tmp_path)} == {100.0}


def test_ib_fault_spec_parsing():
    assert is_ib_fault("ib3:down") and is_ib_fault("mlx5_0:errors") and not is_ib_fault("gpu3:thermal")
    f = parse_ib_fault("ib2:degraded=100")
    assert (f.target, f.kind, f.arg) == ("ib2", "degraded", 100.0)
    for bad in ("ib2", "ib2:melted", "gpu1:down", "ib2:degraded=x"):
        with pytest.raises(ValueError):
            parse_ib_fault(bad)
