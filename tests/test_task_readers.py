"""Task data readers (CoNLL-2003, CoNLL-U, Chinese character NER, sentence classification) and tag schemes: hand
files for every format and every bad-data case (each error names FILE:LINE), hand tag conversions, a round-trip
property, and the real files in ../shared (sizes as their SOURCE.md give them)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_path
from elmokit.errors import DataError, MissingFileError, UsageError
from elmokit.tasks.readers import (
    LabelledSentence,
    TaggedSentence,
    TagSequenceError,
    check_tags,
    convert_tags,
    detect_scheme,
    label_set,
    read_char_ner,
    read_conll2003,
    read_conllu,
    read_labelled,
    spans_to_tags,
    tag_spans,
)


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return p


# ============================================================================================ tag schemes
@pytest.mark.parametrize(
    "tags, source, target, expected",
    [
        # IOB1: I- starts an entity after O or another type; B- only between two adjacent same-type entities
        ("I-PER I-PER B-PER O I-LOC I-ORG", "IOB1", "BIO", "B-PER I-PER B-PER O B-LOC B-ORG"),
        ("I-PER I-PER B-PER O I-LOC I-ORG", "IOB1", "BIOES", "B-PER E-PER S-PER O S-LOC S-ORG"),
        ("I-MISC I-MISC I-MISC O", "IOB1", "BIOES", "B-MISC I-MISC E-MISC O"),
        ("B-PER I-PER B-PER O B-LOC", "BIO", "IOB1", "I-PER I-PER B-PER O I-LOC"),
        ("B-NAME M-NAME E-NAME O S-ORG", "BMES", "BIO", "B-NAME I-NAME I-NAME O B-ORG"),
        ("B-NAME M-NAME E-NAME O S-ORG", "BMES", "BIOES", "B-NAME I-NAME E-NAME O S-ORG"),
        ("O O", "BIO", "BIOES", "O O"),
    ],
)
def test_convert_tags_hand_cases(tags, source, target, expected):
    assert convert_tags(tags.split(), source, target) == expected.split()


def test_invalid_bio_is_repaired_as_conlleval_or_refused_with_strict():
    tags = ["O", "I-PER", "I-PER", "I-LOC"]  # I-PER after O, I-LOC after I-PER: two invalid transitions
    assert tag_spans(tags, "BIO") == [(1, 3, "PER"), (3, 4, "LOC")]
    assert convert_tags(tags, "BIO", "BIO") == ["O", "B-PER", "I-PER", "B-LOC"]
    with pytest.raises(TagSequenceError, match="position 1: invalid BIO sequence: I-PER after O") as info:
        check_tags(tags, "BIO")
    assert info.value.position == 1
    check_tags(tags, "IOB1")  # the same tags are valid IOB1 (by definition)
    check_tags(["B-PER", "I-PER", "O"], "BIO")
    with pytest.raises(TagSequenceError, match="not closed with E-PER"):
        check_tags(["B-PER", "I-PER", "O"], "BIOES")
    with pytest.raises(TagSequenceError, match="ends inside the PER entity"):
        check_tags(["O", "B-PER"], "BIOES")
    with pytest.raises(TagSequenceError, match="'E-PER' is not a BIO tag"):
        check_tags(["B-PER", "E-PER"], "BIO")
    with pytest.raises(UsageError, match="scheme must be one of"):
        convert_tags(["O"], "BILOU", "BIO")


def test_detect_scheme():
    assert detect_scheme(["B-A", "I-A", "O"]) == "BIO"
    assert detect_scheme(["B-A", "M-A", "E-A", "S-B"]) == "BMES"
    assert detect_scheme(["B-A", "I-A", "E-A"]) == "BIOES"
    with pytest.raises(DataError, match="I, M"):
        detect_scheme(["I-A", "M-A"])


_spans = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.sampled_from(["PER", "LOC", "B-X"])), max_size=6)


@settings(max_examples=150, deadline=None)
@given(_spans, st.sampled_from(["IOB1", "BIO", "BIOES", "BMES"]), st.sampled_from(["IOB1", "BIO", "BIOES", "BMES"]))
def test_conversion_keeps_the_entities(gaps, source, target):
    """Any non-overlapping entities (adjacent same-type ones included, types with hyphens) written in one scheme
    and converted to another are the same entities; the output is a valid sequence of the target scheme."""
    spans, pos = [], 0
    for gap, length, t in gaps:
        spans.append((pos + gap, pos + gap + length, t))
        pos += gap + length
    n = pos + 1
    tags = spans_to_tags(spans, n, source)
    check_tags(tags, source)
    out = convert_tags(tags, source, target)
    check_tags(out, target)
    assert tag_spans(out, target) == spans


# ============================================================================================ CoNLL-2003
CONLL = """-DOCSTART- -X- O O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER
Smith NNP I-NP B-PER

