"""DiskSpool (agent/spool/): order, restart, the size cap, damaged records, the ack file."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.cli import open_queue, parse_config
from agent.metrics import NodeMetrics, pusher_stats
from agent.push import MemoryQueue
from agent.sample import (
    GpuSample,
    NicSample,
    Sample,
    XidEvent,
    build_batch,
    sample_from_dict,
    sample_to_dict,
)
from agent.spool import ACK_FILE, HEADER, DiskSpool, SpoolError
from tests.agent.test_push import Collector, make_pusher

REPO = Path(__file__).resolve().parents[2]


def sample(i: int) -> Sample:
    return Sample(
        ts=1_700_000_000.0 + i,
        gpus=[GpuSample(index=0, uuid="GPU-0", model="NVIDIA H100", temp_c=40.0 + i, power_w=None,
                        sm_clock_mhz=1980, remapped_rows_pending=False, xids=[XidEvent(xid=79, ts=1_700_000_000.5 + i)]),
              GpuSample(index=1, uuid="GPU-1", lost=True)],
        nics=[NicSample(device="mlx5_0", port=1, state="ACTIVE", tx_bytes_total=4 * i)],
    )


def ts_of(items) -> list[float]:
    return [s.ts for _, s in items]


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("seg-*.log"))


@pytest.fixture
def spool_dir(tmp_path) -> Path:
    return tmp_path / "spool"


# --- order ------------------------------------------------------------------------------------


def test_put_peek_ack_in_order(spool_dir):
    with DiskSpool(spool_dir) as spool:
        for i in range(10):
            spool.put(sample(i))
        assert len(spool) == 10
        head = spool.peek(4)
        seqs = [seq for seq, _ in head]
        assert seqs == sorted(seqs) and len(set(seqs)) == 4
        assert ts_of(head) == [sample(i).ts for i in range(4)]
        assert spool.peek(4) == head  # peek does not consume
        spool.ack(seqs[-1])
        assert len(spool) == 6
        assert ts_of(spool.peek(100)) == [sample(i).ts for i in range(4, 10)]
        spool.ack(seqs[0])  # an old ack changes nothing
        assert len(spool) == 6


def test_samples_come_back_field_for_field(spool_dir, tmp_path):
    with DiskSpool(spool_dir) as spool:
        spool.put(sample(3))
    with DiskSpool(spool_dir, cache_size=0) as spool:  # nothing cached: read from the file
        [(_, back)] = spool.peek(1)
    assert back == sample(3)
    assert sample_to_dict(back) == sample_to_dict(sample(3))


def test_peek_reads_from_disk_when_the_cache_is_small(spool_dir):
    with DiskSpool(spool_dir, cache_size=2) as spool:
        for i in range(20):
            spool.put(sample(i))
        assert ts_of(spool.peek(20)) == [sample(i).ts for i in range(20)]


# --- restart ----------------------------------------------------------------------------------


def test_restart_resumes_the_unacked_only(spool_dir):
    with DiskSpool(spool_dir) as spool:
        for i in range(10):
            spool.put(sample(i))
        head = spool.peek(4)
        spool.ack(head[-1][0])
        last_seq = spool.peek(100)[-1][0]
    with DiskSpool(spool_dir) as spool:
        assert len(spool) == 6
        assert [s for _, s in spool.peek(100)] == [sample(i) for i in range(4, 10)]
        spool.put(sample(10))
        assert spool.peek(100)[-1][0] > last_seq  # seqs keep increasing across restarts
        assert ts_of(spool.peek(100))[-1] == sample(10).ts


def test_delivered_segments_are_deleted_and_seqs_never_reused(spool_dir):
    with DiskSpool(spool_dir, max_bytes=64 * 1024, segment_bytes=4096) as spool:
        for i in range(40):
            spool.put(sample(i))
        assert len(segments(spool_dir)) > 3
        last_seq = spool.peek(100)[-1][0]
        spool.ack(last_seq)
        assert len(spool) == 0
        assert len(segments(spool_dir)) == 1  # only the one being written stays
    with DiskSpool(spool_dir, max_bytes=64 * 1024, segment_bytes=4096) as spool:
        assert len(spool) == 0 and segments(spool_dir) == []
        spool.put(sample(99))
        [(seq, _)] = spool.peek(10)
        assert seq > last_seq


def test_a_crashed_agent_loses_nothing_it_put(spool_dir):
    """os._exit: no close(), no final fsync or ack save; every put() is already in the kernel."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.agent.test_spool import sample
        from agent.spool import DiskSpool
        spool = DiskSpool({str(spool_dir)!r}, ack_interval=0)
        for i in range(12):
            spool.put(sample(i))
        spool.ack(spool.peek(5)[-1][0])
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=REPO)
    with DiskSpool(spool_dir) as spool:
        assert [s for _, s in spool.peek(100)] == [sample(i) for i in range(5, 12)]


