"""Corpus reading, sentence batches and bilm-tf stream windows (incl. exact resume)."""

from __future__ import annotations

import itertools
import json
import logging
from collections import Counter

import pytest

from conftest import shared_path
from elmokit.data import CorpusDecodeError, SentenceBatcher, StreamWindows, TextCorpus
from elmokit.errors import DataError, MissingFileError, UsageError


def _write(path, content: str | bytes):
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


@pytest.fixture
def shards(tmp_path):
    """Three shards of numbered sentences of varied lengths (plus blank lines)."""
    rng_lengths = [3, 1, 7, 2, 5, 9, 4, 1, 6, 2, 8, 3, 5, 2, 1, 4, 7, 3]
    k = 0
    for s in range(3):
        lines = []
        for j in range(6):
            n = rng_lengths[k]
            lines.append(" ".join(f"s{s}l{j}w{i}" for i in range(n)))
            if j == 2:
                lines.append("   ")
            k += 1
        _write(tmp_path / f"shard-{s}.txt", "\n".join(lines) + "\n")
    return str(tmp_path / "shard-*.txt")


# ---------------------------------------------------------------------------------------------- reading
def test_fixture_counts():
    corpus = TextCorpus(shared_path("fixtures", "bilm-tf", "train", "data.txt"))
    sents = list(corpus)
    assert len(sents) == 5
    assert sum(len(s) for s in sents) == 134
    assert sents[1] == "these models make use of neural networks .".split()


def test_sorted_shards_and_blank_lines(shards, tmp_path):
    corpus = TextCorpus(shards)
    assert [p.name for p in corpus.files] == ["shard-0.txt", "shard-1.txt", "shard-2.txt"]
    sents = list(corpus)
    assert len(sents) == 18  # blank / whitespace-only lines skipped
    assert sents[0][0] == "s0l0w0" and sents[6][0] == "s1l0w0" and sents[-1][0] == "s2l5w0"
    # a list of patterns / literal paths, deduplicated
    both = TextCorpus([tmp_path / "shard-1.txt", shards])
    assert len(both.files) == 3


def test_no_files_names_pattern(tmp_path):
    pattern = str(tmp_path / "missing-*.txt")
    with pytest.raises(MissingFileError, match="missing-"):
        TextCorpus(pattern)


def test_empty_corpus_raises_when_iterated(tmp_path):
    _write(tmp_path / "empty.txt", "")
    _write(tmp_path / "blank.txt", "\n  \n\t\n")
    for name in ("empty.txt", "blank.txt", "*.txt"):
        corpus = TextCorpus(str(tmp_path / name))
        with pytest.raises(DataError, match="no sentences in"):
            list(corpus)
        with pytest.raises(DataError, match="no sentences in"):
            next(iter(StreamWindows(corpus, 2, 5, num_epochs=None)))  # infinite epochs must not hang
        with pytest.raises(DataError, match="no sentences in"):
            list(SentenceBatcher(corpus, 4))


def test_empty_shard_among_others_is_fine(tmp_path):
    _write(tmp_path / "a.txt", "")
    _write(tmp_path / "b.txt", "x y\n")
    assert list(TextCorpus(str(tmp_path / "*.txt"))) == [["x", "y"]]


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = _write(tmp_path / "bad.txt", b"good line\nstill good\nbad \xff byte here\nlast\n")
    with pytest.raises(CorpusDecodeError, match=r"bad\.txt:3: invalid UTF-8") as e:
        list(TextCorpus(path))
    assert isinstance(e.value, DataError) and isinstance(e.value, ValueError) and e.value.lineno == 3
    with pytest.raises(DataError, match=r"bad\.txt:3"):  # also when shuffling (shard read whole)
        list(TextCorpus(path, shuffle=True))
    assert list(TextCorpus(path, errors="replace"))[2] == ["bad", "\ufffd", "byte", "here"]
    assert list(TextCorpus(path, errors="ignore"))[2] == ["bad", "byte", "here"]
    assert list(TextCorpus(path, errors="skip")) == [["good", "line"], ["still", "good"], ["last"]]
    with pytest.raises(UsageError, match="errors must be one of"):
        TextCorpus(path, errors="bogus")


