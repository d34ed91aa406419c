from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

import agent.sysfs.infiniband as ib_module
from agent.sim.infiniband import SimIbTree, is_ib_fault, parse_ib_fault
from agent.sysfs.infiniband import IbPorts, parse_counter, parse_rate, parse_state

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "mixed"


@pytest.fixture(params=["read_ib_ports", "IbPorts"])
def read_ib_ports(request):
    """Both readers answer every test here: the one-shot function, and one IbPorts per root
    kept across the test's reads (the files it opened then reread in place)."""
    if request.param == "read_ib_ports":
        yield ib_module.read_ib_ports
        return
    readers: dict[str, IbPorts] = {}

    def read(root):
        key = os.fspath(root)
        if key not in readers:
            readers[key] = IbPorts(root)
        return readers[key].read()

    yield read
    for reader in readers.values():
        reader.close()


def by_device(nics):
    return {n.device: n for n in nics}


def test_fixture_ports_sorted_and_complete(read_ib_ports):
    nics = read_ib_ports(FIXTURE)
    assert [(n.device, n.port) for n in nics] == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1), ("mlx5_3", 1)]


def test_active_ndr_port_units_are_bytes(read_ib_ports):
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


def test_down_port(read_ib_ports):
    nic = by_device(read_ib_ports(FIXTURE))["mlx5_1"]
    assert nic.state == "DOWN"
    assert nic.rate_gbps == 10.0
    assert nic.link_downed_total == 4
    assert nic.tx_bytes_total == 0  # a real zero stays zero


def test_roce_port_with_na_counter(read_ib_ports):
    nic = by_device(read_ib_ports(FIXTURE))["mlx5_2"]
    assert nic.state == "ACTIVE"
    assert nic.rate_gbps == 200.0
    assert nic.tx_bytes_total == 2500000000 * 4
    assert nic.xmit_wait_total is None  # "N/A (no PMA)"


def test_missing_counter_file_is_none_not_zero(read_ib_ports):
    nic = by_device(read_ib_ports(FIXTURE))["mlx5_3"]
    assert nic.symbol_errors_total is None
    assert nic.xmit_wait_total is None
    assert nic.tx_bytes_total == 4000
    assert nic.rcv_errors_total == 0


def test_no_infiniband_class_gives_empty_list(read_ib_ports, tmp_path):
    assert read_ib_ports(tmp_path) == []
    assert read_ib_ports(tmp_path / "does-not-exist") == []


def test_bad_port_does_not_stop_others(read_ib_ports, tmp_path):
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


def test_unreadable_counter_is_none(read_ib_ports, tmp_path):
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


def test_sim_tree_reads_like_real_hardware(read_ib_ports, tmp_path):
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


def test_sim_faults(read_ib_ports, tmp_path):
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


def test_sim_tree_written_through_open_files_reads_the_same(tmp_path):
    trees = [SimIbTree(tmp_path / name, devices=3, seed=5, start_ts=0.0, keep_open=keep)
             for name, keep in (("plain", False), ("kept", True))]
    for t, fault in ((1.0, None), (2.0, "ib0:down"), (3.0, "ib*:degraded=25"), (4.0, None)):
        for tree in trees:
            if fault:
                tree.inject(fault)
            tree.advance(t)
        plain, kept = (ib_module.read_ib_ports(tree.root) for tree in trees)
        assert kept == plain and kept[2].tx_bytes_total > 0
    rate = Path(trees[1].root) / "class/infiniband/mlx5_1/ports/1/rate"
    assert rate.read_text() == "25 Gb/sec (1X EDR)\n"  # shorter than what it replaced: truncated
    trees[1].close()
    assert all(not port.fds for port in trees[1].ports)


def test_ib_fault_spec_parsing():
    assert is_ib_fault("ib3:down") and is_ib_fault("mlx5_0:errors") and not is_ib_fault("gpu3:thermal")
    f = parse_ib_fault("ib2:degraded=100")
    assert (f.target, f.kind, f.arg) == ("ib2", "degraded", 100.0)
    for bad in ("ib2", "ib2:melted", "gpu1:down", "ib2:degraded=x"):
        with pytest.raises(ValueError):
            parse_ib_fault(bad)


