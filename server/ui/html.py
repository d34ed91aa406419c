"""HTML helpers of the status page: escaping, links under the proxy's path prefix, the page
layout. Every value that reaches the page goes through `e()` (html.escape, quotes included)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from server.ui.views import ago, when

STATIC = "/ui/static"
ACTION_TEXT = {"ok": "ok", "rebalance": "rebalance", "avoid": "avoid", "drain": "drain"}


def e(value: Any) -> str:
    return escape("" if value is None else str(value))


class Links:
    """URLs of the page's views under `prefix` (a reverse proxy's root_path)."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix.rstrip("/")

    def _url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return self.prefix + path + ("?" + urlencode(q) if q else "")

    def fleet(self, cluster: str | None = None) -> str:
        return self._url("/ui", {"cluster": cluster})

    def episode(self, episode_id: int) -> str:
        return self._url(f"/ui/episodes/{int(episode_id)}")

    def node(self, cluster: str, node: str) -> str:
        return self._url(f"/ui/nodes/{quote(node, safe='')}", {"cluster": cluster})

    def static(self, name: str) -> str:
        return self._url(f"{STATIC}/{name}")

    def login(self, next_url: str | None = None) -> str:
        return self._url("/ui/login", {"next": next_url})

    def logout(self) -> str:
        return self._url("/ui/logout")

    def api(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        return self._url(path, query)


def a(href: str, text: Any, **attrs: Any) -> str:
    extra = "".join(f' {k.rstrip("_").replace("_", "-")}="{e(v)}"' for k, v in attrs.items() if v is not None)
    return f'<a href="{e(href)}"{extra}>{e(text)}</a>'


def badge(text: str, kind: str) -> str:
    return f'<span class="badge b-{e(kind)}">{e(text)}</span>'


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], *, css: str = "", empty: str = "none") -> str:
    """Cells are HTML already (escape what goes into them); a wrapper scrolls on small screens."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if not body:
        return f'<p class="empty">{e(empty)}</p>'
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    return f'<div class="scroll"><table class="{e(css)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def stamp(ts: float | None, now: float | None = None) -> str:
    """A sample time as UTC text, and how long before the cluster's now, in a <time>."""
    if ts is None:
        return "—"
    rel = ago(ts, now)
    return f'<time datetime="{e(when(ts))}">{e(when(ts))}</time>' + (f' <span class="ago">({e(rel)} ago)</span>' if rel else "")


def page(title: str, body: str, links: Links, *, refresh: int = 0, signed_in: bool = False, notice: str = "", nav: str = "") -> str:
    """The whole document. `refresh` > 0: ui.js reloads <main> that often (seconds); without
    JavaScript a <meta refresh> reloads the page."""
    meta = f'<noscript><meta http-equiv="refresh" content="{int(refresh)}"></noscript>' if refresh > 0 else ""
    logout = (f'<form method="post" action="{e(links.logout())}" class="logout"><button type="submit">sign out</button></form>'
              if signed_in else "")
    updated = time.strftime("%H:%M:%S", time.gmtime())
    banner = f'<p class="notice">{e(notice)}</p>' if notice else ""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)} · Laggard</title>
<link rel="stylesheet" href="{e(links.static('ui.css'))}">
<link rel="icon" href="{e(links.static('icon.svg'))}" type="image/svg+xml">
<script src="{e(links.static('ui.js'))}" defer></script>
{meta}
</head>
<body data-refresh="{int(refresh)}">
<header class="top">
<a class="brand" href="{e(links.fleet())}">Laggard</a>
<nav>{a(links.fleet(), 'Fleet')}{nav}</nav>
<span id="updated" class="updated" data-updated="0" title="page time (UTC)">updated {e(updated)} UTC</span>
{logout}
</header>
{banner}
<main id="main">
{body}
</main>
<footer>Read-only view of this collector · {a(links.api('/docs'), 'API docs')} · times are UTC sample times</footer>
</body>
</html>
"""