def test_bom_and_crlf(tmp_path):
    path = _write(tmp_path / "a.txt", "\ufeffa b\r\nc\r\n")
    assert list(TextCorpus(path)) == [["a", "b"], ["c"]]


def test_huge_line_split_by_default(tmp_path, caplog):
    path = _write(tmp_path / "huge.txt", "short one\n" + " ".join(f"t{i}" for i in range(100_000)) + "\nend\n")
    with caplog.at_level(logging.WARNING, logger="elmokit.data.shards"):
        sents = list(TextCorpus(path))
    assert len(sents) == 1 + 100 + 1
    assert all(len(s) == 1000 for s in sents[1:-1])
    assert sents[1][0] == "t0" and sents[100][-1] == "t99999"  # consecutive chunks, nothing lost
    warnings = [r for r in caplog.records if "split into chunks" in r.getMessage()]
    assert len(warnings) == 1 and "huge.txt:2" in warnings[0].getMessage()

    with pytest.raises(DataError, match=r"huge\.txt:2: sentence of 100000 tokens exceeds"):
        list(TextCorpus(path, long_sentences="error"))
    assert [len(s) for s in TextCorpus(path, max_tokens_per_sentence=None)] == [2, 100_000, 1]
    assert len(list(TextCorpus(path, max_tokens_per_sentence=30_000))) == 1 + 4 + 1


def test_shuffle_deterministic_per_epoch(shards):
    plain = list(TextCorpus(shards).sentences(0))
    c = TextCorpus(shards, shuffle=True, seed=5)
    e0, e1 = list(c.sentences(0)), list(c.sentences(1))
    e0b = list(TextCorpus(shards, shuffle=True, seed=5).sentences(0))
    assert e0 == e0b  # same seed, same epoch -> same order
    assert e0 != e1 and e0 != plain  # epochs differ
    assert sorted(map(tuple, e0)) == sorted(map(tuple, plain)) == sorted(map(tuple, e1))
    assert list(TextCorpus(shards, shuffle=True, seed=6).sentences(0)) != e0
    # sentences stay grouped by shard (one shard in memory at a time)
    shard_of = [s[0][:2] for s in e0]
    assert [k for k, _ in itertools.groupby(shard_of)] == [f"s{i}" for i in c.shard_order(0)]


# ---------------------------------------------------------------------------------------------- sentence batches
def test_sentence_batcher_plain(shards):
    corpus = TextCorpus(shards)
    batches = list(SentenceBatcher(corpus, 4))
    assert [len(b) for b in batches] == [4, 4, 4, 4, 2]
    assert [s for b in batches for s in b] == list(corpus)
    assert [len(b) for b in SentenceBatcher(corpus, 4, drop_last=True)] == [4, 4, 4, 4]
    assert len(list(SentenceBatcher(corpus, 4, num_epochs=2))) == 9  # 36 sentences: epochs run into each other


def test_sentence_batcher_bucketed(shards):
    corpus = TextCorpus(shards, shuffle=True, seed=1)
    batches = list(SentenceBatcher(corpus, 3, bucket_by_length=True, pool_batches=3, num_epochs=2))
    all_sents = [s for b in batches for s in b]
    assert Counter(map(tuple, all_sents)) == Counter({tuple(s): 2 for s in TextCorpus(shards)})
    for b in batches:
        assert [len(s) for s in b] == sorted(len(s) for s in b)
    # within each pool of 9 sentences, batches hold consecutive lengths
    spread = sum(max(map(len, b)) - min(map(len, b)) for b in batches)
    unbucketed = sum(max(map(len, b)) - min(map(len, b)) for b in SentenceBatcher(corpus, 3, num_epochs=2))
    assert spread < unbucketed


@pytest.mark.parametrize("bucket", [False, True])
def test_sentence_batcher_resume_exact(shards, bucket):
    def make():
        return SentenceBatcher(
            TextCorpus(shards, shuffle=True, seed=3), 4, num_epochs=3, bucket_by_length=bucket, pool_batches=2
        )

    full = list(make())
    assert len(full) == 14  # 54 sentences
    for k in (0, 1, 2, 3, 5, 9, 13, 14):
        b = make()
        head = [next(b) for _ in range(k)]
        assert head == full[:k]
        state = json.loads(json.dumps(b.state_dict()))
        restored = make()
        restored.load_state_dict(state)
        assert list(restored) == full[k:], f"resume after {k} batches"


