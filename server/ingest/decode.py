"""Turning a request body into a validated Batch: size limits, gzip, JSON, protocol rules."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

import msgspec
from pydantic import ValidationError

from server.auth.tokens import ADMIN, ANONYMOUS, Principal
from server.errors import ApiError, pydantic_details
from server.ingest.protocol_decoder import BATCH_STRUCT_DECODER, PRINTABLE_BATCH_STRUCT_DECODER, BatchStructDecoder
from server.protocol import BATCH, Batch
from server.store.samples import UnresolvedBatch, unresolved_rows


def content_is_gzip(content_encoding: str | None) -> bool:
    encoding = (content_encoding or "identity").strip().lower()
    if encoding not in {"identity", "gzip"}:
        raise ApiError(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none", loc=["header", "content-encoding"],
                       type="unsupported_encoding")
    return encoding == "gzip"


async def read_body(chunks: AsyncIterator[bytes], *, content_length: str | None, limit: int) -> bytes:
    """The body as sent, refusing more than `limit` bytes."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise _too_large(limit)
    raw = bytearray()
    async for chunk in chunks:
        raw += chunk
        if len(raw) > limit:
            raise _too_large(limit)
    return bytes(raw)


def decode_rows(raw: bytes, *, gzipped: bool, limit: int, now: float, max_future_skew_s: float,
                principal: Principal = ANONYMOUS) -> UnresolvedBatch:
    """decode_batch, checked against what the pushing token may do, then as rows for a writer."""
    batch = decode_batch(raw, gzipped=gzipped, limit=limit, now=now, max_future_skew_s=max_future_skew_s)
    if (refusal := principal.may_push(cluster=batch.cluster, node=batch.node)) is not None:
        field = "cluster" if principal.cluster is not None and batch.cluster != principal.cluster else "node"
        raise ApiError(403, refusal, loc=["body", field], type="forbidden")
    if ADMIN in principal.scopes:
        return unresolved_rows(batch)
    clusters = None if principal.cluster is None else frozenset({principal.cluster})
    return unresolved_rows(batch, clusters=clusters, nodes=principal.nodes)


def decode_batch(raw: bytes, *, gzipped: bool, limit: int, now: float, max_future_skew_s: float) -> Batch:
    """gunzip (if sent so) and validate: the CPU-heavy half of ingest, run off the event loop."""
    body = gunzip_limited(raw, limit) if gzipped else raw
    return parse_batch(body, now=now, max_future_skew_s=max_future_skew_s)


def gunzip_limited(data: bytes, limit: int) -> bytes:
    # max_length stops a gzip bomb before it is inflated in memory.
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, limit + 1)
        if len(out) > limit or inflater.unconsumed_tail:
            raise _too_large(limit)
        out += inflater.flush()
    except zlib.error as exc:
        raise ApiError(400, f"corrupt gzip body: {exc}", loc=["body"], type="corrupt_gzip") from exc
    if not inflater.eof:
        raise ApiError(400, "corrupt gzip body: truncated stream", loc=["body"], type="corrupt_gzip")
    if inflater.unused_data:
        # Another gzip member or garbage: what it holds would be silently ignored.
        raise ApiError(400, f"corrupt gzip body: {len(inflater.unused_data)} bytes after the end of the gzip stream",
                       loc=["body"], type="corrupt_gzip")
    if len(out) > limit:
        raise _too_large(limit)
    return out


# Above this many bytes (~5 ms of decoding, a switch interval of the GIL) a body is decoded
# sample by sample, so that it never holds up the process's other requests for longer.
PIECEWISE_BYTES = 256 << 10


def parse_batch(body: bytes, *, now: float, max_future_skew_s: float) -> Batch:
    if not body:
        raise ApiError(400, "empty body: expected a JSON object", loc=["body"], type="empty_body")
    try:
        decoder = _decoder_for(body)
        batch = decoder.decode_piecewise(body) if len(body) > PIECEWISE_BYTES else decoder.decode(body)
    except msgspec.MsgspecError as exc:
        raise _rejection(body, exc) from None
    except RecursionError:
        # Arrays nested thousands deep (in an unknown field, which is skipped recursively).
        raise ApiError(400, "JSON nested too deeply", loc=["body"], type="json_too_deep") from None
    horizon = now + max_future_skew_s
    for i, sample in enumerate(batch.samples):
        if sample.ts > horizon:
            raise _future(sample.ts, ["body", "samples", i, "ts"], now=now, max_future_skew_s=max_future_skew_s)
        # Per GPU of every sample of every push: no enumerate (its tuples cost ~5% of decoding),
        # and XIDs, which most GPUs never report, looked at only where there are some.
        for gpu in sample.gpus:
            for k, xid in enumerate(gpu.xids) if gpu.xids else ():
                if xid.ts > horizon:
                    j = next(j for j, g in enumerate(sample.gpus) if g is gpu)
                    raise _future(xid.ts, ["body", "samples", i, "gpus", j, "xids", k, "ts"], now=now, max_future_skew_s=max_future_skew_s)
    return batch


def _decoder_for(body: bytes) -> BatchStructDecoder:
    # JSON can only hold a control character in a string as an escape (a raw one is malformed
    # JSON) or, for DEL, as itself: without either, no string needs checking for one.
    if b"\\" in body or b"\x7f" in body:
        return BATCH_STRUCT_DECODER
    return PRINTABLE_BATCH_STRUCT_DECODER


def _future(ts: float, loc: list, *, now: float, max_future_skew_s: float) -> ApiError:
    what = "XID" if "xids" in loc else "sample"
    return ApiError(422, f"{what} timestamp {ts} is {ts - now:.0f} s in the future (limit {max_future_skew_s:.0f} s)",
                    loc=loc, type="future_timestamp")


def _rejection(body: bytes, exc: msgspec.MsgspecError) -> ApiError:
    """Why a body was refused: pydantic's error list names every bad field (msgspec stops at
    the first). Should pydantic accept what msgspec refused, msgspec's own message stands."""
    try:
        BATCH.validate_json(body)
    except ValidationError as pydantic_exc:
        errors = pydantic_exc.errors(include_url=False, include_input=False)
        status = 400 if errors and errors[0]["type"] == "json_invalid" else 422
        return ApiError.from_details(status, pydantic_details(errors, prefix=("body",)))
    status = 400 if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError) else 422
    return ApiError(status, str(exc), loc=["body"], type="json_invalid" if status == 400 else "invalid")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"body larger than {limit} bytes (counted after decompression)", loc=["body"], type="too_large")
