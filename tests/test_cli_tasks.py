"""`elmokit tag …` / `elmokit classify …` end to end on temp files with a tiny biLM (a few steps)."""

from __future__ import annotations

import json

import pytest

from elmokit import save_pretrained
from elmokit.cli import main
from helpers import tiny_random_bilm
from test_tasks import class_sentences, one_thread, tag_sentences, write_conll, write_labelled  # noqa: F401


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_tasks")
    save_pretrained(tiny_random_bilm(0), root / "bilm")
    write_conll(root / "ner.train", tag_sentences(30, 1))
    write_conll(root / "ner.dev", tag_sentences(8, 2))
    write_labelled(root / "cls.train", class_sentences(30, 1))
    write_labelled(root / "cls.dev", class_sentences(8, 2))
    common = (
        '[bilm]\nmodel = "bilm"\ncache = false\n[static]\nvectors = "random"\ndim = 8\n'
        "[model]\nhidden = 8\n[train]\nepochs = 2\nbatch_size = 8\nlr = 0.01\n"
    )
    (root / "ner.toml").write_text(
        'task = "tag"\n[data]\nreader = "conll2003"\ntrain = "ner.train"\ndev = "ner.dev"\ntest = "ner.dev"\n' + common,
        encoding="utf-8",
    )
    (root / "cls.toml").write_text(
        'task = "classify"\n[data]\ntrain = "cls.train"\ndev = "cls.dev"\n'
        + common.replace("cache = false\n", "cache = false\nat_output = true\n"),
        encoding="utf-8",
    )
    return root


def run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_tag_train_predict_evaluate(setup, tmp_path, capsys):
    status, out, err = run(
        capsys, "tag", "train", setup / "ner.toml", "--out", tmp_path / "m", "--seed", "3", "--device", "cpu"
    )
    assert status == 0, err
    assert f"tagger saved to {tmp_path / 'm'}" in out and "test entity_f1" in out and "softmax(s) = [" in out
    assert "epoch 1: train loss" in err
    # the biLM layers of each data file are computed with a progress bar (issue 19: minutes without one)
    assert "biLM layers of train: 100%" in err and "biLM layers of dev: 100%" in err
    (tmp_path / "in.txt").write_text("the cat sat on the mat\n\ndog ran\n", encoding="utf-8")
    status, out, err = run(capsys, "tag", "predict", tmp_path / "m", tmp_path / "in.txt")
    assert status == 0, err
    blocks = [b.splitlines() for b in out.strip("\n").split("\n\n")]
    assert [[line.split("\t")[0] for line in b] for b in blocks] == [
        ["the", "cat", "sat", "on", "the", "mat"],
        ["dog", "ran"],
    ]
    assert {line.split("\t")[1] for b in blocks for line in b} <= {"B-ANI", "B-OBJ", "O"}
    # raw text with --tokenize (sacremoses splits the full stop off)
    (tmp_path / "raw.txt").write_text("the dog sat.\n", encoding="utf-8")
    status, out, err = run(
        capsys, "tag", "predict", tmp_path / "m", tmp_path / "raw.txt", "--tokenize", "--output", tmp_path / "tags.txt"
    )
    assert status == 0, err
    assert [line.split("\t")[0] for line in (tmp_path / "tags.txt").read_text().split()[::2]] == [
        "the",
        "dog",
        "sat",
        ".",
    ]
    # an existing --output (here the input itself, then the earlier output) is not replaced without --overwrite
    status, out, err = run(
        capsys, "tag", "predict", tmp_path / "m", tmp_path / "raw.txt", "--output", tmp_path / "raw.txt", "--overwrite"
    )
    assert status == 2 and "is the input" in err and (tmp_path / "raw.txt").read_text() == "the dog sat.\n"
    status, out, err = run(
        capsys, "tag", "predict", tmp_path / "m", tmp_path / "in.txt", "--output", tmp_path / "tags.txt"
    )
    assert status == 2 and "already exists: pass --overwrite" in err
    status, out, err = run(
        capsys, "tag", "predict", tmp_path / "m", tmp_path / "in.txt", "--output", tmp_path / "tags.txt", "--overwrite"
    )
    assert status == 0 and (tmp_path / "tags.txt").read_text().split()[::2][:2] == ["the", "cat"]
    status, out, err = run(capsys, "tag", "evaluate", tmp_path / "m", setup / "ner.dev")
    assert status == 0, err
    result = json.loads(out)
    assert result["metric"] == "entity_f1" and result["sentences"] == 8 and set(result["per_type"]) <= {"ANI", "OBJ"}
    # the same model folder again: refused without --overwrite
    status, out, err = run(capsys, "tag", "train", setup / "ner.toml", "--out", tmp_path / "m")
    assert status == 2 and "already holds a task model: pass --overwrite" in err


