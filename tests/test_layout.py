"""The package layout's rules (issues 20 and 39): one home per concept, a small package root without alias modules,
the library never importing a recipe or the command line, no function over 80 lines without a reason."""

import ast
import importlib
import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "elmokit"
#: the one-release alias modules of the layout change, gone since issue 39 (no release promised them)
OLD_PATHS = [
    "elmokit.pooling",
    "elmokit.senses",
    "elmokit.polysemy",
    "elmokit.embed_output",
    "elmokit.zoo",
    "elmokit.zoo.build",
    "elmokit.zoo.corpora",
    "elmokit.training",
    "elmokit.threads",
]
#: where the long-function rule applies (``tools/long_functions.py``)
CHECKED = ["src", "bench", "experiments", "tools"]


def test_the_root_holds_at_most_twelve_modules():
    """Every ``.py`` directly in ``src/elmokit`` counts, ``__init__`` and ``__main__`` too."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 12, modules


@pytest.mark.parametrize("old", OLD_PATHS)
def test_the_old_module_paths_are_gone(old):
    sys.modules.pop(old, None)
    try:
        spec = importlib.util.find_spec(old)
    except ModuleNotFoundError:  # its parent package is gone
        spec = None
    # a folder left behind with only a stale __pycache__ (git keeps untracked files) imports as an empty namespace
    # package: no code of its own (origin None), which is gone enough
    assert spec is None or spec.origin is None, spec
    assert not hasattr(importlib.import_module("elmokit"), "_moved")  # the aliases' helper went with them


def _sources():
    return sorted(p for p in PACKAGE.rglob("*.py"))


#: the parts of the package that are not the library: the command line and the recipes (and the root's entry points)
NOT_LIBRARY = {"cli", "recipes", "__init__", "__main__"}


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import in ``tree``, inside functions too (``from elmokit import cli`` gives
    ``elmokit.cli``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def test_no_library_module_imports_the_recipes_or_the_command_line():
    """The design's rule, lazy imports included (``serving.app`` read its page's examples from the quickstart
    recipes until issue 39; they live in :mod:`elmokit.data.examples` now)."""
    offenders = []
    for path in _sources():
        part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if part in NOT_LIBRARY:
            continue
        for line, name in _imported(ast.parse(path.read_text(encoding="utf-8"))):
            if name.split(".")[:2] in (["elmokit", "recipes"], ["elmokit", "cli"]):
                offenders.append(f"{path.relative_to(PACKAGE)}:{line} {name}")
    assert not offenders, offenders


def test_the_import_contract_names_every_library_part():
    """``lint-imports`` (in CI) enforces the rule through the contract in pyproject.toml; a new package or root module
    must be listed there, or the rule would not cover it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; 3.10 runs the test above
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (forbidden,) = [c for c in contracts if c["type"] == "forbidden" and "elmokit.recipes" in c["forbidden_modules"]]
    assert sorted(forbidden["forbidden_modules"]) == ["elmokit.cli", "elmokit.recipes"]
    parts = {p.stem for p in PACKAGE.glob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert sorted(forbidden["source_modules"]) == sorted(f"elmokit.{p}" for p in parts - NOT_LIBRARY)


def test_no_module_over_600_lines():
    long_modules = []
    for path in _sources():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > 600:
            long_modules.append(f"{path.relative_to(PACKAGE)}: {n} lines")
    assert not long_modules, long_modules


def _long_functions(*args):
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "long_functions.py"), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )


def test_no_function_over_80_lines_without_a_reason():
    """Functions ≤ 80 lines (def line to last line) in the library, the benches, the experiments and the tools,
    unless the line above the ``def`` (or its first decorator) says ``# long: <reason>``."""
    res = _long_functions(*CHECKED)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


def test_the_long_function_checker_finds_one_and_honours_a_reason(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(79))  # def line + 79 + return = 81 lines
    (tmp_path / "a.py").write_text(f"import os\n\n\ndef short():\n    return 1\n\n\ndef f():\n{body}    return 0\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text(f"# long: one table\n@staticmethod\ndef g():\n{body}    return 0\n")
    method = body.replace("    ", "        ")
    (tmp_path / "sub" / "c.py").write_text(f"class C:\n    async def h(self):\n{method}        return 0\n")
    res = _long_functions(str(tmp_path))
    rows = sorted(res.stdout.splitlines())
    assert res.returncode == 1
    assert rows == [f"{tmp_path / 'a.py'}:8 f: 81 lines", f"{tmp_path / 'sub' / 'c.py'}:2 h: 81 lines"]
    res = _long_functions(str(tmp_path), f"--exclude={tmp_path / 'sub' / 'c.py'}", "--exclude", str(tmp_path / "a.py"))
    assert (res.returncode, res.stdout) == (0, "")
    assert _long_functions(str(tmp_path), "--limit", "81").returncode == 0  # 81 lines is not over 81


def test_an_import_inside_a_function_says_why():
    """Imports sit at the top of a module; one inside a function keeps the CLI's start-up fast or an optional
    library optional, and a comment on it (or on the import just above it) says which: ``# lazy: …`` or
    ``# optional: …`` — or it goes through :func:`elmokit.errors.import_optional`, which names the extra."""
    unexplained = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    window = lines[max(0, node.lineno - 4) : node.end_lineno]
                    if not any("# lazy" in line or "# optional" in line for line in window):
                        unexplained.append(
                            f"{path.relative_to(PACKAGE)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
                        )
    assert not unexplained, "\n".join(unexplained)
