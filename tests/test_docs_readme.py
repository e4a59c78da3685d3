"""The README stays short and leads into the site: at most 250 lines, its first two fenced blocks the set-up
commands (the main job, then the tests: what .ci/run runs), every link it holds to a file of the repository (a site
page, a plot) leads to one that exists, at a heading that exists; and its "load and embed" and "embed a file"
examples run as written on a model a user holds (the AllenNLP test model's options.json + HDF5 in place of the
released "original", which is a download)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shared_path

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


def _readme_block(language: str, contains: str) -> str:
    blocks = re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.S | re.M)
    return next(b for b in blocks if contains in b)


@pytest.fixture
def held_model(tmp_path) -> Path:
    """A folder as a user holds one: the AllenNLP test model's options.json + HDF5 (``../shared/fixtures``)."""
    fixture = shared_path("fixtures", "allennlp-elmo")
    folder = tmp_path / "my-elmo"
    folder.mkdir()
    shutil.copy(fixture / "options.json", folder / "elmo_options.json")
    shutil.copy(fixture / "lm_weights.hdf5", folder / "elmo_weights.hdf5")
    return folder


def test_the_load_and_embed_example_runs(held_model):
    code = _readme_block("python", "Elmo.from_pretrained").replace('"original"', repr(str(held_model)))
    namespace: dict = {}
    exec(compile(code, "README.md (Use it)", "exec"), namespace)
    assert tuple(namespace["out"]["elmo_representations"][0].shape[:2]) == (2, 6)
    assert namespace["layers"].shape[:2] == (3, 4)


def test_the_embed_a_file_example_runs(held_model, tmp_path):
    lines = "The river bank was muddy .\nI went to the bank .\n"
    for name in ("sentences.txt", "mine.txt", "big.txt"):
        (tmp_path / name).write_text(lines, encoding="utf-8")
    script = _readme_block("bash", "elmokit embed original").replace(" original ", f" {held_model} ")
    script = script.replace("my-elmo/", f"{held_model}/").replace("runs/mylm/model", str(held_model))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("(3, 6, 32)")  # line 1's layers: L+1, its 6 tokens, 2P of the test model
    assert (tmp_path / "mine.hdf5").is_file() and (tmp_path / "big.hdf5").is_file()
