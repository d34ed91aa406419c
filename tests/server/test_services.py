"""The app's wiring: one typed Services object (server/app.py), built in the lifespan, the only
attribute of the app's state; routers reach it through server/services.py, never through
app.state themselves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from server.app import Services, create_app
from server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# Who may touch app.state: the app (which sets it), the accessor (which reads it), the demo (which
# watches its collector's writer from outside, as a test does).
MAY_TOUCH_STATE = {"server/app.py", "server/services.py", "server/demo.py"}


def test_the_lifespan_builds_one_services_object_and_nothing_else_on_the_state(sqlite_url):
    settings = Settings(database_url=sqlite_url, insecure=True, detection_enabled=False, retention_interval_s=3600)
    app = create_app(settings)
    assert not hasattr(app.state, "services")  # built when the app starts, not when it is made
    with TestClient(app) as client:
        services = app.state.services
        assert isinstance(services, Services) and services.settings is settings
        assert vars(app.state)["_state"].keys() == {"services"}
        assert client.get("/readyz").json()["status"] == "ok"
        assert client.get("/api/v1/hints").status_code == 200
        assert services.metrics.settings is settings.metrics and services.hints is not None


def test_no_router_reads_the_app_state_itself():
    touching = {str(p.relative_to(ROOT)) for p in (ROOT / "server").rglob("*.py") if re.search(r"app\.state\b", p.read_text())}
    assert touching <= MAY_TOUCH_STATE, touching - MAY_TOUCH_STATE


def test_importing_the_services_imports_none_of_the_parts():
    """Every domain imports server.services for its dependencies: it must not drag another
    domain in behind it (nor, by importing the app, make an arrow that points up)."""
    parts = ("server.alerts", "server.hints", "server.metrics", "server.detect", "server.api", "server.auth", "server.ingest", "server.app",
             "server.store", "server.settings")
    code = ("import sys, server.services; "
            f"print(sorted(m for m in sys.modules if m.startswith({parts!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
