"""elmokit.data.examples: the bundled example sentences, one home that the quickstart recipes and the server's page
both read (issue 39: the library no longer imports a recipe for them)."""

from collections import Counter

import httpx
import pytest

from elmokit.data.examples import APPLE_SENTENCES, APPLE_TEXTS, BANK_SENTENCES
from elmokit.embedding import Embedder
from elmokit.recipes.quickstart.en import en_job
from elmokit.recipes.quickstart.zh import zh_job
from elmokit.serving.settings import ServeSettings
from elmokit.weights.native import load_pretrained_bilm
from serve_helpers import running_server, save_tiny_model


@pytest.mark.parametrize(
    ("rows", "word", "senses"),
    [(BANK_SENTENCES, "bank", {"river": 3, "money": 3}), (APPLE_SENTENCES, "苹果", {"fruit": 4, "company": 4})],
)
def test_each_example_holds_its_word_once_at_its_index(rows, word, senses):
    assert Counter(sense for sense, _, _ in rows) == senses
    for _, tokens, i in rows:
        assert tokens[i] == word and tokens.count(word) == 1
        assert all(t and not t.isspace() and " " not in t for t in tokens)


def test_the_apple_texts_are_the_segmented_sentences_joined():
    assert [s for s, _ in APPLE_TEXTS] == [s for s, _, _ in APPLE_SENTENCES]
    assert [t for _, t in APPLE_TEXTS] == ["".join(tokens) for _, tokens, _ in APPLE_SENTENCES]


def test_the_quickstarts_probe_with_them():
    assert en_job().probes is BANK_SENTENCES and zh_job().probes is APPLE_SENTENCES


def test_the_server_page_offers_them(tmp_path, one_thread):
    model = save_tiny_model(tmp_path / "model")
    settings = ServeSettings(model=str(model), max_wait_ms=5)
    with running_server(settings, Embedder(load_pretrained_bilm(model))) as (url, _):
        ex = httpx.get(f"{url}/examples", timeout=30).json()
    assert ex == {
        "bank": {
            "word": "bank",
            "sentences": [t for _, t, _ in BANK_SENTENCES],
            "labels": ["river"] * 3 + ["money"] * 3,
        },
        "苹果": {
            "word": "苹果",
            "sentences": [t for _, t, _ in APPLE_SENTENCES],
            "labels": ["fruit"] * 4 + ["company"] * 4,
        },
    }
