"""Headless Chromium for the status page's tests and screenshots: Debian's `chromium` (installed by
.ci/run, never downloaded by `playwright install`) driven by Playwright for Python, on a fresh
profile, with every request URL, console error and page error recorded."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

CHROMIUM = os.environ.get("LAGGARD_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def missing() -> str | None:
    """Why the browser cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium chromium-driver)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install -e '.[dev]')"
    return None


@dataclass
class Recorder:
    """Everything the pages asked for and every JavaScript complaint, across all pages of a context."""

    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    # Chromium logs an HTTP error status of any load as a console error ("Failed to load
    # resource"): kept apart, so that a test can expect the one its step provokes.
    http_errors: list[str] = field(default_factory=list)

    def attach(self, context) -> None:
        context.on("request", lambda r: self.requests.append(r.url))
        context.on("requestfailed", lambda r: self.failed.append(f"{r.url}: {r.failure}"))
        context.on("page", self._page)
        for page in context.pages:
            self._page(page)

    def _page(self, page) -> None:
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.page_errors.append(str(exc)))

    def _console(self, message) -> None:
        if message.type != "error":
            return
        if message.text.startswith("Failed to load resource: the server responded with a status of"):
            self.http_errors.append(f"{message.location.get('url')}: {message.text}")
        else:
            self.console_errors.append(f"{message.text} ({message.location})")

    def off_host(self, base_url: str) -> list[str]:
        return [u for u in self.requests if not (u == base_url or u.startswith(base_url.rstrip("/") + "/"))]

    def javascript_errors(self) -> list[str]:
        return self.console_errors + self.page_errors


@contextlib.contextmanager
def chromium(viewport: dict[str, int] = LAPTOP) -> Iterator[tuple[object, Recorder]]:
    """A browser context on a fresh --user-data-dir, and its recorder."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="laggard-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=FLAGS, viewport=viewport)
            recorder = Recorder()
            recorder.attach(context)
            try:
                yield context, recorder
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
