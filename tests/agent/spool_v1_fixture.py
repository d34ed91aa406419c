"""The spool tree in tests/fixtures/spool_v1/: what an older agent left on disk.

`python -m tests.agent.spool_v1_fixture` writes it again (it was written by agent/spool.py as
it stood before the spool became a package, and is committed so that a later agent is held
against what an earlier one really wrote, not against itself). Two agent runs spooled into the
tree: the first put 12 samples and had the first 4 acknowledged, the second put 2 more; then a
power cut tore the last record, and cut short an ack write (a stale ack.json.tmp).
`expected.json` is what that same code read back from the tree.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from agent.sample import GpuSample, NicSample, Sample, XidEvent, sample_to_dict
from agent.workload.record import Workload

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "spool_v1"
SPOOL_ARGS = {"max_bytes": 64 * 1024, "segment_bytes": 8192}


def fixture_sample(i: int) -> Sample:
    """A sample using every kind of field: numbers, None, flags, a workload, XIDs, a lost GPU, a NIC."""
    job = Workload(kind="slurm", job="llm-a", slurm_job_id=str(4000 + i), user="ana", process="python", pid=900 + i,
                   processes=1, workloads=1)
    busy = GpuSample(index=0, uuid="GPU-0a1b", model="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:19:00.0",
                     temp_c=41.0 + i, mem_temp_c=None, power_w=612.25, power_limit_w=700.0, sm_clock_mhz=1980 - i,
                     sm_clock_max_mhz=1980, clocks_event_reasons=4, nvlink_links_up=18, nvlink_links_total=18,
                     remapped_rows_pending=False, tensor_active_pct=None if i == 0 else 63.5, workload=job,
                     xids=[XidEvent(xid=79, ts=1_700_000_000.5 + i)] if i % 5 == 2 else [])
    lost = GpuSample(index=1, uuid="GPU-9f8e", lost=True)
    nic = NicSample(device="mlx5_0", port=1, state="ACTIVE", rate_gbps=400.0, tx_bytes_total=4096 * i, symbol_errors_total=0)
    return Sample(ts=1_700_000_000.0 + i, gpus=[busy, lost], nics=[nic])


def write_spool(directory: Path) -> None:
    from agent.spool import DiskSpool

    with DiskSpool(directory, **SPOOL_ARGS) as spool:
        for i in range(12):
            spool.put(fixture_sample(i))
        spool.ack(spool.peek(4)[-1][0])
    with DiskSpool(directory, **SPOOL_ARGS) as spool:
        for i in range(12, 14):
            spool.put(fixture_sample(i))
    last = sorted(directory.glob("seg-*.log"))[-1]
    os.truncate(last, last.stat().st_size - 7)  # the power cut, in the middle of the last record
    (directory / "ack.json.tmp").write_text('{"acked_seq": 9')


def read_back(directory: Path) -> dict:
    """What the spool hands the pusher from a copy of the tree (reopening changes the tree)."""
    from agent.spool import DiskSpool

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "spool"
        shutil.copytree(directory, copy)
        with DiskSpool(copy, **SPOOL_ARGS) as spool:
            unsent = spool.peek(100)
            return {"corrupt": spool.corrupt, "queued": len(spool), "size_bytes": spool.size_bytes,
                    "seqs": [seq for seq, _ in unsent], "samples": [sample_to_dict(s) for _, s in unsent]}


def main(target: Path = FIXTURE) -> None:
    spool_dir = target / "spool"
    shutil.rmtree(spool_dir, ignore_errors=True)
    write_spool(spool_dir)
    (spool_dir / "lock").unlink()  # empty, and the tree must not carry an agent's lock file
    expected = read_back(spool_dir)
    (target / "expected.json").write_text(json.dumps(expected) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE)
