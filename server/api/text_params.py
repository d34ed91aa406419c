"""Path and query parameters hold no control characters, the same rule as the protocol's
text (server/protocol.py PRINTABLE): PostgreSQL refuses NUL in a query's text parameters
(a 500 there, a plain miss on SQLite); here both answer 422 naming the parameter."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import Request

from server.errors import ApiError

_CONTROL = frozenset(map(chr, [*range(0x20), 0x7F]))


def control_character_loc(path_params: Mapping[str, Any], query_params: Iterable[tuple[str, str]]) -> list[str] | None:
    """Where the first control character is: ["path", name] or ["query", name]; None if nowhere."""
    for name, value in path_params.items():
        if isinstance(value, str) and not _CONTROL.isdisjoint(value):
            return ["path", name]
    for name, value in query_params:
        if not _CONTROL.isdisjoint(name) or not _CONTROL.isdisjoint(value):
            return ["query", name]
    return None


# async: FastAPI would run a plain-def dependency on its thread pool, a needless hand-off.
async def refuse_control_characters(request: Request) -> None:
    loc = control_character_loc(request.path_params, request.query_params.multi_items())
    if loc is not None:
        raise ApiError(422, f"{loc[0]} parameter {loc[1]!r} contains a control character", loc=loc, type="control_character")
