"""Test data in the formats of the zoo recipes' staged pretraining text (xz, a paragraph a line, a blank line between
documents) and of the evaluation files only the n-gram filter reads; used by the zoo corpus and build tests."""

from __future__ import annotations

import lzma
import zipfile
from pathlib import Path

#: An MSRA NER sentence (an evaluation file only the n-gram filter reads) ...
MSRA_SENTENCE = "当希望工程救助的百万儿童成长起来，科教兴国蔚然成风时。"
#: ... and a news paragraph quoting 15 of its characters inside other text: the n-gram filter drops it.
PLANTED_NEWS = "记者报道说希望工程救助的百万儿童成长起来了，大家都很高兴。"


def write_xz_documents(path: Path, documents: list[list[str]]) -> None:
    """``documents`` (lists of paragraphs) as staged text: one paragraph a line, a blank line after each document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join("".join(p + "\n" for p in doc) + "\n" for doc in documents)
    path.write_bytes(lzma.compress(text.encode("utf-8")))


def _char_lines(sentence: str, digit: bool) -> str:
    return "".join(f"{ch}{i % 2 if digit else ''}\tO\n" for i, ch in enumerate(sentence)) + "\n"


def write_zh_staged(root: Path, paragraphs: list[str]) -> None:
    """The three staged Chinese folders (``paragraphs`` cut into documents of two, with :data:`PLANTED_NEWS` in
    zh-news-cctv's second document) and the Chinese evaluation files only the n-gram filter reads (Weibo and Resume
    NER train, MSRA with :data:`MSRA_SENTENCE`)."""
    docs = [paragraphs[i : i + 2] for i in range(0, len(paragraphs), 2)]
    write_xz_documents(root / "zh-news-cctv" / "text.txt.xz", [docs[0], [docs[1][0], PLANTED_NEWS], *docs[2:4]])
    write_xz_documents(root / "zh-wikipedia" / "text.txt.xz", docs[4:6])
    write_xz_documents(root / "zh-classical-novels" / "text.txt.xz", docs[6:8])
    for name in ("weiboNER_2nd_conll.train", "weiboNER.conll.train"):
        (root / "zh-weibo-ner" / name).write_text(_char_lines("训练集的一句话", True), encoding="utf-8")
    (root / "zh-resume-ner" / "train.char.bmes").write_text(_char_lines("简历训练集", False), encoding="utf-8")
    (root / "zh-msra-ner-unsplit").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(root / "zh-msra-ner-unsplit" / "dh_msra.zip", "w") as z:
        z.writestr("dh_msra.txt", _char_lines(MSRA_SENTENCE, False))
