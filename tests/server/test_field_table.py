"""Issue #14: one field table (agent/fields.py). Every layer that names a reading derives it from
the table, so a reading added there reaches the agent's sample, the wire and its decoder, the
sample and rollup tables, /metrics and the detector; the video clock (DCGM_FI_DEV_VIDEO_CLOCK)
was added that way: its row, its reader, migration 0012, and the end-to-end test below."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import httpx
import pydantic
import pytest
from sqlalchemy import select

from agent import fields
from agent.dcgm_fields import DCGM_FIELDS, nic_families
from agent.nvml.source import NvmlGpuSource
from agent.sample import GpuSample, NicSample, Sample, build_batch
from agent.sim.gpu import SimNode
from agent.sim.install import install_simulated_nvml
from agent.sim.libnvml import SimNvmlLib
from server import protocol
from server.app import create_app
from server.detect.model import GpuObs, NicObs
from server.ingest.protocol_decoder import BATCH_DECODER
from server.serve import start_in_thread
from server.store import schema
from server.store.engine import make_engine
from tests.metrics.test_collector import settings_for, wait_metric
from tests.metrics.tools import values

_PYTHON_TYPE = {bool: bool, int: int, float: float, str: str}
GPU, NIC = fields.GPU_READINGS, fields.NIC_READINGS
PROTOCOL_DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("reading", GPU, ids=lambda r: r.name)
def test_every_gpu_reading_reaches_every_layer(reading: fields.Reading):
    assert reading.name in _names(GpuSample)
    assert reading.name in protocol.Gpu.__annotations__ and reading.name in protocol.GPU_METRICS
    column = schema.GpuSample.__table__.c[reading.name]
    assert column.type.python_type is _PYTHON_TYPE[reading.type] and column.nullable == reading.nullable
    rollup = schema.GpuRollupT.c
    assert all(f"{reading.name}_{s}" in rollup for s in schema.ROLLUP_STATS) if reading.plot else reading.name in rollup
    if reading.series is not None:
        assert reading.series.name in {f.name for f in DCGM_FIELDS}
    for carried in (reading.name if reading.detect else None, reading.rate, reading.delta):
        if carried is not None:
            assert carried in GpuObs.__struct_fields__


@pytest.mark.parametrize("reading", GPU + NIC, ids=lambda r: r.name)
def test_the_wire_format_documents_every_reading(reading: fields.Reading):
    assert f"`{reading.name}`" in PROTOCOL_DOC


@pytest.mark.parametrize("reading", NIC, ids=lambda r: r.name)
def test_every_port_reading_reaches_every_layer(reading: fields.Reading):
    assert reading.name in _names(NicSample)
    assert reading.name in protocol.Nic.__annotations__ and reading.name in protocol.NIC_METRICS
    column = schema.NicSample.__table__.c[reading.name]
    assert column.type.python_type is _PYTHON_TYPE[reading.type]
    if reading.series is not None:
        assert reading.series.name in {f.name for f in nic_families([])}
    for carried in (reading.name if reading.detect else None, reading.rate, reading.delta):
        if carried is not None:
            assert carried in NicObs.__struct_fields__


def _body_with(key: str, value) -> bytes:
    gpu = {"index": 0, "uuid": "GPU-0", key: value}
    return json.dumps({"version": 1, "node": "n1", "samples": [{"ts": time.time(), "gpus": [gpu]}]}).encode()


@pytest.mark.parametrize("reading", [r for r in GPU if r.hi is not None], ids=lambda r: r.name)
def test_both_validators_hold_each_reading_to_its_physical_range(reading: fields.Reading):
    inside, beyond = _body_with(reading.name, reading.hi), _body_with(reading.name, reading.hi * 2 + 1)
    BATCH_DECODER.decode(inside)
    protocol.BATCH.validate_json(inside)
    with pytest.raises(Exception, match=reading.name):
        BATCH_DECODER.decode(beyond)
    with pytest.raises(pydantic.ValidationError, match=reading.name):
        protocol.BATCH.validate_json(beyond)


def test_the_video_clock_goes_from_nvml_to_storage_and_metrics(database_url):
    """The reading added through the table alone: read by the real pynvml bindings from the
    simulated library, pushed over HTTP, stored in its column, exported as dcgm-exporter's
    DCGM_FI_DEV_VIDEO_CLOCK."""
    node = SimNode("n1", "h100", 2, workload="busy", seed=3)
    ts = float(int(time.time()) - 5)
    node.advance(0.0)
    with install_simulated_nvml(SimNvmlLib(node)), NvmlGpuSource() as src:
        gpus = src.read(ts)
    clocks = [g.video_clock_mhz for g in gpus]
    # The simulated H100 runs its video engines at 1545/1980 of the SM clock.
    assert all(isinstance(c, int) and 0 < c < g.sm_clock_mhz for c, g in zip(clocks, gpus)), clocks
    server = start_in_thread(create_app(settings_for(database_url, dcgm_extra_series=True)))  # not in dcgm-exporter's default set
    try:
        body = build_batch([Sample(ts=ts, gpus=gpus)], node="n1", cluster="prod", labels={}, agent_info={})
        r = httpx.post(f"{server.url}/api/v1/samples", json=body, timeout=30)
        assert r.status_code == 200, r.text
        engine = make_engine(database_url)
        try:
            with engine.connect() as conn:
                stored = conn.execute(select(schema.GpuSample.__table__.c.video_clock_mhz).order_by(schema.GpuSample.__table__.c.gpu_id))
                assert [row[0] for row in stored] == clocks
        finally:
            engine.dispose()
        scraped = wait_metric(server.url, "DCGM_FI_DEV_VIDEO_CLOCK")
        assert [values(scraped, "DCGM_FI_DEV_VIDEO_CLOCK", gpu=str(i)) for i in range(2)] == [[c] for c in clocks]
        assert "# TYPE DCGM_FI_DEV_VIDEO_CLOCK gauge" in scraped
    finally:
        server.stop()
