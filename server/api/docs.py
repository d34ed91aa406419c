"""The API's documentation pages, /docs (Swagger UI) and /redoc, with every script, stylesheet
and icon served by the collector itself: FastAPI's own pages load them from public CDNs and
are blank on an air-gapped cluster (issue #16 item 11). The files come from the
fastapi-offline package (server extra; only its static files are used): Swagger UI 5, the
first to render the OpenAPI 3.1 document FastAPI publishes, and ReDoc. Open to anyone, like
/openapi.json; left out of the schema."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse

from server.errors import ApiError

ASSETS = "/docs/assets"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
OPENAPI = "/openapi.json"
# Starlette adds "; charset=utf-8" to text types: the bundles hold UTF-8 and the Swagger UI
# page names no charset, so without it a browser reads them as Latin-1 and stops at a SyntaxError.
_MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
# The files change only with the package: a browser may keep them a day.
_CACHE = {"Cache-Control": "public, max-age=86400"}
_READ = ["GET", "HEAD"]  # as FastAPI's own /docs answered

router = APIRouter(include_in_schema=False)

# Found without importing the package's code: its files are all this module wants.
_FILES = {p.name: p for p in (Path(find_spec("fastapi_offline").origin).parent / "static").iterdir() if p.suffix in _MEDIA_TYPES}


def _prefix(request: Request) -> str:
    """Where the app is mounted, as FastAPI's own pages find it (a proxy's root_path)."""
    return request.scope.get("root_path", "").rstrip("/")


@router.api_route("/docs", methods=_READ)
def swagger_ui(request: Request) -> HTMLResponse:
    prefix = _prefix(request)
    return get_swagger_ui_html(
        openapi_url=prefix + OPENAPI,
        title=f"{request.app.title} - Swagger UI",
        oauth2_redirect_url=prefix + OAUTH2_REDIRECT,
        swagger_js_url=f"{prefix}{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{prefix}{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{prefix}{ASSETS}/favicon.png",
    )


@router.api_route(OAUTH2_REDIRECT, methods=_READ)
def swagger_ui_oauth2_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.api_route("/redoc", methods=_READ)
def redoc(request: Request) -> HTMLResponse:
    prefix = _prefix(request)
    return get_redoc_html(
        openapi_url=prefix + OPENAPI,
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{prefix}{ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{prefix}{ASSETS}/favicon.png",
        with_google_fonts=False,
    )


@router.api_route(ASSETS + "/{name}", methods=_READ)
def asset(name: str) -> FileResponse:
    path = _FILES.get(name)
    if path is None:
        raise ApiError(404, f"no documentation asset {name!r}", loc=["path", "name"], type="not_found")
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_CACHE)
