"""The main job end to end on its real corpus, kept short (a few steps): every stage runs and reports what it says."""
import json
import math
from collections import Counter

import pytest

from elmokit.cli import main as cli_main
from elmokit.quickstart import BANK_SENTENCES, load_lee_corpus, tokenize
from elmokit.training.trainer import load_lm


def test_tokenize_sentences_and_punctuation():
    assert tokenize('He said "hi." Then 3,000 people left! Don\'t go.') == [
        ["He", "said", '"', "hi", ".", '"'], ["Then", "3,000", "people", "left", "!"], ["Don't", "go", "."]]


def test_lee_corpus_split_is_disjoint_articles():
    train, held = load_lee_corpus()
    assert len(train) > 2000 and len(held) > 200
    assert sum(map(len, train)) > 50_000
    assert all(s for s in train + held)


@pytest.mark.slow
def test_quickstart_runs_every_stage(tmp_path, capsys):
    assert cli_main(["quickstart", "--out-dir", str(tmp_path), "--steps", "8"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "quickstart.json").read_text())
    assert result["steps"] == 8
    assert f"unigram baseline (add-one, same vocabulary of" in printed and "top layer" in printed
    # the unigram figure is the add-one model over the saved vocabulary, recomputed here independently
    lm = load_lm(result["model_dir"])
    train, held = load_lee_corpus()
    counts = Counter(lm.vocab.token_to_id(w) for s in train for w in s)
    counts[lm.vocab.eos_id] += len(train)
    total = sum(counts.values()) + len(lm.vocab)
    targets = [lm.vocab.token_to_id(w) for s in held for w in s] + [lm.vocab.eos_id] * len(held)
    expected = math.exp(-sum(math.log((counts[t] + 1) / total) for t in targets) / len(targets))
    assert result["unigram_perplexity"] == pytest.approx(expected, rel=1e-9)
    # rare words are <UNK> (min count 2): the vocabulary is smaller than the set of training words
    assert len(lm.vocab) < len({w for s in train for w in s})
    assert set(result["bank_cosine"]) == {"river 1 ~ river 2", "river 1 ~ money", "river 2 ~ money"}
    assert all(-1 <= v <= 1 for v in result["bank_cosine"].values())
    assert [t[i] for _, t, i in BANK_SENTENCES] == ["bank"] * 3
