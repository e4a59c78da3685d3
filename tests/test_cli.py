"""The `elmokit` command as a user meets it: clear errors for mistakes, outputs that line up with inputs, nothing
partial left behind when a run is stopped."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, shared_path
from elmokit import Embedder, load_pretrained_bilm
from elmokit.cli import main as cli_main
from elmokit.config import elmo_tiny
from elmokit.modules.bilm import BiLM
from elmokit.weights.native import save_pretrained
from helpers import fixture_model


def _err(capsys) -> str:
    return capsys.readouterr().err


def _fixture_folder(tmp_path: Path) -> Path:
    """A copy of the allennlp-elmo fixture folder (options.json, lm_weights.hdf5 and its other HDF5 dumps)."""
    src = shared_path("fixtures", "allennlp-elmo")
    dst = tmp_path / "fx"
    shutil.copytree(src, dst)
    return dst


def test_original_folder_with_several_hdf5_resolves_to_the_weights(tmp_path):
    folder = _fixture_folder(tmp_path)
    assert len(list(folder.glob("*.hdf5"))) > 1  # lm_weights.hdf5 beside the embedding dumps
    model = load_pretrained_bilm(folder)
    reference = fixture_model("allennlp-elmo")
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name


def test_export_into_the_model_folder_is_refused(tmp_path, capsys):
    folder = _fixture_folder(tmp_path)
    assert cli_main(["export", str(folder), str(folder)]) == 2
    assert "model's own folder" in _err(capsys)
    assert cli_main(["export", str(folder), str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["options.json", "weights.hdf5"]


def test_ambiguous_folder_lists_what_it_found(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "options.json").write_text("{}")
    (tmp_path / "m" / "a.hdf5").write_bytes(b"")
    (tmp_path / "m" / "b.hdf5").write_bytes(b"")
    assert cli_main(["info", str(tmp_path / "m")]) == 2
    err = _err(capsys)
    assert "a.hdf5" in err and "b.hdf5" in err and "elmokit convert" in err


def test_embed_refuses_to_overwrite_its_input(tmp_path, capsys):
    text = tmp_path / "s.txt"
    text.write_text("a b\n")
    assert cli_main(["embed", str(_fixture_folder(tmp_path)), str(text), str(text)]) == 2
    assert "is the input file" in _err(capsys)
    assert text.read_text() == "a b\n"


def test_embed_file_keeps_line_numbers_and_allennlp_sentence_keys(tmp_path):
    text = tmp_path / "s.txt"
    text.write_text("the bank .\n\n  the bank .  \nriver\n", encoding="utf-8")
    emb = Embedder(fixture_model("allennlp-elmo"))
    assert emb.embed_file(text, tmp_path / "o.h5", progress=False) == 4
    with h5py.File(tmp_path / "o.h5", "r") as h5:
        assert [h5[str(i)].shape[1] for i in range(4)] == [3, 0, 3, 1]
        index = json.loads(h5["sentence_to_index"][0])
    assert index == {"the bank .": "2", "": "1", "river": "3"}  # stripped; the last of repeated lines, as AllenNLP


def test_long_line_is_embedded_alone_and_results_do_not_change(tmp_path):
    emb = Embedder(fixture_model("allennlp-elmo"), batch_size=8, max_batch_tokens=64)
    sentences = [["w"] * n for n in (3, 200, 5, 4, 6, 2)]
    shapes = []
    real = emb.embed_batch

    def spy(batch):
        shapes.append((len(batch), max(len(s) for s in batch)))
        return real(batch)

    emb.embed_batch = spy
    got = list(emb.embed_sentences(sentences))
    assert all(b * t <= 64 or b == 1 for b, t in shapes) and (1, 200) in shapes
    for s, arr in zip(sentences, got):
        np.testing.assert_allclose(arr, real([s])[0], atol=1e-5)


def test_truncated_safetensors_is_a_clear_error(tmp_path, capsys):
    save_pretrained(BiLM(elmo_tiny()), tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert cli_main(["info", str(tmp_path / "m")]) == 2
    assert "not a readable safetensors file" in _err(capsys)


def test_perplexity_on_an_embedding_only_folder_says_what_is_missing(tmp_path, capsys):
    save_pretrained(BiLM(elmo_tiny()), tmp_path / "m")
    (tmp_path / "s.txt").write_text("a b\n")
    assert cli_main(["perplexity", str(tmp_path / "m"), str(tmp_path / "s.txt")]) == 2
    assert "not a trained LM folder (no vocab.txt)" in _err(capsys)


def _tiny_train_args(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["train", str(corpus), "--out-dir", str(out), "--preset", "tiny", "--batch-size", "4", "--negatives", "0",
            "--log-every", "1", "--no-progress", *extra]


def test_train_resume_rules(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank .\nthe money bank .\na boat on the river .\n" * 4)
    out = tmp_path / "run"
    assert cli_main(["train", "--out-dir", str(tmp_path / "nothing"), "--resume"]) == 2
    assert "nothing to resume" in _err(capsys)
    assert cli_main(_tiny_train_args(corpus, out, "--max-steps", "3")) == 0
    capsys.readouterr()
    # repeating the same options with --resume is fine; changing a fixed one is refused, naming it
    assert cli_main(_tiny_train_args(corpus, out, "--batch-size", "8", "--resume")) == 2
    assert "--batch-size" in _err(capsys)
    assert cli_main(_tiny_train_args(corpus, out, "--max-steps", "5", "--resume")) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 5
    # the data order depends on the number of epochs: it is fixed too; more steps are not
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--epochs", "20"]) == 2
    assert "--epochs" in _err(capsys)
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--max-steps", "9"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 9 and summary["tokens"] > 0


def test_train_bad_options_and_device(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n")
    (tmp_path / "o.json").write_text("not json")
    assert cli_main(_tiny_train_args(corpus, tmp_path / "r", "--options", str(tmp_path / "o.json"))) == 2
    assert "o.json is not valid JSON" in _err(capsys)
    assert cli_main(_tiny_train_args(corpus, tmp_path / "r", "--device", "banana")) == 2
    assert "unknown device 'banana'" in _err(capsys)


def test_score_output_lines_up_with_input_lines(tmp_path, capsys):
    from elmokit.training.trainer import TrainConfig, Trainer

    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank .\nthe money bank .\n" * 4)
    Trainer(TrainConfig(train_files=[str(corpus)], out_dir=str(tmp_path / "run"), model=elmo_tiny().to_options(),
                        batch_size=4, n_negative_samples=0, max_steps=2, progress=False)).train()
    text = tmp_path / "s.txt"
    text.write_text("the bank .\n\n" + " ".join(["river"] * 1500) + "\nbank\n")
    assert cli_main(["score", str(tmp_path / "run" / "model"), str(text)]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3, 4]
    assert [r["words"] for r in rows] == [3, 0, 1500, 1]  # the long line is one sentence, the blank line an empty one
    assert all(r["logprob_forward"] < 0 and r["logprob_backward"] < 0 for r in rows)


def test_sigterm_during_embed_leaves_no_partial_file(tmp_path):
    folder = _fixture_folder(tmp_path)
    text = tmp_path / "big.txt"
    text.write_text("the river bank is muddy after the rain .\n" * 20000)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "elmokit.cli", "embed", str(folder), str(text),
                             str(tmp_path / "out.hdf5"), "--batch-size", "8"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(".out.hdf5.*.tmp")):
        time.sleep(0.05)
    assert list(tmp_path.glob(".out.hdf5.*.tmp")), "the embed run never started writing"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    assert "interrupted" in proc.stderr.read().decode()
    assert not list(tmp_path.glob(".out.hdf5.*")) and not (tmp_path / "out.hdf5").exists()


def test_resume_follows_a_moved_folder_and_refuses_changed_defaults(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank .\nthe money bank .\na boat on the river .\n" * 4)
    assert cli_main(_tiny_train_args(corpus, tmp_path / "runA", "--max-steps", "3", "--seed", "5")) == 0
    (tmp_path / "runA").rename(tmp_path / "runB")
    capsys.readouterr()
    # going back to a default value is a change too
    assert cli_main(["train", "--out-dir", str(tmp_path / "runB"), "--resume", "--seed", "0"]) == 2
    assert "--seed" in _err(capsys)
    assert cli_main(["train", "--out-dir", str(tmp_path / "runB"), "--resume", "--max-steps", "5"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 5 and Path(summary["model_dir"]) == tmp_path / "runB" / "model"
    assert not (tmp_path / "runA").exists()
    assert [json.loads(x)["step"] for x in (tmp_path / "runB" / "metrics.jsonl").read_text().splitlines()] == [
        1, 2, 3, 4, 5]


def test_bad_training_settings_are_refused(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n" * 3)
    for flag, value, name in (("--clip-norm", "0", "clip_norm"), ("--dropout", "-0.5", "dropout"),
                              ("--max-steps", "0", "max_steps"), ("--lr", "-1", "lr")):
        assert cli_main(_tiny_train_args(corpus, tmp_path / "r", flag, value)) == 2
        assert name in _err(capsys)
    # a corpus too small for one window batch trains nothing: an error, not an untrained model
    assert cli_main(_tiny_train_args(corpus, tmp_path / "w", "--batching", "windows", "--batch-size", "128",
                                     "--epochs", "1")) == 2
    assert "no training step could be made" in _err(capsys)
    assert not (tmp_path / "w" / "model").exists()


def test_convert_and_embed_do_not_overwrite_models(tmp_path, capsys):
    fx = shared_path("fixtures", "allennlp-elmo")
    out = tmp_path / "native"
    assert cli_main(["convert", str(fx / "options.json"), str(fx / "lm_weights.hdf5"), str(out)]) == 0
    assert cli_main(["convert", str(fx / "options.json"), str(fx / "lm_weights.hdf5"), str(out)]) == 2
    assert "already holds a model" in _err(capsys)
    (tmp_path / "s.txt").write_text("\ufeffa b\n")
    assert cli_main(["embed", str(out), str(tmp_path / "s.txt"), str(out / "model.safetensors")]) == 2
    assert "inside the model folder" in _err(capsys)
    assert cli_main(["embed", str(out), str(tmp_path / "s.txt"), str(tmp_path)]) == 2
    assert "is a folder" in _err(capsys)
    assert cli_main(["embed", str(out), str(tmp_path / "s.txt"), str(tmp_path / "v.h5"), "--device", "banana"]) == 2
    assert "unknown device" in _err(capsys)
    assert cli_main(["embed", str(out), str(tmp_path / "s.txt"), str(tmp_path / "v.h5")]) == 0
    with h5py.File(tmp_path / "v.h5", "r") as h5:  # the byte-order mark is not part of the first token
        assert json.loads(h5["sentence_to_index"][0]) == {"a b": "0"}
