"""/docs and /redoc work on an air-gapped cluster (issue #16 item 11): every script, stylesheet
and icon they load comes from the collector itself (server/api/docs.py), none from a CDN, and
each of those answers 200 with its content type, behind a proxy's path prefix (root_path) too."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.settings import Settings

PREFIX = "/laggard"  # a reverse proxy that serves the collector under a path and strips it
PAGES = ("/docs", "/redoc")
# The bundles hold UTF-8 text and the Swagger UI page names no charset: without one in the
# header a browser reads them as Latin-1 and stops at a SyntaxError, a blank page again.
CONTENT_TYPES = {".js": ("text/javascript", "charset=utf-8"), ".css": ("text/css", "charset=utf-8"), ".png": ("image/png",)}


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.found.extend(value for name, value in attrs if name in ("src", "href") and value)


def links(html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    return parser.found


@pytest.fixture
def app(sqlite_url):
    # No lifespan: the pages and their assets read no database.
    return create_app(Settings(database_url=sqlite_url))


@pytest.mark.parametrize("root_path", ["", PREFIX])
@pytest.mark.parametrize("page", PAGES)
def test_the_docs_pages_load_nothing_from_off_host(app, page, root_path):
    client = TestClient(app, root_path=root_path)
    response = client.get(page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    found = links(response.text)
    assert found, "the page references no script or stylesheet at all"
    off_host = [url for url in found if re.match(r"^([a-z][a-z0-9+.-]*:|//)", url, re.IGNORECASE)]
    assert off_host == [], f"{page} loads from off host: {off_host}"
    assert "http://" not in response.text and "https://" not in response.text
    assert all(url.startswith(f"{root_path}/") for url in found), f"outside root_path {root_path!r}: {found}"
    for url in found:
        # The proxy strips its prefix before the request reaches the collector.
        asset = client.get(url.removeprefix(root_path))
        assert asset.status_code == 200, f"{url}: {asset.status_code}"
        suffix = url[url.rfind("."):]
        content_type = asset.headers["content-type"].replace(" ", "").lower()
        assert all(part in content_type for part in CONTENT_TYPES[suffix]), f"{url}: {content_type}"
        assert len(asset.content) > 100, f"{url} is empty"


@pytest.mark.parametrize("root_path", ["", PREFIX])
def test_the_docs_point_at_the_schema_and_oauth2_redirect_under_root_path(app, root_path):
    client = TestClient(app, root_path=root_path)
    html = client.get("/docs").text
    assert f"url: '{root_path}/openapi.json'" in html
    redirect = re.search(r"oauth2RedirectUrl: window\.location\.origin \+ '([^']+)'", html)
    assert redirect is not None and redirect.group(1).startswith(f"{root_path}/")
    page = client.get(redirect.group(1).removeprefix(root_path))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "http://" not in page.text and "https://" not in page.text
    assert client.get("/openapi.json").status_code == 200


def test_the_bundled_swagger_ui_renders_openapi_3_1(app):
    """Swagger UI before 5 answers 'Unable to render this definition' for `openapi: 3.1.x`,
    the version FastAPI publishes: a bundle of 4.x would load offline and still show nothing."""
    client = TestClient(app)
    schema_version = client.get("/openapi.json").json()["openapi"]
    bundle = next(url for url in links(client.get("/docs").text) if url.endswith("swagger-ui-bundle.js"))
    version = re.search(r'PACKAGE_VERSION:"(\d+)\.', client.get(bundle).text)
    assert version is not None, "no PACKAGE_VERSION in the bundle: check its Swagger UI version by hand"
    assert schema_version.startswith("3.0.") or int(version.group(1)) >= 5, (schema_version, version.group(0))


def test_the_docs_are_open_and_outside_the_schema(app):
    # Authentication on: the pages and their assets still need no token, as /docs always did.
    client = TestClient(create_app(Settings(database_url="sqlite://", insecure=False)))
    for url in (*PAGES, *(u for page in PAGES for u in links(client.get(page).text))):
        assert client.get(url).status_code == 200, url
    assert client.get("/docs/assets/nothing-here.js").status_code == 404
    assert client.head("/docs").status_code == 200  # FastAPI's own /docs answered HEAD too
    paths = app.openapi()["paths"]
    assert not [p for p in paths if p.startswith(("/docs", "/redoc"))]
