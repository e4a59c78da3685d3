"""Downstream task models (elmokit.tasks.models / training / config): tiny biLM, tiny data, a few steps."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch

from elmokit import Elmo, save_pretrained
from elmokit.errors import CheckpointError, ConfigError, DataError, InputError, UsageError
from elmokit.tasks.config import SCHEMA, BilmSection, TaskConfig, TrainSection, load_task_config, task_config_from_dict
from elmokit.tasks.models import SentenceClassifier, SequenceTagger, TokenInputs
from elmokit.tasks.training import (
    TaskData,
    TaskModel,
    aligned_segmenter,
    bilm_fingerprint,
    build_from_config,
    char_words,
    fit,
    load_task_model,
    prepare_task,
    save_task_model,
    train_from_config,
)
from elmokit.weights.fingerprint import FINGERPRINT_VERSION, legacy_weights_sha256
from helpers import tiny_random_bilm

ANIMALS, THINGS = ["cat", "dog", "bird"], ["mat", "tree", "car"]
FILLER = "the a sat ran on under big small red fast slowly".split()


def tag_sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """Sentences of 3–7 words; animals are ANI entities, things OBJ (one token each), the rest O."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(FILLER + ANIMALS + THINGS) for _ in range(rng.randint(3, 7))]
        tags = ["B-ANI" if w in ANIMALS else "B-OBJ" if w in THINGS else "O" for w in words]
        out.append((words, tags))
    return out


def write_conll(path, sentences) -> None:
    """CoNLL-2003 (token POS chunk NER, IOB1: a lone entity token is I-X)."""
    lines = ["-DOCSTART- -X- -X- O", ""]
    for words, tags in sentences:
        lines += [f"{w} NN I-NP {t.replace('B-', 'I-')}" for w, t in zip(words, tags)] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")


