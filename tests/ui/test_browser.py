"""The status page in a real headless Chromium (Debian's, through Playwright: tests/ui/browser.py)
against a collector with authentication on, fed by a simulated fleet whose faults were injected
after a healthy while (tests/ui/fleet.py): sign in through the form (an agent token is refused,
a read token works), the flagged GPUs in the grid, idle GPUs apart from slow ones, an episode's
chart with the GPU's line, its peers' band and the reason bits, the node's hint and what the
schedulers are told, the generatorURL landing, the live refresh, a phone-sized screen. Every
request must stay on the collector, and any JavaScript error (console or uncaught) fails it.

Under CI (env CI set) a missing Chromium or Playwright fails the test instead of skipping it."""

from __future__ import annotations

import os
import re

import pytest

from tests.ui import browser
from tests.ui.fleet import EXPECTED_GPUS, EXPECTED_NODES, IDLE, started


@pytest.fixture(scope="module")
def chromium_ready():
    why = browser.missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"the browser test needs Chromium and Playwright under CI: {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def fleet(chromium_ready, tmp_path_factory):
    f = started(str(tmp_path_factory.mktemp("ui") / "laggard.db"), healthy_s=12.0)
    yield f
    f.close()


def cells(page, selector: str) -> list[tuple[str, int, str | None]]:
    return [(n, int(g), c) for n, g, c in page.eval_on_selector_all(
        selector, "els => els.map(e => [e.dataset.node, e.dataset.gpu, e.dataset.cause || null])")]


def test_the_status_page_in_a_real_browser(fleet):
    with browser.chromium(browser.LAPTOP) as (context, rec):
        page = context.pages[0]

        def clean(step: str) -> None:
            assert rec.javascript_errors() == [], f"{step}: JavaScript errors {rec.javascript_errors()}"
            assert rec.off_host(fleet.url) == [], f"{step}: requests off the collector {rec.off_host(fleet.url)}"
            assert rec.failed == [], f"{step}: failed requests {rec.failed}"
            assert rec.http_errors == [], f"{step}: error statuses {rec.http_errors}"

        # Sign in: the form refuses an agent token, takes a read token.
        page.goto(f"{fleet.url}/ui")
        assert "/ui/login" in page.url and page.locator("form.login").is_visible()
        page.fill("#token", fleet.token("agent", cluster="sim"))
        page.click("form.login button")
        assert "lacks the read scope" in page.locator(".error").inner_text()
        assert [e.split(": ", 1)[0] for e in rec.http_errors] == [f"{fleet.url}/ui/login"] and "403" in rec.http_errors[0]
        rec.http_errors.clear()  # the refusal this step asked for
        page.fill("#token", fleet.read_token)
        page.click("form.login button")
        page.wait_for_selector(".cluster")
        assert page.url == f"{fleet.url}/ui"
        clean("sign in")

        # The fleet: every injected fault flagged where it was injected; idle GPUs shown as idle.
        flagged = {(n, g): c for n, g, c in cells(page, "a.gpu[data-state=flagged]")}
        assert {k: flagged.get(k) for k in EXPECTED_GPUS} == EXPECTED_GPUS, flagged
        for node, cause in EXPECTED_NODES.items():
            assert page.locator(f'.node-row[data-node="{node}"] .node-name a.badge', has_text=cause).count() == 1
        idle = {(n, g) for n, g, _ in cells(page, "a.gpu[data-state=idle]")}
        assert {("sim-node-4", g) for g in IDLE[4]} <= idle
        idle_look = page.eval_on_selector('a.gpu[data-state=idle]', "e => getComputedStyle(e).backgroundImage")
        slow_look = page.eval_on_selector('a.gpu[data-state=flagged]', "e => getComputedStyle(e).backgroundColor")
        assert "repeating-linear-gradient" in idle_look and slow_look == "rgb(198, 40, 40)"
        assert page.locator("#capacity .big").inner_text().endswith("%")
        clean("fleet")

        # The thermal GPU's episode: its SM clock against its peers' median and band, reason bits marked.
        page.click('a.gpu[data-node="sim-node-1"][data-gpu="3"]')
        page.wait_for_url(re.compile(r".*/ui/episodes/\d+$"))
        assert "thermal" in page.locator("h1").inner_text()
        first = page.locator("svg.chart").first
        assert "SM clock" in first.locator("title").first.text_content()
        assert int(first.locator("path.gpu-line").get_attribute("data-points")) >= 5
        assert int(first.locator("path.peer-band").get_attribute("data-points")) >= 5
        assert first.locator("path.peer-band").get_attribute("d").startswith("M")
        assert first.locator("path.peer-median").count() == 1
        assert first.locator('rect.reason-span[data-reason="HW thermal slowdown"]').count() >= 1
        assert first.locator("g.mark").count() >= 1
        line_box = first.locator("path.gpu-line").bounding_box()
        # Drawn, and visibly dropping at the onset: healthy at its peers' clock before, far below after.
        assert line_box["width"] > 50 and line_box["height"] > 50, line_box
        episode_url = page.url
        clean("episode")

        # Its node: the hint and what Slurm and Kubernetes are told.
        page.click("text=what the schedulers are told")
        page.wait_for_url(re.compile(r".*/ui/nodes/sim-node-1\?cluster=sim$"))
        sched = page.locator("dl.sched").inner_text()
        assert "laggard.io/straggler=thermal" in sched and "Weight raised" in sched
        assert page.locator("#gpu-3").count() == 1 and page.locator("table.nics-table tbody tr").count() == 8
        clean("node")

        # An alert's generatorURL query (cluster, node) lands on the episode's page.
        page.goto(f"{fleet.url}/ui/stragglers?cluster=sim&node=sim-node-1")
        assert page.url == episode_url
        clean("generatorURL")

        # Live: the page refreshes itself.
        page.goto(f"{fleet.url}/ui?refresh=1")
        page.wait_for_function("() => Number(document.getElementById('updated').dataset.updated) >= 2", timeout=20_000)
        assert page.locator("a.gpu[data-state=flagged]").count() >= len(EXPECTED_GPUS)
        clean("refresh")

        # A phone: nothing wider than the screen; the chart scales down.
        page.set_viewport_size(browser.PHONE)
        for url in (f"{fleet.url}/ui?refresh=0", f"{episode_url}?refresh=0"):
            page.goto(url)
            width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            assert width[0] <= width[1], (url, width)
        assert page.locator("svg.chart").first.bounding_box()["width"] <= browser.PHONE["width"]
        clean("phone")

        # Sign out: the page asks for a token again.
        page.click("form.logout button")
        page.wait_for_url(re.compile(r".*/ui/login$"))
        page.goto(f"{fleet.url}/ui")
        assert "/ui/login" in page.url
        clean("sign out")
        assert rec.requests and all(u.startswith(fleet.url) for u in rec.requests)
