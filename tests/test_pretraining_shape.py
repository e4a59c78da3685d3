"""The shape of the pretraining code: the package name (and the old one as an alias), the typed config that owns the
resume rules, a Trainer given its model/optimiser/data, one train_step for the loop and the bench, the main process
as the only writer, and vocabularies counted part by part."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from elmokit.characters import CharVocabulary
from elmokit.config import ElmoConfig, elmo_tiny
from elmokit.errors import ConfigError, UsageError
from elmokit.pretraining.config import (
    RESUME_MAY_CHANGE,
    Batching,
    DecodeErrors,
    OptimizerName,
    TrainConfig,
    literal_choices,
)
from elmokit.pretraining.data import (
    PartCounts,
    char_vocabulary_from_counts,
    part_batch_size,
    parts_of_process,
    vocabulary_from_counts,
)
from elmokit.pretraining.distributed import DistContext
from elmokit.pretraining.trainer import Trainer, build_trainer
from elmokit.vocabulary import Vocabulary
from helpers import TINY_TRAIN_OPTIONS, TINY_WORDS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("shape")
    lines = [" ".join(TINY_WORDS[(5 * i + 3 * j) % len(TINY_WORDS)] for j in range(2 + i % 6)) for i in range(40)]
    (d / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d / "train.txt"


def _cfg(corpus: Path, out: Path, **kw) -> TrainConfig:
    base = dict(
        train_files=[str(corpus)],
        out_dir=str(out),
        model=TINY_TRAIN_OPTIONS,
        batch_size=4,
        n_epochs=50,
        max_steps=6,
        n_negative_samples=6,
        dropout=0.1,
        clip_norm=1.0,
        seed=0,
        checkpoint_every=3,
        log_every=1,
        progress=False,
    )
    base.update(kw)
    return TrainConfig(**base)


def _losses(out: Path) -> dict[int, float]:
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


# ---------------------------------------------------------------------------------------------- package names
# ---------------------------------------------------------------------------------------------- the config
@pytest.mark.parametrize(
    "name,tp", [("batching", Batching), ("optimizer", OptimizerName), ("decode_errors", DecodeErrors)]
)
def test_choices_come_from_the_literal_types(corpus, tmp_path, name, tp):
    choices = literal_choices(tp)
    assert len(choices) >= 2
    for value in choices:
        _cfg(corpus, tmp_path, **{name: value}).validate()
    with pytest.raises(ConfigError) as e:
        _cfg(corpus, tmp_path, **{name: "nonesuch"}).validate()
    assert all(repr(c) in str(e.value) for c in choices)  # the message lists exactly the type's values
    # the command line offers the same values
    from elmokit.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    flag = {"batching": "--batching", "optimizer": "--optimizer", "decode_errors": "--decode-errors"}[name]
    action = next(a for a in train._actions if flag in a.option_strings)
    assert tuple(action.choices) == choices


def test_model_is_an_elmoconfig_and_the_config_round_trips(corpus, tmp_path):
    cfg = _cfg(corpus, tmp_path, valid_files=[str(corpus)], valid_every=2)
    assert isinstance(cfg.model, ElmoConfig) and cfg.model.lstm.dim == 16
    data = cfg.to_dict()
    assert data["model"] == ElmoConfig.from_options(TINY_TRAIN_OPTIONS).to_options()
    back = TrainConfig.from_dict(json.loads(json.dumps(data)))
    assert back.to_dict() == data and isinstance(back.model, ElmoConfig)
    # a train_config.json of the previous version (no newer fields) still reads, with their defaults
    old = {
        k: v
        for k, v in data.items()
        if k not in ("valid_files", "valid_every", "valid_minutes", "init_from", "freeze_bilm_steps", "data_parts")
    }
    old_cfg = TrainConfig.from_dict(old)
    assert old_cfg.valid_files is None and old_cfg.data_parts is None and old_cfg.freeze_bilm_steps == 0
    with pytest.raises(ConfigError, match="TrainConfig.model: missing required key lstm.dim"):
        _cfg(corpus, tmp_path, model={"lstm": {}, "char_cnn": TINY_TRAIN_OPTIONS["char_cnn"]})
    with pytest.raises(ConfigError, match="TrainConfig.model is missing"):
        TrainConfig([str(corpus)], str(tmp_path)).validate()
    with pytest.raises(ConfigError, match="need valid_files"):
        _cfg(corpus, tmp_path, valid_every=3).validate()
    with pytest.raises(ConfigError, match=r"batch_size=2 \(--batch-size\) is smaller than data_parts=3"):
        _cfg(corpus, tmp_path, batch_size=2, data_parts=3).validate()


def test_resume_rules_live_in_the_config(corpus, tmp_path):
    saved = _cfg(corpus, tmp_path, vocab_file="v.txt")
    changed = saved.resumed(
        {
            "max_steps": 99,
            "valid_files": ["h.txt"],
            "valid_every": 4,
            "device": "cpu",
            "batch_size": 4,
            "train_files": [str(corpus.parent / "." / corpus.name)],
            "vocab_file": "./v.txt",
            "model": dict(TINY_TRAIN_OPTIONS),
        }
    )
    assert changed.max_steps == 99 and changed.valid_files == ["h.txt"] and changed.device == "cpu"
    assert saved.max_steps == 6  # the saved one is not changed
    with pytest.raises(UsageError) as e:
        saved.resumed(
            {"batch_size": 8, "seed": 1, "max_steps": 7, "model": elmo_tiny().to_options()}, describe=lambda n: f"<{n}>"
        )
    msg = str(e.value)
    assert msg.startswith("<batch_size>, <seed>, <model>: differ from the run being resumed")
    assert all(f"<{n}>" in msg.split("only ")[1] for n in RESUME_MAY_CHANGE)
    # fields that change what is computed may not change; what only says how long / how often / where may
    assert {"max_steps", "valid_every", "checkpoint_every", "device"} <= RESUME_MAY_CHANGE
    assert not {"batch_size", "seed", "model", "data_parts", "init_from", "freeze_bilm_steps"} & RESUME_MAY_CHANGE


# ---------------------------------------------------------------------------------------------- the trainer
def test_trainer_is_given_its_model_optimizer_and_data(corpus, tmp_path):
    built = build_trainer(_cfg(corpus, tmp_path / "a"))
    sgd = torch.optim.SGD(built.lm.parameters(), lr=0.5)
    before = {k: v.clone() for k, v in built.lm.state_dict().items()}
    trainer = Trainer(built.config, built.lm, sgd, built.data)
    assert trainer.optimizer is sgd and trainer.lm is built.lm and trainer.vocab is built.lm.vocab
    trainer.train_step(trainer.next_batch())
    # plain SGD moved the weights by -lr · (clipped) gradient: exactly, since the gradients are still there
    w = "softmax.bias"
    assert torch.allclose(built.lm.state_dict()[w], before[w] - 0.5 * built.lm.softmax.bias.grad, atol=1e-7)
    with pytest.raises(UsageError, match="together"):
        Trainer(built.config, built.lm)


def test_the_loop_runs_train_step(corpus, tmp_path):
    loop_summary = Trainer(_cfg(corpus, tmp_path / "loop")).train()
    manual = build_trainer(_cfg(corpus, tmp_path / "manual"))
    manual.lm.train()
    results = [manual.train_step(manual.next_batch()) for _ in range(6)]
    assert [r.step for r in results] == list(range(1, 7))
    assert {r.step: round(r.loss, 6) for r in results} == _losses(tmp_path / "loop")
    assert loop_summary["tokens"] == sum(r.tokens for r in results)
    final = load_file(str(tmp_path / "loop" / "model" / "model.safetensors"))
    mine = {k: v for k, v in manual.lm.bilm.state_dict().items()}
    assert all(torch.equal(final[k], mine[k]) for k in mine)
    assert torch.equal(final["softmax.weight"], manual.lm.softmax.weight.detach())


def test_only_the_main_process_writes(corpus, tmp_path):
    # process 1 of 2 (no process group here: the collectives are left out, only the roles are tested)
    other = DistContext(rank=1, world_size=2)
    trainer = build_trainer(_cfg(corpus, tmp_path / "run", valid_files=[str(corpus)]), dist=other)
    assert trainer.data.parts == [1] and trainer.config.data_parts == 2
    summary = trainer.train()
    assert summary["steps"] == 6 and summary["valid"]["step"] == 6
    assert not (tmp_path / "run").exists()  # no folder, no config, metrics, checkpoint, best/ or model/
    main = build_trainer(_cfg(corpus, tmp_path / "run", valid_files=[str(corpus)]), dist=DistContext(0, 2))
    main.train()
    assert {p.name for p in (tmp_path / "run").iterdir()} >= {
        "train_config.json",
        "metrics.jsonl",
        "model",
        "best",
        "checkpoint.json",
        "learning_curve.png",
    }


def test_global_batch_split_into_parts():
    assert [part_batch_size(10, 3, d) for d in range(3)] == [4, 3, 3]
    assert sum(part_batch_size(128, 7, d) for d in range(7)) == 128
    assert parts_of_process(1, 2, 4) == [1, 3] and parts_of_process(0, 1, 3) == [0, 1, 2]
    with pytest.raises(UsageError, match=r"3 processes but the run's data is in 2 part\(s\).*1 to 2 processes"):
        parts_of_process(0, 3, 2)


# ---------------------------------------------------------------------------------------------- vocabularies
words = st.sampled_from(["a", "b", "c", "dd", "e", "<UNK>", "<S>", "ü", "苹果"])


@settings(max_examples=60, deadline=None)
@given(
    sentences=st.lists(st.lists(words, min_size=1, max_size=6), min_size=1, max_size=20),
    n_parts=st.integers(1, 4),
    min_count=st.integers(1, 3),
    max_size=st.one_of(st.none(), st.integers(3, 6)),
)
def test_vocabulary_from_part_counts_is_the_whole_corpus_vocabulary(sentences, n_parts, min_count, max_size):
    parts = []
    for d in range(n_parts):
        mine = sentences[d::n_parts]
        chars = Counter()
        for s in mine:
            for t in s:
                chars.update(t)
        parts.append(PartCounts(d, Counter(w for s in mine for w in s), len(mine), chars))
    built = Vocabulary.build(sentences, min_count=min_count, max_size=max_size)
    got = vocabulary_from_counts(parts[::-1], min_count, max_size)  # the order the counts arrive in does not matter
    assert got.tokens == built.tokens and got.counts == built.counts
    in_part_order = [s for d in range(n_parts) for s in sentences[d::n_parts]]
    assert (
        char_vocabulary_from_counts(parts[::-1], 10).characters
        == CharVocabulary.build(in_part_order, max_characters_per_token=10).characters
    )