def test_resume_rejects_other_options(shards):
    b = SentenceBatcher(TextCorpus(shards, shuffle=True, seed=3), 4)
    next(b)
    other = SentenceBatcher(TextCorpus(shards, shuffle=True, seed=4), 4)
    with pytest.raises(UsageError, match="seed=3"):
        other.load_state_dict(b.state_dict())
    with pytest.raises(UsageError, match="batch_size"):
        SentenceBatcher(TextCorpus(shards, shuffle=True, seed=3), 5).load_state_dict(b.state_dict())


# ---------------------------------------------------------------------------------------------- stream windows
def test_stream_windows_hand_computed_one_row(tmp_path):
    path = _write(tmp_path / "c.txt", "a b c\nd e\n")
    batches = list(StreamWindows(TextCorpus(path), 1, 3))
    # forward stream <S> a b c </S> | <S> d e </S>; </S> is never an input (bilm-tf), the last window is incomplete
    assert len(batches) == 2
    assert batches[0].forward_inputs == [["<S>", "a", "b"]]
    assert batches[0].forward_targets == [["a", "b", "c"]]
    assert batches[1].forward_inputs == [["c", "<S>", "d"]]
    assert batches[1].forward_targets == [["</S>", "d", "e"]]
    # backward stream </S> c b a <S> | </S> e d <S>
    assert batches[0].backward_inputs == [["</S>", "c", "b"]]
    assert batches[0].backward_targets == [["c", "b", "a"]]
    assert batches[1].backward_inputs == [["a", "</S>", "e"]]
    assert batches[1].backward_targets == [["<S>", "e", "d"]]
    assert batches[0].lengths == [3]

    tail = list(StreamWindows(TextCorpus(path), 1, 3, drop_last=False))
    assert len(tail) == 3
    assert tail[2].forward_inputs == [["e"]] and tail[2].forward_targets == [["</S>"]]
    assert tail[2].backward_inputs == [["d"]] and tail[2].backward_targets == [["<S>"]]
    assert tail[2].lengths == [1]


def test_stream_windows_rows_filled_in_order(tmp_path):
    path = _write(tmp_path / "c.txt", "a\nb c\nd\n")
    batches = list(StreamWindows(TextCorpus(path), 2, 2))
    assert len(batches) == 1  # the second step runs out of data in row 1 and is dropped, as in bilm-tf
    assert batches[0].forward_inputs == [["<S>", "a"], ["<S>", "b"]]
    assert batches[0].forward_targets == [["a", "</S>"], ["b", "c"]]
    assert batches[0].backward_inputs == [["</S>", "a"], ["</S>", "c"]]
    assert batches[0].backward_targets == [["a", "<S>"], ["c", "b"]]
    tail = list(StreamWindows(TextCorpus(path), 2, 2, drop_last=False))
    assert len(tail) == 2
    assert tail[1].forward_inputs == [["<S>", "d"], ["c"]]
    assert tail[1].forward_targets == [["d", "</S>"], ["</S>"]]
    assert tail[1].lengths == [2, 1]


def test_stream_windows_fixture_covers_every_token_both_directions():
    corpus = TextCorpus(shared_path("fixtures", "bilm-tf", "train", "data.txt"))
    sents = list(corpus)
    batches = list(StreamWindows(corpus, 2, 10, drop_last=False))
    assert sum(sum(b.lengths) for b in batches) == 134 + 5  # n + 1 predictions per sentence
    words = Counter(t for s in sents for t in s)
    assert Counter(t for b in batches for r in b.forward_targets for t in r) == words + Counter({"</S>": 5})
    assert Counter(t for b in batches for r in b.backward_targets for t in r) == words + Counter({"<S>": 5})

    def split(stream, marker):
        pieces = []
        for t in stream:
            if t == marker:
                pieces.append([])
            else:
                pieces[-1].append(t)
        return pieces

    for row in range(2):
        # a row's input stream is "<S> s1 <S> s2 …" forward and "</S> rev(s1) </S> rev(s2) …" backward
        fwd = split([t for b in batches for t in b.forward_inputs[row]], "<S>")
        bwd = split([t for b in batches for t in b.backward_inputs[row]], "</S>")
        assert len(fwd) >= 2 and all(fwd)
        assert bwd == [list(reversed(p)) for p in fwd]
    for b in batches:
        rows = zip(b.forward_inputs, b.forward_targets, b.backward_inputs, b.backward_targets, b.lengths)
        for fi, ft, bi, bt, n in rows:
            assert len(fi) == len(ft) == len(bi) == len(bt) == n


