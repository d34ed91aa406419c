"""Typed dependency aliases: routers ask for what they need, the app state provides it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Connection


def _connection(request: Request) -> Iterator[Connection]:
    with request.app.state.engine.connect() as conn:
        yield conn


ConnDep = Annotated[Connection, Depends(_connection)]


def _raw_retention_s(request: Request) -> float:
    return request.app.state.settings.raw_retention_s


# How long raw samples are kept (the read API chooses raw samples or rollups by it).
RawRetentionDep = Annotated[float, Depends(_raw_retention_s)]