-DOCSTART- -X- O O

"""


def test_conll2003_hand_file(tmp_path):
    p = _write(tmp_path, "x.conll", CONLL)
    bio = read_conll2003(p)
    assert bio == [
        TaggedSentence(("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O"), str(p), 3),
        TaggedSentence(("Peter", "Blackburn", "Smith"), ("B-PER", "I-PER", "B-PER"), str(p), 8),
    ]
    assert read_conll2003(p, "BIOES")[1].tags == ("B-PER", "E-PER", "S-PER")
    assert read_conll2003(p, "IOB1")[1].tags == ("I-PER", "I-PER", "B-PER")
    assert read_conll2003(p, limit=1) == bio[:1]
    assert label_set(bio) == ["B-MISC", "B-ORG", "B-PER", "I-PER", "O"]
    assert label_set(reversed(bio)) == label_set(bio)


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("EU NNP I-NP I-ORG\nrejects\n", 2, "token 'rejects' has no tag"),
        ("EU NNP I-ORG\n", 1, "3 columns; a CoNLL-2003 line is 4"),
        ("# sent_id = 1\n1\tEU\tEU\tPROPN\tNNP\t_\t0\troot\t_\t_\n", 1, "looks like a CoNLL-U file"),
        ("EU NNP I-NP I-ORG\n\nx NN I-NP X-PER\n", 3, "tag 'X-PER' is not a IOB1 tag"),
        (b"EU NNP I-NP I-ORG\ncaf\xe9 NN I-NP O\n", 2, "not valid utf-8 \\(byte 0xe9 at column 4\\)"),
    ],
)
def test_conll2003_bad_data_names_file_and_line(tmp_path, text, line, message):
    p = _write(tmp_path, "bad.conll", text)
    with pytest.raises(DataError, match=f"^{p}:{line}: .*{message}"):
        read_conll2003(p)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(MissingFileError, match="no such file"):
        read_conll2003(tmp_path / "nope.txt")
    with pytest.raises(MissingFileError, match="is a folder"):
        read_labelled(tmp_path)
    with pytest.raises(DataError, match="no sentences"):
        read_conll2003(_write(tmp_path, "e.conll", "-DOCSTART- -X- O O\n\n"))
    with pytest.raises(UsageError, match="limit must be"):
        read_conll2003(_write(tmp_path, "x.conll", CONLL), limit=0)


# ============================================================================================ CoNLL-U
CONLLU = """# sent_id = a
# text = Don't go.
1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tDo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_
3\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
3.1\tgone\tgo\tVERB\tVBN\t_\t_\t_\t3:conj\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

# sent_id = b
1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def test_conllu_hand_file_skips_ranges_and_empty_nodes(tmp_path):
    p = _write(tmp_path, "x.conllu", CONLLU)
    upos = read_conllu(p)
    assert upos == [
        TaggedSentence(("Do", "n't", "go", "."), ("AUX", "PART", "VERB", "PUNCT"), str(p), 4),
        TaggedSentence(("Hi",), ("INTJ",), str(p), 11),
    ]
    assert read_conllu(p, "xpos")[0].tags == ("VBP", "RB", "VB", ".")
    with pytest.raises(UsageError, match="field must be a CoNLL-U column"):
        read_conllu(p, "pos")


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("1\tHi\thi\t_\tUH\t_\t0\troot\t_\t_\n", 1, "word 'Hi' has no upos"),
        ("1\tHi\thi\tINTJ\n", 1, "4 tab-separated columns; a CoNLL-U word line has 10"),
        ("EU NNP I-NP I-ORG\n", 1, "this looks like a CoNLL-2003 file"),
        ("1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n\n# only a comment\n", 3, "comment lines only"),
    ],
)
def test_conllu_bad_data_names_file_and_line(tmp_path, text, line, message):
    p = _write(tmp_path, "bad.conllu", text)
    with pytest.raises(DataError, match=f"^{p}:{line}: .*{message}"):
        read_conllu(p)


