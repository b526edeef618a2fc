"""`make screenshots`: the built docs site's home page and one tutorial page, photographed with the suite's
browser (Debian's Chromium at /usr/bin/chromium, driven by Playwright as tests/test_serve.py drives it) into
docs/images/site-home.png and docs/images/site-tutorial.png, which are committed. The tests never run this:
they write nothing into the tree.

    python docs/_ext/screenshots.py build/docs/html docs/images

The pages are read from the built files (file:// URLs): nothing is served and nothing is fetched.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
PAGES = {"site-home.png": "index.html", "site-tutorial.png": "tutorials/translation.html"}  # picture -> page
VIEWPORT = {"width": 1280, "height": 960}  # the top of each page, as a reader's window shows it


def take(html: Path, out: Path) -> list[Path]:
    """Photograph each page of ``PAGES`` under the built site ``html`` into ``out``; the paths written."""
    from playwright.sync_api import sync_playwright

    missing = [str(html / page) for page in PAGES.values() if not (html / page).is_file()]
    if missing:
        raise SystemExit(f"error: {missing[0]} does not exist; build the site first (make docs)")
    if not CHROMIUM.exists():
        raise SystemExit(f"error: {CHROMIUM} is missing; `make install` installs Debian's chromium package")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page(viewport=VIEWPORT)
            for picture, name in PAGES.items():
                page.goto((html / name).resolve().as_uri())
                page.wait_for_load_state("load")
                target = out / picture
                staged = target.with_name(f".{target.name}.partial.png")  # then renamed: no half-written picture
                page.screenshot(path=str(staged))
                staged.replace(target)
                written.append(target)
        finally:
            browser.close()
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python docs/_ext/screenshots.py BUILT_HTML_DIR OUT_DIR")
    for path in take(Path(sys.argv[1]), Path(sys.argv[2])):
        print(path)
