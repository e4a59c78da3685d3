"""ELMoForManyLangs (EFML) parity: elmokit's outputs on an EFML folder equal EFML 0.0.4.post2's own.

tests/fixtures/efml/ was made by tools/make_efml_fixtures.py in a venv holding EFML: a small random-weight model written
by EFML's own trainer (dictionaries, config.json) and its own module classes and save code (the .pkl files), and
EFML's ``Embedder.sents2elmo`` outputs for output_layer 0, 1, 2, -1, -2 (each on a fresh Embedder) on 8 English and
8 Chinese (word-segmented) UD sentences and two made-up ones with over-long tokens, plus a second call's outputs on
one Embedder (its carried state). EFML's own float64-vs-float32 gap on this input is in the fixture (≈ 1e-7).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT
from elmokit import Elmo, Embedder, batch_to_ids, load_pretrained_bilm
from elmokit.cli import main as cli_main
from elmokit.compat.efml import Embedder as EfmlEmbedder
from elmokit.errors import UsageError
from elmokit.weights.fingerprint import bilm_fingerprint

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "efml"
TOL = 1e-5  # EFML's outputs here are within ±0.5; its own float64 gap is ≈ 1.4e-7
META = json.loads((FIXTURE / "sentences.json").read_text(encoding="utf-8"))
SENTENCES = META["sentences"]
N_EN, N_ZH = META["english"], META["chinese"]


def _expected(key: str) -> list[np.ndarray]:
    """EFML's arrays for ``key``, one per sentence (the fixture concatenates them along the token axis)."""
    data = np.load(FIXTURE / "expected.npz")[key]
    return np.split(data, np.cumsum(META["lengths"])[:-1], axis=-2)


def _max_gap(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    assert [g.shape for g in got] == [w.shape for w in want]
    return max(float(np.abs(g - w).max()) for g, w in zip(got, want) if g.size)


@pytest.fixture(scope="module")
def embedder(one_thread):
    return EfmlEmbedder(FIXTURE)


def test_the_fixture_is_what_its_generator_says():
    assert META["lengths"] == [len(s) for s in SENTENCES] and N_EN == N_ZH == 8
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in "".join(s)) for s in SENTENCES[N_EN : N_EN + N_ZH])
    assert float(np.load(FIXTURE / "expected.npz")["f64_gap"]) < 1e-6  # well-conditioned: a 1e-5 bound means something


@pytest.mark.parametrize("layer", [0, 1, 2, -1, -2])
def test_sents2elmo_equals_efml_on_english_and_chinese(embedder, layer):
    got = embedder.sents2elmo(SENTENCES, output_layer=layer)
    want = _expected(f"layer{layer}")
    assert all(g.dtype == np.float32 for g in got)
    assert got[0].shape == ((3, len(SENTENCES[0]), 32) if layer == -2 else (len(SENTENCES[0]), 32))
    english, chinese = slice(0, N_EN), slice(N_EN, N_EN + N_ZH)
    assert _max_gap(got[english], want[english]) <= TOL
    assert _max_gap(got[chinese], want[chinese]) <= TOL
    assert _max_gap(got, want) <= TOL  # the over-long tokens and the one-token sentence too
    assert max(float(np.abs(w).max()) for w in want) > 0.1  # not a comparison of near-zeros


def test_output_layers_relate_as_in_efml(embedder):
    every = embedder.sents2elmo(SENTENCES[:3], output_layer=-2)
    for k in range(3):
        assert all(np.array_equal(a[k], b) for a, b in zip(every, embedder.sents2elmo(SENTENCES[:3], k)))
    mean = embedder.sents2elmo(SENTENCES[:3], -1)
    assert all(np.allclose(a.mean(axis=0), m, atol=1e-7) for a, m in zip(every, mean))
    half = every[0].shape[-1] // 2
    assert np.array_equal(every[0][0, :, :half], every[0][0, :, half:])  # layer 0 = [t; t]


def test_stateless_by_default_and_efml_carried_state_on_request(embedder):
    first = embedder.sents2elmo(SENTENCES, -2)
    assert all(np.array_equal(a, b) for a, b in zip(first, embedder.sents2elmo(SENTENCES, -2)))  # deterministic
    second = _expected("second_call")  # EFML: a second call on one Embedder starts from the state the first reached
    assert _max_gap(first, second) > 1e-2
    stateful = EfmlEmbedder(FIXTURE, stateful=True)
    assert _max_gap(stateful.sents2elmo(SENTENCES, -2), _expected("layer-2")) <= TOL
    assert _max_gap(stateful.sents2elmo(SENTENCES, -2), second) <= TOL
    stateful.reset_states()
    assert _max_gap(stateful.sents2elmo(SENTENCES, -2), _expected("layer-2")) <= TOL


