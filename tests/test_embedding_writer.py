"""Embedding at scale: streamed file embedding in atomic parts, resume after Ctrl-C / kill -9, worker processes,
batch/order invariance, float16, sentence keys, tokenizers, the token-vector cache, and pooling over real tokens."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conftest import REPO_ROOT
from elmokit import Embedder, TokenVectorCache, batch_to_ids
from elmokit.cli import main as cli_main
from elmokit.embedding import writer as embed_output
from elmokit.embedding.pooling import masked_max, masked_mean, parse_layers
from elmokit.embedding.reader import open_embeddings, sentence_key
from elmokit.errors import UsageError
from elmokit.io import LOCK_NAME
from elmokit.weights.native import save_pretrained
from helpers import fixture_dir, fixture_model, tiny_random_bilm

pytestmark = pytest.mark.usefixtures("one_thread")

#: duplicates, a blank line, "/" and "." inside and alone, non-ASCII and emoji, runs of spaces, a literal "%2F"
LINES = [
    "the bank of the river .",
    "",
    "a/b c.d . ..",
    "naïve café 苹果 😀",
    "the bank of the river .",
    "  padded   spaces  ",
    "x",
    "one two three four five six seven eight nine ten eleven twelve",
    "%2F literal",
    ".",
    "the money bank",
    "bank",
]


@pytest.fixture(scope="module")
def bilm():
    return tiny_random_bilm(3)


def _write(path: Path, lines, *, bom=False, newline_at_end=True) -> Path:
    text = "\n".join(lines) + ("\n" if newline_at_end else "")
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


def _read_all(path) -> dict[str, np.ndarray]:
    with open_embeddings(path) as reader:
        return {k: reader[k] for k in reader}


def _assert_same(a: dict, b: dict, atol=0.0) -> float:
    """Same keys, same shapes, values within atol (0: bitwise); returns the max abs difference."""
    assert sorted(a) == sorted(b)
    worst = 0.0
    for k in a:
        assert a[k].shape == b[k].shape, k
        if a[k].size:
            worst = max(worst, float(np.abs(a[k].astype(np.float64) - b[k]).max()))
    assert worst <= atol, worst
    return worst


# ------------------------------------------------------------------------------------------------- pooling
def test_masked_mean_and_max_by_hand_ignore_padding():
    # row 0: 3 real positions, row 1: 1 real position; padding filled with 100 so that counting it would show
    x = torch.full((2, 4, 2), 100.0)
    x[0, :3] = torch.tensor([[1.0, -2.0], [3.0, -4.0], [5.0, -9.0]])
    x[1, :1] = torch.tensor([[-7.0, -8.0]])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    assert masked_mean(x, mask).tolist() == [[3.0, -5.0], [-7.0, -8.0]]
    assert masked_max(x, mask).tolist() == [[5.0, -2.0], [-7.0, -8.0]]
    # with zero padding (what the biLM gives), max over all-negative real values must not return the padding's 0
    x[1, 1:] = 0.0
    assert masked_max(x, mask)[1].tolist() == [-7.0, -8.0]
    # a row with no real position pools to zeros; layers (B, L+1, T, D) are pooled per layer
    empty = torch.zeros((1, 3), dtype=torch.bool)
    assert masked_mean(torch.ones(1, 3, 2), empty).tolist() == [[0.0, 0.0]]
    assert masked_max(-torch.ones(1, 3, 2), empty).tolist() == [[0.0, 0.0]]
    layered = torch.stack([x, 2 * x], dim=1)  # (2, 2, 4, 2)
    assert masked_mean(layered, mask)[0].tolist() == [[3.0, -5.0], [6.0, -10.0]]


def test_sentence_vectors_do_not_depend_on_the_padding_of_their_batch(bilm):
    emb = Embedder(bilm)
    short, long = ["the", "bank"], ["a", "very", "long", "sentence", "about", "the", "bank", "of", "a", "river"]
    alone = emb.embed_sentence(short)  # (L+1, 2, 16)
    np.testing.assert_allclose(
        emb.embed_batch([long, short], pool="mean", layers="top")[1], alone[-1].mean(0), atol=1e-6
    )
    np.testing.assert_allclose(emb.embed_batch([long, short], pool="max")[1], alone.max(axis=1), atol=1e-6)
    # the pitfall reproduced: a mean over the padded batch tensor (zeros past the end) is not the sentence's mean
    with torch.inference_mode():
        vectors, mask = emb.token_vectors([long, short])
        padded = emb.bilm.forward_token_vectors(vectors, mask).layers[1, -1]  # (10, 16), 8 padding rows
    assert np.abs(padded.mean(0).numpy() - alone[-1].mean(0)).max() > 1e-2
    # an empty sentence: a zero vector pooled, a zero-length array otherwise
    assert emb.embed_sentence([], pool="mean").shape == (3, 16) and not emb.embed_sentence([], pool="mean").any()
    assert emb.embed_sentence([], layers="top").shape == (0, 16)


def test_layer_choices_and_fixed_mix(bilm):
    emb = Embedder(bilm)
    s = ["the", "river", "bank", "."]
    full = emb.embed_sentence(s)
    np.testing.assert_allclose(emb.embed_sentence(s, layers="average"), full.mean(0), atol=1e-6)
    np.testing.assert_array_equal(emb.embed_sentence(s, layers="top"), full[-1])
    np.testing.assert_array_equal(emb.embed_sentence(s, layers=0), full[0])
    np.testing.assert_allclose(
        emb.embed_sentence(s, layers=[0.2, 0.3, 0.5]), 0.2 * full[0] + 0.3 * full[1] + 0.5 * full[2], atol=1e-6
    )
    np.testing.assert_allclose(emb.embed_sentence(s, layers="0,1,0", pool="max"), full[1].max(0), atol=1e-6)
    for bad in (3, [1.0, 2.0], "bottom", -1, True, "1,x,2"):
        with pytest.raises(UsageError, match="layer"):
            emb.embed_sentence(s, layers=bad)
    with pytest.raises(UsageError, match="pool"):
        emb.embed_sentence(s, pool="sum")
    assert parse_layers("0.25,0.25,0.5").text() == "0.25,0.25,0.5" and parse_layers(2).text() == "2"


def test_keep_sentence_boundaries_adds_the_boundary_vectors(bilm):
    emb = Embedder(bilm)
    s = ["the", "bank"]
    inner = emb.embed_sentence(s)
    kept = emb.embed_sentence(s, keep_sentence_boundaries=True)
    assert kept.shape == (3, 4, 16)
    np.testing.assert_allclose(kept[:, 1:3], inner, atol=1e-6)
    with torch.no_grad():
        bos, eos = emb.bilm.boundary_vectors()
    np.testing.assert_allclose(kept[0, 0], torch.cat([bos, bos]).numpy(), atol=1e-6)  # layer 0 at <S>
    np.testing.assert_allclose(kept[0, -1], torch.cat([eos, eos]).numpy(), atol=1e-6)
    # pooled with the boundaries: the mean covers the n + 2 positions
    np.testing.assert_allclose(
        emb.embed_sentence(s, keep_sentence_boundaries=True, pool="mean"), kept.mean(1), atol=1e-6
    )
    assert emb.embed_sentence([], keep_sentence_boundaries=True).shape == (3, 2, 16)  # <S> </S>


# ------------------------------------------------------------------------------------------------- token cache
def test_token_cache_equals_the_character_path(bilm):
    words = ["the", "bank", "river", "of", "苹果", "😀"]
    plain, cached = Embedder(bilm), Embedder(bilm, vocab_to_cache=words)
    sentences = [["the", "bank", "of", "the", "river"], ["unknown", "bank", "苹果", "😀"], [], ["zzz"]]
    encoded = []
    original = cached.bilm.token_encoder.encode_unique
    cached.bilm.token_encoder.encode_unique = lambda ids: (encoded.append(ids.shape[0]), original(ids))[1]
    cached.bilm._derived.clear()  # the <S> </S> vectors are encoded once per model, then cached
    try:
        got = cached.embed_batch(sentences)
        assert encoded == [2, 2]  # only "unknown" and "zzz" went through the character CNN, then the <S> </S> rows
        cached.embed_batch(sentences)
        assert encoded == [2, 2, 2]  # the boundary vectors were not encoded again
    finally:
        cached.bilm.token_encoder.encode_unique = original
    for a, b in zip(got, plain.embed_batch(sentences)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # a ready TokenVectorCache is accepted too; one from another model is refused
    reuse = Embedder(bilm, vocab_to_cache=TokenVectorCache(bilm, words))
    np.testing.assert_allclose(reuse.embed_sentence(["the", "bank"]), plain.embed_sentence(["the", "bank"]), atol=1e-6)
    with pytest.raises(UsageError, match="TokenVectorCache"):
        Embedder(bilm, vocab_to_cache=TokenVectorCache(_wider_bilm(), words))


def _wider_bilm():
    from elmokit import BiLM, CharCNNConfig, ElmoConfig, LSTMConfig

    return BiLM(
        ElmoConfig(
            char_cnn=CharCNNConfig(filters=[(1, 4)], n_highway=1, embedding_dim=4),
            lstm=LSTMConfig(dim=8, projection_dim=4, n_layers=1),
        )
    ).eval()


def test_token_cache_reproduces_allennlp_token_embeddings():
    d = fixture_dir("allennlp-elmo")
    words = (d / "vocab_test.txt").read_text(encoding="utf-8").split("\n")
    with h5py.File(d / "elmo_token_embeddings.hdf5", "r") as fh:
        expected = fh["embedding"][()]
    emb = Embedder(fixture_model("allennlp-elmo"), vocab_to_cache=words)
    # every word through the cache path (the character CNN is not run: all are cached)
    emb.bilm.token_encoder.encode_unique, original = None, emb.bilm.token_encoder.encode_unique
    try:
        with torch.inference_mode():
            vectors, _ = emb.token_vectors([words])
    finally:
        emb.bilm.token_encoder.encode_unique = original
    assert np.abs(vectors[0].numpy() - expected).max() <= 1e-5


def test_a_long_sentence_runs_the_character_cnn_in_chunks(bilm):
    # the memory bug: the char CNN ran on all tokens of a 10,000-token sentence at once (~3.3 GB with the small
    # model); now at most Embedder.char_chunk distinct words at a time
    emb = Embedder(bilm)
    sentence = [f"w{i}" for i in range(1000)]
    sizes = []
    original = emb.bilm.token_encoder.encode_unique
    emb.bilm.token_encoder.encode_unique = lambda ids: (sizes.append(ids.shape[0]), original(ids))[1]
    emb.bilm._derived.clear()  # the <S> </S> vectors are encoded once per model, then cached
    try:
        got = emb.embed_sentence(sentence, layers="top")
    finally:
        emb.bilm.token_encoder.encode_unique = original
    assert max(sizes) <= emb.char_chunk and sum(sizes) == 1000 + 2  # the words, then the <S> </S> rows
    with torch.inference_mode():
        reference = emb.bilm(batch_to_ids([sentence])).layers[0, -1].numpy()  # the one-pass character path
    np.testing.assert_allclose(got, reference, atol=1e-5)


# ------------------------------------------------------------------------------------------------- files
def test_streaming_reads_and_writes_one_part_at_a_time(bilm, tmp_path, monkeypatch):
    src = _write(tmp_path / "in.txt", LINES * 3)  # 36 lines → parts of 5: 8 parts
    events = []
    folder = tmp_path / "out.h5.parts"

    def probe(event, part, **info):
        if event == "part_read":
            # every earlier part is a finished file, no later one exists: one part in flight
            finished = sorted(p.name for p in folder.iterdir() if p.name.startswith("part-"))
            assert finished == [f"part-{k:06d}.hdf5" for k in range(part)]
        events.append((event, part, info.get("held")))

    import elmokit.data.corpus

    monkeypatch.setattr(elmokit.data.corpus, "read_lines", None)  # the whole-file reader must not be used
    monkeypatch.setattr(embed_output, "_probe", probe)
    emb = Embedder(bilm, batch_size=2)
    assert emb.embed_file(src, tmp_path / "out.h5", format="hdf5", part_size=5, progress=False) == 36
    reads = [(part, held) for event, part, held in events if event == "part_read"]
    assert reads == [(k, 5) for k in range(7)] + [(7, 1)]
    assert max(held for event, _, held in events if event == "batch") <= 2
    assert not folder.exists()  # merged, then removed
    with h5py.File(tmp_path / "out.h5", "r") as h5:
        assert h5.attrs["lines"] == 36 and "sentence_to_index" not in h5
        assert list(h5["sentences"].asstr()[:4]) == [LINES[0], "", LINES[2], LINES[3]]
        assert [h5[str(i)].shape for i in (0, 1, 3)] == [(3, 6, 16), (3, 0, 16), (3, 4, 16)]


def test_formats_agree_and_allennlp_layout_is_kept(bilm, tmp_path):
    src = _write(tmp_path / "in.txt", LINES, bom=True, newline_at_end=False)
    emb = Embedder(bilm)
    outs = {}
    for fmt in ("allennlp", "hdf5", "parts"):
        out = tmp_path / f"o-{fmt}"
        assert emb.embed_file(src, out, format=fmt, part_size=4, progress=False) == len(LINES)
        outs[fmt] = _read_all(out)
    _assert_same(outs["allennlp"], outs["hdf5"])
    _assert_same(outs["allennlp"], outs["parts"])
    with h5py.File(tmp_path / "o-allennlp", "r") as h5:
        index = json.loads(h5["sentence_to_index"][0])
    # stripped lines; the last of repeated lines; the BOM is not part of the first token
    assert index["the bank of the river ."] == "4" and index["padded   spaces"] == "5" and index[""] == "1"
    np.testing.assert_allclose(outs["hdf5"]["3"], emb.embed_sentence(LINES[3].split()), atol=1e-6)
    with open_embeddings(tmp_path / "o-parts") as reader:
        assert reader.sentence(5) == "padded   spaces" and len(reader) == len(LINES)


def test_top_and_average_match_all_through_the_cli(bilm, tmp_path, capsys):
    save_pretrained(bilm, tmp_path / "m")
    src = _write(tmp_path / "in.txt", LINES)
    runs = {
        "all": ["--layers", "all"],
        "top": ["--top"],
        "average": ["--average"],
        "mix": ["--layers", "0,0.5,0.5"],
        "mean": ["--top", "--pool", "mean"],
    }
    got = {}
    for name, flags in runs.items():
        assert (
            cli_main(["embed", str(tmp_path / "m"), str(src), str(tmp_path / f"{name}.h5"), "--no-progress", *flags])
            == 0
        )
        got[name] = _read_all(tmp_path / f"{name}.h5")
    for k, full in got["all"].items():
        np.testing.assert_allclose(got["average"][k], full.mean(0), atol=1e-6)
        np.testing.assert_array_equal(got["top"][k], full[-1])
        np.testing.assert_allclose(got["mix"][k], 0.5 * (full[1] + full[2]), atol=1e-6)
        expected = full[-1].mean(0) if full.shape[1] else np.zeros(16, np.float32)
        np.testing.assert_allclose(got["mean"][k], expected, atol=1e-6)
    capsys.readouterr()
    assert cli_main(["embed", str(tmp_path / "m"), str(src), str(tmp_path / "x.h5"), "--top", "--layers", "0"]) == 2
    assert "--top and --layers 0" in capsys.readouterr().err
    assert cli_main(["embed", str(tmp_path / "m"), str(src), str(tmp_path / "x.h5"), "--layers", "7"]) == 2
    assert "layers 0 (token layer) to 2" in capsys.readouterr().err
    assert cli_main(["embed", str(tmp_path / "m"), str(src), str(tmp_path / "x.h5"), "--top", "--all"]) == 2


def test_batch_size_and_line_order_do_not_change_the_vectors(bilm, tmp_path):
    lines = [
        " ".join(random.Random(i).choices("the a bank river money of on boat 苹果 😀".split(), k=1 + i % 13))
        for i in range(60)
    ] + ["", "x"]
    order = list(range(len(lines)))
    random.Random(0).shuffle(order)
    src = _write(tmp_path / "in.txt", lines)
    shuffled = _write(tmp_path / "shuffled.txt", [lines[i] for i in order])
    emb = Embedder(bilm)
    by_line = {}
    for name, path, bs in (("b1", src, 1), ("b7", src, 7), ("b64", src, 64), ("s7", shuffled, 7), ("s1", shuffled, 1)):
        emb.embed_file(path, tmp_path / f"{name}.h5", batch_size=bs, format="hdf5", progress=False)
        got = _read_all(tmp_path / f"{name}.h5")
        if path is shuffled:  # back to the original line numbers
            got = {str(order[int(k)]): v for k, v in got.items()}
        by_line[name] = got
    for name in ("b7", "b64", "s7"):
        _assert_same(by_line["b1"], by_line[name], atol=1e-4)  # the bound docs/explanation/numerics.md states
    _assert_same(by_line["b1"], by_line["s1"])  # batch size 1: bitwise the same whatever the line order


def test_float16_halves_the_file_within_its_rounding(bilm, tmp_path):
    src = _write(tmp_path / "in.txt", LINES * 4)
    emb = Embedder(bilm)
    emb.embed_file(src, tmp_path / "f32.h5", format="hdf5", progress=False)
    emb.embed_file(src, tmp_path / "f16.h5", format="hdf5", dtype="float16", progress=False)
    a, b = _read_all(tmp_path / "f32.h5"), _read_all(tmp_path / "f16.h5")
    assert all(v.dtype == np.float16 for v in b.values())
    for k in a:
        assert np.all(np.abs(b[k].astype(np.float32) - a[k]) <= np.abs(a[k]) * 2.0**-11 + 2.0**-25)
    data = lambda d: sum(v.nbytes for v in d.values())  # noqa: E731
    assert data(b) * 2 == data(a)


def test_use_sentence_keys_names_datasets_by_their_line(bilm, tmp_path):
    src = _write(tmp_path / "in.txt", LINES)
    emb = Embedder(bilm)
    numbered = _read_all(_embedded(emb, src, tmp_path / "n.h5", format="hdf5"))
    for fmt in ("allennlp", "hdf5", "parts"):
        out = _embedded(emb, src, tmp_path / f"k-{fmt}", format=fmt, use_sentence_keys=True, part_size=3)
        keyed = _read_all(out)
        expected = {}
        for i, line in enumerate(LINES):
            key = sentence_key(line)
            if key is not None and key not in expected:
                expected[key] = numbered[str(i)]  # the first of repeated lines; blank lines have no dataset
        if fmt == "parts":  # the repeated line sits in parts 0 and 1: stored in both, the first returned
            assert sorted(keyed) == sorted(expected) and list(open_embeddings(out)).count(LINES[0]) == 2
        _assert_same(keyed, expected, atol=1e-5)  # other parts, other batches: float rounding
        assert {"a%2Fb c.d . ..", "%2E", "%252F literal", "naïve café 苹果 😀"} <= set(keyed)
    with h5py.File(tmp_path / "k-allennlp", "r") as h5:
        assert "sentence_to_index" not in h5  # as AllenNLP with use_sentence_keys


def _embedded(emb, src, out, **options):
    emb.embed_file(src, out, progress=False, **options)
    return out


def test_tokenizers_moses_and_jieba(bilm, tmp_path):
    src = _write(tmp_path / "in.txt", ["Hello, world! It's 3.5 km.", "我喜欢吃苹果", ""])
    emb = Embedder(bilm)
    moses = _read_all(_embedded(emb, src, tmp_path / "m.h5", format="hdf5", tokenizer="moses"))
    from sacremoses import MosesTokenizer

    tokens = MosesTokenizer(lang="en").tokenize("Hello, world! It's 3.5 km.", escape=False)
    assert tokens[:4] == ["Hello", ",", "world", "!"]
    np.testing.assert_allclose(moses["0"], emb.embed_sentence(tokens), atol=1e-6)
    jieba_out = _read_all(_embedded(emb, src, tmp_path / "j.h5", format="hdf5", tokenizer="jieba"))
    import jieba

    words = jieba.lcut("我喜欢吃苹果")
    assert "苹果" in words and len(words) < 6  # segmented into words, not characters
    np.testing.assert_allclose(jieba_out["1"], emb.embed_sentence(words), atol=1e-6)
    assert jieba_out["2"].shape == (3, 0, 16)
    with pytest.raises(UsageError, match="tokenizer"):
        emb.embed_file(src, tmp_path / "x.h5", tokenizer="spacy")


# ------------------------------------------------------------------------------------------------- resume, workers
def test_resume_after_ctrl_c_continues_from_the_finished_parts(bilm, tmp_path, monkeypatch):
    src = _write(tmp_path / "in.txt", LINES * 2)  # 24 lines, parts of 5 → 5 parts
    emb = Embedder(bilm, batch_size=3)
    reference = _read_all(_embedded(emb, src, tmp_path / "ref.h5", format="hdf5", part_size=5))
    read = []

    def interrupt_after_part_1(event, part, **info):
        if event == "part_read":
            read.append(part)
        if event == "part_done" and part == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(embed_output, "_probe", interrupt_after_part_1)
    out = tmp_path / "out.h5"
    with pytest.raises(KeyboardInterrupt):
        emb.embed_file(src, out, format="hdf5", part_size=5, progress=False)
    folder = tmp_path / "out.h5.parts"
    assert not out.exists() and sorted(p.name for p in folder.iterdir()) == [
        "index.json",
        "part-000000.hdf5",
        "part-000001.hdf5",
    ]
    with pytest.raises(UsageError, match="interrupted run: rerun with resume=True"):  # the Python wording
        emb.embed_file(src, out, format="hdf5", part_size=5, progress=False)
    with pytest.raises(UsageError, match=r"changed pool \(was 'none', now 'mean'\)"):
        emb.embed_file(src, out, format="hdf5", part_size=5, progress=False, resume=True, pool="mean")
    read.clear()
    assert emb.embed_file(src, out, format="hdf5", part_size=5, progress=False, resume=True, batch_size=3) == 24
    assert read == [2, 3, 4] and not folder.exists()
    _assert_same(_read_all(out), reference)
    # a changed input is refused (the finished output is replaced only with overwrite=True)
    monkeypatch.setattr(embed_output, "_probe", interrupt_after_part_1)
    with pytest.raises(UsageError, match="already exists: pass overwrite=True"):
        emb.embed_file(src, out, format="hdf5", part_size=5, progress=False)
    with pytest.raises(KeyboardInterrupt):
        emb.embed_file(src, out, format="hdf5", part_size=5, progress=False, overwrite=True)
    _write(src, LINES * 2 + ["one more"])
    with pytest.raises(UsageError, match="not the file the interrupted run read"):
        emb.embed_file(src, out, format="hdf5", part_size=5, progress=False, resume=True, overwrite=True)


def _env(**extra: str) -> dict:
    # an ASCII locale: the non-ASCII and emoji lines are read as UTF-8 all the same
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT / "src"),
        "OMP_NUM_THREADS": "1",
        "LC_ALL": "C",
        "LANG": "C",
        "PYTHONUTF8": "0",
        "PYTHONIOENCODING": "",
        **extra,
    }


def _killed_at(point: str, cmd: list[str]) -> list[str]:
    """``cmd`` (``python -m elmokit …``) through the test entry tests/run_hooks.py, which SIGKILLs the process at
    ``point`` (``before_rename:<part>``, ``after_part:<part>``) of writing the parts."""
    assert cmd[1:3] == ["-m", "elmokit"]
    return [cmd[0], str(Path(__file__).parent / "run_hooks.py"), "--embed-kill-at", point, "--", *cmd[3:]]


def test_resume_after_kill_9_gives_the_uninterrupted_output(bilm, tmp_path):
    save_pretrained(bilm, tmp_path / "m")
    src = _write(tmp_path / "in.txt", LINES * 2)
    out = tmp_path / "out.h5"
    cmd = [
        sys.executable,
        "-m",
        "elmokit",
        "embed",
        str(tmp_path / "m"),
        str(src),
        str(out),
        "--part-size",
        "5",
        "--no-progress",
        "--batch-size",
        "4",
    ]
    # killed with its part 1 fully written under the temporary name, then (resumed) right after finishing part 3
    first = subprocess.run(_killed_at("before_rename:1", cmd), env=_env(), capture_output=True)
    assert first.returncode == -9, first.stderr.decode()
    folder = tmp_path / "out.h5.parts"
    assert (folder / LOCK_NAME).is_file()  # the killed run's writer lock is left, unlocked: it does not block
    names = sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME)
    assert names[1:] == ["index.json", "part-000000.hdf5"] and names[0].startswith(".part-000001.hdf5.")
    assert not out.exists()
    second = subprocess.run(_killed_at("after_part:3", cmd + ["--resume"]), env=_env(), capture_output=True)
    assert second.returncode == -9, second.stderr.decode()
    assert sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME) == ["index.json"] + [
        f"part-00000{k}.hdf5" for k in range(4)
    ]
    third = subprocess.run(cmd + ["--resume"], env=_env(), capture_output=True)
    assert third.returncode == 0, third.stderr.decode()
    assert not folder.exists()
    reference = _embedded(Embedder(bilm, batch_size=4), src, tmp_path / "ref.h5", format="hdf5", part_size=5)
    _assert_same(_read_all(out), _read_all(reference))  # bitwise: the same batches on one thread


def test_two_workers_give_the_one_worker_output(bilm, tmp_path):
    src = _write(tmp_path / "in.txt", LINES * 3)
    emb = Embedder(bilm, batch_size=4)
    one = _read_all(_embedded(emb, src, tmp_path / "one.h5", format="hdf5", part_size=5))
    two = _read_all(_embedded(emb, src, tmp_path / "two.h5", format="hdf5", part_size=5, workers=2))
    _assert_same(one, two)  # each part is embedded the same way wherever it runs (one thread each)
    keyed = _read_all(
        _embedded(emb, src, tmp_path / "k.h5", format="allennlp", part_size=5, workers=2, use_sentence_keys=True)
    )
    assert len(keyed) == len({sentence_key(x) for x in LINES} - {None})


def test_two_torchrun_processes_give_the_one_process_output_and_resume(bilm, tmp_path):
    """torchrun ranks: each process embeds every second part, process 0 merges — bitwise the one-process file; a
    resumed torchrun run over a folder one process left half done embeds only the missing parts."""
    save_pretrained(bilm, tmp_path / "m")
    src = _write(tmp_path / "in.txt", LINES * 3)
    reference = _embedded(Embedder(bilm, batch_size=4), src, tmp_path / "ref.h5", format="hdf5", part_size=5)
    out = tmp_path / "out.h5"
    args = [
        "-m",
        "elmokit",
        "embed",
        str(tmp_path / "m"),
        str(src),
        str(out),
        "--part-size",
        "5",
        "--no-progress",
        "--batch-size",
        "4",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {k: v for k, v in _env().items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    res = subprocess.run(torchrun + args, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("embedded 36 sentences") == 1  # process 0 reports, process 1 stays quiet
    _assert_same(_read_all(out), _read_all(reference))
    assert not (tmp_path / "out.h5.parts").exists()
    # one process killed after its part 2: the two-process resume finishes the rest, same file
    out.unlink()
    first = subprocess.run(_killed_at("after_part:2", [sys.executable] + args), env=_env(), capture_output=True)
    assert first.returncode == -9
    # without --resume: process 0's usage error, reported as such by both processes (not a gloo "internal error")
    res = subprocess.run(torchrun + args, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert res.stderr.count("holds the parts of an interrupted run") == 2, res.stderr[-2000:]
    assert "process 0 stopped" in res.stderr and "internal error" not in res.stderr
    res = subprocess.run(torchrun + args + ["--resume"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    _assert_same(_read_all(out), _read_all(reference))


def test_parts_folder_rules(bilm, tmp_path):
    src = _write(tmp_path / "in.txt", LINES)
    emb = Embedder(bilm)
    out = tmp_path / "vectors"
    emb.embed_file(src, out, format="parts", part_size=5, progress=False)
    index = json.loads((out / "index.json").read_text())
    assert index["complete"] and index["part_files"] == ["part-000000.hdf5", "part-000001.hdf5", "part-000002.hdf5"]
    with pytest.raises(UsageError, match="already holds finished embeddings: pass overwrite=True"):
        emb.embed_file(src, out, format="parts", part_size=4, progress=False)
    emb.embed_file(src, out, format="parts", part_size=4, progress=False, overwrite=True)  # replaced, as asked
    assert len(json.loads((out / "index.json").read_text())["part_files"]) == 3
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not an elmokit parts folder"):
        emb.embed_file(src, tmp_path / "mine", format="parts", progress=False)
    with pytest.raises(UsageError, match="is a file"):
        emb.embed_file(src, _write(tmp_path / "f.txt", ["a"]), format="parts", progress=False)
    with pytest.raises(UsageError, match="format must be"):
        emb.embed_file(src, tmp_path / "x.h5", format="npz")


def test_embed_refuses_an_output_anywhere_inside_the_model_folder(bilm, tmp_path):
    """Not only beside the weights: a sub-folder of the model folder (a zoo folder's word2vec/) is refused too."""
    save_pretrained(bilm, tmp_path / "m")
    (tmp_path / "m" / "word2vec").mkdir()
    src = _write(tmp_path / "in.txt", LINES[:3])
    for out in (tmp_path / "m" / "v.h5", tmp_path / "m" / "word2vec" / "vectors.bin"):
        assert cli_main(["embed", str(tmp_path / "m"), str(src), str(out), "--no-progress"]) == 2
        assert not out.exists()