# ============================================================================================ Chinese NER
def test_char_ner_weibo_positions_and_bmes(tmp_path):
    # weiboNER_2nd_conll: CHAR + position in its gold word; multi-digit positions, a digit character, an emoji
    # written as two U+FFFD
    weibo = _write(tmp_path, "weibo", "科0\tB-ORG.NAM\n技1\tI-ORG.NAM\n310\tO\n\ufffd\ufffd0\tO\n\n我0\tB-PER.PRO\n")
    got = read_char_ner(weibo)
    assert got[0] == TaggedSentence(("科", "技", "3", "\ufffd"), ("B-ORG.NAM", "I-ORG.NAM", "O", "O"), str(weibo), 1)
    assert got[1].tokens == ("我",) and got[1].line == 6
    resume = _write(tmp_path, "r.bmes", "高 B-NAME\n勇 E-NAME\n： O\n中 S-CONT\n")
    assert read_char_ner(resume).pop().tags == ("B-NAME", "I-NAME", "O", "B-CONT")
    assert read_char_ner(resume, "BIOES").pop().tags == ("B-NAME", "E-NAME", "O", "S-CONT")


def test_char_ner_invalid_bio_repaired_with_a_warning_or_refused(tmp_path, caplog):
    p = _write(tmp_path, "w", "a\tO\nb\tI-PER\nc\tI-PER\n\nd\tB-LOC\ne\tI-ORG\n")
    with caplog.at_level(logging.WARNING, logger="elmokit.tasks.readers"):
        got = read_char_ner(p)
    assert [s.tags for s in got] == [("O", "B-PER", "I-PER"), ("B-LOC", "B-ORG")]
    assert f"{p}: 2 invalid BIO transitions" in caplog.text and "first at line 2: I-PER after O" in caplog.text
    with pytest.raises(TagSequenceError, match=f"^{p}:2: invalid BIO sequence: I-PER after O"):
        read_char_ner(p, strict=True)


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("a\tO\nb\n", 2, "token 'b' has no tag"),
        ("ab\tO\n", 1, "token 'ab' is 2 characters"),
        ("科0\tO\n技\tO\n", 2, "not CHARACTER\\+position digits"),
        ("a\tO\nb\tQ-PER\n", 2, "tag 'Q-PER' is not a BIO, BIOES or BMES tag"),
        ("a\tB-X\nb\tM-X\nc\tE-X\nd\tO\ne\tB-Y\n", 5, "not closed with E-Y"),
    ],
)
def test_char_ner_bad_data_names_file_and_line(tmp_path, text, line, message):
    p = _write(tmp_path, "bad", text)
    with pytest.raises(DataError, match=f"^{p}:{line}: .*{message}"):
        read_char_ner(p, source_scheme="BMES" if "M-X" in text else "auto", strict=True)


# ============================================================================================ classification
def test_labelled_formats(tmp_path):
    tsv = _write(tmp_path, "a.tsv", "pos\tgood  film .\n\nneg\tbad\n")
    assert read_labelled(tsv) == [
        LabelledSentence(("good", "film", "."), "pos", str(tsv), 1),
        LabelledSentence(("bad",), "neg", str(tsv), 3),
    ]
    sst = _write(tmp_path, "stsa", "4 a stirring film\n0 dull .\n")
    assert [(s.label, s.tokens) for s in read_labelled(sst)] == [("4", ("a", "stirring", "film")), ("0", ("dull", "."))]
    trec = _write(tmp_path, "trec", "NUM:dist How far is it ?\nHUM:ind Who was Galileo ?\n")
    assert [s.label for s in read_labelled(trec)] == ["NUM", "HUM"]
    assert [s.label for s in read_labelled(trec, trec_fine=True)] == ["NUM:dist", "HUM:ind"]
    assert read_labelled(trec, "space")[0].label == "NUM:dist"
    assert label_set(read_labelled(sst)) == ["0", "4"]
    latin = _write(tmp_path, "latin", "0 caf\xe9 noir\n".encode("latin-1"))
    assert read_labelled(latin, encoding="latin-1")[0].tokens == ("café", "noir")