def test_a_second_agent_cannot_share_the_spool(spool_dir):
    with DiskSpool(spool_dir), pytest.raises(SpoolError, match="in use"):
        DiskSpool(spool_dir)
    DiskSpool(spool_dir).close()  # released on close


def test_unusable_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SpoolError, match="cannot use spool directory"):
        DiskSpool(blocker / "spool")


def test_bad_caps_are_refused(spool_dir):
    with pytest.raises(ValueError, match="at least"):
        DiskSpool(spool_dir, max_bytes=1000)
    with pytest.raises(ValueError, match="half the cap"):
        DiskSpool(spool_dir, max_bytes=64 * 1024, segment_bytes=64 * 1024)


# --- the size cap -----------------------------------------------------------------------------


def test_cap_drops_the_oldest_whole_segments_and_counts(spool_dir, caplog):
    cap = 64 * 1024
    with caplog.at_level(logging.WARNING, logger="agent.spool"), \
            DiskSpool(spool_dir, max_bytes=cap, segment_bytes=8 * 1024) as spool:
        for i in range(300):
            spool.put(sample(i))
            assert sum(p.stat().st_size for p in segments(spool_dir)) <= cap
        kept = len(spool)
        assert spool.dropped > 0 and spool.dropped + kept == 300
        assert ts_of(spool.peek(kept)) == [sample(i).ts for i in range(300 - kept, 300)]  # the newest survive
    assert "oldest unsent samples" in caplog.text
    with DiskSpool(spool_dir, max_bytes=cap, segment_bytes=8 * 1024) as spool:
        assert len(spool) == kept


def test_a_lowered_cap_applies_when_reopened(spool_dir):
    with DiskSpool(spool_dir, max_bytes=256 * 1024, segment_bytes=8 * 1024) as spool:
        for i in range(300):
            spool.put(sample(i))
        before = len(spool)
    with DiskSpool(spool_dir, max_bytes=64 * 1024, segment_bytes=8 * 1024) as spool:
        assert 0 < len(spool) < before and spool.dropped == before - len(spool)
        assert ts_of(spool.peek(1000))[-1] == sample(299).ts


# --- damaged files ----------------------------------------------------------------------------


