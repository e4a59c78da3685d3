"""The site's generated reference against the code it documents: the command-line page lists every ``elmokit``
subcommand and every option ``elmokit <cmd> --help`` shows, with its help text; the HTTP page's routes table covers
every route of the server's OpenAPI document; the API pages render every public name of the documented packages.
(The site's build and what a browser sees are ``test_docs_site.py``.)"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "tools" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()
COMMANDS = hooks.command_parsers()


def _words(text: str) -> str:
    return " ".join(text.split())


def _help_text(path: tuple[str, ...], capsys) -> str:
    """What ``elmokit <path> --help`` prints (the same parser the program builds)."""
    from elmokit.cli import build_parser

    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([*path, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def _listed_in_help(text: str) -> tuple[set[str], set[str]]:
    """The option strings (``-v``, ``--verbose``) and positional names that a ``--help`` text lists."""
    options, positionals, section = set(), set(), None
    for line in text.splitlines():
        if re.match(r"^\S.*:$", line):
            section = line[:-1]
            continue
        if not line.strip():
            section = None if section == "positional arguments" else section
            continue
        m = re.match(r"^  (\S.*?)(?:\s{2,}|$)", line)
        if not m or section is None:
            continue
        head = m.group(1)
        if head.startswith("-"):
            options.update(re.findall(r"(?:^|, )(--?[\w-]+)", head))
        elif section == "positional arguments":
            positionals.add(head)
    return options, positionals


def test_every_command_is_walked():
    names = {" ".join(path) for path, _, _ in COMMANDS}
    # the top-level commands the design lists, and the groups' subcommands
    for name in (
        "train",
        "perplexity",
        "score",
        "embed",
        "similar",
        "convert",
        "export",
        "info",
        "quickstart",
        "zoo build",
        "zoo list",
        "tag train",
        "tag predict",
        "tag evaluate",
        "classify train",
        "serve",
    ):
        assert name in names, name
    markdown = hooks.cli_markdown()
    for path, _, _ in COMMANDS:
        assert f"## `elmokit {' '.join(path)}` {{ #{hooks._anchor(path)} }}" in markdown


@pytest.mark.parametrize("path", [p for p, _, _ in COMMANDS], ids=lambda p: " ".join(p))
def test_cli_page_lists_every_option_of_help(path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one help text a line: nothing wrapped or hyphen-broken
    text = _help_text(path, capsys)
    parser = dict((p, parser) for p, parser, _ in COMMANDS)[path]
    rows = hooks.option_rows(parser)
    documented_options = {s for row in rows for s in re.findall(r"(?:^|, )(--?[\w-]+)", row["invocation"])}
    documented_positionals = {row["invocation"] for row in rows if not row["invocation"].startswith("-")}
    options, positionals = _listed_in_help(text)
    assert options and "--help" in options
    assert options == documented_options
    assert positionals == documented_positionals
    flat = _words(text)
    markdown = hooks.cli_markdown()
    for row in rows:
        assert _words(row["help"]) in flat, row["invocation"]  # the same help text as --help, %(default)s expanded
        assert f"- `{row['invocation']}`" in markdown
        if row["default"] is not None:
            assert f"default: {hooks._code(row['default'])}" in markdown


def test_help_of_the_installed_program_is_the_walked_parsers(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    env = {**os.environ, "COLUMNS": "1000", "PYTHONPATH": str(REPO / "src")}
    real = subprocess.run(
        [sys.executable, "-m", "elmokit", "embed", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert real.returncode == 0, real.stderr
    assert real.stdout == _help_text(("embed",), capsys)


def test_markdown_escaping_keeps_the_help_text():
    assert hooks._md("a <b> & `c` *d* [e] f_g|h") == r"a &lt;b&gt; &amp; \`c\` \*d\* \[e\] f\_g\|h"
    assert hooks._code("a`b") == "`` a`b ``" and hooks._code(64) == "`64`"


def test_sphinx_roles_become_code():
    text = "an :class:`~elmokit.Elmo` or :func:`elmokit.batch_to_ids`, :meth:`Embedder.embed_file` and ``x``"
    assert hooks.sphinx_roles_to_code(text) == "an `Elmo` or `elmokit.batch_to_ids`, `Embedder.embed_file` and ``x``"


def test_http_page_covers_every_openapi_route():
    pytest.importorskip("fastapi", reason="the serve extra")
    document = hooks.openapi_document()
    page = (DOCS / "reference" / "http.md").read_text(encoding="utf-8")
    table = {(m.upper(), p) for m, p in re.findall(r"^\| `(GET|POST) ([^` ]+)`", page, flags=re.M)}
    routes = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert {("POST", "/embed"), ("POST", "/v1/embeddings"), ("GET", "/health")} <= routes
    assert routes <= table | {("GET", "/examples")}  # /examples is named in the `GET /` row
    assert "GET /examples" in page
    generated = hooks.openapi_markdown(document)
    for method, path in routes:
        assert f"| `{method}` | `{path}` |" in generated


def _rendered(page: str) -> list[tuple[str, dict]]:
    """The ``::: identifier`` directives of an API page, with ``members: false`` noted."""
    text = (DOCS / "reference" / "api" / page).read_text(encoding="utf-8")
    found = []
    for m in re.finditer(r"^::: (\S+)\n((?:    .*\n)*)", text, flags=re.M):
        found.append((m.group(1), {"members_false": "members: false" in m.group(2)}))
    return found


API_PAGES = [
    "elmokit.md",
    "embedding.md",
    "pretraining.md",
    "serving.md",
    "export.md",
    "tasks.md",
    "analysis.md",
    "compat.md",
]


def test_api_pages_render_every_public_name():
    rendered = {ident: opts for page in API_PAGES for ident, opts in _rendered(page)}
    whole = {ident for ident, opts in rendered.items() if not opts["members_false"]}
    # (elmokit.pretraining's lazily exported names are rendered from their modules: test_docs_site.py checks each)
    for package in (
        "elmokit",
        "elmokit.export",
        "elmokit.serving",
        "elmokit.embedding",
        "elmokit.compat.allennlp",
        "elmokit.compat.efml",
        "elmokit.compat.simple_elmo",
    ):
        assert package in whole, f"{package}: its public names (__all__) are not rendered"
    # packages without a static __all__: every public name is rendered from the module that defines it
    for package in ("elmokit.tasks", "elmokit.analysis", "elmokit.integrations"):
        module = importlib.import_module(package)
        names = getattr(module, "__all__", None)
        if names is not None:
            for name in names:
                home = getattr(module, name).__module__
                assert home in whole, f"{package}.{name} (defined in {home}) is on no API page"
        for info in __import__("pkgutil").iter_modules(module.__path__):
            if not info.name.startswith("_"):
                assert f"{package}.{info.name}" in whole, f"{package}.{info.name} is on no API page"
