"""Who sees the status page, over real HTTP with authentication on: the read API's rule (read or
admin scope) whether the token comes as a bearer header or from the session cookie the login
form sets; an agent or scheduler token is refused, and so is a revoked one; the cookie opens
the page only, never the JSON API; under --insecure the page is open."""

from __future__ import annotations

import httpx
import pytest

from server.auth.store import revoke_token
from server.auth.tokens import key_id_of
from server.settings import Settings
from server.ui.auth import COOKIE, safe_next
from tests.auth.conftest import SecureCollector


@pytest.fixture
def collector(sqlite_url):
    c = SecureCollector(Settings(database_url=sqlite_url, insecure=False, token_cache_s=0, detection_enabled=False, retention_interval_s=3600))
    yield c
    c.close()


def browser(c: SecureCollector) -> httpx.Client:
    return httpx.Client(base_url=c.url, timeout=30, follow_redirects=False)


def login(client: httpx.Client, token: str, next_url: str | None = None) -> httpx.Response:
    form = {"token": token} | ({"next": next_url} if next_url else {})
    return client.post("/ui/login", data=form)


def test_without_a_token_a_browser_is_sent_to_the_login_form(collector):
    with browser(collector) as b:
        r = b.get("/ui/nodes/n1?cluster=prod")
        assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=%2Fui%2Fnodes%2Fn1%3Fcluster%3Dprod"
        form = b.get(r.headers["location"])
        assert form.status_code == 200 and 'name="token"' in form.text and 'value="/ui/nodes/n1?cluster=prod"' in form.text
        assert b.get("/ui/static/ui.css").status_code == 200  # the login form's own assets need no token


@pytest.mark.parametrize("scopes, status", [(("read",), 200), (("admin",), 200), (("agent",), 403), (("scheduler",), 403)])
def test_a_bearer_token_opens_the_page_with_the_read_scope_only(collector, scopes, status):
    token = collector.token(*scopes, cluster="prod" if "agent" in scopes else None)
    with collector.client(token) as c:
        r = c.get("/ui")
        assert r.status_code == status and r.headers["content-type"].startswith("text/html")
        if status == 403:
            assert "lacks the scope read" in r.text and 'class="gpu' not in r.text


def test_a_bad_bearer_token_is_401_not_a_redirect(collector):
    with collector.client("lgd_000000000000_nonsense") as c:
        r = c.get("/ui", follow_redirects=False)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")


def test_the_login_form_refuses_an_agent_token_and_keeps_a_read_token_in_an_http_only_cookie(collector):
    agent, read = collector.token("agent", cluster="prod"), collector.token("read")
    with browser(collector) as b:
        refused = login(b, agent)
        assert refused.status_code == 403 and "lacks the read scope" in refused.text and "set-cookie" not in refused.headers
        assert login(b, "lgd_000000000000_nonsense").status_code == 401
        assert b.get("/ui").status_code == 303
        r = login(b, read, "/ui/nodes/n1?cluster=prod")
        assert r.status_code == 303 and r.headers["location"] == "/ui/nodes/n1?cluster=prod"
        cookie = r.headers["set-cookie"].lower()
        assert cookie.startswith(f"{COOKIE}=") and "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
        assert "max-age" not in cookie and "expires" not in cookie  # a session cookie
        assert b.get("/ui").status_code == 200
        assert b.get("/ui/login").status_code == 303  # signed in already: on to the page
        # The cookie is the page's only: the JSON API still wants a bearer token.
        assert b.get("/api/v1/nodes").status_code == 401
        out = b.post("/ui/logout")
        assert out.status_code == 303 and f'{COOKIE}=""' in out.headers["set-cookie"]
        assert b.get("/ui").status_code == 303


def test_a_revoked_token_stops_opening_the_page_and_its_cookie_is_dropped(collector):
    read = collector.token("read")
    with browser(collector) as b:
        assert login(b, read).status_code == 303 and b.get("/ui").status_code == 200
        with collector.engine.begin() as conn:
            assert revoke_token(conn, key_id=key_id_of(read))
        r = b.get("/ui")
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
        assert f'{COOKIE}=""' in r.headers["set-cookie"]


def test_the_login_form_goes_nowhere_but_this_page(collector):
    read = collector.token("read")
    with browser(collector) as b:
        for evil in ("https://evil.example/ui", "//evil.example/ui", "/api/v1/tokens", "/ui\\@evil", "javascript:alert(1)"):
            assert login(b, read, evil).headers["location"] == "/ui", evil
    assert safe_next("/ui/episodes/3", "") == "/ui/episodes/3" and safe_next(None, "/p") == "/p/ui"
    assert safe_next("/p/ui/nodes/x", "/p") == "/p/ui/nodes/x" and safe_next("/ui/nodes/x", "/p") == "/p/ui"


def test_under_insecure_the_page_is_open(sqlite_url):
    c = SecureCollector(Settings(database_url=sqlite_url, insecure=True, detection_enabled=False, retention_interval_s=3600))
    try:
        with browser(c) as b:
            r = b.get("/ui")
            assert r.status_code == 200 and "Authentication is off" in r.text and "sign out" not in r.text
            assert b.get("/ui/login").status_code == 303
    finally:
        c.close()
