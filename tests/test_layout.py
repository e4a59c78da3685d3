"""The package layout's rules (issue 20): one home per concept, the old module paths as one-release aliases."""

import ast
import importlib
import subprocess
import sys
import warnings

import pytest

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "elmokit"
#: one-release alias modules at the root (not counted among the root's modules)
ALIASES = {
    "pooling": "elmokit.embedding.pooling",
    "senses": "elmokit.analysis.senses",
    "polysemy": "elmokit.analysis.polysemy",
    "embed_output": None,
}


def test_old_module_paths_warn_and_give_the_new_modules():
    for old, new in ALIASES.items():
        sys.modules.pop(f"elmokit.{old}", None)
        with pytest.warns(FutureWarning, match=f"elmokit.{old} moved to elmokit"):
            module = importlib.import_module(f"elmokit.{old}")
        if new is not None:  # the same module object: patching the old name patches the real one
            assert module is importlib.import_module(new)
        sys.modules.pop(f"elmokit.{old}", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from elmokit.embed_output import open_embeddings, sentence_key
        from elmokit.zoo.build import load_tokenizer
        from elmokit.zoo.corpora import split_english
    from elmokit.data.tokenizers import load_tokenizer as new_load
    from elmokit.data.tokenizers import split_english as new_split
    from elmokit.embedding.reader import open_embeddings as new_open
    from elmokit.embedding.reader import sentence_key as new_key

    assert (open_embeddings, sentence_key, load_tokenizer, split_english) == (new_open, new_key, new_load, new_split)


def test_the_alias_warning_points_at_the_importing_line():
    code = "import elmokit.pooling\n"
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO_ROOT / "src"), "PATH": ""},
    )
    assert res.stderr.startswith("<string>:1: FutureWarning: elmokit.pooling moved to elmokit.embedding.pooling")


def test_the_root_holds_at_most_twelve_modules_and_no_training_alias():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    counted = [m for m in modules if m not in ALIASES]
    assert len(counted) <= 12, counted
    assert not (PACKAGE / "training" / "__init__.py").exists()  # (a stale __pycache__ folder may remain)


def _sources():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_no_module_over_600_lines_and_no_function_over_80_without_a_reason():
    """Modules ≤ 600 lines; functions ≤ 80 lines (def line to last line) unless the line above the ``def`` (or its
    first decorator) says ``# long: <reason>``."""
    long_modules, long_functions = [], []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        if len(lines) > 600:
            long_modules.append(f"{path.relative_to(PACKAGE)}: {len(lines)} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = node.end_lineno - node.lineno + 1
                if length > 80 and not lines[first - 2].strip().startswith("# long:"):
                    long_functions.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {length} lines")
    assert not long_modules and not long_functions, long_modules + long_functions


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
