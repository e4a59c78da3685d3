"""Move the README's sections into the documentation site's pages (issue 42), and prove that nothing was lost.

``python tools/docs_migrate.py [--readme README.md] [--check]`` fills the page templates under
``tools/docs_pages/`` (the same paths as under ``docs/``) and writes ``docs/<page>.md``. A template is Markdown with
directives, each alone on its line::

    {{readme "Heading"}}                      the section with that heading (any level), its subsections included
                                              ("Parent > Heading" where the title repeats)
    {{readme "Heading" intro}}                the heading and its text before the first subsection
    {{readme "Heading" from "Text" to "Text"}}  the section's lines from the first that starts with the one text up
                                              to (not including) the first after it that starts with the other
    ... level N                               the section's heading becomes level N (default 2), its subsections follow
    ... noheading                             without the heading line

While it copies, it rewrites the README's links for the site: ``#anchor`` → the page (and anchor) where that
heading now lives, ``experiments/results/X`` → ``results/X`` (the site carries those files, see
``tools/docs_hooks.py``), ``docs/serve-page.png`` → ``serve-page.png``; a copy of a whole result file of
``experiments/results/`` becomes an include of that file (``--8<--``), so the page shows what the script wrote.
On the tutorial and how-to pages each Python or shell block that a template does not mark runnable (``<!-- run -->``
on the line before a directive: every block of it runs) gets a skip marker with the reason (``REASONS``), which
``tests/test_docs_snippets.py`` requires.

Then it reports every non-blank README line that no page took (``--check``: exit 1 if any). It is the tool of the
move, run again after each README change until the README shrinks; afterwards the pages are the source.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "tools" / "docs_pages"
DOCS = ROOT / "docs"
SNIPPET_PAGES = ("tutorials/", "how-to/")
DIRECTIVE = re.compile(r"^\{\{readme (.*)\}\}\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)(.*)$")

#: why a copied block cannot run in the snippet tests: the first pattern found in the block gives its reason
REASONS = [
    (r"torchrun|--nnodes", "needs several processes or machines (torchrun)"),
    (r"elmokit serve", "starts a server that runs until stopped"),
    (r"localhost|127\.0\.0\.1|httpx|OpenAI\(|curl ", "needs a running `elmokit serve`"),
    (r"zhs\.model|sents2elmo", "needs an ELMoForManyLangs model (a download)"),
    (r"model\.zip|ElmoModel", "needs an NLPL model zip (a download)"),
    (r"CONLL_03|flair", "needs the flair extra and CoNLL-2003 (downloads, hours of training)"),
    (
        r"push_to_hub|my-org/",
        "run by tests/test_integrations_hub.py against a recorded Hub (an upload needs an account)",
    ),
    (r"ray\.data|ray\.init", "run by tests/test_integrations_ray.py on a local Ray with a small model (the ray extra)"),
    (r"nlp\.add_pipe", "run by tests/test_integrations_spacy.py with a small model (the spacy extra)"),
    (r"ElmoEmbedder\(options_file", "needs the released model's files (a download)"),
    (r"elmokit train|build_trainer|--init-from", "trains for minutes to hours on a corpus of your own"),
    (r"\"original\"|'original'| original |small\.pt2|small\.onnx|original-5\.5b", "downloads a released model"),
    (r"zoo build|elmokit-en|elmokit-zh|experiments/", "needs a zoo model (`elmokit zoo build`: an hour of training)"),
    (r"elmokit quickstart", "trains for 5 minutes (the tutorial's own run)"),
    (r"tag train|classify train|tag evaluate", "needs a trained task model and the task data (minutes of training)"),
    (r"bench/", "a benchmark: minutes on a quiet machine"),
    (r"pip install", "installs packages"),
    (r".", "uses placeholders for files of your own"),
]


@dataclass
class Section:
    level: int
    title: str
    start: int  # the heading's line index
    end: int  # one past the section's last line (subsections included)
    body_end: int  # one past the last line before its first subsection


def parse_sections(lines: list[str]) -> list[Section]:
    """The README's headings (outside code blocks) and the line ranges of their sections."""
    heads, fence = [], None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(2)
            elif m.group(2).startswith(fence[0]) and len(m.group(2)) >= len(fence) and not m.group(3).strip():
                fence = None
            continue
        if fence is None and (h := re.match(r"^(#{1,6}) (.*)$", line)):
            heads.append((i, len(h.group(1)), h.group(2).strip()))
    sections = []
    for k, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        body_end = heads[k + 1][0] if k + 1 < len(heads) and heads[k + 1][0] < end else end
        sections.append(Section(level, title, i, end, body_end))
    return sections


