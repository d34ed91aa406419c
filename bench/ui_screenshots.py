"""Screenshots of the status page (/ui) for the README, taken by headless Chromium (Debian's, through
Playwright: tests/ui/browser.py) against a collector fed by a simulated fleet that runs healthy for a
while and then gets its faults (tests/ui/fleet.py). Writes, under --out (docs/img):

  ui-fleet.png      the fleet grid, laptop width
  ui-straggler.png  the thermal GPU's episode: its SM clock against its peers' band, reason bits
  ui-node.png       that GPU's node: GPUs, ports, hint, what Slurm and Kubernetes are told
  ui-phone.png      the fleet on a phone-sized screen

    .venv/bin/python -m bench.ui_screenshots [--out docs/img] [--healthy 90] [--after 60]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.ui.browser import LAPTOP, PHONE, chromium, missing
from tests.ui.fleet import started

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--healthy", type=float, default=90.0, help="seconds the fleet runs healthy before the faults")
    parser.add_argument("--after", type=float, default=60.0, help="seconds after the faults are flagged before the screenshots")
    args = parser.parse_args(argv)
    why = missing()
    if why:
        print(f"ui_screenshots: {why}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        fleet = started(f"{tmp}/laggard.db", healthy_s=args.healthy)
        try:
            time.sleep(args.after)
            shoot(fleet, args.out)
        finally:
            fleet.close()
    return 0


def shoot(fleet, out: Path) -> None:
    with chromium(LAPTOP) as (context, recorder):
        page = context.pages[0]
        page.goto(f"{fleet.url}/ui?refresh=0")
        if page.locator("form.login").count():
            page.fill("#token", fleet.read_token)
            page.click("form.login button")
            page.wait_for_selector(".cluster")
        page.screenshot(path=str(out / "ui-fleet.png"), full_page=True)
        page.click('a.gpu[data-node="sim-node-1"][data-gpu="3"]')
        page.wait_for_selector("svg.chart path.gpu-line")
        page.goto(page.url + "?refresh=0")
        page.screenshot(path=str(out / "ui-straggler.png"), full_page=True)
        page.goto(f"{fleet.url}/ui/nodes/sim-node-1?cluster=sim&refresh=0")
        page.screenshot(path=str(out / "ui-node.png"), full_page=True)
        page.set_viewport_size(PHONE)
        page.goto(f"{fleet.url}/ui?refresh=0")
        page.screenshot(path=str(out / "ui-phone.png"), full_page=False)
        problems = recorder.javascript_errors() + recorder.off_host(fleet.url)
        if problems:
            raise SystemExit(f"ui_screenshots: the pages misbehaved: {problems}")
    for name in ("ui-fleet", "ui-straggler", "ui-node", "ui-phone"):
        print(out / f"{name}.png")


if __name__ == "__main__":
    sys.exit(main())
