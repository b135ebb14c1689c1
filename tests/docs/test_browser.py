"""Every page of the built site in a real headless browser (Debian's chromium, driven by Playwright):
it renders without console errors, and every internal link and anchor resolves. External links are
listed, never fetched: every request off loopback is aborted."""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest
from support.needs import require

from .conftest import BuiltSite

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(built_site: BuiltSite) -> Iterator[str]:
    assert built_site.returncode == 0, built_site.log
    handler = functools.partial(QuietHandler, directory=str(built_site.directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the browser check needs Playwright: pip install -e '.[docs]'"
    if shutil.which(CHROMIUM) is None:
        return "the browser check needs Debian's chromium: apt-get install -y chromium"
    return None


def test_pages_render_and_links_resolve(built_site: BuiltSite, site_url: str) -> None:
    require(browser_missing(), "the docs browser check")
    from playwright.sync_api import Route, sync_playwright

    pages = sorted(
        p.relative_to(built_site.directory).as_posix() for p in built_site.directory.rglob("*.html")
    )
    pages = [p for p in pages if p != "404.html"]
    assert "index.html" in pages and "reference/sandboxes.html" in pages
    problems: list[str] = []
    internal: set[tuple[str, str]] = set()  # (page url without fragment, fragment)
    external: set[str] = set()
    blocked: list[str] = []

    def only_loopback(route: Route) -> None:
        if urlparse(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.route("**/*", only_loopback)
        page.on("console", lambda m: m.type == "error" and problems.append(f"{page.url}: console: {m.text}"))
        page.on("pageerror", lambda e: problems.append(f"{page.url}: {e}"))
        ids: dict[str, set[str]] = {}
        for name in pages:
            url = site_url + name
            response = page.goto(url)
            assert response is not None and response.status == 200, url
            assert page.locator("article h1").count() >= 1, f"{name}: no title rendered"
            ids[url] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
            for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
                target, fragment = urldefrag(href)
                if urlparse(target).hostname == "127.0.0.1":
                    internal.add((target, fragment))
                elif urlparse(target).scheme in ("http", "https"):
                    external.add(target)
        for target, fragment in sorted(internal):
            if target not in ids:
                path = Path(urlparse(target).path.lstrip("/"))
                response = page.goto(target)
                if response is None or response.status != 200:
                    problems.append(f"broken link: {target}")
                    continue
                ids[target] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
                assert path.suffix in ("", ".html", ".xml", ".json", ".css", ".js"), target
            if fragment and fragment not in ids[target]:
                problems.append(f"broken anchor: {target}#{fragment}")
        browser.close()
    print(f"\n{len(pages)} pages, {len(internal)} internal links; external links (not fetched):")
    for url in sorted(external):
        print(f"  {url}")
    assert not problems, "\n".join(problems)
    assert not blocked, f"the site fetched off loopback: {blocked}"
