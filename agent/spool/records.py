"""The spool's record format (version 1), as it lies in a segment file.

A record is a 20-byte little-endian header and a payload:

    magic   b"LGS1"   format version 1; also where reading resumes after a damaged stretch
    length  u32       payload bytes
    seq     u64       increases across segments and restarts
    crc     u32       CRC-32 of length, seq and payload
    payload           the sample's v1 dict as JSON (docs/protocol.md), so that any later agent
                      version can read a spool an older one left behind

Changing any of this strands the samples an older agent spooled: a new format needs a new magic.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator

from agent.sample import Sample, json_default, sample_from_dict

MIB = 1024 * 1024
MAGIC = b"LGS1"
HEADER = struct.Struct("<4sIQI")
_CRC_PREFIX = struct.Struct("<IQ")
MAX_RECORD_BYTES = 64 * MIB  # a length beyond this is damage, not a sample


def encode_payload(sample: Sample) -> bytes:
    """The sample as compact JSON: exactly its part of a v1 request body (the pusher splices it in).

    Raises TypeError or ValueError for what is not a sample."""
    return json.dumps(sample, separators=(",", ":"), default=json_default).encode()


def decode_payload(payload: bytes) -> Sample:
    """Raises ValueError when the JSON is not a v1 sample."""
    return sample_from_dict(json.loads(payload))


def encode_record(seq: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(_CRC_PREFIX.pack(len(payload), seq)))
    return HEADER.pack(MAGIC, len(payload), seq, crc) + payload


def record_at(data: bytes, pos: int) -> tuple[int, int] | None:
    """(payload length, seq) of an intact record starting at data[pos], else None."""
    if pos + HEADER.size > len(data):
        return None
    magic, length, seq, crc = HEADER.unpack_from(data, pos)
    if magic != MAGIC or length > MAX_RECORD_BYTES or pos + HEADER.size + length > len(data):
        return None
    start = pos + HEADER.size
    payload = memoryview(data)[start:start + length]
    if zlib.crc32(payload, zlib.crc32(_CRC_PREFIX.pack(length, seq))) != crc:
        return None
    return length, seq


def scan_records(data: bytes) -> Iterator[tuple[int, int, int] | None]:
    """(offset, payload length, seq) of each intact record in a segment's bytes, in order.

    A damaged or torn stretch yields one None and reading resumes at the next intact record
    (found by its magic), so one bad record costs only itself."""
    pos = 0
    while pos < len(data):
        found = record_at(data, pos)
        if found is not None:
            yield pos, found[0], found[1]
            pos += HEADER.size + found[0]
            continue
        yield None
        pos = data.find(MAGIC, pos + 1)
        while pos != -1 and record_at(data, pos) is None:
            pos = data.find(MAGIC, pos + 1)
        if pos == -1:
            return
