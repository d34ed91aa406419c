"""Typed dependency aliases: routers ask for what they need, the app's Services provide it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends
from sqlalchemy import Connection

from server.services import EngineDep, ServicesDep


def _connection(engine: EngineDep) -> Iterator[Connection]:
    with engine.connect() as conn:
        yield conn


ConnDep = Annotated[Connection, Depends(_connection)]


async def _raw_retention_s(services: ServicesDep) -> float:
    return services.settings.retention.raw_s


# How long raw samples are kept (the read API chooses raw samples or rollups by it).
RawRetentionDep = Annotated[float, Depends(_raw_retention_s)]
