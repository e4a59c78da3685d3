"""Every Python and shell block on the site's tutorial and how-to pages runs (Sybil), or says on the line before it
why it cannot: ``<!-- skip: next "needs a download" -->``.

Each page runs in a fresh folder that holds a small model — the AllenNLP test model of ``../shared/fixtures``
(``elmo_options.json`` + ``elmo_weights.hdf5``) and its native copy ``my-model/`` — and ``sentences.txt``, with the
page's Python blocks sharing one namespace in page order and each ``bash`` block run by ``bash -euo pipefail`` with
this tree's ``elmokit``. A block that fails fails its page's test. (The serving tutorial starts ``elmokit serve`` on
port 18080 and stops it; the test stops it too if a block failed in between.)"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import unittest
from pathlib import Path

import pytest

from conftest import shared_path

sybil = pytest.importorskip("sybil", reason="the docs extra (pip install -e '.[docs]')")
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted((REPO / "docs" / "tutorials").glob("*.md")) + sorted((REPO / "docs" / "how-to").glob("*.md"))
SNIPPET_LANGUAGES = ("python", "bash")
SENTENCES = ["The river bank was muddy .", "I went to the bank to deposit money .", "苹果 很 好吃 ."]


def _run_bash(example) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", example.parsed], capture_output=True, text=True, env=env, timeout=600
    )
    if done.returncode != 0:
        raise AssertionError(
            f"exit {done.returncode}\n{example.parsed}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )


SYBIL = sybil.Sybil(
    parsers=[PythonCodeBlockParser(), CodeBlockParser("bash", _run_bash), SkipParser()], path=str(REPO / "docs")
)


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory) -> Path:
    """The files every page may use: the AllenNLP test model (original format and native), a sentences file."""
    fixture = shared_path("fixtures", "allennlp-elmo")
    folder = tmp_path_factory.mktemp("docs_snippets")
    shutil.copy(fixture / "options.json", folder / "elmo_options.json")
    shutil.copy(fixture / "lm_weights.hdf5", folder / "elmo_weights.hdf5")
    (folder / "sentences.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run(
        [sys.executable, "-m", "elmokit", "convert", "elmo_options.json", "elmo_weights.hdf5", "my-model"],
        cwd=folder,
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )
    return folder


def _fences(text: str) -> list[tuple[int, str, str]]:
    """``(line, language, the line before it that is not blank)`` of each fenced block of a page."""
    lines, found, inside, previous = text.split("\n"), [], None, ""
    for n, line in enumerate(lines, 1):
        m = re.match(r"^\s*(```+)(\S*)\s*$", line)
        if inside is None and m:
            found.append((n, m.group(2), previous))
            inside = m.group(1)
        elif inside is not None and line.strip() == inside:
            inside = None
        elif inside is None and line.strip():
            previous = line.strip()
    return found


def _stop_server(pid_file: Path) -> None:
    if pid_file.is_file():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO / "docs").as_posix())
def test_every_snippet_runs_or_says_why_not(page, base_folder, tmp_path, monkeypatch):
    fences = _fences(page.read_text(encoding="utf-8"))
    snippets = [f for f in fences if f[1] in SNIPPET_LANGUAGES]
    for line, language, before in fences:
        assert language, f"{page.name}:{line}: a fenced block without a language (python, bash, text, …)"
        assert language not in ("sh", "shell", "console", "py"), f"{page.name}:{line}: say `bash` or `python`"
        if before.startswith("<!-- skip"):
            assert re.fullmatch(r'<!-- skip: next "[^"]{10,}" -->', before), f"{page.name}:{line}: no reason given"
    document = SYBIL.parse(page)
    examples = list(document.examples())
    code = [e for e in examples if e.region.lexemes.get("arguments") in SNIPPET_LANGUAGES]
    assert len(code) == len(snippets), f"{page.name}: Sybil found {len(code)} blocks, the page has {len(snippets)}"
    work = tmp_path / "work"
    shutil.copytree(base_folder, work)
    monkeypatch.chdir(work)
    ran = 0
    try:
        for example in examples:
            try:
                example.evaluate()
            except unittest.SkipTest:
                continue
            ran += example in code
    finally:
        _stop_server(work / "serve.pid")  # the serving tutorial's server, if a block failed before it stopped it
    skipped = sum(1 for _, language, before in snippets if before.startswith("<!-- skip"))
    assert ran == len(snippets) - skipped, f"{page.name}: {ran} blocks ran, {len(snippets) - skipped} should have"
