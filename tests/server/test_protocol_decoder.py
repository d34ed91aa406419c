"""The msgspec decoder ingest runs (server/ingest/protocol_decoder.py) against the pydantic
definition it is derived from: same verdict, same output, on the same bytes."""

from __future__ import annotations

import copy
import gc
import json
from typing import Annotated, Any

import msgspec
import pytest
from pydantic import ConfigDict, Field, ValidationError, with_config
from typing_extensions import TypedDict

from server.ingest.protocol_decoder import BATCH_DECODER, BATCH_STRUCT_DECODER, PRINTABLE_BATCH_STRUCT_DECODER, UntranslatableConstraint, derive
from server.protocol import BATCH, DEFAULT_CLUSTER
from tests.server.payloads import batch


def _set(path: list[Any], value: Any):
    def mutate(body: dict) -> dict:
        body = copy.deepcopy(body)
        target = body
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return body

    return mutate


_DELETE = object()
GPU0 = ["samples", 0, "gpus", 0]
NIC0 = ["samples", 0, "nics", 0]

ACCEPTED = {
    "full": _set(["node"], "gpu-node-001"),
    "int where float": _set([*GPU0, "temp_c"], 61),
    "null metric": _set([*GPU0, "power_w"], None),
    "absent optional metric": _set([*GPU0, "power_w"], _DELETE),
    "no cluster": _set(["cluster"], _DELETE),
    "no labels": _set(["labels"], _DELETE),
    "null agent": _set(["agent"], None),
    "partial agent": _set(["agent"], {"version": "1"}),
    "unknown field": _set([*GPU0, "fan_speed_pct"], 40),
    "unknown top-level field": _set(["future"], {"x": [1, 2]}),
    "no gpus": _set(["samples", 0, "gpus"], _DELETE),
    "lost gpu": _set([*GPU0, "lost"], True),
    "xids": _set([*GPU0, "xids"], [{"xid": 79, "ts": 1764662400.5}]),
    "counter at int64 max": _set([*GPU0, "nvlink_tx_bytes_total"], 2**63 - 1),
    "unicode label": _set(["labels"], {"team": "données"}),
    "temperature at bounds": _set([*GPU0, "temp_c"], 200.0),
    "nic port 0": _set([*NIC0, "port"], 0),
    "tensor activity": _set([*GPU0, "tensor_active_pct"], 57.25),
    "tensor activity at 100": _set([*GPU0, "tensor_active_pct"], 100),
    "tensor activity null": _set([*GPU0, "tensor_active_pct"], None),
    # dcgm-exporter's default series (issue #16)
    "energy counter": _set([*GPU0, "energy_mj_total"], 76_320_314_449),
    "encoder and decoder": _set([*GPU0, "util_enc_pct"], 35),
    "reserved memory": _set([*GPU0, "mem_reserved_bytes"], 551 * 2**20),
    "remap failure": _set([*GPU0, "remapped_rows_failure"], True),
    "remapped rows": _set([*GPU0, "remapped_rows_uncorrectable_total"], 3),
    "graphics engine active null": _set([*GPU0, "gr_engine_active_pct"], None),
    "dram active": _set([*GPU0, "dram_active_pct"], 44.5),
    "non-ASCII and C1 in a name": _set(["node"], "nœud-\u0085-\u00a0"),  # control characters are C0 and DEL only
    "slash in a uuid": _set([*GPU0, "uuid"], "MIG-GPU-1/2/0"),  # only node and cluster are URL path segments
    # What uses the GPU (issue #15): every key optional, null when unknown, kind null when idle.
    "k8s workload": _set([*GPU0, "workload"], {
        "kind": "k8s", "job": "llm-a", "namespace": "team-a", "pod": "llm-a-worker-3", "pod_uid": "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b",
        "container": "trainer", "container_id": "0123456789abcdef" * 4, "process": "python3", "pid": 4242, "processes": 1, "workloads": 1}),
    "slurm workload": _set([*GPU0, "workload"], {"kind": "slurm", "job": "j" * 256, "user": "alice", "slurm_job_id": "4242",
                                                 "slurm_step": "batch", "process": "python3", "pid": 7, "processes": 2, "workloads": 1}),
    "idle workload": _set([*GPU0, "workload"], {"kind": None, "processes": 0, "workloads": 0}),
    "unknown workload": _set([*GPU0, "workload"], None),
    "empty workload": _set([*GPU0, "workload"], {}),
    "workload with a newer key": _set([*GPU0, "workload"], {"kind": "process", "cgroup": "/x"}),
}