def test_classify_train_predict_evaluate(setup, tmp_path, capsys):
    status, out, err = run(
        capsys, "classify", "train", setup / "cls.toml", "--out", tmp_path / "c", "--json", "--no-progress"
    )
    assert status == 0, err
    assert "biLM layers of train:" not in err and "100%" not in err  # --no-progress
    result = json.loads(out)
    assert result["dev"]["metric"] == "accuracy" and len(result["mix_weights"]) == 2
    (tmp_path / "in.txt").write_text("the cat sat\na red car\n", encoding="utf-8")
    status, out, err = run(capsys, "classify", "predict", tmp_path / "c", tmp_path / "in.txt")
    assert status == 0, err
    lines = out.splitlines()
    assert [line.split("\t")[1] for line in lines] == ["the cat sat", "a red car"]
    assert {line.split("\t")[0] for line in lines} <= {"neg", "pos"}
    status, out, err = run(capsys, "classify", "evaluate", tmp_path / "c", setup / "cls.dev")
    assert status == 0 and json.loads(out)["sentences"] == 8
    # a tagger config given to classify, a classifier folder given to tag: usage errors naming the right command
    status, out, err = run(capsys, "classify", "train", setup / "ner.toml")
    assert status == 2 and "is a 'tag' task (tagger): use `elmokit tag train`" in err
    status, out, err = run(capsys, "tag", "evaluate", tmp_path / "c", setup / "cls.dev")
    assert status == 2 and "use `elmokit classify evaluate`" in err


def test_cli_bad_inputs(setup, tmp_path, capsys):
    status, out, err = run(capsys, "tag", "train", setup / "ner.toml", "--out", tmp_path / "m")
    assert status == 0, err
    # an unseen label: exit 1 naming file:line; counted as wrong on request
    write_conll(tmp_path / "odd.txt", [(["the", "Paris"], ["O", "B-LOC"])])
    status, out, err = run(capsys, "tag", "evaluate", tmp_path / "m", tmp_path / "odd.txt")
    assert status == 1 and f"{tmp_path / 'odd.txt'}:3: label 'B-LOC' was never seen in training" in err
    status, out, err = run(capsys, "tag", "evaluate", tmp_path / "m", tmp_path / "odd.txt", "--unseen-labels", "wrong")
    assert status == 0 and json.loads(out)["unseen_labels"] == 1
    # a file in the wrong format: the reader's FILE:LINE message, exit 1
    write_labelled(tmp_path / "cls.txt", [(["a", "b"], "pos")])
    status, out, err = run(capsys, "tag", "evaluate", tmp_path / "m", tmp_path / "cls.txt")
    assert status == 1 and f"{tmp_path / 'cls.txt'}:1:" in err
    # a bad config key: exit 2 naming it
    (tmp_path / "bad.toml").write_text((setup / "ner.toml").read_text().replace("hidden = 8", "hiden = 8"))
    status, out, err = run(capsys, "tag", "train", tmp_path / "bad.toml")
    assert status == 2 and "unknown key model.hiden" in err
    # no such model folder / config
    status, out, err = run(capsys, "tag", "predict", tmp_path / "nothing", tmp_path / "odd.txt")
    assert status == 2 and "no such folder" in err
    status, out, err = run(capsys, "tag", "train", tmp_path / "nothing.toml")
    assert status == 2 and "no such file" in err


def test_task_train_refuses_a_model_folder_another_process_writes(setup, tmp_path, capsys):
    from test_writers import holding

    with holding(tmp_path / "m") as holder:
        status, out, err = run(capsys, "tag", "train", setup / "ner.toml", "--out", tmp_path / "m", "--overwrite")
    assert status == 1 and "is in use" in err and f"pid {holder.pid}" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "m" / "task.json").exists()