def class_sentences(n: int, seed: int) -> list[tuple[list[str], str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(FILLER + THINGS) for _ in range(rng.randint(3, 7))]
        label = "pos" if rng.random() < 0.5 else "neg"
        if label == "pos":
            words[rng.randrange(len(words))] = rng.choice(ANIMALS)
        out.append((words, label))
    return out


def write_labelled(path, rows) -> None:
    path.write_text("".join(f"{label}\t{' '.join(words)}\n" for words, label in rows), encoding="utf-8")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one torch thread is as fast alone and far faster on a loaded machine (two threads of tiny ops
    wait for each other); restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def bilm_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bilm") / "tiny"
    save_pretrained(tiny_random_bilm(0), folder)
    return folder


def base_config(tmp_path, bilm_dir, task="tag", **sections) -> dict:
    if task == "tag":
        write_conll(tmp_path / "train.txt", tag_sentences(40, 1))
        write_conll(tmp_path / "dev.txt", tag_sentences(12, 2))
        data = {"reader": "conll2003"}
    else:
        write_labelled(tmp_path / "train.txt", class_sentences(40, 1))
        write_labelled(tmp_path / "dev.txt", class_sentences(12, 2))
        data = {"reader": "labelled"}
    data.update(train=str(tmp_path / "train.txt"), dev=str(tmp_path / "dev.txt"))
    raw = {
        "task": task,
        "data": data,
        "bilm": {"model": str(bilm_dir), "cache": False, "dropout": 0.0},
        "static": {"vectors": "random", "dim": 8},
        "model": {"hidden": 8, "dropout": 0.0},
        "train": {"epochs": 2, "patience": 2, "batch_size": 8, "lr": 0.01, "seed": 0},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return raw


# ------------------------------------------------------------------------------------------------ live == cached
def test_live_elmo_equals_cached_layers():
    """The same ScalarMix parameters mix the live biLM output and precomputed layers: emissions agree."""
    bilm = tiny_random_bilm(3)
    elmo = Elmo(bilm=bilm, num_output_representations=2, dropout=0.0, do_layer_norm=True, layer_norm_mask="tokens")
    with torch.no_grad():  # non-default mix weights, so that a wrong layer order would show
        for mix in elmo.scalar_mixes:
            for k, p in enumerate(mix.scalar_parameters):
                p.fill_(0.3 * k - 0.2)
            mix.gamma.fill_(1.7)
    vocab = ["<pad>", "<unk>", "the", "cat"]
    inputs = TokenInputs(
        vocab,
        torch.randn(4, 5),
        elmo=elmo,
        elmo_at_output=True,
        char_cnn={"embedding_dim": 4, "filters": [[1, 4], [2, 4]], "max_characters": 8},
    )
    tagger = SequenceTagger(inputs, 3, hidden=6).eval()
    sentences = [["the", "cat", "sat", "down"], ["A", "dog"], ["the"]]
    live = inputs.encode(sentences)
    out = bilm(live.elmo_char_ids)
    cached = inputs.encode(sentences, layers=out.layers, layer_mask=out.mask)
    assert cached.elmo_char_ids is None and live.layers is None
    e_live, e_cached = tagger.emissions(live), tagger.emissions(cached)
    assert e_live.shape == (3, 4, 3)
    assert torch.allclose(e_live, e_cached, atol=1e-4)
    # and the layers really enter: other layers change the emissions
    other = inputs.encode(sentences, layers=out.layers.flip(1), layer_mask=out.mask)
    assert (tagger.emissions(other) - e_live).abs().max() > 1e-3


def test_cached_layers_refused_for_fine_tuning_and_boundary_layer_norm():
    bilm = tiny_random_bilm(0)
    out = bilm(torch.ones(1, 2, 50, dtype=torch.long))
    fine = TokenInputs(elmo=Elmo(bilm=bilm, requires_grad=True))
    with pytest.raises(UsageError, match="fine-tuned"):
        fine.encode([["a", "b"]], layers=out.layers, layer_mask=out.mask)
    norm = TokenInputs(elmo=Elmo(bilm=tiny_random_bilm(0), do_layer_norm=True))  # layer_norm_mask with_boundaries
    with pytest.raises(UsageError, match="layer_norm_mask='tokens'"):
        norm.encode([["a", "b"]], layers=out.layers, layer_mask=out.mask)


def test_encode_rejects_empty_sentence_and_bad_static_vocab():
    inputs = TokenInputs(["<pad>", "<unk>", "x"], torch.zeros(3, 2))
    with pytest.raises(InputError, match="sentence 1 of the batch is empty"):
        inputs.encode([["x"], []])
    with pytest.raises(UsageError, match="<pad>"):
        TokenInputs(["<unk>", "x"], torch.zeros(2, 2))
    # lookup: exact, then lower-cased, else <unk>
    assert inputs.word_ids([["x", "X", "y"]]).tolist() == [[2, 2, 1]]


def test_classifier_pooling_ignores_padding():
    """A sentence's logits alone equal its logits inside a padded batch (max and attention pooling)."""
    torch.manual_seed(0)
    for pooling in ("max", "attention"):
        inputs = TokenInputs(
            ["<pad>", "<unk>", "a", "b"], torch.randn(4, 5), elmo=Elmo(bilm=tiny_random_bilm(1), dropout=0.0)
        )
        clf = SentenceClassifier(inputs, 3, hidden=4, pooling=pooling).eval()
        alone = clf.logits(inputs.encode([["a", "b"]]))
        batched = clf.logits(inputs.encode([["a", "b"], ["b", "a", "a", "b", "a"]]))
        assert torch.allclose(alone[0], batched[0], atol=1e-5), pooling


def test_l2_penalty_is_on_the_mix_weights():
    elmo = Elmo(bilm=tiny_random_bilm(0), num_output_representations=2)
    with torch.no_grad():
        for p, v in zip(elmo.scalar_mixes[0].scalar_parameters, (1.0, -2.0, 0.5)):
            p.fill_(v)
    inputs = TokenInputs(elmo=elmo, elmo_at_output=True)
    assert float(inputs.l2_penalty(0.1).detach()) == pytest.approx(0.1 * (1 + 4 + 0.25))  # second mix: zeros
    weights = inputs.mix_weights()
    assert len(weights) == 2 and weights[1]["weights"] == pytest.approx([1 / 3] * 3)


def test_frozen_by_default_and_fine_tune_trains_the_bilm():
    bilm = tiny_random_bilm(0)
    before = {k: v.clone() for k, v in bilm.state_dict().items()}
    data = TaskData(tokens=[w for w, _ in tag_sentences(8, 0)], targets=[t for _, t in tag_sentences(8, 0)])
    labels = sorted({t for tags in data.targets for t in tags})
    config = task_config_from_dict({"task": "tag", "data": {"train": "x", "dev": "y"}, "bilm": {"model": "m"}})
    for fine_tune in (False, True):
        inputs = TokenInputs(elmo=Elmo(bilm=bilm, requires_grad=fine_tune, dropout=0.0))
        model = TaskModel("tag", SequenceTagger(inputs, len(labels), hidden=4), labels, config)
        fit(model, data, data, epochs=1, batch_size=4, lr=0.01)
        changed = any(not torch.equal(before[k], v) for k, v in bilm.state_dict().items())
        assert changed == fine_tune
        assert (
            "inputs.elmo._elmo_lstm.token_encoder.projection.weight"
            in {f"inputs.{k}" for k in inputs.task_state_dict()}
        ) == fine_tune


# ------------------------------------------------------------------------------------------------ training
def test_tagger_trains_predicts_saves_and_reloads(tmp_path, bilm_dir):
    config = task_config_from_dict(
        base_config(tmp_path, bilm_dir, char_cnn={"enabled": True}, bilm={"at_output": True})
    )
    model = train_from_config(config, out_dir=tmp_path / "model")
    h = model.history
    assert len(h) == 2 and h[-1]["train_loss"] < h[0]["first_loss"]  # the loss falls
    assert {"B-ANI", "B-OBJ", "O"} <= set(model.labels) <= {"B-ANI", "I-ANI", "B-OBJ", "I-OBJ", "O"}
    assert model.labels == sorted(model.labels)
    sentences = [["the", "cat", "sat", "on", "the", "mat"], ["dog"]]
    tags = model.predict(sentences)
    assert [len(t) for t in tags] == [6, 1] and {t for s in tags for t in s} <= set(model.labels)
    assert model.results["dev"]["metric"] == "entity_f1" and 0 <= model.results["dev"]["score"] <= 100
    meta = json.loads((tmp_path / "model" / "task.json").read_text())
    assert meta["bilm"]["weights_sha256"] == bilm_fingerprint(tiny_random_bilm(0))
    assert meta["vocab"][:2] == ["<pad>", "<unk>"] and meta["labels"] == model.labels
    reloaded = load_task_model(tmp_path / "model")
    assert reloaded.predict(sentences) == tags
    e1 = model.module.emissions(model.batch(TaskData(sentences), [0, 1]))
    e2 = reloaded.module.emissions(reloaded.batch(TaskData(sentences), [0, 1]))
    assert torch.allclose(e1, e2, atol=1e-6)


def test_classifier_trains_predicts_saves_and_reloads(tmp_path, bilm_dir):
    config = task_config_from_dict(
        base_config(
            tmp_path, bilm_dir, task="classify", model={"pooling": "attention"}, train={"epochs": 6, "patience": 6}
        )
    )
    model = train_from_config(config, out_dir=tmp_path / "model")
    assert model.history[-1]["train_loss"] < 0.9 * model.history[0]["train_loss"]
    assert model.labels == ["neg", "pos"]
    sentences = [["the", "cat", "sat"], ["a", "red", "car"], ["tree"]]
    labels = model.predict(sentences)
    assert len(labels) == 3 and set(labels) <= {"neg", "pos"}
    assert load_task_model(tmp_path / "model").predict(sentences) == labels


def test_training_is_deterministic(tmp_path, bilm_dir):
    config = task_config_from_dict(base_config(tmp_path, bilm_dir, model={"dropout": 0.3}, train={"epochs": 1}))
    a, b, c = (train_from_config(config, seed=s, max_steps=3) for s in (5, 5, 6))
    losses = [[r["train_loss"] for r in m.history] for m in (a, b, c)]
    assert losses[0] == losses[1] and losses[0] != losses[2]
    sentences = [["the", "cat", "sat"]]
    assert a.predict(sentences) == b.predict(sentences)


def test_another_bilm_is_refused(tmp_path, bilm_dir):
    config = task_config_from_dict(base_config(tmp_path, bilm_dir, train={"epochs": 1}))
    train_from_config(config, out_dir=tmp_path / "model", max_steps=1)
    with pytest.raises(CheckpointError, match="trained with the biLM .* but the biLM given has weights sha256"):
        load_task_model(tmp_path / "model", bilm=tiny_random_bilm(1))
    # the same weights loaded another way are accepted
    assert load_task_model(tmp_path / "model", bilm=tiny_random_bilm(0)).labels
    # the recorded biLM folder replaced by other weights: refused too
    save_pretrained(tiny_random_bilm(2), bilm_dir.parent / "other")
    meta = json.loads((tmp_path / "model" / "task.json").read_text())
    meta["bilm"]["model"] = str(bilm_dir.parent / "other")
    (tmp_path / "model" / "task.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="found now has weights sha256"):
        load_task_model(tmp_path / "model")


def test_task_model_saved_before_the_one_fingerprint_still_loads(tmp_path, bilm_dir):
    """A task.json of an earlier elmokit records the weights-only sha256 and no "fingerprint": checked by that."""
    config = task_config_from_dict(base_config(tmp_path, bilm_dir, train={"epochs": 1}))
    model = train_from_config(config, out_dir=tmp_path / "model", max_steps=1)
    assert model.bilm_record["fingerprint"] == FINGERPRINT_VERSION
    meta = json.loads((tmp_path / "model" / "task.json").read_text())
    del meta["bilm"]["fingerprint"]
    meta["bilm"]["weights_sha256"] = legacy_weights_sha256(tiny_random_bilm(0))
    (tmp_path / "model" / "task.json").write_text(json.dumps(meta))
    sentences = [["the", "cat", "sat"]]
    assert load_task_model(tmp_path / "model").predict(sentences) == model.predict(sentences)
    with pytest.raises(CheckpointError, match="but the biLM given has weights sha256"):
        load_task_model(tmp_path / "model", bilm=tiny_random_bilm(1))


def test_prepared_task_is_shared_by_seeds_and_gives_the_fresh_results(tmp_path, bilm_dir):
    config = task_config_from_dict(base_config(tmp_path, bilm_dir, model={"dropout": 0.3}, train={"epochs": 1}))
    prepared = prepare_task(config)
    assert prepared.labels == sorted(prepared.labels) and set(prepared.data) == {"train", "dev"}
    assert prepared.bilm_record["weights_sha256"] == bilm_fingerprint(tiny_random_bilm(0))
    assert prepared.vocab[:2] == ["<pad>", "<unk>"] and prepared.table.shape == (len(prepared.vocab), 8)
    fresh = [train_from_config(config, seed=s, max_steps=3) for s in (5, 6)]
    shared = [train_from_config(config, seed=s, max_steps=3, prepared=prepared) for s in (5, 6)]
    for a, b in zip(fresh, shared):
        assert [r["train_loss"] for r in a.history] == [r["train_loss"] for r in b.history]
        assert a.results["dev"]["score"] == b.results["dev"]["score"]
    assert shared[0].inputs.elmo.bilm is shared[1].inputs.elmo.bilm is prepared.bilm  # loaded once
    model, data = build_from_config(config.override({"train.epochs": 3}), prepared=prepared)  # [train] may differ
    assert data is prepared.data and model.labels == prepared.labels
    with pytest.raises(UsageError, match=r"made for another config \(static differs\)"):
        build_from_config(config.override({"static.dim": 4}), prepared=prepared)
    with pytest.raises(UsageError, match="either bilm or prepared"):
        build_from_config(config, prepared=prepared, bilm=tiny_random_bilm(0))


def test_character_ner_with_a_segmenter_builds_trains_and_reloads(tmp_path, bilm_dir):
    """data.segmenter (jieba): each character's static string is its word, its ELMo layers its word's; the model keeps
    the segmenter it was built with and a reloaded model makes its own."""
    pytest.importorskip("jieba")
    loc = ["B-LOC", "I-LOC"]
    rows = [("我们爱北京", ["O"] * 3 + loc), ("北京很大", loc + ["O"] * 2), ("我们在上海", ["O"] * 3 + loc)]

    def write(path, n):
        lines = []
        for i in range(n):
            chars, tags = rows[i % len(rows)]
            lines += [f"{c}\t{t}" for c, t in zip(chars, tags)] + [""]
        path.write_text("\n".join(lines), encoding="utf-8")

    write(tmp_path / "train.txt", 9)
    write(tmp_path / "dev.txt", 3)
    raw = base_config(tmp_path, bilm_dir, data={"reader": "char_ner", "segmenter": "jieba"}, train={"epochs": 1})
    write(tmp_path / "train.txt", 9)  # base_config wrote CoNLL files over them
    write(tmp_path / "dev.txt", 3)
    config = task_config_from_dict(raw)
    prepared = prepare_task(config)
    train = prepared.data["train"]
    assert train.tokens[0] == list("我们爱北京") and train.static_tokens[0] == ["我们", "我们", "爱", "北京", "北京"]
    assert train.features is not None and len(train.features) == len(train)
    model = train_from_config(config, prepared=prepared, out_dir=tmp_path / "model", max_steps=2)
    assert model.segmenter is prepared.segmenter
    reloaded = load_task_model(tmp_path / "model")
    sentences = [list("北京很大")]
    assert reloaded.predict(sentences) == model.predict(sentences)
    assert reloaded.segmenter is not None and reloaded.segmenter("我们爱北京") == ["我们", "爱", "北京"]


def test_unseen_dev_label_names_file_and_line_or_counts_as_wrong(tmp_path, bilm_dir):
    raw = base_config(tmp_path, bilm_dir, train={"epochs": 1})
    dev = tag_sentences(3, 9)
    dev[2] = (["the", "Paris", "sat"], ["O", "B-LOC", "O"])
    write_conll(tmp_path / "dev.txt", dev)
    config = task_config_from_dict(raw)
    # the third sentence starts on line 3 + lengths of the first two (+ a blank line each)
    line = 3 + len(dev[0][0]) + 1 + len(dev[1][0]) + 1
    with pytest.raises(DataError, match=rf"dev.txt:{line}: label 'B-LOC' was never seen in training"):
        train_from_config(config)
    model = train_from_config(config, unseen="wrong")
    r = model.results["dev"]
    assert r["unseen_labels"] == 1
    assert r["per_type"]["LOC"]["f1"] == 0.0 and r["per_type"]["LOC"]["support"] == 1  # a missed entity


def test_static_only_and_char_cnn_only_models(tmp_path, bilm_dir):
    for sections in (
        {"bilm": {"model": "none"}},
        {"bilm": {"model": "none"}, "static": {"vectors": "none"}, "char_cnn": {"enabled": True}},
    ):
        model = train_from_config(task_config_from_dict(base_config(tmp_path, bilm_dir, **sections)), max_steps=3)
        assert model.bilm_record is None and model.mix_weights() == []
        save_task_model(model, tmp_path / "m")
        assert load_task_model(tmp_path / "m").predict([["the", "cat"]]) == model.predict([["the", "cat"]])


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "change, message",
    [
        ({"bilm": {"modle": "x"}}, r"unknown key bilm\.modle"),
        ({"trian": {}}, r"unknown key 'trian'"),
        ({"train": {"epochs": 0}}, r"train\.epochs must be >= 1, got 0"),
        ({"train": {"lr": "fast"}}, r"train\.lr must be a number, got 'fast'"),
        ({"model": {"dropout": 1.0}}, r"model\.dropout must be a number in \[0, 1\)"),
        ({"model": {"pooling": "mean"}}, r"model\.pooling must be one of 'max', 'attention'"),
        ({"data": {"reader": "labelled"}}, r"data\.reader 'labelled' reads classify data, but task is 'tag'"),
        ({"bilm": {"model": "random"}}, r"bilm\.random_like"),
        ({"bilm": {"model": "none", "at_output": True}}, r"bilm\.at_output needs a biLM"),
        ({"char_cnn": {"filters": [[3]]}}, r"char_cnn\.filters must be a non-empty list of \[width, count\]"),
        ({"data": {"segmenter": "elmokit-zh"}}, r"data\.segmenter is for character-tagged data"),
    ],
)
def test_bad_config_names_the_key(tmp_path, bilm_dir, change, message):
    raw = base_config(tmp_path, bilm_dir)
    for section, values in change.items():
        raw.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError, match=message):
        task_config_from_dict(raw, source="x.toml")


def test_config_file_paths_relative_to_the_file_and_required_keys(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "t.toml").write_text(
        'task = "classify"\n[data]\ntrain = "../tr.txt"\ndev = "dv.txt"\n[static]\nvectors = "random"\n',
        encoding="utf-8",
    )
    config = load_task_config(tmp_path / "c" / "t.toml")
    assert config.data.train == str(tmp_path / "tr.txt") and config.data.dev == str(tmp_path / "c" / "dv.txt")
    assert config.metric == "accuracy" and config.train.epochs == 5
    (tmp_path / "bad.toml").write_text('task = "tag"\n[data]\ntrain = "a"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.toml: data\.dev is required"):
        load_task_config(tmp_path / "bad.toml")
    (tmp_path / "broken.toml").write_text('task = "tag\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="broken.toml: not valid TOML"):
        load_task_config(tmp_path / "broken.toml")
    with pytest.raises(ConfigError, match=r"override 'train\.epoch': unknown key"):
        config.override({"train.epoch": 3})


def test_config_sections_are_typed_objects():
    config = task_config_from_dict(
        {"task": "tag", "data": {"train": "a", "dev": "b"}, "bilm": {"model": "m"}, "train": {"lr": 1}}
    )
    assert isinstance(config, TaskConfig) and isinstance(config.bilm, BilmSection)
    assert isinstance(config.train, TrainSection) and config.train.lr == 1.0 and isinstance(config.train.lr, float)
    assert config.data.reader == "conll2003" and config.bilm.model == "m" and config.bilm.dropout == 0.5
    assert config.char_cnn.filters == [[1, 16], [2, 16], [3, 32]]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train.epochs = 3
    # every key of every section is a field with the schema's default, and to_dict round-trips
    for section, keys in SCHEMA.items():
        assert [f.name for f in dataclasses.fields(getattr(config, section))] == list(keys)
    assert task_config_from_dict(config.to_dict()) == config
    assert config.override({"train.seed": 7}).train == dataclasses.replace(config.train, seed=7)
    # the mapping form of earlier versions still reads, with a warning naming the attribute
    with pytest.warns(FutureWarning, match=r"read config\.data\.train instead"):
        assert config.data["train"] == "a"
    with pytest.raises(KeyError):
        config.data["nope"]


# ------------------------------------------------------------------------------------------------ characters
def test_char_words_gives_each_character_its_word():
    segment = aligned_segmenter(lambda text: ["我们", "爱", "北京"] if text == "我们爱北京！" else [])
    assert segment("我们爱北京！") == ["我们", "爱", "北京", "！"]  # the dropped "！" kept as its own word
    assert char_words([list("我们爱北京！")], segment) == [["我们", "我们", "爱", "北京", "北京", "！"]]
    with pytest.raises(DataError, match="do not re-join"):
        char_words([list("ab")], lambda text: ["x"])
