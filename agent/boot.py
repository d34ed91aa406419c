"""When this node booted (/proc/stat `btime`, epoch seconds): sent in the batches' agent info so
the collector can tell that a node was rebooted after a hardware fault (server/hints/remedy.py)."""

from __future__ import annotations


def boot_time(path: str = "/proc/stat") -> float | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
