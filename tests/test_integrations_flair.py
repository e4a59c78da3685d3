"""``elmokit.integrations.flair.ELMoEmbeddings`` in flair 0.15: the token vectors equal the Embedder's in each
``embedding_mode``, a ``SequenceTagger`` trains on them (a slice of CoNLL-2003, ../shared/data/conll2003), and a saved
tagger loads again in a process that has not imported this module. Needs the ``flair`` extra (in ``test``)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from conftest import shared_path
from elmokit import Embedder
from helpers import assert_close_to_scale, fixture_dir

flair_data = pytest.importorskip("flair.data", reason="flair is not installed (pip install 'elmokit[flair]')")
from flair.datasets import FlairDatapointDataset  # noqa: E402
from flair.embeddings.base import EMBEDDING_CLASSES  # noqa: E402
from flair.models import SequenceTagger  # noqa: E402

from elmokit.integrations.flair import ELMoEmbeddings  # noqa: E402

N_TRAIN = 24


def _conll_sentences(n: int) -> list:
    """The first ``n`` sentences of CoNLL-2003's dev file as flair Sentences with "ner" spans (IOB1 tags)."""
    rows: list[list[tuple[str, str]]] = [[]]
    with open(shared_path("data", "conll2003", "eng.testa"), encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if not parts:
                if rows[-1]:
                    rows.append([])
                    if len(rows) > n:
                        break
            elif parts[0] != "-DOCSTART-":
                rows[-1].append((parts[0], parts[-1]))
    sentences = []
    for row in rows[:n]:
        sentence = flair_data.Sentence([w for w, _ in row])
        start, kind = None, None
        for i, (_, tag) in enumerate([*row, ("", "O")]):
            prefix, _, t = tag.partition("-")
            if start is not None and (prefix != "I" or t != kind):
                sentence[start:i].add_label("ner", kind)
                start = None
            if prefix == "B" or (prefix == "I" and start is None):
                start, kind = i, t
        sentences.append(sentence)
    return sentences


@pytest.fixture(scope="module")
def model_files():
    d = fixture_dir("allennlp-elmo")
    return str(d / "options.json"), str(d / "lm_weights.hdf5")


@pytest.mark.parametrize("mode", ["all", "top", "average"])
def test_token_vectors_equal_the_embedders(model_files, mode):
    embeddings = ELMoEmbeddings(options_file=model_files[0], weight_file=model_files[1], embedding_mode=mode)
    assert embeddings.name == f"elmo-allennlp-elmo-{mode}"
    assert embeddings.embedding_length == (96 if mode == "all" else 32)
    sentence = _conll_sentences(3)[2]
    embeddings.embed(sentence)
    got = torch.stack([token.get_embedding([embeddings.name]) for token in sentence]).numpy()
    want = Embedder(*model_files).embed_sentence([t.text for t in sentence], layers=mode)
    if mode == "all":  # layer 0, then layer 1, then layer 2, each (n, 32)
        want = np.concatenate(list(want), axis=-1)
    assert got.shape == (len(sentence), embeddings.embedding_length)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["all", "top"])
def test_an_empty_sentence_in_a_batch_gets_no_vectors_and_the_others_theirs(model_files, mode):
    embeddings = ELMoEmbeddings(options_file=model_files[0], weight_file=model_files[1], embedding_mode=mode)
    empty, words = flair_data.Sentence(""), flair_data.Sentence(["The", "bank", "closed"])
    embeddings.embed([empty, words])  # "all" once failed reshaping the empty sentence's (3, 0, 32) array
    assert len(empty) == 0
    got = torch.stack([token.get_embedding([embeddings.name]) for token in words]).numpy()
    want = Embedder(*model_files).embed_sentence(["The", "bank", "closed"], layers=mode)
    # batched with the empty sentence, not alone: equal to float rounding
    assert_close_to_scale(got, np.concatenate(list(want), axis=-1) if mode == "all" else want, 1e-5)