def github_slug(title: str) -> str:
    """GitHub's anchor for a heading (the README's links use these)."""
    text = re.sub(r"[^\w\- ]", "", title.lower(), flags=re.UNICODE)
    return text.replace(" ", "-")


def site_slug(title: str) -> str:
    """Python-Markdown's toc anchor for a heading (what the site uses)."""
    from markdown.extensions.toc import slugify  # lazy: the docs extra's

    text = re.sub(r"<[^>]+>", "", title)
    text = re.sub(r"`([^`]*)`", r"\1", text)
    return slugify(text, "-")


@dataclass
class Piece:
    page: str
    lines: list[int]  # README line indices, in order
    dropped: int | None  # a heading line that the page's own heading replaces
    shift: int
    heading_line: int | None  # the README line index of a heading kept as the piece's first line
    run: bool


def parse_directive(
    args: str, sections: list[Section], lines: list[str], where: str
) -> tuple[list[int], int, int | None]:
    """``(README lines to copy, heading-level shift, the heading line dropped by noheading — the page's own heading
    stands for it — or None)``."""
    words = shlex.split(args)
    title, options = words[0], words[1:]
    parent, _, title = title.rpartition(" > ")
    matches = [s for s in sections if s.title == title]
    if parent:  # "Parent > Child": the child inside that parent (titles repeat)
        outer = [p for p in sections if p.title == parent]
        matches = [s for s in matches if any(p.start < s.start < p.end for p in outer)]
    if len(matches) != 1:
        raise SystemExit(f"{where}: {len(matches)} README sections are titled {title!r}")
    sec = matches[0]
    level, keep_heading, start, end = 2, True, sec.start, sec.end
    k = 0
    while k < len(options):
        opt = options[k]
        if opt == "intro":
            end = sec.body_end
        elif opt == "noheading":
            keep_heading = False
        elif opt == "level":
            level = int(options[k + 1])
            k += 1
        elif opt in ("from", "to"):
            text = options[k + 1]
            k += 1
            lo = start + 1 if opt == "to" else sec.start + 1
            hits = [i for i in range(lo, sec.end) if lines[i].lstrip().startswith(text)]
            if not hits:
                raise SystemExit(f"{where}: no line of {title!r} starts with {text!r}")
            if opt == "from":
                start, keep_heading = hits[0], False
            else:
                end = hits[0]
        else:
            raise SystemExit(f"{where}: unknown option {opt!r}")
        k += 1
    indices = list(range(start, end))
    dropped = None
    if not keep_heading and indices and indices[0] == sec.start:
        indices, dropped = indices[1:], sec.start
    return indices, level - sec.level, dropped


