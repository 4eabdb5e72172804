"""Browser tests of the pages `appliance serve` answers: Playwright for Python driving Debian's Chromium
(/usr/bin/chromium; Playwright's own browser download cannot work offline). `make test` installs both
(Makefile); where either is missing these tests skip, saying which.

`open_page` opens a URL in a fresh browser context and records what would show a broken page: console
errors, failed requests, answers of 400 or more, and uncaught exceptions (`page.problems`); and the URL of
every request the page made, in order (`page.requested`). `screenshot` saves what a test sees; with
`--docs-screenshots` (`make screenshots`) it also replaces the pictures of README.md and docs/, so they
show the page as it is.
"""
import os
import shutil

import pytest

from tests.conftest import REPO

CHROMIUM = os.environ.get("APPLIANCE_TEST_CHROMIUM", "/usr/bin/chromium")
# Headless, and nothing that reaches for the network (this machine's network is closed: Chromium's
# background services would fill the log with refused connections).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 360, "height": 740}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="package")
def browser():
    """One Chromium for the browser tests, stopped after them: Playwright's sync API holds an event loop
    running in the main thread while it lives, where later tests' `asyncio.run` would fail."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (make test installs it)")
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (make test does it where it runs as root)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def open_page(browser):
    """open_page(url, viewport=DESKTOP, init_script=None) -> a Page with `.problems`, a list of what went
    wrong while it ran, and `.requested`, the URLs it asked for from the start; `init_script` runs in the
    page before its own scripts."""
    contexts = []

    def open_(url, viewport=DESKTOP, init_script=None):
        context = browser.new_context(viewport=viewport)
        contexts.append(context)
        page = context.new_page()
        page.problems = []
        page.requested = []
        page.on("request", lambda r: page.requested.append(r.url))
        page.on("console", lambda m: m.type == "error" and page.problems.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: page.problems.append(f"exception: {e}"))
        page.on("requestfailed", lambda r: page.problems.append(f"failed: {r.url} {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and page.problems.append(f"HTTP {r.status}: {r.url}"))
        if init_script:
            page.add_init_script(init_script)
        page.goto(url)
        return page

    yield open_
    for context in contexts:
        context.close()


@pytest.fixture
def screenshot(tmp_path, request):
    """screenshot(page, name, **options) -> the PNG's path in the test's directory; with --docs-screenshots
    also copied over docs/`name` (the README's and docs' pictures of the pages)."""
    def take(page, name, **options):
        path = tmp_path / name
        page.screenshot(path=path, **options)
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        if request.config.getoption("--docs-screenshots"):
            shutil.copyfile(path, REPO / "docs" / name)
        return path

    return take
