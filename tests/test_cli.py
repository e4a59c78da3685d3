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
from elmokit import Embedder, interrupts, load_pretrained_bilm
from elmokit.cli import main as cli_main
from elmokit.config import elmo_tiny
from elmokit.modules.bilm import BiLM
from elmokit.weights.native import save_pretrained
from helpers import assert_close_to_scale, fixture_model


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

    forward = emb.bilm.forward_token_vectors

    def spy(vectors, mask, **kwargs):  # the token vectors of every forward pass: (B, T, P)
        shapes.append(tuple(vectors.shape[:2]))
        return forward(vectors, mask, **kwargs)

    emb.bilm.forward_token_vectors = spy
    got = list(emb.embed_sentences(sentences))
    del emb.bilm.forward_token_vectors
    assert all(b * t <= 64 or b == 1 for b, t in shapes) and (1, 200) in shapes
    for s, arr in zip(sentences, got):
        assert_close_to_scale(arr, emb.embed_batch([s])[0], 1e-5)  # layer values reach ~2.2


def test_truncated_safetensors_is_a_clear_error(tmp_path, capsys):
    save_pretrained(BiLM(elmo_tiny()), tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert cli_main(["info", str(tmp_path / "m")]) == 1  # a damaged file: a failure, not a usage error
    assert "not a readable safetensors file" in _err(capsys)


def test_perplexity_on_an_embedding_only_folder_says_what_is_missing(tmp_path, capsys):
    save_pretrained(BiLM(elmo_tiny()), tmp_path / "m")
    (tmp_path / "s.txt").write_text("a b\n")
    assert cli_main(["perplexity", str(tmp_path / "m"), str(tmp_path / "s.txt")]) == 2
    assert "not a trained LM folder (no vocab.txt)" in _err(capsys)


def test_perplexity_on_a_run_folder_points_at_its_model(tmp_path, capsys):
    model = _tiny_lm(tmp_path)
    (tmp_path / "blank.txt").write_text("\n \n")
    assert cli_main(["score", str(model.parent), str(tmp_path / "blank.txt")]) == 2
    assert f"is a training run folder: give its model folder, {model}" in _err(capsys)
    # only blank lines: nothing to evaluate is a data problem named as such, not a crash
    assert cli_main(["perplexity", str(model), str(tmp_path / "blank.txt")]) == 1
    assert "holds no sentence" in _err(capsys)


def _tiny_train_args(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        str(corpus),
        "--out-dir",
        str(out),
        "--preset",
        "tiny",
        "--batch-size",
        "4",
        "--negatives",
        "0",
        "--log-every",
        "1",
        "--no-progress",
        *extra,
    ]


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
    from elmokit.pretraining.trainer import TrainConfig, Trainer

    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank .\nthe money bank .\n" * 4)
    Trainer(
        TrainConfig(
            train_files=[str(corpus)],
            out_dir=str(tmp_path / "run"),
            model=elmo_tiny().to_options(),
            batch_size=4,
            n_negative_samples=0,
            max_steps=2,
            progress=False,
        )
    ).train()
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
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "elmokit",
            "embed",
            str(folder),
            str(text),
            str(tmp_path / "out.hdf5"),
            "--batch-size",
            "8",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    parts = tmp_path / "out.hdf5.parts"  # the work is written in parts there (see elmokit.embedding.writer)
    deadline = time.time() + 120
    while time.time() < deadline and not list(parts.glob(".part-*.tmp")):
        time.sleep(0.05)
    assert list(parts.glob(".part-*.tmp")), "the embed run never started writing"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    err = proc.stderr.read().decode()
    assert "interrupted" in err and "--resume" in err
    assert not list(tmp_path.rglob("*.tmp")) and not (tmp_path / "out.hdf5").exists()


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
        1,
        2,
        3,
        4,
        5,
    ]


