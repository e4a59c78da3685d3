"""The documentation site's generated parts (``mkdocs.yml`` names this file under ``hooks:``; the tests import it).

* :func:`cli_markdown`: the command-line reference, walked from :func:`elmokit.cli.build_parser` — every subcommand,
  every option with its help (argparse's own expansion of ``%(default)s``), default and choices. It replaces the
  ``<!-- generated: cli -->`` line of ``docs/reference/cli.md``; ``tests/test_docs_reference.py`` compares it with
  ``elmokit <cmd> --help``.
* :func:`openapi_document` / :func:`openapi_markdown`: the HTTP routes from the server's own OpenAPI document
  (``create_app`` on a tiny random model, nothing served), in place of ``<!-- generated: openapi -->`` in
  ``docs/reference/http.md``; the document itself is written to the site as ``reference/openapi.json``.
* the measured results under ``experiments/results/`` (plots, tables) are added to the site as ``results/…``, so
  the explanation pages show the files the scripts wrote, never a copy.
* :class:`SphinxRoles`: a griffe extension (``mkdocs.yml``, mkdocstrings' ``extensions``) that shows the docstrings'
  Sphinx roles (``:class:`~elmokit.Elmo```) as code (``Elmo``), since mkdocstrings renders Markdown.

Needs the ``docs`` extra (mkdocs, mkdocs-material, mkdocstrings-python) and, for the HTTP page, ``serve``.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
CLI_MARK = "<!-- generated: cli -->"
OPENAPI_MARK = "<!-- generated: openapi -->"


# ---------------------------------------------------------------------------------------------- the command line
def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """``(name, parser, one-line help)`` of each subcommand of ``parser``, in registration order (aliases once)."""
    found, seen = [], set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    found.append((name, sub, helps.get(name, "")))
    return found


def command_parsers(parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()) -> list:
    """Every command of ``elmokit`` as ``(path, parser, one-line help)``, depth first: ``(("zoo", "build"), …)``."""
    if parser is None:
        from elmokit.cli import build_parser  # lazy: only the docs build and its tests need the CLI

        parser = build_parser()
    found = []
    for name, sub, short in _subcommands(parser):
        found.append(((*path, name), sub, short))
        found.extend(command_parsers(sub, (*path, name)))
    return found


def option_rows(parser: argparse.ArgumentParser) -> list[dict]:
    """One row per argument that ``--help`` lists: ``invocation`` (as argparse writes it: ``-v, --verbose``,
    ``--layers SPEC``, ``MODEL``), ``help`` (``%(default)s`` expanded as ``--help`` does), ``default``, ``choices``,
    ``required``. Suppressed arguments are left out, as ``--help`` leaves them out; a command group's subcommand
    argument (``COMMAND``) is a row whose choices are the subcommands."""
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        default = action.default
        shown_default = None
        if action.option_strings and default not in (None, argparse.SUPPRESS, False) and action.nargs != 0:
            shown_default = default
        rows.append(
            {
                "invocation": formatter._format_action_invocation(action),
                "help": formatter._expand_help(action) if action.help else "",
                "default": shown_default,
                "choices": list(action.choices) if action.choices is not None else None,
                "required": bool(action.required) if action.option_strings else True,
            }
        )
    return rows


def _md(text: str) -> str:
    """Plain text as Markdown that shows it as it is (argparse help is plain text)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", text)