def test_input_order_is_kept_and_batches_do_not_matter(one_thread):
    small = EfmlEmbedder(FIXTURE, batch_size=3)
    got = small.sents2elmo(SENTENCES[::-1], 1)[::-1]
    assert _max_gap(got, _expected("layer1")) <= TOL


@pytest.mark.parametrize("bad", [3, -3, "1", 1.0, None])
def test_a_bad_output_layer_is_one_line(embedder, bad):
    with pytest.raises(UsageError) as info:
        embedder.sents2elmo(SENTENCES[:1], output_layer=bad)
    message = str(info.value)
    assert "\n" not in message and "output_layer must be an int in -2 … 2" in message and repr(bad) in message


def test_tokens_are_cut_to_max_chars_minus_two_before_both_lookups(embedder):
    vocab = embedder.bilm.char_vocab
    c = vocab.max_characters_per_token
    assert c == 16 and vocab.id_width == 17
    longest, longer = "abcdefghijklmn", "internationalization"  # 14 = C − 2 characters, and 20
    row = vocab.token_to_ids(longest)
    # crossed, as EFML's code places them: <eow>'s id first, <bow>'s after the characters (+1: 0 = no token)
    assert row[0] == vocab.chars.index("<eow>") + 1 and row[c - 1] == vocab.chars.index("<bow>") + 1
    assert vocab.token_to_ids(longer) == vocab.token_to_ids(longer[: c - 2])
    cut = longer[: c - 2]
    assert vocab.token_to_ids(longer)[-1] == vocab.words.index(cut if cut in vocab.words else "<oov>")
    sentence = SENTENCES[N_EN + N_ZH]
    assert longest in sentence and longer in sentence  # and the parity test covers this sentence
    a, b = embedder.sents2elmo([[longer, "x"], [longer[:14], "x"]], 0)
    assert np.array_equal(a, b)


def test_elmo_and_embedder_read_the_efml_folder(one_thread):
    want_mean, want_all = _expected("layer-1"), _expected("layer-2")
    elmo = Elmo.from_pretrained(FIXTURE, num_output_representations=1).eval()
    ids = batch_to_ids(SENTENCES, char_vocab=elmo.bilm.char_vocab)
    assert ids.shape == (len(SENTENCES), max(META["lengths"]), 17)
    with torch.no_grad():
        out = elmo(ids)
    mixed = out["elmo_representations"][0]  # ScalarMix at its start: the plain mean of the 3 layers
    got = [mixed[i, : len(s)].numpy() for i, s in enumerate(SENTENCES)]
    assert _max_gap(got, want_mean) <= TOL
    assert out["mask"].sum(1).tolist() == META["lengths"]  # padding positions masked
    assert float(mixed[~out["mask"]].abs().max()) == 0.0
    embedder = Embedder(FIXTURE, vocab_to_cache=sorted({t for s in SENTENCES[:4] for t in s}))
    assert _max_gap(list(embedder.embed_sentences(SENTENCES)), want_all) <= TOL


def test_convert_gives_a_native_folder_with_identical_vectors(tmp_path, capsys, one_thread):
    out = tmp_path / "native"
    assert cli_main(["convert", str(FIXTURE), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["char.dic", "config.json", "model.safetensors", "word.dic"]
    original, native = load_pretrained_bilm(FIXTURE), load_pretrained_bilm(out)
    assert bilm_fingerprint(original) == bilm_fingerprint(native)
    ids = batch_to_ids(SENTENCES, char_vocab=native.char_vocab)
    assert torch.equal(ids, batch_to_ids(SENTENCES, char_vocab=original.char_vocab))
    with torch.no_grad():
        assert torch.equal(original(ids).layers, native(ids).layers)
    assert _max_gap(EfmlEmbedder(out).sents2elmo(SENTENCES, -2), _expected("layer-2")) <= TOL
    capsys.readouterr()
    assert cli_main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "elmokit (converted from ELMoForManyLangs)" and info["word_vocab_size"] == 1104
