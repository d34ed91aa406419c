"""Configuration errors on the command line: one line naming the problem and the fix, exit 2,
instead of the 20-180 lines of traceback a bad database URL or an unreachable database gave."""

from __future__ import annotations

import os
from typing import Any

EXIT_CONFIG = 2


def config_errors() -> tuple[type[BaseException], ...]:
    from pydantic import ValidationError
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

    return (ValidationError, ArgumentError, NoSuchModuleError, OperationalError)


def explain(exc: BaseException, args: Any) -> str:
    """The one line for a configuration error (one of config_errors())."""
    from pydantic import ValidationError
    from sqlalchemy.exc import OperationalError

    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        return f"invalid setting {where}: {err['msg']} (a LAGGARD_* variable or a flag; see docs/operations.md)"
    url = getattr(args, "database_url", None) or os.environ.get("LAGGARD_DATABASE_URL", "sqlite:///laggard.db")
    if isinstance(exc, OperationalError):
        reason = _first_line(getattr(exc, "orig", None) or exc)
        return f"cannot open the database {_redact(url)}: {reason} (check LAGGARD_DATABASE_URL or --database-url, and that the server is up)"
    return f"not a database URL Laggard can use: {_redact(url)}: {_first_line(exc)} (LAGGARD_DATABASE_URL or --database-url: " \
           "sqlite:///path/laggard.db or postgresql+psycopg://user@host/db)"


def check_database(url: str) -> None:
    """Connect once, so that an unusable database is one line before anything starts."""
    from server.store.engine import make_engine

    engine = make_engine(url)
    try:
        with engine.connect():
            pass
    finally:
        engine.dispose()


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _redact(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "(unparseable URL)"
