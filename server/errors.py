"""One error shape for every rejection: {"detail": [{"loc": [...], "msg": ..., "type": ...}]},
the same shape FastAPI uses for its own validation errors, so clients parse one format."""

from __future__ import annotations

from typing import Any

from server.protocol import PATTERN_MEANINGS


class ApiError(Exception):
    def __init__(self, status: int, msg: str, *, loc: list[Any] | None = None, type: str = "invalid", headers=None):
        super().__init__(msg)
        self.status = status
        self.detail = [{"loc": loc or [], "msg": msg, "type": type}]
        self.headers = headers

    @classmethod
    def from_details(cls, status: int, details: list[dict[str, Any]]) -> "ApiError":
        err = cls(status, details[0]["msg"] if details else "invalid")
        err.detail = details
        return err


def pydantic_details(errors: list[dict[str, Any]], *, prefix: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    # The offending input is left out: echoing a 16 MiB body back helps nobody.
    return [{"loc": [*prefix, *e["loc"]], "msg": _message(e), "type": e["type"]} for e in errors]


def _message(error: dict[str, Any]) -> str:
    # "String should match pattern '^[^\\x00-...]*$'" says what, not why.
    meaning = PATTERN_MEANINGS.get(error.get("ctx", {}).get("pattern")) if error["type"] == "string_pattern_mismatch" else None
    return error["msg"] if meaning is None else meaning
