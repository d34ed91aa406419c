"""Reads RDMA port state and counters from <sysfs_root>/class/infiniband/*/ports/*.

Formats (Documentation/ABI/stable/sysfs-class-infiniband):
  state       "4: ACTIVE"              -> "ACTIVE"
  rate        "400 Gb/sec (4X NDR)"    -> 400.0
  counters/port_xmit_data, port_rcv_data hold data octets divided by 4, so they are
  multiplied by 4 here to report bytes; the other counters are plain event counts.
RoCE ports (link_layer "Ethernet") live in the same class and are read the same way.
Counters a driver cannot read show up as missing files or as text such as
"N/A (no PMA)"; both become None, never 0.

`read_ib_ports(root)` looks everything up afresh; `IbPorts(root).read()` is the same for a
long-running agent, cheaper: it keeps the files open and rereads them in place (see there).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.sample import NicSample

log = logging.getLogger(__name__)

DEFAULT_SYSFS_ROOT = "/sys"

# counters/<file> -> (NicSample field, multiplier to bytes/events)
COUNTERS: dict[str, tuple[str, int]] = {
    "port_xmit_data": ("tx_bytes_total", 4),
    "port_rcv_data": ("rx_bytes_total", 4),
    "symbol_error": ("symbol_errors_total", 1),
    "link_downed": ("link_downed_total", 1),
    "port_rcv_errors": ("rcv_errors_total", 1),
    "port_xmit_discards": ("xmit_discards_total", 1),
    "port_xmit_wait": ("xmit_wait_total", 1),
}


def _read_text(path: str) -> str | None:
    # os.open/os.read: about half the cost of open(); this runs ~80 times per sample.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _text(os.read(fd, 256))
    except OSError:
        return None
    finally:
        os.close(fd)


def _text(data: bytes) -> str:
    return data.decode("ascii", "replace").strip()


def parse_state(text: str | None) -> str | None:
    """ "4: ACTIVE" -> "ACTIVE"; tolerates a bare name."""
    if not text:
        return None
    name = text.split(":", 1)[-1].strip()
    return name.upper() or None


def parse_rate(text: str | None) -> float | None:
    """ "400 Gb/sec (4X NDR)" -> 400.0, "2.5 Gb/sec (1X SDR)" -> 2.5."""
    if not text:
        return None
    head = text.split(None, 1)[0]
    try:
        value = float(head)
    except ValueError:
        return None
    return value if value >= 0 else None


def parse_counter(text: str | None) -> int | None:
    if not text:
        return None
    try:
        value = int(text, 10)
    except ValueError:
        return None  # e.g. "N/A (no PMA)"
    return value if value >= 0 else None


# The files of one port, relative to its directory, in the order _port_sample reads them.
PORT_FILES = ("state", "rate", *(f"counters/{name}" for name in COUNTERS))


def _port_sample(device: str, port: int, texts: list[str | None]) -> NicSample:
    """A NicSample from the texts of PORT_FILES (None: missing or unreadable)."""
    nic = NicSample(device=device, port=port)
    nic.state = parse_state(texts[0])
    nic.rate_gbps = parse_rate(texts[1])
    for (field, scale), text in zip(COUNTERS.values(), texts[2:]):
        value = parse_counter(text)
        if value is not None:
            setattr(nic, field, value * scale)
    return nic


def read_port(port_dir: str, device: str, port: int) -> NicSample:
    return _port_sample(device, port, [_read_text(os.path.join(port_dir, rel)) for rel in PORT_FILES])


def _list_dir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def find_ports(sysfs_root: str | os.PathLike[str] = DEFAULT_SYSFS_ROOT) -> list[tuple[str, int, str]]:
    """(device, port, port directory) of every RDMA port under the root, sorted."""
    class_dir = os.path.join(os.fspath(sysfs_root), "class", "infiniband")
    found = []
    for device in _list_dir(class_dir):
        ports_dir = os.path.join(class_dir, device, "ports")
        for port_name in _list_dir(ports_dir):
            try:
                port = int(port_name)
            except ValueError:
                continue
            found.append((device, port, os.path.join(ports_dir, port_name)))
    found.sort()
    return found


def read_ib_ports(sysfs_root: str | os.PathLike[str] = DEFAULT_SYSFS_ROOT) -> list[NicSample]:
    """All RDMA ports under the root, sorted by (device, port); [] when there are none."""
    nics: list[NicSample] = []
    for device, port, port_dir in find_ports(sysfs_root):
        try:
            nics.append(read_port(port_dir, device, port))
        except Exception:  # one odd port must not hide the others
            log.exception("reading %s port %s failed", device, port)
    return nics


# What a read of an open sysfs file answers once its device is removed (kernfs: ENODEV).
_GONE = frozenset({errno.ENODEV, errno.ENOENT, errno.ESTALE, errno.ENXIO})

# An open file, or its path when no descriptor was to be had (EMFILE): then opened per read.
_File = int | str | None


@dataclass
class _OpenPort:
    device: str
    port: int
    files: list[_File]  # one per PORT_FILES entry; None: missing when the port was found


class IbPorts:
    """read_ib_ports for an agent that reads the same ports every few seconds.

    The ports found and their files stay open, and every read is one pread at offset 0 per
    file: sysfs refills an attribute's text on each read from offset 0 (Linux 2.6.26 on),
    so this sees the current value without the open/close of read_ib_ports (0.10 instead of
    0.53 ms for 8 ports, docs/performance.md). Ports are looked for again every `rediscover_s`
    seconds, so a port or counter file that appears is picked up, and at the next read after
    a read answered that its device is gone (_GONE); any other failed read is just None.
    """

    def __init__(self, sysfs_root: str | os.PathLike[str] = DEFAULT_SYSFS_ROOT, *, rediscover_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = os.fspath(sysfs_root)
        self.rediscover_s = rediscover_s
        self._clock = clock
        self._ports: list[_OpenPort] = []
        self._found_at: float | None = None
        self._failed = False
        self.discoveries = 0

    def read(self) -> list[NicSample]:
        now = self._clock()
        if self._failed or self._found_at is None or now - self._found_at >= self.rediscover_s:
            self._discover(now)
        nics: list[NicSample] = []
        for port in self._ports:
            try:
                nics.append(_port_sample(port.device, port.port, [self._read(f) for f in port.files]))
            except Exception:  # one odd port must not hide the others
                log.exception("reading %s port %s failed", port.device, port.port)
        return nics

    def _read(self, file: _File) -> str | None:
        if file is None:
            return None
        if isinstance(file, str):
            return _read_text(file)
        try:
            return _text(os.pread(file, 256, 0))
        except OSError as exc:
            if exc.errno in _GONE:
                self._failed = True  # the device went away: look again at the next read
            return None

    def _discover(self, now: float) -> None:
        self.close()
        self._ports = [_OpenPort(device, port, [_open(os.path.join(port_dir, rel)) for rel in PORT_FILES])
                       for device, port, port_dir in find_ports(self.root)]
        self._found_at, self._failed = now, False
        self.discoveries += 1

    def close(self) -> None:
        for port in self._ports:
            for file in port.files:
                if isinstance(file, int):
                    os.close(file)
        self._ports = []

    def __enter__(self) -> IbPorts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(path: str) -> _File:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return path  # out of descriptors: read it the one-shot way instead
        return None