def test_stream_windows_all_full_when_dropping_last():
    corpus = TextCorpus(shared_path("fixtures", "bilm-tf", "train", "data.txt"))
    batches = list(StreamWindows(corpus, 2, 10, num_epochs=3))
    assert all(b.lengths == [10, 10] for b in batches)
    # 3 × 139 predictions; the step that runs out of data is dropped (a row may run dry a little before the other)
    assert len(batches) == 19 and 19 * 20 <= 3 * 139 < 21 * 20
    full = list(StreamWindows(corpus, 2, 10, num_epochs=3, drop_last=False))
    assert full[:19] == batches and sum(sum(b.lengths) for b in full) == 3 * 139


def test_stream_windows_infinite_epochs(shards):
    w = StreamWindows(TextCorpus(shards, shuffle=True), 4, 5, num_epochs=None)
    batches = list(itertools.islice(w, 100))
    assert len(batches) == 100 and w.steps == 100


@pytest.mark.parametrize("drop_last", [True, False])
def test_stream_windows_resume_exact(shards, drop_last):
    def make():
        return StreamWindows(TextCorpus(shards, shuffle=True, seed=9), 3, 4, num_epochs=2, drop_last=drop_last)

    full = list(make())
    assert len(full) > 10
    for k in list(range(0, len(full) + 1, 3)) + [len(full)]:
        w = make()
        head = [next(w) for _ in range(k)]
        assert head == full[:k]
        state = json.loads(json.dumps(w.state_dict()))
        restored = make()
        restored.load_state_dict(state)
        assert list(restored) == full[k:], f"resume after {k} batches"
        assert restored.steps == len(full) or k == len(full)


def test_stream_windows_resume_with_long_line_split(tmp_path):
    _write(tmp_path / "a.txt", "x " * 2500 + "\nshort line\n")
    _write(tmp_path / "b.txt", "another one here\n" + "y " * 1200 + "\n")

    def make():
        return StreamWindows(TextCorpus(str(tmp_path / "*.txt"), shuffle=True, seed=2), 2, 64, num_epochs=2)

    full = list(make())
    w = make()
    for _ in range(37):
        next(w)
    restored = make()
    restored.load_state_dict(w.state_dict())
    assert list(restored) == full[37:]


def test_stream_windows_options_validated(shards):
    with pytest.raises(UsageError, match="unroll_steps"):
        StreamWindows(TextCorpus(shards), 2, 0)
    with pytest.raises(UsageError, match="batch_size"):
        SentenceBatcher(TextCorpus(shards), 0)
    w = StreamWindows(TextCorpus(shards), 2, 3)
    with pytest.raises(UsageError, match="unroll_steps"):
        StreamWindows(TextCorpus(shards), 2, 4).load_state_dict(w.state_dict())


# ---------------------------------------------------------------------------------------------- data parts
def _lines_of(corpus: TextCorpus) -> list[tuple[str, ...]]:
    return [tuple(s) for s in corpus.sentences(0)]


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_parts_hold_every_line_exactly_once(shards, parts):
    whole = Counter(_lines_of(TextCorpus(shards)))
    pieces = [TextCorpus(shards, part=k, parts=parts) for k in range(parts)]
    got = Counter()
    for piece in pieces:
        got.update(_lines_of(piece))
    assert got == whole  # each line in exactly one part, none cut in two
    assert all(_lines_of(p) for p in pieces)  # 18 lines in 3 files: every part has some
    # each part reads its own byte range of each file: the ranges tile every file
    for i, path in enumerate(pieces[0].files):
        ranges = [p._ranges[i] for p in pieces]
        assert ranges[0][0] == 0 and ranges[-1][1] == path.stat().st_size
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        data = path.read_bytes()
        assert all(start == 0 or data[start - 1 : start] == b"\n" for start, _ in ranges)  # ranges start lines


