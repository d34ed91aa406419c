"""A simulated InfiniBand sysfs tree: the files the agent reads, with moving counters.

`SimIbTree(root)` writes <root>/class/infiniband/mlx5_N/ports/1/... laid out like a
ConnectX-7 NDR host, and `advance(ts)` moves the counters to sample time `ts`, so the
real reader (agent.sysfs.infiniband) is what gets exercised. Data counters are written
in the kernel's units (octets / 4).

Faults, per port ("ib3:down", "mlx5_3:congestion", "ib*:errors"):
  down        state "1: DOWN", phys_state Polling, no traffic, link_downed +1
  degraded    rate drops to 200 Gb/sec (or "degraded=100"), traffic capped to it
  errors      symbol_error and port_rcv_errors keep rising
  congestion  port_xmit_wait rises fast, throughput sags
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass, field

FAULT_KINDS = ("down", "degraded", "errors", "congestion")

# Width/speed name the kernel prints after the rate, for realistic "rate" files.
_RATE_NAMES = {400.0: "4X NDR", 200.0: "4X HDR", 100.0: "4X EDR", 50.0: "2X HDR", 25.0: "1X EDR"}

# How fast a healthy busy port moves, bytes per second each way (NDR line rate is 50 GB/s).
_BUSY_FRACTION = (0.6, 0.85)
# port_xmit_wait ticks per second when healthy vs congested.
_WAIT_IDLE = (200, 2_000)
_WAIT_CONGESTED = (20_000_000, 60_000_000)
_MTU = 4096


@dataclass
class IbFault:
    target: str  # "ib3", "mlx5_3" or "ib*"
    kind: str
    arg: float | None = None


def parse_ib_fault(spec: str) -> IbFault:
    """ "ib3:down", "mlx5_3:degraded=100", "ib*:errors" -> IbFault; ValueError if malformed."""
    target, sep, rest = spec.partition(":")
    kind, _, arg = rest.partition("=")
    kind = kind.strip().lower()
    if not sep or not re.fullmatch(r"(ib(\d+|\*)|mlx5_\d+)", target.strip()) or kind not in FAULT_KINDS:
        raise ValueError(
            f"bad IB fault {spec!r}: want ibN:KIND or mlx5_N:KIND with KIND one of {', '.join(FAULT_KINDS)}"
        )
    try:
        value = float(arg) if arg else None
    except ValueError:
        raise ValueError(f"bad IB fault {spec!r}: {arg!r} is not a number") from None
    return IbFault(target.strip(), kind, value)


def is_ib_fault(spec: str) -> bool:
    return bool(re.match(r"(ib(\d+|\*)|mlx5_\d+):", spec.strip()))


@dataclass
class _Port:
    device: str
    index: int
    dir: str
    rate_gbps: float
    counters: dict[str, int] = field(default_factory=dict)
    faults: dict[str, float | None] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)
    fds: dict[str, int] = field(default_factory=dict)  # with keep_open: the files, kept open


class SimIbTree:
    """A fixture sysfs tree with `devices` single-port HCAs under `root`."""

    def __init__(self, root: str | os.PathLike[str], *, devices: int = 8, rate_gbps: float = 400.0,
                 seed: int | str | None = None, start_ts: float | None = None, keep_open: bool = False) -> None:
        self.root = os.fspath(root)
        # keep_open: write each file in place through a descriptor kept open (about 20 per
        # port) instead of opening it per write; for one node in a process, not a fleet.
        self.keep_open = keep_open
        self._rng = random.Random(seed)
        self._last_ts = start_ts
        self.ports: list[_Port] = []
        for i in range(devices):
            name = f"mlx5_{i}"
            port_dir = os.path.join(self.root, "class", "infiniband", name, "ports", "1")
            port = _Port(name, i, port_dir, rate_gbps)
            self._write_static(port)
            self.ports.append(port)

    # --- faults -----------------------------------------------------------------------

    def inject(self, fault: IbFault | str) -> None:
        if isinstance(fault, str):
            fault = parse_ib_fault(fault)
        for port in self._targets(fault.target):
            if fault.kind == "down" and "down" not in port.faults:
                port.counters["link_downed"] += 1
            port.faults[fault.kind] = fault.arg
            self._write_state(port)
            self._tick(port, 0.0)

    def clear(self, target: str = "ib*", kind: str | None = None) -> None:
        for port in self._targets(target):
            if kind is None:
                port.faults.clear()
            else:
                port.faults.pop(kind, None)
            self._write_state(port)

    def _targets(self, target: str) -> list[_Port]:
        if target == "ib*":
            return self.ports
        m = re.fullmatch(r"(?:ib|mlx5_)(\d+)", target)
        found = [p for p in self.ports if m and p.index == int(m.group(1))]
        if not found:
            raise ValueError(f"no simulated IB port {target!r} (have ib0..ib{len(self.ports) - 1})")
        return found

    # --- clock ------------------------------------------------------------------------

    def advance(self, ts: float) -> None:
        """Move every counter forward to sample time `ts` (seconds)."""
        dt = 0.0 if self._last_ts is None else max(0.0, ts - self._last_ts)
        self._last_ts = ts
        for port in self.ports:
            self._tick(port, dt)

    def _tick(self, port: _Port, dt: float) -> None:
        rng, c, f = self._rng, port.counters, port.faults
        if dt > 0 and "down" not in f:
            line_bytes = self._effective_rate(port) * 1e9 / 8
            frac = rng.uniform(*_BUSY_FRACTION) * (0.4 if "congestion" in f else 1.0)
            for data, pkts in (("port_xmit_data", "port_xmit_packets"), ("port_rcv_data", "port_rcv_packets")):
                nbytes = int(line_bytes * frac * rng.uniform(0.97, 1.03) * dt)
                c[data] += nbytes // 4
                c[pkts] += nbytes // _MTU
            c["port_xmit_wait"] += int(rng.uniform(*(_WAIT_CONGESTED if "congestion" in f else _WAIT_IDLE)) * dt)
            if "errors" in f:
                c["symbol_error"] += max(1, int(rng.uniform(50, 500) * dt))
                c["port_rcv_errors"] += max(1, int(rng.uniform(5, 50) * dt))
                c["port_xmit_discards"] += int(rng.uniform(0, 3) * dt)
        for name, value in c.items():
            self._write(port, f"counters/{name}", str(value))

    def _effective_rate(self, port: _Port) -> float:
        if "degraded" in port.faults:
            return port.faults["degraded"] or port.rate_gbps / 2
        return port.rate_gbps

    # --- files ------------------------------------------------------------------------

    def _write(self, port: _Port, rel: str, text: str) -> None:
        # Cheap on purpose: the agent benchmark runs this at 1 Hz in the agent's own process.
        # Unchanged files are skipped, and truncation (slow on ext4) happens only when the
        # new text is shorter; counters only grow, so that is rare.
        prev = port.written.get(rel)
        if prev == text:
            return
        data = (text + "\n").encode()
        if self.keep_open:
            fd = port.fds.get(rel)
            if fd is None:
                fd = port.fds[rel] = os.open(os.path.join(port.dir, rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.pwrite(fd, data, 0)
            if prev is not None and len(text) < len(prev):
                os.ftruncate(fd, len(data))
        else:
            flags = os.O_WRONLY | os.O_CREAT
            if prev is None or len(text) < len(prev):
                flags |= os.O_TRUNC
            fd = os.open(os.path.join(port.dir, rel), flags, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        port.written[rel] = text

    def close(self) -> None:
        """Close the files kept open (keep_open); the tree stays."""
        for port in self.ports:
            for fd in port.fds.values():
                os.close(fd)
            port.fds.clear()

    def _write_static(self, port: _Port) -> None:
        dev_dir = os.path.dirname(os.path.dirname(port.dir))
        os.makedirs(os.path.join(port.dir, "counters"), exist_ok=True)
        guid = f"b83f:d203:00{port.index:02x}:{self._rng.randrange(1 << 16):04x}"
        for name, text in (("node_type", "1: CA"), ("node_guid", guid), ("sys_image_guid", guid),
                           ("fw_ver", "28.39.1002"), ("hca_type", "MT4129"), ("board_id", "MT_0000000838")):
            with open(os.path.join(dev_dir, name), "w") as f:
                f.write(text + "\n")
        for name, text in (("link_layer", "InfiniBand"), ("lid", f"0x{0x100 + port.index:x}"),
                           ("sm_lid", "0x1"), ("sm_sl", "0"), ("lid_mask_count", "0"),
                           ("cap_mask", "0xa751e84a")):
            self._write(port, name, text)
        start = self._rng.randrange(1 << 40)
        port.counters = {
            "port_xmit_data": start, "port_rcv_data": start + self._rng.randrange(1 << 30),
            "port_xmit_packets": start // 1024, "port_rcv_packets": start // 1024,
            "symbol_error": 0, "link_downed": 0, "port_rcv_errors": 0, "port_xmit_discards": 0,
            "port_xmit_wait": self._rng.randrange(1 << 24), "link_error_recovery": 0,
            "local_link_integrity_errors": 0, "excessive_buffer_overrun_errors": 0,
            "port_rcv_remote_physical_errors": 0, "port_rcv_switch_relay_errors": 0,
            "port_rcv_constraint_errors": 0, "port_xmit_constraint_errors": 0, "VL15_dropped": 0,
        }
        self._write_state(port)
        self._tick(port, 0.0)

    def _write_state(self, port: _Port) -> None:
        if "down" in port.faults:
            self._write(port, "state", "1: DOWN")
            self._write(port, "phys_state", "2: Polling")
        else:
            self._write(port, "state", "4: ACTIVE")
            self._write(port, "phys_state", "5: LinkUp")
        rate = self._effective_rate(port)
        name = _RATE_NAMES.get(rate, "4X")
        self._write(port, "rate", f"{rate:g} Gb/sec ({name})")
