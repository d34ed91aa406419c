"""Hypothesis properties of the ingest validator (server/ingest/decode.py parse_batch, msgspec with
pydantic explaining rejections):
- every document the published JSON Schema allows is accepted, and decodes to what was sent;
- one field replaced by any JSON value: msgspec and pydantic agree on accept or reject, and a
  rejection is a 422 that names a field of the document;
- any bytes at all: accepted, or a 400/422 with a JSON-able detail, never another exception."""

from __future__ import annotations

import json
import math

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from server.errors import ApiError
from server.ingest.decode import parse_batch
from server.protocol import BATCH, Batch
from tests.fuzz.schema_strategy import from_json_schema

SCHEMA = BATCH.json_schema()
DOCUMENTS = from_json_schema(SCHEMA)
NO_FUTURE_LIMIT = {"now": 0.0, "max_future_skew_s": math.inf}
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


def plain(struct) -> object:
    # Through JSON: arrays decode as tuples on structs, and are sent as lists.
    return msgspec.json.decode(msgspec.json.encode(struct))


@PROPERTY
@given(DOCUMENTS)
def test_every_document_the_schema_allows_is_accepted_as_sent(doc):
    batch = parse_batch(json.dumps(doc).encode(), **NO_FUTURE_LIMIT)
    decoded = plain(batch)
    assert decoded["node"] == doc["node"] and len(decoded["samples"]) == len(doc["samples"])
    for sent, got in zip(doc["samples"], decoded["samples"], strict=True):
        assert got["ts"] == sent["ts"]
        for sent_gpu, got_gpu in zip(sent.get("gpus", []), got["gpus"], strict=True):
            assert {k: got_gpu[k] for k in sent_gpu if k in got_gpu} == {k: v for k, v in sent_gpu.items() if k in got_gpu}


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _replace(doc, path, new):
    if not path:
        return new
    copy = json.loads(json.dumps(doc))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return copy


@PROPERTY
@given(st.data())
def test_one_field_replaced_by_anything_msgspec_and_pydantic_agree(data):
    doc = data.draw(DOCUMENTS)
    path = data.draw(st.sampled_from(list(_paths(doc))))
    mutated = _replace(doc, path, data.draw(json_values))
    pydantic_ok, refusal = verdicts(json.dumps(mutated).encode())
    assert (refusal is None) == pydantic_ok, mutated
    if refusal is not None:
        assert refusal.status == 422, refusal.detail
        assert refusal.detail and all(d["loc"][:1] == ["body"] for d in refusal.detail)


def verdicts(raw: bytes) -> tuple[bool, ApiError | None]:
    """(pydantic accepts raw, our validator's refusal or None)."""
    try:
        BATCH.validate_json(raw)
        pydantic_ok = True
    except ValidationError:
        pydantic_ok = False
    try:
        parse_batch(raw, **NO_FUTURE_LIMIT)
    except ApiError as exc:
        return pydantic_ok, exc
    return pydantic_ok, None


@PROPERTY
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_are_accepted_or_refused_with_400_or_422(raw):
    try:
        parse_batch(raw, **NO_FUTURE_LIMIT)
    except ApiError as exc:
        assert exc.status in (400, 422)
        json.dumps(exc.detail)


@PROPERTY
@given(st.from_type(Batch))
def test_protocol_shaped_documents_with_any_values_msgspec_and_pydantic_agree(doc):
    # from_type fills the protocol's shape with values that ignore its ranges and lengths:
    # mostly rejections, each of which both validators must see alike.
    pydantic_ok, refusal = verdicts(json.dumps(doc).encode())
    assert (refusal is None) == pydantic_ok, doc
    assert refusal is None or refusal.status in (400, 422)
