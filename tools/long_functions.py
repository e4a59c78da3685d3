"""List the functions over 80 lines that do not say why (the design's rule, ``../shared/docs/design.md``).

A function's length runs from its ``def`` line to its last line. One over the limit passes when the line above its
``def`` (or above its first decorator) starts with ``# long: <reason>``. Usage::

    python tools/long_functions.py src bench experiments tools [--exclude bench/train.py] [--limit 80]

Prints one ``path:line name: N lines`` row per offender and exits 1 when there is any, 0 otherwise. Paths are files
or folders (every ``*.py`` below them); ``--exclude`` takes files or folders, relative to the current folder or
absolute, and may be repeated.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

LIMIT = 80
REASON = "# long:"

__all__ = ["LIMIT", "long_functions", "python_files", "main"]


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[int, str, int]]:
    """``(def line, name, length)`` of each function (nested ones and methods included) in ``source`` that is over
    ``limit`` lines without a ``# long:`` line above its ``def`` or its first decorator, in source order."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        above = lines[first - 2].strip() if first >= 2 else ""
        if length > limit and not above.startswith(REASON):
            found.append((node.lineno, node.name, length))
    return sorted(found)


def python_files(paths: Iterable[Path], exclude: Iterable[Path] = ()) -> Iterator[Path]:
    """The ``*.py`` files given or below the folders given, sorted per argument, less those at or below ``exclude``."""
    excluded = [p.resolve() for p in exclude]
    for path in paths:
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        for file in files:
            resolved = file.resolve()
            if not any(resolved == e or e in resolved.parents for e in excluded):
                yield file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="files or folders to check")
    parser.add_argument("--exclude", action="append", type=Path, default=[], help="a file or folder to skip")
    parser.add_argument("--limit", type=int, default=LIMIT, help=f"most lines allowed (default {LIMIT})")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such file or folder: {', '.join(missing)}")
    offenders = 0
    for file in python_files(args.paths, args.exclude):
        for line, name, length in long_functions(file.read_text(encoding="utf-8"), args.limit):
            print(f"{file}:{line} {name}: {length} lines")
            offenders += 1
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main())
