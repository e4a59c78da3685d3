"""The documentation site as built and as a reader sees it: ``mkdocs build --strict`` succeeds (a broken link,
anchor or cross-reference fails it); the API pages hold the docstrings of ``Embedder``, ``Elmo``, ``BiLM``,
``ScalarMix``, ``batch_to_ids`` and ``load_exported``; and in headless Chromium (Debian's ``chromium`` and
``chromium-driver`` through selenium, as ``test_serve_page.py``) the site served on loopback leads from its home
page through the navigation to ``Embedder``'s API entry, and its search finds "苹果" and "bank" (and 发布会, which
stands only inside 苹果发布会: the index holds Chinese text as words, ``mkdocs.yml``).

``.ci/run`` builds the site once (``mkdocs build --strict``) and names it in ``ELMOKIT_DOCS_SITE``; without it this
module builds its own. The browser test skips with the reason when the browser is missing, unless
``ELMOKIT_REQUIRE_BROWSER=1``, which fails instead."""

from __future__ import annotations

import ast
import functools
import html
import http.server
import inspect
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from test_serve_page import _browser_or_skip, _wait
from test_serve_page import browser as browser  # noqa: F401 (the fixture)

REPO = Path(__file__).resolve().parent.parent
DOCSTRINGS = {
    "reference/api/elmokit/index.html": ["Embedder", "Elmo", "BiLM", "ScalarMix", "batch_to_ids"],
    "reference/api/export/index.html": ["load_exported"],
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    given = os.environ.get("ELMOKIT_DOCS_SITE")
    if given:
        path = Path(given)
        assert (path / "index.html").is_file(), f"ELMOKIT_DOCS_SITE={given} holds no built site"
        return path
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site") / "site"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _text(page: str) -> str:
    """A page's text without tags or whitespace (inline markup such as ``<code>BiLM</code>,`` leaves no gap)."""
    return "".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())


def _first_sentence(obj) -> str:
    doc = inspect.getdoc(obj)
    first = re.split(r"(?<=[.:])\s", " ".join(doc.split()), maxsplit=1)[0]
    role = r":(?:class|func|meth|mod|data|attr|exc):`(~?)([^`]+)`"  # shown as code: ~ keeps the last name only
    first = re.sub(role, lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), first)
    return first.replace("``", "").replace("`", "")


def test_api_pages_show_the_docstrings(site):
    import elmokit
    import elmokit.export

    for page, names in DOCSTRINGS.items():
        source = (site / page).read_text(encoding="utf-8")
        text = _text(source)
        module = elmokit.export if "export" in page else elmokit
        for name in names:
            assert f'id="{module.__name__}.{name}"' in source, f"{name}: no API entry on {page}"
            first = "".join(_first_sentence(getattr(module, name)).split())
            assert first in text, f"{name}: its docstring is not on {page}"


PUBLIC = {  # the packages whose __all__ an API page renders whole
    "elmokit": "elmokit",
    "elmokit.embedding": "embedding",
    "elmokit.pretraining": "pretraining",
    "elmokit.serving": "serving",
    "elmokit.export": "export",
    "elmokit.compat.allennlp": "compat",
    "elmokit.compat.efml": "compat",
    "elmokit.compat.simple_elmo": "compat",
    "elmokit.integrations.flair": "compat",
    "elmokit.integrations.spacy": "compat",
    "elmokit.integrations.hub": "compat",
    "elmokit.integrations.ray": "compat",
}


def _static_all(module: str) -> list[str]:
    """A module's ``__all__`` read from its source (nothing imported: flair, fastapi may be missing)."""
    path = REPO / "src" / Path(*module.split("."))
    source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no literal __all__")


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_api_pages_have_an_entry_for_every_public_name(site, module):
    source = (site / "reference" / "api" / PUBLIC[module] / "index.html").read_text(encoding="utf-8")
    names = _static_all(module)
    assert names
    ids = set(re.findall(r'id="([\w.]+)"', source))
    # the entry of the package's name, or of the module that defines it (a lazily exported name)
    missing = [
        n for n in names if not any(i == f"{module}.{n}" or re.fullmatch(rf"{module}(\.\w+)+\.{n}", i) for i in ids)
    ]
    assert not missing, f"{module}: no API entry for {missing}"


def test_the_four_parts_and_the_generated_reference_are_built(site):
    for part in ("tutorials", "how-to", "reference", "explanation"):
        assert (site / part / "index.html").is_file(), part
    cli = _text((site / "reference" / "cli" / "index.html").read_text(encoding="utf-8"))
    assert "elmokitembed" in cli and "--max-batch-tokens" in cli and "elmokitzoobuild" in cli
    assert (site / "reference" / "openapi.json").is_file()
    assert (site / "results" / "senses-bank.png").is_file()  # the measured plots come from experiments/results


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _click(driver, text: str) -> None:
    """Click the first visible link whose text is ``text`` (the sidebar's, the page's, the table of contents')."""
    for link in driver.find_elements("css selector", "a"):
        if link.is_displayed() and " ".join(link.text.split()) == text:
            link.click()
            return
    raise AssertionError(f"no visible link {text!r} on {driver.current_url}")


def test_navigation_leads_to_embedders_api_entry(browser, served):  # noqa: F811 (the fixture)
    _browser_or_skip()
    browser.get(served + "/")
    _wait(browser, "return document.readyState === 'complete'")
    _click(browser, "Reference")
    _click(browser, "Python API")
    _click(browser, "elmokit")
    assert browser.current_url.endswith("/reference/api/elmokit/"), browser.current_url
    _click(browser, "Embedder")  # the page's table of contents
    assert browser.current_url.endswith("#elmokit.Embedder"), browser.current_url
    entry = browser.find_element("id", "elmokit.Embedder")
    assert entry.is_displayed()
    body = browser.find_element("css selector", "article").text
    assert "Embed tokenised sentences with a (frozen) BiLM" in body


# 发布会 stands only inside 苹果发布会 (on the quickstart tutorial): found because the index holds Chinese text as
# jieba's words (mkdocs.yml's search separator); without that, it has no usable token for Chinese text at all
@pytest.mark.parametrize(
    ("query", "page"),
    [("苹果", "tutorials/polysemy/"), ("bank", "tutorials/polysemy/"), ("发布会", "tutorials/quickstart/")],
)
def test_search_finds(query, page, browser, served):  # noqa: F811 (the fixture)
    _browser_or_skip()
    browser.get(served + "/")
    _wait(browser, "return document.readyState === 'complete'")
    box = browser.find_element("css selector", "input.md-search__input")
    box.click()  # the header's search field (a 1280-pixel window shows it)
    box.send_keys(query)
    _wait(browser, "return document.querySelectorAll('.md-search-result__item').length > 0", timeout=30)
    items = browser.find_elements("css selector", ".md-search-result__item")
    links = [a.get_attribute("href") for item in items for a in item.find_elements("css selector", "a")]
    assert any(f"/{page}" in link for link in links), links
    meta = browser.find_element("css selector", ".md-search-result__meta").text
    assert re.search(r"\d+ matching document", meta), meta
