"""No silent garbage (issue 19, item 4): untokenised lines and out-of-vocabulary targets are reported.

Observed before: raw Chinese without ``--tokenizer jieba`` became one token per line, cut at the model's character
limit, and was embedded and scored without a word; a line of 5,000 random words scored a low perplexity; ``perplexity``
and ``score`` never said how many targets were ``<UNK>``."""

from __future__ import annotations

import dataclasses
import json
import logging
import random

import pytest
import torch

from elmokit.characters import CharVocabulary
from elmokit.cli import main as cli_main
from elmokit.config import elmo_tiny
from elmokit.data.text_checks import (
    CJK_RUN,
    SUSPECT_TOKEN_SHARE,
    UNK_WARN_SHARE,
    check_tokenisation,
    token_limit,
    unk_targets,
    unk_warning,
)
from elmokit.pretraining.objective import BidirectionalLM
from elmokit.pretraining.perplexity import evaluate_perplexity
from elmokit.pretraining.trainer import save_lm
from elmokit.vocabulary import Vocabulary

WORDS = [
    "<S>",
    "</S>",
    "<UNK>",
    "我",
    "喜欢",
    "吃",
    "苹果",
    "香蕉",
    "，",
    "也",
    "和",
    "。",
    "很",
    "好",
    "我们",
    "去",
    "他",
    "说",
    "the",
    "river",
    "bank",
    ".",
]
RAW_ZH = "我喜欢吃苹果，也喜欢吃香蕉和橘子。\n今天天气很好，我们去公园散步吧。\n他说苹果很甜\n"


