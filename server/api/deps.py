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
