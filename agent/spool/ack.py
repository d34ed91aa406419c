"""The ack position: up to which seq the collector has durably stored the samples.

Kept in ack.json as {"acked_seq": N} (every record with seq <= N was delivered), replaced
atomically: a temporary file, fsync, rename. It is saved at the first ack after `interval`
seconds since the last save, and at close; a crash can lose about that much progress, and
those samples are sent again, which is harmless: the collector stores each (gpu, ts) once
(INSERT ... ON CONFLICT DO NOTHING).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

ACK_FILE = "ack.json"


class AckPosition:
    """The acknowledged seq in memory, and the copy in ack.json that lags it by at most `interval`."""

    def __init__(self, directory: Path, *, interval: float, clock: Callable[[], float], now: float) -> None:
        self.dir = directory
        self.interval = interval
        self._clock = clock
        self.acked = -1  # -1: nothing acknowledged yet
        self._saved = -1
        self._due = now  # when an ack may save at once, not leave it to the sync thread
        self._save_lock = threading.Lock()  # one ack.json writer at a time

    def load(self) -> int:
        """Read ack.json (none, or unreadable: -1, so everything is sent again) and clear the
        temporary files of a save that was cut short, where the old ack.json stands."""
        self.acked = self._saved = self._read()
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        return self.acked

    def advance(self, upto_seq: int) -> bool:
        """Move the position forward (never back); False if it did not move."""
        if upto_seq <= self.acked:
            return False
        self.acked = upto_seq
        return True

    def save_due(self) -> bool:
        return self._clock() >= self._due

    def save(self) -> None:
        """Persist the position if it moved. It fsyncs, so it runs on the pusher's thread or the
        sync thread, never on the sampler's."""
        with self._save_lock:
            acked = self.acked
            if acked == self._saved:
                return
            try:
                self._write(acked)
            except OSError as exc:
                log.warning("spool %s: cannot save the ack position (%s); a restart would resend some samples",
                            self.dir, exc)
                return
            finally:
                self._due = self._clock() + self.interval
            self._saved = acked

    def _write(self, acked: int) -> None:
        path, tmp = self.dir / ACK_FILE, self.dir / (ACK_FILE + ".tmp")
        with open(tmp, "wb") as f:
            f.write(json.dumps({"acked_seq": acked}).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # readers see the old file or the new one, never a mix

    def _read(self) -> int:
        path = self.dir / ACK_FILE
        try:
            acked = json.loads(path.read_bytes())["acked_seq"]
            if type(acked) is not int:
                raise ValueError(f"acked_seq {acked!r} is not an integer")
            return acked
        except FileNotFoundError:
            return -1
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Everything left is sent again: duplicates are harmless, losses are not.
            log.warning("spool %s: ignoring unreadable %s (%s); resending all spooled samples", self.dir, ACK_FILE, exc)
            return -1
