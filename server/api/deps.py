"""Typed dependency aliases: routers ask for what they need, the app state provides it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Connection

from server.settings import Settings
from server.store.writer import IngestWriter


# async: FastAPI would run a plain-def dependency on its thread pool, a needless hand-off.
async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _writer(request: Request) -> IngestWriter:
    return request.app.state.writer


def _connection(request: Request) -> Iterator[Connection]:
    with request.app.state.engine.connect() as conn:
        yield conn


SettingsDep = Annotated[Settings, Depends(_settings)]
WriterDep = Annotated[IngestWriter, Depends(_writer)]
ConnDep = Annotated[Connection, Depends(_connection)]