def _char_config(c: int = 10):
    cfg = elmo_tiny()
    chars = CharVocabulary(sorted({ch for w in WORDS[3:] for ch in w}), max_characters_per_token=c)
    return dataclasses.replace(
        cfg, char_cnn=dataclasses.replace(cfg.char_cnn, max_characters_per_token=c, char_vocab_size=chars.vocab_size)
    ), chars


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two untrained LM folders: a character-vocabulary one (C = 10, as elmokit-zh) and a byte one (C = 50)."""
    root = tmp_path_factory.mktemp("text_checks")
    torch.manual_seed(0)
    config, chars = _char_config()
    save_lm(BidirectionalLM(config, Vocabulary(WORDS), dropout=0.0, char_vocab=chars), root / "zh")
    save_lm(BidirectionalLM(elmo_tiny(), Vocabulary(WORDS), dropout=0.0), root / "en")
    return root


# ---------------------------------------------------------------------------------------------- the rules
def test_token_limit_follows_the_character_scheme():
    assert token_limit(elmo_tiny()) == (48, "bytes")
    assert token_limit(_char_config()[0]) == (8, "characters")


def test_check_tokenisation_by_hand():
    config = _char_config()[0]  # limit 8 characters
    lines = [(1, ["我", "喜欢", "苹果"]), (2, ["我喜欢吃苹果和香蕉"]), (3, ["六个字的词语"]), (4, ["abcdefghi"])]
    check = check_tokenisation(lines, config)
    # 6 tokens: one cut (9 CJK characters > 8), one run of 6 CJK characters, one cut Latin token (9 > 8)
    assert (check.tokens, check.cut, check.cjk_runs, check.cjk) == (6, 2, 1, 2)
    assert check.share == pytest.approx(3 / 6) and check.example == (2, "我喜欢吃苹果和香蕉")
    warning = check.warning()
    assert "50.0 % of the 6 tokens" in warning and "--tokenizer jieba" in warning and "line 2" in warning
    # segmented text: nothing to say (a 5-character word is an ordinary word)
    assert check_tokenisation([(1, ["我", "喜欢", "五个字词语"])], config).warning() is None
    assert CJK_RUN == 6
    # byte model: 48 bytes = 16 CJK characters; raw English is split on spaces and its long tokens are not CJK
    long_latin = [(1, ["x" * 60, "a", "b"])]
    check = check_tokenisation(long_latin, elmo_tiny())
    assert check.cut == 1 and check.cjk == 0 and "--tokenizer moses" in check.warning()
    # already segmented by jieba: no tokenizer to suggest, only spaces
    check = check_tokenisation([(1, ["十个字十个字十个字十"])], config, tokenizer="jieba")
    assert "--tokenizer" not in check.warning()
    # at the threshold no warning, above it one (share > SUSPECT_TOKEN_SHARE)
    n = int(1 / SUSPECT_TOKEN_SHARE)
    assert check_tokenisation([(1, ["x" * 60] + ["a"] * (n - 1))], elmo_tiny()).warning() is None
    assert check_tokenisation([(1, ["x" * 60] + ["a"] * (n - 2))], elmo_tiny()).warning() is not None


def test_unk_targets_and_warning_by_hand():
    vocab = Vocabulary(WORDS)
    # words + one boundary per sentence; an empty sentence is one target; a literal <UNK> counts as unknown
    assert unk_targets(vocab, [["the", "zebra", "bank"], [], ["<UNK>", "river"]]) == (2, 4 + 1 + 3)
    assert unk_warning(1, 4, len(vocab)) is None  # 25 %: at the threshold
    assert UNK_WARN_SHARE == 0.25
    warning = unk_warning(26, 100, len(vocab))
    assert "26.0 % of the targets (26 of 100) are <UNK>" in warning and f"vocabulary of {len(vocab)}" in warning
    assert unk_warning(0, 0, 5) is None


def test_evaluate_perplexity_reports_the_unk_share(models):
    from elmokit.pretraining.trainer import load_lm

    lm = load_lm(models / "en")
    result = evaluate_perplexity(lm, [["the", "zebra", "bank"], ["a", "b"]])
    assert result["tokens"] == 4 + 3 and result["unk_targets"] == 3
    assert result["unk_share"] == pytest.approx(3 / 7)
    # a generator is read once for the perplexity and once for the count: the same figures
    assert evaluate_perplexity(lm, (s for s in [["the", "zebra", "bank"], ["a", "b"]])) == pytest.approx(result)


# ---------------------------------------------------------------------------------------------- the observations
def test_raw_chinese_is_reported_by_perplexity_score_and_embed(models, tmp_path, capsys, caplog):
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW_ZH, encoding="utf-8")
    assert cli_main(["perplexity", str(models / "zh"), str(raw)]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    # every line is one token: three targets a line, the line itself <UNK>
    assert result["tokens"] == 6 and result["unk_targets"] == 3 and result["unk_share"] == pytest.approx(0.5)
    assert "look untokenised" in err and "--tokenizer jieba" in err and "cut at the model's limit of 8" in err
    assert "50.0 % of the targets (3 of 6) are <UNK>" in err
    # the fix the warning names: segmented, the same text has fewer unknown words and no tokenisation warning
    assert cli_main(["perplexity", str(models / "zh"), str(raw), "--tokenizer", "jieba"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    # jieba's 26 words + 3 boundaries; unknown: 橘子, 今天天气, 公园, 散步, 吧, 很甜
    assert (result["tokens"], result["unk_targets"]) == (29, 6) and "untokenised" not in err and "<UNK>" not in err
    assert cli_main(["score", str(models / "zh"), str(raw)]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["unk"] for x in lines] == [1, 1, 1] and [x["words"] for x in lines] == [1, 1, 1]
    assert "look untokenised" in err and "--tokenizer jieba" in err and "(3 of 6) are <UNK>" in err
    with caplog.at_level(logging.WARNING, logger="elmokit"):
        assert cli_main(["embed", str(models / "zh"), str(raw), str(tmp_path / "v.h5"), "--no-progress"]) == 0
    assert "look untokenised" in caplog.text and "--tokenizer jieba" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="elmokit"):
        assert (
            cli_main(
                ["embed", str(models / "zh"), str(raw), str(tmp_path / "w.h5"), "--no-progress", "--tokenizer", "jieba"]
            )
            == 0
        )
    assert "untokenised" not in caplog.text
    # a byte model (48 bytes = 16 CJK characters) reading the same raw lines: cut as well
    assert cli_main(["perplexity", str(models / "en"), str(raw)]) == 0
    assert "--tokenizer jieba" in capsys.readouterr().err


def test_random_words_are_all_unk_and_say_so(models, tmp_path, capsys):
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7)) for _ in range(5000)]
    path = tmp_path / "random.txt"
    path.write_text(" ".join(words) + "\n", encoding="utf-8")
    assert cli_main(["perplexity", str(models / "en"), str(path)]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert (result["tokens"], result["unk_targets"]) == (5001, 5000)
    assert "100.0 % of the targets (5000 of 5001) are <UNK>" in err and "untokenised" not in err
    # ordinary text in the vocabulary: a note with the share for score, nothing for perplexity
    good = tmp_path / "good.txt"
    good.write_text("the river bank .\n\nthe bank\n", encoding="utf-8")
    assert cli_main(["perplexity", str(models / "en"), str(good)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["unk_targets"] == 0 and err == ""
    assert cli_main(["score", str(models / "en"), str(good)]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(x)["unk"] for x in out.splitlines()] == [0, 0, 0]
    assert "note: 0 of the 9 targets (0.0 %) are <UNK>" in err