def _code(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    ticks = "``" if "`" in text else "`"
    return f"{ticks} {text} {ticks}" if ticks == "``" else f"`{text}`"


def cli_markdown() -> str:
    """The reference of every ``elmokit`` command (Markdown), generated from the argparse parsers."""
    from elmokit.cli import build_parser  # lazy: only the docs build and its tests need the CLI

    top = build_parser()
    commands = command_parsers(top)
    lines = ["## Commands", ""]
    lines += [f"- [`elmokit {' '.join(path)}`](#{_anchor(path)}): {_md(short)}" for path, _, short in commands]
    for path, parser, short in [((), top, "")] + commands:
        name = " ".join(("elmokit", *path))
        lines += ["", f"## `{name}` {{ #{_anchor(path)} }}", ""]
        if short:
            lines += [_md(short), ""]
        usage = parser.format_usage().strip()
        lines += ["```text", usage.removeprefix("usage: "), "```", ""]
        if parser.description:
            lines += [_md(" ".join(parser.description.split())), ""]
        for row in option_rows(parser):
            entry = f"- `{row['invocation']}`" + (
                " (required)" if row["required"] and row["invocation"][0] == "-" else ""
            )
            if row["help"]:
                entry += f": {_md(' '.join(row['help'].split()))}"
            extras = []
            if row["choices"] is not None:
                extras.append("choices: " + ", ".join(_code(c) for c in row["choices"]))
            if row["default"] is not None:
                extras.append(f"default: {_code(row['default'])}")
            if extras:
                entry += " — *" + "; ".join(extras) + "*"
            lines.append(entry)
        subs = _subcommands(parser)
        if subs:
            lines += ["", "Subcommands: " + ", ".join(f"[`{s}`](#{_anchor((*path, s))})" for s, _, _ in subs) + "."]
        if parser.epilog:
            lines += ["", "```text", parser.epilog.strip(), "```"]
    return "\n".join(lines) + "\n"


def _anchor(path: tuple[str, ...]) -> str:
    return "elmokit" + "".join(f"-{p}" for p in path)


# ---------------------------------------------------------------------------------------------- the HTTP API
@functools.cache
def openapi_document() -> dict:
    """The server's OpenAPI document (``GET /openapi.json``), from ``create_app`` on a tiny random model."""
    import torch  # lazy: only the docs build and its tests need these

    from elmokit.config import elmo_tiny
    from elmokit.embedding import Embedder
    from elmokit.modules.bilm import BiLM
    from elmokit.serving.app import create_app
    from elmokit.serving.settings import ServeSettings

    torch.manual_seed(0)
    app = create_app(ServeSettings(model="tiny"), Embedder(BiLM(elmo_tiny())))
    while not hasattr(app, "openapi"):  # the outer ASGI layers (key check, CORS) wrap FastAPI's application
        app = app.app
    return app.openapi()


def openapi_markdown(document: dict) -> str:
    """The routes of an OpenAPI document as a Markdown table (method, path, summary, responses)."""
    info = document.get("info", {})
    lines = [
        f"The server's OpenAPI document ({document.get('openapi', '?')}; title {info.get('title')!r}, version "
        f"{info.get('version')!r}) lists these routes. It is served at `GET /openapi.json`; the copy made when this "
        "site was built is [openapi.json](openapi.json).",
        "",
        "| method | path | operation | responses |",
        "|---|---|---|---|",
    ]
    for path, item in sorted(document.get("paths", {}).items()):
        for method, op in sorted(item.items()):
            responses = ", ".join(sorted(op.get("responses", {})))
            lines.append(f"| `{method.upper()}` | `{path}` | {_md(op.get('summary', ''))} | {responses} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- mkdocs hooks
def on_files(files, config):
    """Add the measured results (``experiments/results/*``) to the site as ``results/<name>``, and the OpenAPI
    document as ``reference/openapi.json``."""
    from mkdocs.structure.files import File  # lazy: mkdocs is the docs extra's

    for path in sorted(RESULTS.iterdir()):
        if path.suffix in (".png", ".md", ".json", ".txt"):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    document = json.dumps(openapi_document(), indent=2, ensure_ascii=False)
    files.append(File.generated(config, "reference/openapi.json", content=document))
    return files


def on_page_markdown(markdown, page, config, files):
    """Fill the generated parts: the CLI reference and the HTTP routes."""
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_markdown())
    if OPENAPI_MARK in markdown:
        markdown = markdown.replace(OPENAPI_MARK, openapi_markdown(openapi_document()))
    return markdown


# ---------------------------------------------------------------------------------------------- docstrings
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def sphinx_roles_to_code(text: str) -> str:
    """``:class:`~elmokit.Elmo``` → ```Elmo```, ``:func:`elmokit.batch_to_ids``` → ```elmokit.batch_to_ids```."""

    def code(match: re.Match) -> str:
        tilde, target = match.groups()
        return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"

    return _ROLE.sub(code, text)


try:  # the griffe extension exists only where griffe is installed (the docs extra)
    import griffe
except ImportError:  # optional: [docs]
    griffe = None

if griffe is not None:

    class SphinxRoles(griffe.Extension):
        """Show Sphinx roles in docstrings as inline code (mkdocstrings renders docstrings as Markdown)."""

        def on_instance(self, *, obj, **kwargs) -> None:
            if obj.docstring is not None:
                obj.docstring.value = sphinx_roles_to_code(obj.docstring.value)
