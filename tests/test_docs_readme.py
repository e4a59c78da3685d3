"""The README stays short and leads into the site: at most 250 lines, its first two fenced blocks the set-up
commands (the main job, then the tests: what .ci/run runs), and every link it holds to a file of the repository (a
site page, a plot) leads to one that exists, at a heading that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def _fenced(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```$", text, flags=re.S | re.M)


def test_readme_is_short():
    assert len(README.splitlines()) <= 250


def test_readme_opens_with_the_two_set_up_commands():
    main_job, tests = _fenced(README)[:2]
    venv = "python3 -m venv .venv && . .venv/bin/activate"
    install = f"{venv}\npip install torch==2.13.0 && pip install -c constraints.txt"
    assert main_job == f"{install} -e '.[all]'\nelmokit quickstart --out-dir runs/quickstart\n"
    assert tests == f"{install} -e '.[all,test]'\npython -m pytest -q\n"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q torch==2.13.0 && pip install -q -c constraints.txt -e '.[all,test]'" in ci


def _anchors(page: Path) -> set[str]:
    from markdown.extensions.toc import slugify  # optional: the docs extra

    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^#{1,6} (.*?)(?: \{ #([\w.-]+) \})?$", line)
        if m:
            found.add(m.group(2) or slugify(re.sub(r"`([^`]*)`", r"\1", m.group(1)), "-"))
    return found


def test_every_link_of_the_readme_leads_somewhere():
    pytest.importorskip("markdown", reason="the docs extra (pip install -e '.[docs]')")
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/how-to/from-allennlp.md") for link in local)
    assert any(link.startswith("docs/how-to/embed-files.md") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        target = REPO / (path or "README.md")  # "#anchor": a heading of the README itself
        assert target.is_file(), f"README links to {link}: no such file"
        if anchor:
            assert anchor in _anchors(target), f"README links to {link}: no such heading"
