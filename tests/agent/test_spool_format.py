"""The spool's on-disk format does not move: an agent upgraded mid-spool sends what the older one spooled.

tests/fixtures/spool_v1/ is a spool tree written by an earlier agent (tests/agent/spool_v1_fixture.py
says how), with what that agent read back from it. The format is spelled out here a second time,
apart from agent/spool/, so that a change there cannot carry the test along with it.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from agent.sample import sample_from_dict
from agent.spool import DiskSpool, encode_record, segment_name
from tests.agent.spool_v1_fixture import FIXTURE, SPOOL_ARGS, fixture_sample, write_spool

V1_HEADER = struct.Struct("<4sIQI")  # magic, payload length, seq, CRC-32 of (length, seq, payload)
V1_NAME = re.compile(r"^seg-(\d{20})\.log$")


def v1_records(data: bytes) -> tuple[list[tuple[int, bytes, bytes]], bytes]:
    """(seq, payload, the record's bytes) of each whole record, and the torn tail after them."""
    records, pos = [], 0
    while pos + V1_HEADER.size <= len(data):
        magic, length, seq, crc = V1_HEADER.unpack_from(data, pos)
        end = pos + V1_HEADER.size + length
        if magic != b"LGS1" or end > len(data):
            break
        payload = data[pos + V1_HEADER.size:end]
        assert zlib.crc32(struct.pack("<IQ", length, seq) + payload) == crc, f"seq {seq}: bad CRC"
        records.append((seq, payload, data[pos:end]))
        pos = end
    return records, data[pos:]


def v1_segments(directory: Path) -> dict[str, tuple[list[tuple[int, bytes, bytes]], bytes]]:
    return {path.name: v1_records(path.read_bytes()) for path in sorted(directory.glob("seg-*.log"))}


@pytest.fixture
def old_spool(tmp_path) -> Path:
    """A copy: opening a spool changes its directory."""
    copy = tmp_path / "spool"
    shutil.copytree(FIXTURE / "spool", copy)
    return copy


def test_a_spool_an_older_agent_left_is_sent_as_it_read_it(old_spool):
    expected = json.loads((FIXTURE / "expected.json").read_text())
    with DiskSpool(old_spool, **SPOOL_ARGS) as spool:
        assert spool.corrupt == expected["corrupt"] == 1  # the torn last record
        assert len(spool) == expected["queued"] and spool.size_bytes == expected["size_bytes"]
        unsent = spool.peek(100)
        assert [seq for seq, _ in unsent] == expected["seqs"]
        assert [s for _, s in unsent] == [sample_from_dict(d) for d in expected["samples"]]
        assert [s for _, s in unsent] == [fixture_sample(seq) for seq in expected["seqs"]]
        spool.put(fixture_sample(99))
        assert spool.peek(100)[-1][0] == expected["seqs"][-1] + 1  # seqs go on from the old ones
    assert not list(old_spool.glob("*.tmp"))  # the ack write the power cut interrupted


def test_the_stored_json_is_what_the_older_agent_wrote(old_spool):
    on_disk = {seq: payload for records, _ in v1_segments(FIXTURE / "spool").values() for seq, payload, _ in records}
    with DiskSpool(old_spool, cache_size=0, **SPOOL_ARGS) as spool:  # read from the files
        encoded = spool.peek_encoded(100)
    assert encoded and all(payload == on_disk[seq] for seq, payload in encoded)


def test_records_and_names_are_framed_as_before():
    segments = v1_segments(FIXTURE / "spool")
    assert list(segments) == ["seg-00000000000000000003.log", "seg-00000000000000000006.log",
                              "seg-00000000000000000009.log", "seg-00000000000000000012.log"]
    for name, (records, tail) in segments.items():
        assert name == segment_name(records[0][0])
        for seq, payload, raw in records:
            assert encode_record(seq, payload) == raw
        assert tail == b"" or name == "seg-00000000000000000012.log"
    assert (FIXTURE / "spool" / "ack.json").read_bytes() == b'{"acked_seq": 3}'


def test_this_agent_writes_the_same_format(tmp_path):
    """The same two runs as the fixture's, by this code: a tree the v1 reading above takes whole."""
    write_spool(tmp_path / "spool")
    assert (tmp_path / "spool" / "ack.json").read_bytes() == b'{"acked_seq": 3}'
    seqs = []
    for name, (records, tail) in v1_segments(tmp_path / "spool").items():
        first = int(V1_NAME.match(name)[1])
        assert records[0][0] == first
        seqs += [seq for seq, _, _ in records]
        for seq, payload, _ in records:
            assert sample_from_dict(json.loads(payload)) == fixture_sample(seq)
    assert seqs == sorted(seqs) and seqs[0] <= 4 and seqs[-1] == 12  # 13 was torn
