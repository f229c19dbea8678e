"""The documentation site in a real browser: Debian's Chromium, driven by chromedriver through
selenium, opens the home page, the notes on the paper and tutorials 05 and 14 from the site
tests/test_site.py checks (one build per session: the `site` fixture in tests/conftest.py).

The site is served as a learner is told to serve it (`python -m http.server -d
build/docs/site`, here on 127.0.0.1 and a free port): Material's search loads its index with a
request that a browser refuses to a page opened from file://. Each page must log no console
error, load every image, show every figure its notebook announced, and the search box must
find "staleness". The one console error allowed is the failed request for MathJax from its CDN
(docs/build.py's MATHJAX_URL: the tests run offline; a learner online typesets the equations).
Screenshots land in the test's temporary folder; their paths are printed (pytest -s)."""

from __future__ import annotations

import functools
import json
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from site_pages import figures_announced

pytestmark = pytest.mark.slow  # the site's build (shared with test_site.py), then ~10 s here

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
if not CHROMIUM or not CHROMEDRIVER:  # at import: before the session builds the site for us
    pytest.skip(
        "no chromium/chromedriver: apt-get install chromium chromium-driver",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium: the dev extra")
MATHJAX_HOST = "cdn.jsdelivr.net/npm/mathjax@"  # the one request allowed to fail (offline)
PAGES = {
    "home": "index.html",
    "paper": "paper.html",
    "05": "tutorials/05_pipe_sgd.html",
    "14": "tutorials/14_where_staleness_costs_accuracy.html",
}
WAIT_S = 20


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")  # wide enough for the header's search box
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on 127.0.0.1 (a free port); yields its base URL."""
    handler = functools.partial(QuietHandler, directory=str(site / "site"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


def open_page(driver, url: str) -> list[str]:
    """Load `url`, wait for it and its images; return its console errors, the CDN's aside."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(url)
    wait = WebDriverWait(driver, WAIT_S)
    wait.until(lambda d: d.execute_script("return document.readyState") == "complete")
    wait.until(lambda d: d.execute_script("return [...document.images].every(i => i.complete)"))
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    cdn = [m for m in errors if MATHJAX_HOST in m]
    assert len(cdn) <= 1, cdn
    return [m for m in errors if MATHJAX_HOST not in m]


def shoot(driver, tmp_path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")


@pytest.mark.parametrize("name", list(PAGES))
def test_a_page_loads_without_errors_and_with_every_image(browser, served, site, name, tmp_path):
    errors = open_page(browser, served + PAGES[name])
    assert not errors, f"{PAGES[name]}: console errors {errors}"
    broken = browser.execute_script(
        "return [...document.images].filter(i => !(i.naturalWidth > 0))"
        ".map(i => i.src.slice(0, 80))"
    )
    assert not broken, f"{PAGES[name]}: images that did not load: {broken}"
    shoot(browser, tmp_path, name)
    if name == "paper":  # the equations are marked for MathJax (typeset where it loads)
        assert len(browser.find_elements("css selector", ".arithmatex")) >= 12
    if name in ("05", "14"):
        stem = PAGES[name].removeprefix("tutorials/").removesuffix(".html")
        notebook = site / "pages" / "tutorials" / f"{stem}.ipynb"
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        figures = browser.find_elements("css selector", "article img[src^='data:image/png']")
        assert len(figures) == figures_announced(cells), f"{stem}: figures on the page"
        for img in figures:
            assert img.get_attribute("alt").startswith("Figure: "), img.get_attribute("alt")


def test_the_search_box_finds_staleness(browser, served, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    assert not open_page(browser, served + "index.html")
    box = browser.find_element("css selector", "input.md-search__input")
    assert box.is_displayed(), "the search box is hidden at 1400 px"
    box.click()
    box.send_keys("staleness")
    results = "li.md-search-result__item"
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_elements("css selector", results))
    found = browser.find_elements("css selector", results)
    meta = browser.find_element("css selector", ".md-search-result__meta").text
    shoot(browser, tmp_path, "search")
    print(f"search 'staleness': {meta}")
    assert found and "staleness" in found[0].text.lower(), [f.text[:80] for f in found[:3]]