def test_a_part_reads_only_its_bytes(tmp_path, monkeypatch):
    # the point of parts: a process never reads the other parts' text
    path = _write(tmp_path / "big.txt", "".join(f"line{i:03d} a b c\n" for i in range(400)))  # 14 bytes a line
    part = TextCorpus(str(path), part=2, parts=4)
    start, end = part._ranges[0]
    consumed = {"bytes": 0}
    real_open = open

    class Counting:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def seek(self, pos):
            return self.fh.seek(pos)

        def __iter__(self):
            for line in self.fh:
                consumed["bytes"] += len(line)
                yield line

    monkeypatch.setattr("builtins.open", lambda *a, **k: Counting(real_open(*a, **k)))
    lines = _lines_of(part)
    monkeypatch.undo()
    assert lines[0] == ("line200", "a", "b", "c") and len(lines) == 100
    # what it read: its own range and at most one line more (the one that tells it the range ended)
    assert end - start <= consumed["bytes"] <= end - start + len("line300 a b c\n")


def test_more_parts_than_lines_is_a_clear_error(tmp_path):
    path = _write(tmp_path / "two.txt", "a b\nc d\n")
    assert _lines_of(TextCorpus(str(path), part=1, parts=2)) == [("c", "d")]
    # 2 lines, 3 parts: the first two parts take a line each, the third holds no byte of the file
    assert [_lines_of(TextCorpus(str(path), part=k, parts=3)) for k in (0, 1)] == [[("a", "b")], [("c", "d")]]
    with pytest.raises(DataError, match=r"part 3 of 3 .* fewer lines than the 3 data parts"):
        TextCorpus(str(path), part=2, parts=3)
    for part, parts in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(UsageError):
            TextCorpus(str(path), part=part, parts=parts)


def test_part_errors_name_the_files_line_and_bom_only_at_the_start(tmp_path):
    good = "".join(f"w{i} x\n" for i in range(40)).encode()
    path = _write(tmp_path / "bad.txt", b"\xef\xbb\xbf" + good + good + b"bad \xff here\n" + good)
    first, second = (TextCorpus(str(path), part=k, parts=2) for k in (0, 1))
    assert first._ranges[0][1] < 3 + 2 * len(good) < second._ranges[0][1]  # the bad line (81) is in the second part
    lines = _lines_of(first)
    assert lines[0] == ("w0", "x") and len(lines) < 80  # the BOM is not part of the first token
    # the second part reads from the middle of the file, and still names the line by its number in the file
    with pytest.raises(CorpusDecodeError, match=r"bad\.txt:81: invalid UTF-8"):
        _lines_of(second)
    with pytest.raises(CorpusDecodeError, match=r"bad\.txt:81: invalid UTF-8"):
        _lines_of(TextCorpus(str(path)))


def test_parts_shuffle_apart_and_resume_exactly(shards):
    a = TextCorpus(shards, shuffle=True, seed=3, part=0, parts=2)
    b = TextCorpus(shards, shuffle=True, seed=3, part=1, parts=2)
    assert a.shard_order(1) != b.shard_order(1) or _lines_of(a) != _lines_of(b)
    assert a.fingerprint()["part"] == 0 and "part" not in TextCorpus(shards).fingerprint()
    # a part's batcher resumes exactly, and refuses the position of another part
    batcher = SentenceBatcher(a, 2, num_epochs=3, bucket_by_length=True)
    for _ in range(4):
        next(batcher)
    state = json.loads(json.dumps(batcher.state_dict()))
    rest = list(batcher)
    again = SentenceBatcher(
        TextCorpus(shards, shuffle=True, seed=3, part=0, parts=2), 2, num_epochs=3, bucket_by_length=True
    )
    again.load_state_dict(state)
    assert list(again) == rest
    other = SentenceBatcher(b, 2, num_epochs=3, bucket_by_length=True)
    with pytest.raises(UsageError, match="part"):
        other.load_state_dict(state)


def test_one_part_is_the_whole_corpus_in_its_old_order(shards):
    assert TextCorpus(shards, shuffle=True, seed=1, part=0, parts=1).shard_order(2) == TextCorpus(
        shards, shuffle=True, seed=1
    ).shard_order(2)
    assert _lines_of(TextCorpus(shards, shuffle=True, seed=1, parts=1)) == _lines_of(
        TextCorpus(shards, shuffle=True, seed=1)
    )