REJECTED = {
    "missing node": _set(["node"], _DELETE),
    "empty node": _set(["node"], ""),
    "wrong version": _set(["version"], 2),
    "string version": _set(["version"], "1"),
    "string temperature": _set([*GPU0, "temp_c"], "61"),
    "bool where int": _set([*GPU0, "sm_clock_mhz"], True),
    "float where int": _set([*GPU0, "sm_clock_mhz"], 1980.5),
    "negative counter": _set([*GPU0, "pcie_replay_total"], -1),
    "counter past int64": _set([*GPU0, "nvlink_tx_bytes_total"], 2**63),
    "temperature too high": _set([*GPU0, "temp_c"], 200.5),
    "percent over 100": _set([*GPU0, "util_gpu_pct"], 100.1),
    "missing uuid": _set([*GPU0, "uuid"], _DELETE),
    "index out of range": _set([*GPU0, "index"], 1024),
    "long model": _set([*GPU0, "model"], "x" * 129),
    "missing ts": _set(["samples", 0, "ts"], _DELETE),
    "zero ts": _set(["samples", 0, "ts"], 0),
    "samples not a list": _set(["samples"], {"ts": 1}),
    "gpus null": _set(["samples", 0, "gpus"], None),
    "xid not an object": _set([*GPU0, "xids"], [79]),
    "empty label key": _set(["labels"], {"": "x"}),
    "long label key": _set(["labels"], {"k" * 64: "x"}),
    "label value not a string": _set(["labels"], {"rack": 12}),
    "nic port too big": _set([*NIC0, "port"], 256),
    "nic missing device": _set([*NIC0, "device"], _DELETE),
    "lost not a bool": _set([*GPU0, "lost"], 1),
    "tensor activity over 100": _set([*GPU0, "tensor_active_pct"], 100.5),
    "tensor activity negative": _set([*GPU0, "tensor_active_pct"], -1.0),
    "energy as float": _set([*GPU0, "energy_mj_total"], 1.5),
    "negative energy": _set([*GPU0, "energy_mj_total"], -1),
    "decoder over 100": _set([*GPU0, "util_dec_pct"], 101),
    "reserved past 1 PiB": _set([*GPU0, "mem_reserved_bytes"], 2**50 + 1),
    "remap failure as int": _set([*GPU0, "remapped_rows_failure"], 1),
    "negative remapped rows": _set([*GPU0, "remapped_rows_correctable_total"], -1),
    "graphics engine active over 100": _set([*GPU0, "gr_engine_active_pct"], 100.5),
    "dram active as a string": _set([*GPU0, "dram_active_pct"], "44"),
    "unknown workload kind": _set([*GPU0, "workload"], {"kind": "vm"}),
    "workload not an object": _set([*GPU0, "workload"], "llm-a"),
    "long pod name": _set([*GPU0, "workload"], {"kind": "k8s", "pod": "p" * 254}),
    "empty namespace": _set([*GPU0, "workload"], {"kind": "k8s", "namespace": ""}),
    "long job": _set([*GPU0, "workload"], {"kind": "k8s", "job": "j" * 257}),
    "long user": _set([*GPU0, "workload"], {"kind": "slurm", "user": "u" * 257}),
    "short container id": _set([*GPU0, "workload"], {"kind": "k8s", "container_id": "abc123"}),
    "upper-case container id": _set([*GPU0, "workload"], {"kind": "k8s", "container_id": "ABCDEF0123456789" * 4}),
    "container id ending in a newline": _set([*GPU0, "workload"], {"kind": "k8s", "container_id": "a" * 64 + "\n"}),
    "newline in a pod name": _set([*GPU0, "workload"], {"kind": "k8s", "pod": "a\nb"}),
    "pid as a string": _set([*GPU0, "workload"], {"kind": "process", "pid": "42"}),
    "negative processes": _set([*GPU0, "workload"], {"kind": "process", "processes": -1}),
    "slurm job id as a number": _set([*GPU0, "workload"], {"kind": "slurm", "slurm_job_id": 4242}),
    "NUL in node": _set(["node"], "n\x00"),
    "NUL in uuid": _set([*GPU0, "uuid"], "\x00"),
    "NUL in model": _set([*GPU0, "model"], "H100\x00"),
    # Python's re matches "$" before a final newline too; pydantic's regex does not.
    "newline ending the node": _set(["node"], "n1\n"),
    "newline ending a label value": _set(["labels"], {"job": "a\n"}),
    "DEL in pci bus id": _set([*GPU0, "pci_bus_id"], "\x7f"),
    "control character in a label key": _set(["labels"], {"\x01": "x"}),
    "slash in node": _set(["node"], "a/b"),
    "slash in cluster": _set(["cluster"], "/"),
    "zero xid ts": _set([*GPU0, "xids"], [{"xid": 79, "ts": 0}]),
}


