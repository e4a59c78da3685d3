"""The polysemy page in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by selenium;
no browser is downloaded): it loads, takes typed sentences, a click on "bank" draws one heatmap per layer whose numbers
(read from the DOM) are ``POST /similar``'s, and the bundled example does the same; a screenshot is saved and is not
blank. Skipped with the reason when the browser is missing, unless ``ELMOKIT_REQUIRE_BROWSER=1`` (set by ``.ci/run``),
which fails instead. ``ELMOKIT_SERVE_SCREENSHOT=PATH`` also writes the screenshot there (the serving tutorial's,
docs/serve-page.png), of the model ``ELMOKIT_SERVE_SCREENSHOT_MODEL`` names (default: the tiny random one)."""

from __future__ import annotations

import os
import shutil

import httpx
import numpy as np
import pytest

from conftest import skip_unless_required
from elmokit.serving.settings import ServeSettings
from serve_helpers import running_server, save_tiny_model

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1100",
)
TYPED = [
    "They walked along the bank of the river .",
    "The bank raised interest rates .",
    "Fishermen sat on the grassy bank .",
]


def _browser_or_skip():
    """selenium's webdriver module, or skip (fail under ELMOKIT_REQUIRE_BROWSER=1) naming what is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        from selenium import webdriver  # optional: the test extra
    except ImportError:
        webdriver, missing = None, [*missing, "the selenium package (pip install -e '.[test]')"]
    if missing:
        msg = f"the browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        skip_unless_required(msg, "BROWSER")
    return webdriver


@pytest.fixture(scope="module")
def page_server(tmp_path_factory):
    # ELMOKIT_SERVE_SCREENSHOT_MODEL: a trained model (e.g. elmokit-en) for the serving tutorial's screenshot
    model = os.environ.get("ELMOKIT_SERVE_SCREENSHOT_MODEL") or save_tiny_model(
        tmp_path_factory.mktemp("serve_page") / "model"
    )
    with running_server(ServeSettings(model=str(model))) as (url, _):
        yield url


@pytest.fixture
def browser(tmp_path, monkeypatch):
    webdriver = _browser_or_skip()
    from selenium.webdriver.chrome.service import Service  # optional: the test extra

    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium's manager never downloads anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _wait(driver, script: str, timeout: float = 20.0):
    from selenium.webdriver.support.ui import WebDriverWait  # optional: the test extra

    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(script))


def _heatmaps(driver) -> dict[str, np.ndarray]:
    """Each layer's matrix as the page's cells hold it (``data-value`` of each ``td``)."""
    out = {}
    for table in driver.find_elements("css selector", "table.heatmap"):
        cells = table.find_elements("css selector", "td")
        n = int(round(len(cells) ** 0.5))
        m = np.zeros((n, n))
        for td in cells:
            m[int(td.get_attribute("data-i")), int(td.get_attribute("data-j"))] = float(td.get_attribute("data-value"))
        out[table.get_attribute("data-layer")] = m
    return out


def _click_token(driver, sentence: int, word: str) -> None:
    for span in driver.find_elements("css selector", f'span.tok[data-sentence="{sentence}"]'):
        if span.text == word:
            span.click()
            return
    raise AssertionError(f"no token {word!r} in sentence {sentence} on the page")


def _same_as_similar(driver, url: str, body: dict) -> dict[str, np.ndarray]:
    _wait(driver, "return document.body.dataset.ready === '1'")
    shown = _heatmaps(driver)
    want = httpx.post(f"{url}/similar", json=body).json()
    assert list(shown) == list(want["layers"]) == ["0 (static)", "1", "2", "average"]
    for name, layer in want["layers"].items():
        assert np.array_equal(shown[name], np.array(layer["cosine"])), name
    return shown


def test_the_page_draws_similars_numbers_for_a_clicked_word(browser, page_server, tmp_path):
    browser.get(page_server + "/")
    _wait(browser, "return document.body.dataset.loaded === '1'")
    box = browser.find_element("id", "text")
    box.clear()
    box.send_keys("\n".join(TYPED))
    browser.find_element("id", "show").click()
    _click_token(browser, 1, "bank")
    shown = _same_as_similar(browser, page_server, {"word": "bank", "sentences": [s.split() for s in TYPED]})
    assert shown["0 (static)"].shape == (3, 3) and np.allclose(shown["0 (static)"], 1.0, atol=1e-6)
    assert len(browser.find_elements("css selector", "svg.proj circle")) == 4 * 3  # 4 panels x 3 occurrences
    assert len(browser.find_elements("css selector", "span.tok.hit")) == 3

    # the bundled example (labelled): its heatmaps and the within/across summary
    examples = httpx.get(f"{page_server}/examples").json()
    browser.execute_script("document.body.dataset.ready = ''")
    browser.find_element("css selector", 'button[data-example="bank"]').click()
    _click_token(browser, 0, "bank")
    body = {"word": "bank", "sentences": examples["bank"]["sentences"], "labels": examples["bank"]["labels"]}
    _same_as_similar(browser, page_server, body)
    assert "gap" in browser.find_element("css selector", 'div.layer[data-layer="2"] .summary').text

    shot = tmp_path / "polysemy-page.png"
    assert browser.save_screenshot(str(shot))
    from PIL import Image  # optional: matplotlib's dependency (the plots extra)

    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int64)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 200
    colours = np.unique(pixels.reshape(-1, 3) @ np.array([1 << 16, 1 << 8, 1]))
    assert len(colours) > 50 and pixels.std() > 20  # text, heatmap cells and dots, not a blank page
    if os.environ.get("ELMOKIT_SERVE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["ELMOKIT_SERVE_SCREENSHOT"])