def record_offsets(path: Path) -> list[int]:
    data, offsets, pos = path.read_bytes(), [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += HEADER.size + HEADER.unpack_from(data, pos)[1]
    return offsets


def test_torn_tail_is_skipped_and_counted(spool_dir):
    with DiskSpool(spool_dir) as spool:
        for i in range(5):
            spool.put(sample(i))
    [seg] = segments(spool_dir)
    os.truncate(seg, seg.stat().st_size - 7)  # a power cut in the middle of the last write
    with DiskSpool(spool_dir) as spool:
        assert spool.corrupt == 1 and len(spool) == 4
        assert ts_of(spool.peek(10)) == [sample(i).ts for i in range(4)]
        spool.put(sample(5))  # goes to a new segment, never after the torn record
    assert len(segments(spool_dir)) == 2
    with DiskSpool(spool_dir) as spool:
        assert ts_of(spool.peek(10)) == [sample(i).ts for i in (0, 1, 2, 3, 5)]


def test_header_only_tail_is_skipped(spool_dir):
    with DiskSpool(spool_dir) as spool:
        for i in range(3):
            spool.put(sample(i))
    [seg] = segments(spool_dir)
    last = record_offsets(seg)[-1]
    os.truncate(seg, last + HEADER.size - 3)
    with DiskSpool(spool_dir) as spool:
        assert spool.corrupt == 1 and ts_of(spool.peek(10)) == [sample(0).ts, sample(1).ts]


@pytest.mark.parametrize("where", ["payload", "length"])
def test_damaged_record_in_the_middle_costs_only_itself(spool_dir, where):
    with DiskSpool(spool_dir) as spool:
        for i in range(5):
            spool.put(sample(i))
    [seg] = segments(spool_dir)
    data = bytearray(seg.read_bytes())
    at = record_offsets(seg)[2]
    if where == "payload":
        data[at + HEADER.size + 10] ^= 0xFF
    else:
        data[at + 4:at + 8] = (10**6).to_bytes(4, "little")  # a length running far past the record
    seg.write_bytes(bytes(data))
    with DiskSpool(spool_dir) as spool:
        assert spool.corrupt == 1
        assert ts_of(spool.peek(10)) == [sample(i).ts for i in (0, 1, 3, 4)]


@pytest.mark.parametrize("how", ["peek", "peek_encoded"])
def test_record_damaged_after_opening_is_skipped_when_read(spool_dir, caplog, how):
    with DiskSpool(spool_dir, cache_size=0) as spool:
        for i in range(3):
            spool.put(sample(i))
        [seg] = segments(spool_dir)
        at = record_offsets(seg)[1]
        with open(seg, "r+b") as f:
            f.seek(at + HEADER.size + 5)
            f.write(b"#")
        with caplog.at_level(logging.ERROR, logger="agent.spool"):
            head = getattr(spool, how)(3)
        assert len(head) == 2 and ts_of(spool.peek(3)) == [sample(0).ts, sample(2).ts]
        assert spool.corrupt == 1 and len(spool) == 2 and "damaged" in caplog.text
        spool.ack(head[-1][0])
        assert len(spool) == 0 and spool.peek(3) == []


# --- the ack file -----------------------------------------------------------------------------


def test_ack_is_written_whole_or_not_at_all(spool_dir, monkeypatch):
    with DiskSpool(spool_dir) as spool:
        for i in range(6):
            spool.put(sample(i))
        spool.ack(spool.peek(2)[-1][0])
    saved = json.loads((spool_dir / ACK_FILE).read_text())

    def crash(*args):  # the agent dies between writing the temp file and renaming it
        raise OSError("simulated crash before rename")

    monkeypatch.setattr("agent.spool.ack.os.replace", crash)
    spool = DiskSpool(spool_dir)
    spool.ack(spool.peek(2)[-1][0])
    spool.close()
    monkeypatch.undo()
    assert json.loads((spool_dir / ACK_FILE).read_text()) == saved  # the old position, intact
    with DiskSpool(spool_dir) as spool:
        # the second ack was lost: those samples come again (duplicates, never losses)
        assert ts_of(spool.peek(10)) == [sample(i).ts for i in range(2, 6)]
    assert not list(spool_dir.glob("*.tmp"))


def test_unreadable_ack_file_resends_everything(spool_dir, caplog):
    with DiskSpool(spool_dir) as spool:
        for i in range(4):
            spool.put(sample(i))
        spool.ack(spool.peek(2)[-1][0])
    (spool_dir / ACK_FILE).write_text('{"acked_se')
    with caplog.at_level(logging.WARNING, logger="agent.spool"), DiskSpool(spool_dir) as spool:
        assert ts_of(spool.peek(10)) == [sample(i).ts for i in range(4)]
    assert "resending" in caplog.text


# --- a disk that refuses writes ---------------------------------------------------------------


def test_samples_wait_in_memory_while_the_disk_refuses_writes(spool_dir):
    """RLIMIT_FSIZE makes the kernel refuse writes past a size (EFBIG), like a full disk."""
    script = textwrap.dedent(f"""
        import json, resource, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.agent.test_spool import sample
        from agent.spool import DiskSpool
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, resource.RLIM_INFINITY))
        spool = DiskSpool({str(spool_dir)!r})
        for i in range(10):
            spool.put(sample(i))
        print(json.dumps({{"ts": [s.ts for _, s in spool.peek(100)], "errors": spool.write_errors, "n": len(spool)}}))
        spool.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=REPO,
                         capture_output=True, text=True)
    result = json.loads(out.stdout)
    assert result["errors"] >= 1
    assert result["n"] == 10 and result["ts"] == [sample(i).ts for i in range(10)]
    with DiskSpool(spool_dir) as spool:  # what reached the disk is intact and in order
        on_disk = ts_of(spool.peek(100))
    assert 0 < len(on_disk) < 10 and on_disk == [sample(i).ts for i in range(len(on_disk))]


# --- with the pusher --------------------------------------------------------------------------


def test_pusher_backfills_in_order_after_failures_and_restart(spool_dir):
    collector = Collector(script=[(503, {"error": "down"}, {})] * 3)
    try:
        spool = DiskSpool(spool_dir)
        p = make_pusher(collector.url, batch_size=3, queue=spool)
        for i in range(7):
            p.submit(sample(i))
        assert p.send_once() is not None and p.send_once() is not None
        p.close(flush_timeout=0)
        spool.close()
        spool = DiskSpool(spool_dir)  # the agent restarts with the collector still failing
        p = make_pusher(collector.url, batch_size=3, queue=spool)
        p.submit(sample(7))
        assert p.send_once() is not None
        assert p.flush(timeout=10)
        p.close()
        spool.close()
    finally:
        collector.close()
    delivered = [s["ts"] for r in collector.requests[3:] for s in r["json"]["samples"]]
    assert delivered == [sample(i).ts for i in range(8)]  # oldest first, each once
    with DiskSpool(spool_dir) as spool:
        assert len(spool) == 0


def test_stored_json_is_the_request_body_part(spool_dir):
    """The pusher splices the spool's JSON into the body: the same bytes as encoding the samples."""
    samples = [sample(i) for i in range(3)]
    with DiskSpool(spool_dir) as spool:
        for s in samples:
            spool.put(s)
    with DiskSpool(spool_dir, cache_size=0) as spool:  # from the file
        payloads = [p for _, p in spool.peek_encoded(3)]
    p = make_pusher("http://127.0.0.1:9")
    p.use_gzip = False
    assert p.encode_encoded(payloads) == p.encode(samples)
    body = json.loads(p.encode_encoded(payloads))
    assert body == build_batch(samples, node="node-a", cluster="c1", labels={"rack": "r1"},
                               agent_info={"version": "0.1.0", "driver": "550.54", "cuda": "12.4"})
    p.close(flush_timeout=0)


def test_pusher_stats_report_the_spool(spool_dir):
    with DiskSpool(spool_dir) as spool:
        p = make_pusher("http://127.0.0.1:9", queue=spool)
        p.submit(sample(0))
        stats = pusher_stats(p)()
        p.close(flush_timeout=0)
    assert stats["queued"] == 1 and stats["spool_bytes"] > 0
    assert stats["spool_corrupt"] == 0 and stats["spool_write_errors"] == 0 and stats["dropped"] == 0


def test_spool_metrics_in_the_agent_exposition(spool_dir):
    with DiskSpool(spool_dir) as spool:
        p = make_pusher("http://127.0.0.1:9", queue=spool)
        p.submit(sample(0))
        text = NodeMetrics(None, node="n1", cluster="c1", stats=pusher_stats(p)).exposition()
        p.close(flush_timeout=0)
    assert f'laggard_agent_spool_bytes{{cluster="c1",node="n1"}} {spool.size_bytes}' in text
    assert 'laggard_agent_spool_corrupt_records_total{cluster="c1",node="n1"} 0' in text
    assert 'laggard_agent_queued_samples{cluster="c1",node="n1"} 1' in text


def test_unencodable_sample_is_logged_not_spooled(spool_dir, caplog):
    with DiskSpool(spool_dir) as spool, caplog.at_level(logging.ERROR, logger="agent.spool"):
        spool.put(Sample(ts=1.0, gpus=[object()]))
        spool.put(sample(1))
        assert ts_of(spool.peek(5)) == [sample(1).ts]
    assert "cannot spool" in caplog.text


def test_ack_beyond_what_was_put_is_clamped(spool_dir):
    with DiskSpool(spool_dir) as spool:
        spool.put(sample(0))
        spool.ack(10**9)
        spool.put(sample(1))
        assert ts_of(spool.peek(5)) == [sample(1).ts]
    with DiskSpool(spool_dir) as spool:  # the later sample is not taken for delivered
        assert ts_of(spool.peek(5)) == [sample(1).ts]


# --- samples from dicts -----------------------------------------------------------------------


def test_sample_from_dict_tolerates_other_versions():
    d = sample_to_dict(sample(1))
    d["gpus"][0]["a_field_from_a_newer_agent"] = 1
    del d["gpus"][0]["mem_temp_c"]  # an older agent did not have it
    back = sample_from_dict(d)
    assert back.gpus[0].temp_c == 41.0 and back.gpus[0].mem_temp_c is None
    assert back.gpus[0].xids == [XidEvent(xid=79, ts=1_700_000_001.5)]


@pytest.mark.parametrize("bad", [[], {"gpus": []}, {"ts": 1.0, "gpus": [{"index": 0}]}, {"ts": 1.0, "nics": [7]}])
def test_sample_from_dict_rejects_non_samples(bad):
    with pytest.raises(ValueError, match="not a v1 sample"):
        sample_from_dict(bad)


# --- configuration ----------------------------------------------------------------------------


def test_spool_settings():
    assert parse_config([], env={}).spool_dir == "/var/lib/laggard-agent/spool"
    assert parse_config([], env={}).spool_max_bytes == 256 * 2**20
    assert parse_config(["--simulate", "H100:1"], env={}).spool_dir is None  # never the real agent's spool
    assert parse_config(["--simulate", "H100:1", "--spool-dir", "/s"], env={}).spool_dir == "/s"
    assert parse_config(["--spool-dir", ""], env={}).spool_dir is None
    assert parse_config([], env={"LAGGARD_SPOOL_DIR": ""}).spool_dir is None
    assert parse_config([], env={"LAGGARD_SPOOL_DIR": "/e"}).spool_dir == "/e"
    assert parse_config(["--spool-dir", "/f"], env={"LAGGARD_SPOOL_DIR": "/e"}).spool_dir == "/f"
    assert parse_config(["--spool-max-bytes", "1GiB"], env={}).spool_max_bytes == 2**30
    assert parse_config([], env={"LAGGARD_SPOOL_MAX_BYTES": "512k"}).spool_max_bytes == 512 * 1024
    assert parse_config(["--spool-max-bytes", "1000000"], env={}).spool_max_bytes == 1_000_000


@pytest.mark.parametrize("value,message", [("lots", "expected a size"), ("1.5G", "expected a size"), ("1k", "at least")])
def test_bad_spool_size_is_a_clear_error(value, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(["--spool-max-bytes", value], env={})
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_unusable_spool_falls_back_to_memory(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cfg = parse_config(["--spool-dir", str(blocker / "spool"), "--max-queue", "9"], env={})
    with caplog.at_level(logging.WARNING, logger="agent"):
        queue = open_queue(cfg)
    assert isinstance(queue, MemoryQueue) and "in memory instead" in caplog.text
    spool = open_queue(parse_config(["--spool-dir", str(tmp_path / "ok")], env={}))
    assert isinstance(spool, DiskSpool)
    spool.close()
