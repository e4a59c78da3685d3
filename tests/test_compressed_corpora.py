"""Compressed training corpora (``.xz``, ``.gz``, ``.bz2``, by extension): read as the plain text they hold, in parts,
and resumed exactly — by the corpus, its batchers and a training run."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections import Counter

import pytest

from elmokit.data import SentenceBatcher, StreamWindows, TextCorpus
from elmokit.data.lines import is_compressed, open_binary, read_lines
from elmokit.errors import DataError
from helpers import tiny_window_config, write_tiny_corpus

COMPRESSORS = {"xz": lzma.compress, "gz": gzip.compress, "bz2": bz2.compress}


def _text(shard: int) -> str:
    lines = []
    for j in range(9):
        lines.append(" ".join(f"s{shard}l{j}w{i}" for i in range(1 + (5 * j + shard) % 7)))
        if j % 4 == 1:
            lines.append("")  # blank lines are skipped, and count as lines for parts
    return "\n".join(lines) + "\n"


@pytest.fixture
def plain(tmp_path):
    for s in range(3):
        (tmp_path / f"plain-{s}.txt").write_text(_text(s), encoding="utf-8")
    return str(tmp_path / "plain-*.txt")


def _compressed(tmp_path, fmt: str) -> str:
    for s in range(3):
        (tmp_path / f"packed-{s}.txt.{fmt}").write_bytes(COMPRESSORS[fmt](_text(s).encode("utf-8")))
    return str(tmp_path / f"packed-*.txt.{fmt}")


@pytest.mark.parametrize("fmt", sorted(COMPRESSORS))
def test_compressed_shards_read_as_their_text(tmp_path, plain, fmt):
    packed = _compressed(tmp_path, fmt)
    assert is_compressed(f"x.txt.{fmt.upper()}") and not is_compressed("x.txt")
    with open_binary(TextCorpus(packed).files[0]) as f:
        assert f.read().decode("utf-8") == _text(0)
    assert list(TextCorpus(packed)) == list(TextCorpus(plain))
    assert list(TextCorpus(packed))[:2] == [["s0l0w0"], ["s0l1w0", "s0l1w1", "s0l1w2", "s0l1w3", "s0l1w4", "s0l1w5"]]
    for epoch in (0, 1):
        a = list(TextCorpus(packed, shuffle=True, seed=5).sentences(epoch))
        assert a == list(TextCorpus(plain, shuffle=True, seed=5).sentences(epoch))
    # read_lines (embed, score) reads them too, line numbers and blank lines kept
    assert read_lines(TextCorpus(packed).files[1])[2] == (3, "")


@pytest.mark.parametrize("fmt", sorted(COMPRESSORS))
@pytest.mark.parametrize("kind", ["sentences", "windows"])
def test_batchers_resume_exactly_inside_a_compressed_shard(tmp_path, plain, fmt, kind):
    packed = _compressed(tmp_path, fmt)

    def make(pattern):
        corpus = TextCorpus(pattern, shuffle=True, seed=3)
        if kind == "windows":
            return StreamWindows(corpus, 2, 4, num_epochs=2)
        return SentenceBatcher(corpus, 4, num_epochs=2, bucket_by_length=True)

    full = list(make(packed))
    assert full == list(make(plain))  # the same batches as the uncompressed text
    assert len(full) > 6
    for k in (1, len(full) // 2, len(full) - 1):  # positions inside a shard: offset > 0 for most
        b = make(packed)
        for _ in range(k):
            next(iter(b))
        state = json.loads(json.dumps(b.state_dict()))
        restored = make(packed)
        restored.load_state_dict(state)
        assert list(restored) == full[k:], f"resume after {k} batches"


@pytest.mark.parametrize("parts", [2, 3])
def test_compressed_parts_hold_every_line_exactly_once(tmp_path, plain, parts):
    packed = _compressed(tmp_path, "gz")
    whole = Counter(tuple(s) for s in TextCorpus(packed))
    got: Counter = Counter()
    for k in range(parts):
        sents = list(TextCorpus(packed, part=k, parts=parts))
        assert sents, f"part {k} is empty"
        got.update(tuple(s) for s in sents)
    assert got == whole
    # part k takes the lines k, k + n, ... (1-based line numbers ≡ k + 1 mod n): shard 0's first lines
    assert list(TextCorpus(packed, part=1, parts=2))[0] == _text(0).splitlines()[1].split()


@pytest.mark.parametrize("fmt", sorted(COMPRESSORS))
def test_truncated_or_mislabelled_file_is_a_clear_error(tmp_path, fmt):
    data = COMPRESSORS[fmt](_text(0).encode("utf-8") * 50)
    (tmp_path / f"cut.txt.{fmt}").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"cut\.txt\.{fmt}: cannot decompress it as \.{fmt}"):
        list(TextCorpus(str(tmp_path / f"cut.txt.{fmt}")))
    (tmp_path / f"plain.txt.{fmt}").write_text(_text(0), encoding="utf-8")  # not compressed at all
    with pytest.raises(DataError, match=rf"plain\.txt\.{fmt}: cannot decompress"):
        list(TextCorpus(str(tmp_path / f"plain.txt.{fmt}")))


def _losses(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("fmt", sorted(COMPRESSORS))
def test_training_on_a_compressed_corpus_resumes_bit_exactly(tmp_path, one_thread, fmt):
    """A run stopped at step 5 and resumed to 12 logs the losses of an uninterrupted run, bit for bit, and both equal
    the run on the uncompressed text (the shuffled windows cut through the middle of the shard)."""
    from elmokit.pretraining.trainer import Trainer  # lazy: torch start-up only for this test

    text = write_tiny_corpus(tmp_path)
    packed = tmp_path / f"train.txt.{fmt}"
    packed.write_bytes(COMPRESSORS[fmt](text.read_bytes()))
    kw = dict(checkpoint_every=1000, shuffle=True)
    Trainer(tiny_window_config(packed, tmp_path / "full", **kw)).train()
    Trainer(tiny_window_config(packed, tmp_path / "cut", **{**kw, "max_steps": 5})).train()
    Trainer(tiny_window_config(packed, tmp_path / "cut", **kw)).train(resume=True)
    Trainer(tiny_window_config(text, tmp_path / "plain", **kw)).train()
    full = _losses(tmp_path / "full")
    assert sorted(full) == list(range(1, 13))
    assert _losses(tmp_path / "cut") == full
    assert _losses(tmp_path / "plain") == full
