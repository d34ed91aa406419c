"""docs/protocol.schema.json is the published JSON Schema of protocol v1: it must match what
the collector validates. Regenerate with `python -m tests.server.test_protocol_schema`."""

from __future__ import annotations

import json
from pathlib import Path

from agent.sample import GpuSample, NicSample
from server.protocol import BATCH, GPU_METRICS, NIC_METRICS

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "protocol.schema.json"


def current_schema() -> dict:
    schema = BATCH.json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://laggard.io/protocol/v1.json", **schema}


def test_published_schema_matches_the_validator():
    published = json.loads(SCHEMA_PATH.read_text())
    assert published == current_schema(), "docs/protocol.schema.json is stale: python -m tests.server.test_protocol_schema"


def test_agent_record_and_wire_protocol_name_the_same_fields():
    # The agent never imports the server; this test is where the two are held together.
    gpu_wire = set(BATCH.json_schema()["$defs"]["Gpu"]["properties"])
    nic_wire = set(BATCH.json_schema()["$defs"]["Nic"]["properties"])
    assert set(GpuSample.__slots__) == gpu_wire
    assert set(NicSample.__slots__) == nic_wire
    assert set(GPU_METRICS) <= gpu_wire and set(NIC_METRICS) <= nic_wire


def test_schema_validates_an_agent_body_and_rejects_a_bad_one():
    import jsonschema

    schema = current_schema()
    good = {"version": 1, "node": "n", "samples": [{"ts": 1.0, "gpus": [{"index": 0, "uuid": "GPU-1", "temp_c": 50.5}]}]}
    jsonschema.validate(good, schema)
    bad = {"version": 1, "node": "n", "samples": [{"ts": 1.0, "gpus": [{"index": 0, "temp_c": 50.5}]}]}
    try:
        jsonschema.validate(bad, schema)
    except jsonschema.ValidationError as exc:
        assert "uuid" in exc.message
    else:
        raise AssertionError("schema accepted a GPU without uuid")


if __name__ == "__main__":
    SCHEMA_PATH.write_text(json.dumps(current_schema(), indent=2) + "\n")
    print(f"wrote {SCHEMA_PATH}")