# --- IbPorts: files kept open ------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_ib_ports_rereads_open_files_in_place_and_closes_them(tmp_path):
    sim = SimIbTree(tmp_path, devices=4, seed=1, start_ts=0.0)
    fds = open_fds()
    ports = IbPorts(tmp_path)
    first = ports.read()
    assert open_fds() == fds + 4 * len(ib_module.PORT_FILES)
    sim.advance(1.0)
    sim.inject("ib1:down")
    second = ports.read()
    assert ports.discoveries == 1  # nothing looked up again: the same files, new values
    assert second == ib_module.read_ib_ports(tmp_path)
    assert all(b.tx_bytes_total > a.tx_bytes_total for a, b in zip(first, second) if b.device != "mlx5_1")
    assert second[1].state == "DOWN"
    ports.close()
    assert open_fds() == fds


def test_ib_ports_finds_new_ports_and_files_at_the_next_discovery(tmp_path):
    now = [0.0]
    SimIbTree(tmp_path, devices=2, seed=1)
    ports = IbPorts(tmp_path, rediscover_s=60.0, clock=lambda: now[0])
    wait = tmp_path / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait"
    wait.unlink()
    assert [n.device for n in ports.read()] == ["mlx5_0", "mlx5_1"]
    SimIbTree(tmp_path / "more", devices=3, seed=2)
    shutil.copytree(tmp_path / "more/class/infiniband/mlx5_2", tmp_path / "class/infiniband/mlx5_2")
    wait.write_text("42\n")
    now[0] = 59.0
    nics = ports.read()
    assert len(nics) == 2 and nics[0].xmit_wait_total is None  # not yet looked for again
    now[0] = 60.0
    nics = ports.read()
    assert [n.device for n in nics] == ["mlx5_0", "mlx5_1", "mlx5_2"] and nics[0].xmit_wait_total == 42
    assert ports.discoveries == 2
    ports.close()


def test_ib_ports_looks_again_after_a_device_went_away(tmp_path, monkeypatch):
    SimIbTree(tmp_path, devices=2, seed=1)
    ports = IbPorts(tmp_path)
    ports.read()
    shutil.rmtree(tmp_path / "class/infiniband/mlx5_1")
    real_pread = os.pread

    def pread(fd, n, offset):  # what sysfs answers for a removed device's open attribute
        if os.readlink(f"/proc/self/fd/{fd}").endswith("(deleted)"):
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    gone = ports.read()
    assert gone[1].state is None and gone[1].tx_bytes_total is None  # unreadable now, not stale
    assert [n.device for n in ports.read()] == ["mlx5_0"]
    assert ports.discoveries == 2
    ports.close()


def test_ib_ports_unreadable_file_is_none_without_looking_again(tmp_path):
    SimIbTree(tmp_path, devices=1, seed=1)
    counter = tmp_path / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    counter.unlink()
    counter.mkdir()  # opens, but every read fails (EISDIR), as a counter the driver refuses
    ports = IbPorts(tmp_path)
    for _ in range(3):
        (nic,) = ports.read()
        assert nic.symbol_errors_total is None and nic.tx_bytes_total is not None
    assert ports.discoveries == 1
    ports.close()


def test_ib_ports_out_of_descriptors_reads_the_one_shot_way(tmp_path, monkeypatch):
    sim = SimIbTree(tmp_path, devices=2, seed=1, start_ts=0.0)
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if "/counters/" in os.fspath(path):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(ib_module.os, "open", open_)
    ports = IbPorts(tmp_path)
    ports.read()
    monkeypatch.setattr(ib_module.os, "open", real_open)
    sim.advance(1.0)
    assert ports.read() == ib_module.read_ib_ports(tmp_path)
    ports.close()