def test_a_whitespace_token_is_embedded_as_flairs_allennlp_embeddings_did(model_files):
    embeddings = ELMoEmbeddings(options_file=model_files[0], weight_file=model_files[1], embedding_mode="top")
    sentence = flair_data.Sentence(["The", " ", "bank"])  # flair keeps " " as a token
    assert [t.text for t in sentence] == ["The", " ", "bank"]
    embeddings.embed(sentence)  # was: InputError naming an empty_tokens option this class does not take
    got = torch.stack([token.get_embedding([embeddings.name]) for token in sentence]).numpy()
    want = Embedder(*model_files, empty_tokens="keep").embed_sentence(["The", " ", "bank"], layers="top")
    np.testing.assert_array_equal(got, want)


def test_a_sequence_tagger_trains_saves_and_loads(tmp_path, monkeypatch, model_files):
    torch.manual_seed(0)
    sentences = _conll_sentences(N_TRAIN + 4)
    train, held = sentences[:N_TRAIN], sentences[N_TRAIN:]
    assert sum(len(s.get_labels("ner")) for s in train) >= 20  # real entities to learn
    corpus = flair_data.Corpus(FlairDatapointDataset(train), FlairDatapointDataset(held), FlairDatapointDataset(held))
    tags = corpus.make_label_dictionary("ner", add_unk=False)
    embeddings = ELMoEmbeddings(options_file=model_files[0], weight_file=model_files[1], embedding_mode="top")
    tagger = SequenceTagger(
        embeddings=embeddings,
        tag_dictionary=tags,
        tag_type="ner",
        hidden_size=16,
        use_rnn=False,
        use_crf=False,
        reproject_embeddings=False,
        word_dropout=0.0,
        locked_dropout=0.0,
    )
    assert not any(p.requires_grad for p in embeddings.bilm.parameters())
    optimizer = torch.optim.SGD([p for p in tagger.parameters() if p.requires_grad], lr=0.5)
    losses = []
    for _ in range(3):  # epochs of mini-batches of 4
        total, count = 0.0, 0
        for i in range(0, len(train), 4):
            loss, n = tagger.forward_loss(train[i : i + 4])
            optimizer.zero_grad()
            (loss / n).backward()
            optimizer.step()
            total, count = total + float(loss.detach()), count + n
        losses.append(total / count)
    assert all(np.isfinite(losses)) and losses[2] < 0.8 * losses[0], losses
    path = tmp_path / "tagger.pt"
    tagger.save(path)
    # the file brings its own loader: reading it imports elmokit.integrations.flair (which registers the class)
    monkeypatch.delitem(sys.modules, "elmokit.integrations.flair")
    monkeypatch.delitem(EMBEDDING_CLASSES, "ElmokitELMoEmbeddings")
    loaded = SequenceTagger.load(path)
    assert "ElmokitELMoEmbeddings" in EMBEDDING_CLASSES
    assert loaded.embeddings.name == embeddings.name and loaded.embeddings.embedding_length == 32
    for key, value in embeddings.bilm.state_dict().items():
        assert torch.equal(loaded.embeddings.bilm.state_dict()[key], value), key
    tagger.eval()
    with torch.no_grad():
        before = float(tagger.forward_loss(held)[0])
        for sentence in held:
            sentence.clear_embeddings()  # the loaded tagger computes them itself
        after = float(loaded.forward_loss(held)[0])
    assert after == pytest.approx(before, rel=1e-6)
    copies = [flair_data.Sentence([t.text for t in s]) for s in held]
    again = [flair_data.Sentence([t.text for t in s]) for s in held]
    tagger.predict(copies)
    loaded.predict(again)
    spans = [[(label.data_point.text, label.value) for label in s.get_labels("ner")] for s in copies]
    assert spans == [[(label.data_point.text, label.value) for label in s.get_labels("ner")] for s in again]