def annotate_fences(text: str, run: bool) -> str:
    """Give every Python/shell block a skip marker with its reason (unless ``run``); a block without a language that
    holds commands becomes ``bash``, other bare blocks ``text``."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, fence, info = m.groups()
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and not lines[j].strip()[len(fence) :]):
            j += 1
        body = lines[i + 1 : j]
        lang = info.strip()
        if not lang:
            lang = "bash" if any(b.strip().startswith(("elmokit ", "python ", "torchrun ")) for b in body) else "text"
        if lang in ("python", "bash", "sh", "shell") and not run:
            joined = "\n".join(body)
            reason = next(r for pattern, r in REASONS if re.search(pattern, joined))
            prev = out[-1] if out else ""
            if not prev.strip().startswith("<!-- skip:"):
                out.append(f'{indent}<!-- skip: next "{reason}" -->')
                out.append("")
        out.append(f"{indent}{fence}{lang}")
        out.extend(body)
        if j < len(lines):
            out.append(lines[j])
        i = j + 1
    return "\n".join(out)


# long: one pass, in order: templates → pieces → where each heading landed → pages → coverage, each a few lines
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    parser.add_argument("--check", action="store_true", help="exit 1 when a README line went to no page")
    args = parser.parse_args(argv)
    lines = Path(args.readme).read_text(encoding="utf-8").split("\n")
    sections = parse_sections(lines)
    by_line = {s.start: s for s in sections}
    pages: dict[str, list] = {}
    for template in sorted(TEMPLATES.rglob("*.md")):
        page = template.relative_to(TEMPLATES).as_posix()
        parts, run_next = [], False
        for n, tline in enumerate(template.read_text(encoding="utf-8").split("\n"), 1):
            m = DIRECTIVE.match(tline)
            if tline.strip() == "<!-- run -->":
                run_next = True
                continue
            if not m:
                if run_next:
                    raise SystemExit(f"{template}:{n}: <!-- run --> stands on the line before a directive only")
                parts.append(tline)
                continue
            indices, shift, dropped = parse_directive(m.group(1), sections, lines, f"{template}:{n}")
            head = indices[0] if indices and indices[0] in by_line else None
            parts.append(Piece(page, indices, dropped, shift, head, run_next))
            run_next = False
        pages[page] = parts
    # where each README heading landed: its anchor on the site
    anchors: dict[str, tuple[str, str]] = {}
    used: dict[int, list[str]] = {}
    for page, parts in pages.items():
        for piece in parts:
            if not isinstance(piece, Piece):
                continue
            if piece.dropped is not None:
                used.setdefault(piece.dropped, []).append(page)
            for i in piece.lines:
                used.setdefault(i, []).append(page)
                sec = by_line.get(i)
                if sec is not None:
                    kept = piece.heading_line == i or i != piece.lines[0]
                    anchors.setdefault(github_slug(sec.title), (page, site_slug(sec.title) if kept else ""))
    for sec in sections:  # a heading whose line was dropped: its first copied line's page
        slug = github_slug(sec.title)
        if slug not in anchors:
            for i in range(sec.start, sec.end):
                if i in used:
                    anchors[slug] = (used[i][0], "")
                    break

    def link(target: str, page: str) -> str:
        page_dir = os.path.dirname(page) or "."
        if target.startswith("#"):
            where = anchors.get(target[1:])
            if where is None:
                raise SystemExit(f"{page}: the README link {target} leads to no heading")
            dest, anchor = where
            rel = "" if dest == page else os.path.relpath(dest, page_dir)
            return rel + (f"#{anchor}" if anchor else "") or "#"
        if target.startswith("experiments/results/"):
            return os.path.relpath("results/" + target.removeprefix("experiments/results/"), page_dir)
        if target == "docs/serve-page.png":
            return os.path.relpath("serve-page.png", page_dir)
        return target

    for page, parts in pages.items():
        out = []
        for piece in parts:
            if not isinstance(piece, Piece):
                out.append(piece)
                continue
            chunk = []
            for i in piece.lines:
                line = lines[i]
                if i in by_line:
                    sec = by_line[i]
                    line = "#" * max(1, sec.level + piece.shift) + " " + sec.title
                line = re.sub(r"\]\(([^)\s]+)\)", lambda m, p=page: f"]({link(m.group(1), p)})", line)
                chunk.append(line)
            text = "\n".join(chunk).strip("\n")
            if page.startswith(SNIPPET_PAGES):
                text = annotate_fences(text, piece.run)
            out.append(text)
        text = "\n".join(out)
        for result in sorted((ROOT / "experiments" / "results").glob("*.md")):  # a script's whole output, copied:
            body = result.read_text(encoding="utf-8").strip()  # include the file instead (pymdownx.snippets)
            if body and body in text:
                text = text.replace(body, f'--8<-- "experiments/results/{result.name}"')
        out = [text]
        dest = DOCS / page
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text("\n".join(out).rstrip("\n") + "\n", encoding="utf-8")
    missing = [i for i, line in enumerate(lines) if line.strip() and i not in used]
    twice = {i: p for i, p in used.items() if len(p) > 1}
    for i in missing:
        print(f"README.md:{i + 1}: on no page: {lines[i][:100]}")
    for i, p in sorted(twice.items()):
        print(f"README.md:{i + 1}: on {len(p)} pages ({', '.join(p)})")
    print(f"{len(pages)} pages; {len(missing)} README lines on no page, {len(twice)} on several", file=sys.stderr)
    return 1 if args.check and missing else 0


if __name__ == "__main__":
    sys.exit(main())