@pytest.mark.parametrize(
    "text, fmt, line, message",
    [
        ("1 good\n0\n", "auto", 2, "label '0' with an empty sentence"),
        ("pos\tgood\nneg bad\n", "auto", 2, "no tab"),
        ("NUM:dist How far ?\n5 How ?\n", "auto", 2, "'5' is not a TREC COARSE:fine label"),
        (b"0 fine\n1 caf\xe9\n", "auto", 2, "not valid utf-8 .*encoding='latin-1'"),
    ],
)
def test_labelled_bad_data_names_file_and_line(tmp_path, text, fmt, line, message):
    p = _write(tmp_path, "bad", text)
    with pytest.raises(DataError, match=f"^{p}:{line}: .*{message}"):
        read_labelled(p, fmt)


def test_labelled_empty_skip_is_logged(tmp_path, caplog):
    p = _write(tmp_path, "e", "1 good\n0\n1 fine\n")
    with caplog.at_level(logging.WARNING, logger="elmokit.tasks.readers"):
        assert [s.line for s in read_labelled(p, empty="skip")] == [1, 3]
    assert "skipped 1 line with a label and no sentence: 2" in caplog.text


# ============================================================================================ real files
def test_real_conll2003():
    folder = shared_path("data", "conll2003")
    train = read_conll2003(folder / "eng.train")
    assert (len(train), sum(len(s.tokens) for s in train)) == (14041, 203621)
    assert train[0].tokens[:3] == ("EU", "rejects", "German") and train[0].tags[:3] == ("B-ORG", "O", "B-MISC")
    assert train[0].line == 3
    for s in train[:2000]:
        check_tags(s.tags, "BIO")
    assert {t[2:] for t in label_set(train) if t != "O"} == {"PER", "ORG", "LOC", "MISC"}
    test = read_conll2003(folder / "eng.testb", "BIOES", limit=500)
    assert len(test) == 500
    for s in test:
        check_tags(s.tags, "BIOES")


def test_real_ud_english_ewt():
    folder = shared_path("data", "ud-english-ewt")
    dev = read_conllu(folder / "en_ewt-ud-dev.conllu")
    assert (len(dev), sum(len(s.tokens) for s in dev)) == (2001, 25147)  # SOURCE.md; train: 12,544 / 204,577
    assert len(label_set(dev)) == 17  # the 17 UPOS tags
    train = read_conllu(folder / "en_ewt-ud-train.conllu", limit=50)
    assert len(train) == 50 and train[0].tokens[:3] == ("Al", "-", "Zaman")


def test_real_chinese_ner():
    weibo = read_char_ner(shared_path("data", "zh-weibo-ner", "weiboNER_2nd_conll.dev"))
    assert (len(weibo), sum(len(s.tokens) for s in weibo)) == (270, 14509)
    assert all(len(t) == 1 for s in weibo for t in s.tokens)  # the position digits are gone
    resume = read_char_ner(shared_path("data", "zh-resume-ner", "dev.char.bmes"))
    assert (len(resume), sum(len(s.tokens) for s in resume)) == (463, 13890)
    for s in resume:
        check_tags(s.tags, "BIO")
    assert "B-NAME" in label_set(resume) and not any(t.startswith(("M-", "E-", "S-")) for t in label_set(resume))


def test_real_sentence_classification():
    folder = shared_path("data", "sentence-classification")
    sst2 = read_labelled(folder / "stsa.binary.train")
    sst5 = read_labelled(folder / "stsa.fine.train")
    assert (len(sst2), label_set(sst2)) == (6920, ["0", "1"])
    assert (len(sst5), label_set(sst5)) == (8544, ["0", "1", "2", "3", "4"])
    assert len(read_labelled(folder / "TREC.train.all", encoding="latin-1")) == 5452
    with pytest.raises(DataError, match="custrev.all:769: label '0' with an empty sentence"):
        read_labelled(folder / "custrev.all")
