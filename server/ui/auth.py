"""Who may see the status page: the read API's rule (a token with the read scope; admin has
every scope; everyone under --insecure), the token taken from `Authorization: Bearer` or from
the session cookie that POST /ui/login sets.

The cookie holds the token itself, HttpOnly (no script reads it), SameSite=Strict (no other
site's page sends it), Path=/ui (the JSON API never sees it: the API keeps bearer tokens
only) and Secure when the page was reached over HTTPS. It has no Max-Age: it ends with the
browser session or at POST /ui/logout. A revoked token stops opening the page within the
token cache time, as for the API (server/auth/guard.py)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from server.auth.tokens import READ, Principal
from server.errors import ApiError
from server.services import services

COOKIE = "laggard_ui"
MAX_FORM_BYTES = 4096


def bearer(request: Request) -> str | None:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() or None if scheme.lower() == "bearer" else None


async def principal_of(request: Request, token: str | None) -> Principal:
    """The principal of `token` with the read scope, else ApiError (401, 403, 429, 503)."""
    auth = services(request).auth
    principal = await auth.principal(token)
    if not principal.allows(READ):
        raise ApiError(403, f"this token lacks the scope {READ}", loc=["header", "authorization"], type="forbidden")
    auth.throttle(principal)
    return principal


def safe_next(value: str | None, prefix: str) -> str:
    """Where to go after signing in: a path of this page only (no other host, no scheme)."""
    home = f"{prefix}/ui"
    if not value:
        return home
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or not value.startswith(home) or value.startswith("//") or "\\" in value:
        return home
    return value


async def form_token(request: Request) -> tuple[str | None, str | None]:
    """(token, next) from a urlencoded login form; python-multipart is not needed for two fields."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ApiError(413, "login form too large", type="too_large")
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=8)
    token = (fields.get("token") or [""])[0].strip() or None
    return token, (fields.get("next") or [None])[0]


def set_session(response: Response, request: Request, token: str, prefix: str) -> None:
    response.set_cookie(COOKIE, token, path=f"{prefix}/ui", httponly=True, samesite="strict", secure=request.url.scheme == "https")


def end_session(response: Response, prefix: str) -> None:
    response.delete_cookie(COOKIE, path=f"{prefix}/ui", httponly=True, samesite="strict")


def to_login(request: Request, prefix: str) -> RedirectResponse:
    """303 to the login form, which comes back here once signed in."""
    path, root = request.scope["path"], request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    query = request.scope.get("query_string", b"").decode("latin-1")
    here = prefix + path + (f"?{query}" if query else "")
    response = RedirectResponse(f"{prefix}/ui/login?{urlencode({'next': here})}", status_code=303)
    if request.cookies.get(COOKIE):
        end_session(response, prefix)  # a cookie that no longer opens the page: gone
    return response