@pytest.mark.parametrize("mutate", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted_bodies_decode_to_what_pydantic_builds(mutate):
    raw = json.dumps(mutate(batch(samples=2, gpus=2))).encode()
    assert BATCH_DECODER.decode(raw) == BATCH.validate_json(raw)


@pytest.mark.parametrize("mutate", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted_bodies_decode_to_structs_holding_the_same_values(mutate):
    raw = json.dumps(mutate(batch(samples=2, gpus=2))).encode()
    _assert_same(BATCH_STRUCT_DECODER.decode(raw), BATCH.validate_json(raw))


# What an absent key reads as on a Struct (protocol.py names these defaults).
_ABSENT = {"lost": False, "cluster": DEFAULT_CLUSTER, "xids": (), "gpus": (), "nics": (), "labels": {}, "workload": msgspec.UNSET}


def _assert_same(struct, plain: dict, path: str = "$") -> None:
    for name in struct.__struct_fields__:
        got = getattr(struct, name)
        want = plain.get(name, _ABSENT.get(name))
        if isinstance(want, list):
            want = tuple(want)  # arrays decode as tuples on structs
        if isinstance(got, tuple) and got and isinstance(got[0], msgspec.Struct):
            assert len(got) == len(want), f"{path}.{name}"
            for i, (g, w) in enumerate(zip(got, want)):
                _assert_same(g, w, f"{path}.{name}[{i}]")
        else:
            assert got == want, f"{path}.{name}: {got!r} != {want!r}"


@pytest.mark.parametrize("mutate", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_piecewise_decoding_builds_the_same_structs(mutate):
    raw = json.dumps(mutate(batch(samples=3, gpus=2))).encode()
    assert BATCH_STRUCT_DECODER.decode_piecewise(raw) == BATCH_STRUCT_DECODER.decode(raw)


def test_a_large_decoded_batch_leaves_little_for_the_cyclic_gc():
    # The cyclic GC walks every tracked object, holding the GIL: 64,000 empty lists per largest
    # body made its full collections ~0.1 s stalls of every request in the process (issue #12).
    raw = json.dumps(batch(samples=200, gpus=8)).encode()
    gc.collect()
    before = len(gc.get_objects())
    decoded = PRINTABLE_BATCH_STRUCT_DECODER.decode_piecewise(raw)
    tracked = len(gc.get_objects()) - before
    assert len(decoded.samples) == 200 and all(g.xids == () for s in decoded.samples for g in s.gpus)
    assert tracked <= 3 * 200, f"{tracked} new objects tracked by the GC for 200 samples of 8 GPUs"


@pytest.mark.parametrize("mutate", REJECTED.values(), ids=REJECTED.keys())
def test_rejected_bodies_are_rejected_by_both(mutate):
    raw = json.dumps(mutate(batch(samples=2, gpus=2))).encode()
    with pytest.raises(ValidationError):
        BATCH.validate_json(raw)
    with pytest.raises(msgspec.ValidationError):
        BATCH_DECODER.decode(raw)
    with pytest.raises(msgspec.ValidationError):
        BATCH_STRUCT_DECODER.decode(raw)
    with pytest.raises(msgspec.ValidationError):
        BATCH_STRUCT_DECODER.decode_piecewise(raw)


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b'{"version": 1, "node": "n", "samples": [{"ts": NaN}]}',
                                 b'{"version": 1, "node": "n", "samples": [{"ts": 1e400}]}', b'{"version": 1} trailing'])
def test_malformed_or_non_finite_json_is_rejected_by_both(raw):
    with pytest.raises(ValidationError):
        BATCH.validate_json(raw)
    with pytest.raises(msgspec.MsgspecError):
        BATCH_DECODER.decode(raw)
    with pytest.raises(msgspec.MsgspecError):
        BATCH_STRUCT_DECODER.decode(raw)
    with pytest.raises(msgspec.MsgspecError):
        BATCH_STRUCT_DECODER.decode_piecewise(raw)


_wire = with_config(ConfigDict(strict=True, allow_inf_nan=False, extra="ignore"))


@_wire
class _Patterned(TypedDict):
    name: Annotated[str, Field(pattern="^[a-z]+$")]


@_wire
class _Multiple(TypedDict):
    n: Annotated[int, Field(multiple_of=2)]


@with_config(ConfigDict(strict=True, allow_inf_nan=False, extra="forbid"))
class _Forbidding(TypedDict):
    n: int


@pytest.mark.parametrize("shape", [_Patterned, _Multiple, _Forbidding, set[int]])
def test_a_rule_msgspec_cannot_express_fails_loudly(shape):
    with pytest.raises(UntranslatableConstraint):
        derive(shape)
    with pytest.raises(UntranslatableConstraint):
        derive(shape, structs=True)