def test_bad_training_settings_are_refused(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n" * 3)
    for flag, value in (("--clip-norm", "0"), ("--dropout", "-0.5"), ("--max-steps", "0"), ("--lr", "-1")):
        assert cli_main(_tiny_train_args(corpus, tmp_path / "r", flag, value)) == 2
        assert f"argument {flag}: must be" in _err(capsys)
    # a corpus too small for one window batch trains nothing: an error, not an untrained model
    assert (
        cli_main(
            _tiny_train_args(corpus, tmp_path / "w", "--batching", "windows", "--batch-size", "128", "--epochs", "1")
        )
        == 1
    )  # TrainingError: a run that cannot go on
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
    assert cli_main(["embed", str(out), str(tmp_path / "s.txt"), str(tmp_path / "v.h5"), "--format", "allennlp"]) == 0
    with h5py.File(tmp_path / "v.h5", "r") as h5:  # the byte-order mark is not part of the first token
        assert json.loads(h5["sentence_to_index"][0]) == {"a b": "0"}


# ---------------------------------------------------------------------------------------------- hardening
def _tiny_model(folder: Path) -> Path:
    save_pretrained(BiLM(elmo_tiny()), folder)
    return folder


def _tiny_lm(tmp_path: Path) -> Path:
    """A 2-step tiny LM (biLM + softmax + vocab.txt) in tmp_path/lm/model."""
    from elmokit.pretraining.trainer import TrainConfig, Trainer

    corpus = tmp_path / "lm-corpus.txt"
    corpus.write_text("the river bank .\nthe money bank .\n" * 4)
    Trainer(
        TrainConfig(
            train_files=[str(corpus)],
            out_dir=str(tmp_path / "lm"),
            model=elmo_tiny().to_options(),
            batch_size=4,
            n_negative_samples=0,
            max_steps=2,
            progress=False,
        )
    ).train()
    return tmp_path / "lm" / "model"


def _subprocess_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1", **extra}


def test_train_refuses_an_earlier_run_unless_overwrite(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank .\nthe money bank .\n" * 4)
    out = tmp_path / "run"
    assert cli_main(_tiny_train_args(corpus, out, "--max-steps", "2")) == 0
    capsys.readouterr()
    # starting again into the same folder would destroy the finished run: refused, naming the way out
    assert cli_main(_tiny_train_args(corpus, out, "--max-steps", "2")) == 2
    assert "--overwrite" in _err(capsys)
    assert cli_main(_tiny_train_args(corpus, out, "--max-steps", "2", "--resume", "--overwrite")) == 2
    assert "give one of them" in _err(capsys)
    assert cli_main(_tiny_train_args(corpus, out, "--max-steps", "3", "--overwrite", "--seed", "4")) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 3
    assert json.loads((out / "train_config.json").read_text())["seed"] == 4


def test_checkpoint_options_may_change_on_resume(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank .\nthe money bank .\n" * 4)
    out = tmp_path / "run"
    assert (
        cli_main(
            _tiny_train_args(corpus, out, "--max-steps", "2", "--keep-checkpoints", "1", "--checkpoint-minutes", "30")
        )
        == 0
    )
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["keep_checkpoints"] == 1 and saved["checkpoint_minutes"] == 30
    capsys.readouterr()
    assert (
        cli_main(
            [
                "train",
                "--out-dir",
                str(out),
                "--resume",
                "--max-steps",
                "4",
                "--keep-checkpoints",
                "3",
                "--checkpoint-minutes",
                "0.5",
                "--no-progress",
            ]
        )
        == 0
    )
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["keep_checkpoints"] == 3 and saved["checkpoint_minutes"] == 0.5
    assert json.loads(capsys.readouterr().out)["steps"] == 4
    for flag in ("--keep-checkpoints", "--checkpoint-minutes"):
        assert cli_main(["train", "--out-dir", str(out), "--resume", flag, "0"]) == 2
        assert f"argument {flag}: must be a positive" in _err(capsys)


def test_export_refuses_to_overwrite_an_export(tmp_path, capsys):
    model = _tiny_model(tmp_path / "m")
    out = tmp_path / "orig"
    assert cli_main(["export", str(model), str(out)]) == 0
    before = (out / "weights.hdf5").stat().st_mtime_ns
    assert cli_main(["export", str(model), str(out)]) == 2
    assert "already holds an export (options.json, weights.hdf5)" in _err(capsys)
    assert (out / "weights.hdf5").stat().st_mtime_ns == before
    assert cli_main(["export", str(model), str(out), "--overwrite"]) == 0
    (tmp_path / "f").write_text("x")
    assert cli_main(["export", str(model), str(tmp_path / "f")]) == 2
    assert "is a file" in _err(capsys)


def test_embed_accepts_the_decode_errors_it_advises(tmp_path, capsys):
    model = _tiny_model(tmp_path / "m")
    text = tmp_path / "latin1.txt"
    text.write_bytes("a caf\xe9 b\nriver\n".encode("latin-1"))
    status = cli_main(["embed", str(model), str(text), str(tmp_path / "v.h5")])
    err = _err(capsys)
    assert status in (1, 2) and "--decode-errors" in err and "latin1.txt:1" in err and "internal error" not in err
    assert (
        cli_main(
            [
                "embed",
                str(model),
                str(text),
                str(tmp_path / "v.h5"),
                "--decode-errors",
                "replace",
                "--no-progress",
                "--format",
                "allennlp",
            ]
        )
        == 0
    )
    with h5py.File(tmp_path / "v.h5", "r") as h5:
        assert h5["0"].shape[1] == 3 and h5["1"].shape[1] == 1
        assert "a caf\ufffd b" in json.loads(h5["sentence_to_index"][0])
    # skip: the count printed is the sentences embedded (it said 2 when 1 was), and the skipped line is named
    assert (
        cli_main(["embed", str(model), str(text), str(tmp_path / "s.h5"), "--decode-errors", "skip", "--no-progress"])
        == 0
    )
    out = capsys.readouterr().out
    assert "embedded 1 sentences" in out and "1 undecodable line(s) skipped, each an empty dataset: line 1" in out


def test_perplexity_and_score_accept_device(tmp_path, capsys):
    # docs/reference/cli.md says --device is on every command; perplexity/score refused it as an unrecognised argument
    for command in ("perplexity", "score"):
        assert cli_main([command, str(tmp_path / "nope"), str(tmp_path / "f.txt"), "--device", "banana"]) == 2
        assert "unrecognized arguments" not in _err(capsys)


def test_embed_under_an_ascii_locale_succeeds(tmp_path):
    # the bug: the file was written, then the "→" of the final message failed with UnicodeEncodeError, exit 2
    model = _tiny_model(tmp_path / "m")
    text = tmp_path / "s.txt"
    text.write_text("the bank .\n")
    out = tmp_path / "vé.h5"
    res = subprocess.run(
        [sys.executable, "-m", "elmokit", "embed", str(model), str(text), str(out), "--no-progress"],
        env=_subprocess_env(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONIOENCODING=""),
        capture_output=True,
    )
    assert res.returncode == 0, res.stderr.decode()
    # the arrow is escaped; the file name's bytes come back as they were given (surrogateescape)
    assert res.stdout == b"embedded 1 sentences \\u2192 " + bytes(out) + b"\n"
    with h5py.File(out, "r") as h5:
        assert h5["0"].shape[1] == 3


def test_score_output_stays_valid_json_under_an_ascii_locale(tmp_path):
    model = _tiny_lm(tmp_path)
    text = tmp_path / "s.txt"
    text.write_text("the café bank 苹果 😀\n", encoding="utf-8")
    res = subprocess.run(
        [sys.executable, "-m", "elmokit", "score", str(model), str(text)],
        env=_subprocess_env(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONIOENCODING=""),
        capture_output=True,
    )
    assert res.returncode == 0, res.stderr.decode()
    assert json.loads(res.stdout.decode("ascii"))["sentence"] == "the café bank 苹果 😀"


def test_broken_pipe_ends_quietly(tmp_path):
    model = _tiny_lm(tmp_path)
    text = tmp_path / "s.txt"
    text.write_text("the river bank .\n" * 4000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "elmokit", "score", str(model), str(text)],
        env=_subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert json.loads(proc.stdout.readline())["line"] == 1
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err and "error" not in err


def test_swallowed_interrupt_still_exits_130(monkeypatch, capsys):
    # the bug: a KeyboardInterrupt raised inside a destructor/weakref callback is only printed ("Exception ignored
    # in …"), the command went on and the run exited 0
    from elmokit.cli import models

    class Swallows:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs here; Python drops what __del__ raises

    def cmd(args):
        Swallows()
        return 0

    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
    monkeypatch.setattr(models, "cmd_info", cmd)
    assert cli_main(["info", "whatever"]) == 130
    assert swallowed == [KeyboardInterrupt]  # the interrupt really was swallowed on the way
    assert "elmokit info: interrupted (SIGINT)" in _err(capsys)
    # the command's interrupt was its own: code that runs after it (the next test) is not interrupted by it
    interrupts.check()
    with interrupts.deferred():
        pass


def test_interrupted_train_hints_resume_only_with_a_checkpoint(tmp_path, monkeypatch, capsys):
    from elmokit.pretraining.trainer import Trainer

    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank .\nthe money bank .\n" * 4)

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train", interrupted)
        assert cli_main(_tiny_train_args(corpus, tmp_path / "fresh")) == 130
    err = _err(capsys)
    assert "interrupted" in err and "--resume" not in err and "no checkpoint" in err
    assert cli_main(_tiny_train_args(corpus, tmp_path / "run", "--max-steps", "3")) == 0
    with monkeypatch.context() as m:
        m.setattr(Trainer, "train", interrupted)
        assert cli_main(["train", "--out-dir", str(tmp_path / "run"), "--resume", "--max-steps", "9"]) == 130
    err = _err(capsys)
    assert "checkpoint of step 3" in err and "(continue with --resume)" in err


def test_sigint_during_train_keeps_a_checkpoint_and_resumes(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank is muddy .\nthe money bank is closed .\na boat on the river .\n" * 50)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "elmokit",
        *_tiny_train_args(corpus, out, "--max-steps", "100000", "--checkpoint-every", "100000"),
    ]
    proc = subprocess.Popen(cmd, env=_subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and not (
        (out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= 3
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    err = proc.stderr.read().decode()
    assert "interrupted (SIGINT)" in err and "(continue with --resume)" in err and "Traceback" not in err
    from elmokit.pretraining.trainer import latest_checkpoint_step

    step = latest_checkpoint_step(out)
    assert step is not None and step >= 3
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--max-steps", str(step + 2), "--no-progress"]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["perplexity", "m", "f"],
        ["score", "m", "f"],
        ["embed", "m", "i", "o"],
        ["train", "c", "--out-dir", "o"],
        ["quickstart"],
    ],
)
@pytest.mark.parametrize("value", ["0", "-1", "x", "1e999"])
def test_count_options_are_validated_naming_the_option(argv, value, capsys):
    flags = {
        "perplexity": ["--batch-size"],
        "score": ["--batch-size"],
        "embed": ["--batch-size"],
        "train": [
            "--batch-size",
            "--epochs",
            "--max-steps",
            "--unroll-steps",
            "--checkpoint-every",
            "--keep-checkpoints",
            "--log-every",
            "--min-count",
            "--max-vocab",
            "--checkpoint-minutes",
            "--lr",
            "--clip-norm",
        ],
        "quickstart": ["--steps", "--minutes"],
    }[argv[0]]
    for flag in flags:
        assert cli_main([*argv, flag, value]) == 2, flag
        err = _err(capsys)
        assert f"elmokit {argv[0]}: error: argument {flag}: must be" in err, err


def test_options_file_that_is_hdf5_is_named(tmp_path, capsys):
    weights = tmp_path / "weights.hdf5"
    with h5py.File(weights, "w") as h5:
        h5["x"] = np.zeros(3)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b\n")
    assert cli_main(_tiny_train_args(corpus, tmp_path / "r", "--options", str(weights))) == 2
    err = _err(capsys)
    assert str(weights) in err and "HDF5" in err and "options.json" in err and "codec" not in err
    assert cli_main(["convert", str(weights), str(weights), str(tmp_path / "out")]) == 2
    assert str(weights) in _err(capsys)
    (tmp_path / "list.json").write_text("[1, 2]")
    assert cli_main(_tiny_train_args(corpus, tmp_path / "r", "--options", str(tmp_path / "list.json"))) == 2
    assert "options must be a JSON object" in _err(capsys)


def test_embed_input_folder_is_called_a_folder(tmp_path, capsys):
    model = _tiny_model(tmp_path / "m")
    (tmp_path / "texts").mkdir()
    assert cli_main(["embed", str(model), str(tmp_path / "texts"), str(tmp_path / "v.h5")]) == 2
    err = _err(capsys)
    assert "is a folder" in err and "no such file" not in err
    assert cli_main(["embed", str(model), str(tmp_path / "nope.txt"), str(tmp_path / "v.h5")]) == 2
    assert "no such file" in _err(capsys)
    (tmp_path / "s.txt").write_text("a\n")
    assert cli_main(["embed", str(model), str(tmp_path / "s.txt"), str(tmp_path / "no" / "v.h5")]) == 2
    assert "does not exist" in _err(capsys)


def test_model_is_checked_before_the_output_location(tmp_path, capsys):
    # the bug: a folder that is not a model got "output inside the model folder" first
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "readme.txt").write_text("x")
    (tmp_path / "s.txt").write_text("a\n")
    assert (
        cli_main(["embed", str(tmp_path / "notamodel"), str(tmp_path / "s.txt"), str(tmp_path / "notamodel" / "v.h5")])
        == 2
    )
    err = _err(capsys)
    assert "is a folder but not a model" in err and "readme.txt" in err and "inside the model folder" not in err
    for argv in (
        ["info", str(tmp_path / "notamodel")],
        ["export", str(tmp_path / "notamodel"), str(tmp_path / "o")],
        ["info", str(tmp_path / "nosuch")],
        ["info", str(tmp_path / "s.txt")],
    ):
        assert cli_main(argv) == 2
        err = _err(capsys)
        assert "not a model" in err or "does not exist" in err or "is a file" in err


def test_released_name_offline_fails_cleanly(tmp_path, monkeypatch, capsys):
    import urllib.error

    from elmokit.weights import native

    def offline(url):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(native, "_urlopen", offline)
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "s.txt").write_text("a\n")
    assert cli_main(["embed", "small", str(tmp_path / "s.txt"), str(tmp_path / "v.h5")]) == 1
    err = _err(capsys)
    assert "elmokit embed: error:" in err and "could not download" in err and "internal error" not in err
    # the user can fetch the file elsewhere: the message says where it goes
    assert f"put it at {tmp_path / 'cache'}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "v.h5").exists()


def _subparsers():
    from elmokit.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return parser, action.choices


def test_every_help_shows_defaults_and_describes_positionals():
    import argparse

    _, commands = _subparsers()
    assert set(commands) == {
        "embed",
        "convert",
        "export",
        "info",
        "train",
        "perplexity",
        "score",
        "quickstart",
        "zoo",
        "tag",
        "classify",
        "similar",
        "serve",
        "push",
    }
    for name, sub in commands.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
            if action.option_strings and not action.required:
                assert "default" in action.help, (name, action.option_strings)
        sub.format_help()  # every %(default)s expands
    help_text = commands["train"].format_help()
    from elmokit.pretraining.trainer import TrainConfig

    defaults = TrainConfig([], "", {})
    for flag, value in (
        ("--batch-size", defaults.batch_size),
        ("--epochs", defaults.n_epochs),
        ("--keep-checkpoints", defaults.keep_checkpoints),
    ):
        block = help_text[help_text.index("\n  " + flag + " ") :]
        assert f"(default: {value})" in " ".join(block[:400].split()), flag
    assert "(default: 0.2 with adagrad, 0.001 with adam)" in " ".join(help_text.split())
    assert "(default: 64)" in " ".join(commands["embed"].format_help().split())


def test_device_defaults_to_auto_everywhere():
    parser, commands = _subparsers()
    assert parser.parse_args(["embed", "m", "i", "o"]).device == "auto"
    assert parser.parse_args(["quickstart"]).device == "auto"
    for name in ("embed", "quickstart", "train"):
        assert "(default: auto)" in " ".join(commands[name].format_help().split()), name


def test_version_and_global_flags_before_and_after(capsys):
    from importlib.metadata import version

    assert cli_main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"elmokit {version('elmokit')}"
    parser, _ = _subparsers()
    assert parser.parse_args(["-v", "info", "m"]).verbose is True
    assert parser.parse_args(["info", "m", "-v"]).verbose is True
    assert parser.parse_args(["info", "-v", "m"]).verbose is True
    assert parser.parse_args(["info", "m"]).verbose is False
    assert cli_main(["info", "--help"]) == 0 and "usage: elmokit info" in capsys.readouterr().out
    assert cli_main(["nosuchcommand"]) == 2 and "invalid choice" in _err(capsys)
    assert cli_main([]) == 2


def test_python_dash_m_elmokit_works():
    res = subprocess.run(
        [sys.executable, "-m", "elmokit", "--version"], env=_subprocess_env(), capture_output=True, text=True
    )
    assert res.returncode == 0 and res.stdout.startswith("elmokit ")
    res = subprocess.run(
        [sys.executable, "-m", "elmokit", "info", "-v"], env=_subprocess_env(), capture_output=True, text=True
    )
    assert res.returncode == 2 and "elmokit info: error: the following arguments are required: model" in res.stderr


@pytest.mark.parametrize(
    "exc, status, line",
    [
        ("UsageError('bad option --x')", 2, "elmokit info: error: bad option --x"),
        ("MissingFileError('f.txt: no such file')", 2, "elmokit info: error: f.txt: no such file"),
        ("ConfigError('options.json: no lstm')", 2, "elmokit info: error: options.json: no lstm"),
        ("WeightsError('w.hdf5: shape')", 1, "elmokit info: error: w.hdf5: shape"),
        ("DataError('c.txt:3: bad')", 1, "elmokit info: error: c.txt:3: bad"),
        (
            "PermissionError(13, 'Permission denied', 'out.h5')",
            1,
            "elmokit info: error: [Errno 13] Permission denied: 'out.h5'",
        ),
        (
            "RuntimeError('boom')",
            1,
            "elmokit info: internal error: RuntimeError: boom (this is a bug; rerun with -v for the traceback)",
        ),
        (
            "ValueError('two\\nlines')",
            1,
            "elmokit info: internal error: ValueError: two lines (this is a bug; rerun with -v for the traceback)",
        ),
    ],
)
def test_exit_status_and_one_line_messages(exc, status, line, monkeypatch, capsys):
    from elmokit import errors
    from elmokit.cli import models

    def cmd(args):
        raise eval(exc, vars(errors))

    monkeypatch.setattr(models, "cmd_info", cmd)
    assert cli_main(["info", "m"]) == status
    err = _err(capsys)
    assert err == line + "\n"
    # -v, before or after the command: an internal error shows its traceback, an expected one stays one line
    for argv in (["-v", "info", "m"], ["info", "m", "-v"]):
        assert cli_main(argv) == status
        err = _err(capsys)
        assert ("Traceback (most recent call last)" in err) == ("internal error" in line)
        assert ("the traceback is above" in err) == ("internal error" in line)


def test_error_lines_name_the_process_under_torchrun(monkeypatch, capsys):
    from elmokit import errors
    from elmokit.cli import models

    def cmd(args):
        raise errors.UsageError("bad option --x")

    monkeypatch.setattr(models, "cmd_info", cmd)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert cli_main(["info", "m"]) == 2
    assert capsys.readouterr().err == "elmokit info [process 1/2]: error: bad option --x\n"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cli_main(["info", "m"]) == 2
    assert capsys.readouterr().err == "elmokit info: error: bad option --x\n"


def test_argparse_errors_are_one_line(capsys):
    assert cli_main(["train", "--valid-every", "0", "x.txt"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "elmokit train: error: argument --valid-every: must be a positive integer, got '0' "
        "(see `elmokit train --help`)\n"
    )
    assert cli_main(["trian"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_lost_peer_process_is_a_training_error_not_a_bug(monkeypatch, tmp_path, capsys):
    """gloo reports a killed peer as a RuntimeError; under torchrun it is an expected stop, with the checkpoint
    named."""
    from elmokit.pretraining import distributed
    from elmokit.pretraining.trainer import Trainer

    class TwoProcesses(distributed.DistContext):
        pass

    def fake_init(device):
        return TwoProcesses(rank=0, world_size=2)

    def boom(self, **kwargs):
        raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:14218")

    monkeypatch.setattr(distributed, "init_from_env", fake_init)
    monkeypatch.setattr(Trainer, "train", boom)
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"a b c {i}\n" for i in range(20)), encoding="utf-8")
    status = cli_main(
        [
            "train",
            str(corpus),
            "--out-dir",
            str(tmp_path / "run"),
            "--preset",
            "tiny",
            "--max-steps",
            "2",
            "--device",
            "cpu",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert status == 1, err
    assert "another process of this run stopped" in err and "internal error" not in err
