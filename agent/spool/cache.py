"""What the spool keeps in memory besides its index.

Samples put recently are kept decoded and as their stored JSON (bounded, oldest evicted
first), so that with a reachable collector nothing is read back from disk. The JSON of a
sample the disk refused is *pinned*: it is the only copy, kept until sent or dropped.
"""

from __future__ import annotations

from agent.sample import Sample


class RecordCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self.pinned: dict[int, bytes] = {}  # seq -> JSON, in put order
        self._payloads: dict[int, bytes] = {}
        self._samples: dict[int, Sample] = {}

    def payload(self, seq: int) -> bytes | None:
        payload = self.pinned.get(seq)
        return payload if payload is not None else self._payloads.get(seq)

    def sample(self, seq: int) -> Sample | None:
        return self._samples.get(seq)

    def keep_payload(self, seq: int, payload: bytes) -> None:
        _remember(self._payloads, seq, payload, self.size)

    def keep_sample(self, seq: int, sample: Sample) -> None:
        _remember(self._samples, seq, sample, self.size)

    def pin(self, seq: int, payload: bytes) -> None:
        self.pinned[seq] = payload

    def drop(self, seq: int) -> None:
        self.pinned.pop(seq, None)
        self._payloads.pop(seq, None)
        self._samples.pop(seq, None)


def _remember(cache: dict, seq: int, item: object, size: int) -> None:
    cache[seq] = item
    if len(cache) > size:
        del cache[next(iter(cache))]
