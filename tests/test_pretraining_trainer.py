"""Pretraining: the original's tiny-LM smoke test, exact resume after kill -9, export, scoring, bad corpora."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, shared_path
from elmokit import batch_to_ids, load_original
from elmokit.data.corpus import TextCorpus
from elmokit.errors import ConfigError, DataError, UsageError
from elmokit.pretraining.objective import BidirectionalLM
from elmokit.pretraining.perplexity import evaluate_perplexity, score_sentences, unigram_perplexity
from elmokit.pretraining.trainer import TrainConfig, Trainer, TrainingError, load_lm
from elmokit.vocabulary import Vocabulary
from elmokit.weights.original import export_original

# The original tests' character variant (see original-format.md): LSTM 16, projection 8, 2 layers, tanh, max 10 chars.
TINY_CHAR = {
    "lstm": {
        "dim": 16,
        "projection_dim": 8,
        "n_layers": 2,
        "cell_clip": None,
        "proj_clip": None,
        "use_skip_connections": True,
    },
    "char_cnn": {
        "embedding": {"dim": 4},
        "filters": [[1, 8], [2, 8], [3, 16], [4, 32], [5, 64]],
        "n_highway": 1,
        "n_characters": 261,
        "max_characters_per_token": 10,
        "activation": "tanh",
    },
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _train_fixture():
    d = shared_path("fixtures", "bilm-tf", "train")
    return d / "data.txt", d / "vocab.txt"


def _tiny_config(out_dir, **kw) -> TrainConfig:
    data, vocab = _train_fixture()
    base = dict(
        train_files=[str(data)],
        out_dir=str(out_dir),
        model=TINY_CHAR,
        vocab_file=str(vocab),
        batch_size=2,
        batching="windows",
        unroll_steps=10,
        n_epochs=50,
        n_negative_samples=16,
        dropout=0.1,
        clip_norm=1.0,
        seed=0,
        checkpoint_every=1000,
        log_every=10,
        progress=False,
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    summary = Trainer(_tiny_config(out)).train()
    return out, summary


def test_original_smoke_test_training_perplexity_below_20(trained):
    out, summary = trained
    data, _ = _train_fixture()
    lm = load_lm(out / "model")
    ppl = evaluate_perplexity(lm, TextCorpus(str(data)).sentences(0))
    assert ppl["tokens"] == 134 + 5  # every word and one boundary per sentence, per direction
    assert ppl["average"] < 20, ppl
    assert math.isclose(ppl["average"], math.sqrt(ppl["forward"] * ppl["backward"]), rel_tol=1e-9)
    # untrained model of the same shape is far worse: the bar is not trivially met
    fresh = BidirectionalLM(lm.config, lm.vocab, dropout=0.0)
    assert evaluate_perplexity(fresh, TextCorpus(str(data)).sentences(0))["average"] > 25
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 10 and rows[-1]["step"] <= summary["steps"]
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_score_equals_hand_computed_logprobs(trained):
    out, _ = trained
    lm = load_lm(out / "model")
    sentence = "neural networks make use of neural words .".split()
    ((f, b),) = lm.score([sentence])
    # by hand: run the biLM, take logits of each position, log-softmax, pick the next / previous word
    with torch.no_grad():
        o = lm.bilm(batch_to_ids([sentence], 10), keep_sentence_boundaries=True)
        words = [lm.vocab.bos_id, *lm.vocab.encode(sentence), lm.vocab.eos_id]
        lf = torch.log_softmax(lm.softmax.logits(o.forward_top[0]).double(), -1)
        lb = torch.log_softmax(lm.softmax.logits(o.backward_top[0]).double(), -1)
    hand_f = sum(float(lf[t, words[t + 1]]) for t in range(len(words) - 1))
    hand_b = sum(float(lb[t, words[t - 1]]) for t in range(1, len(words)))
    assert f == pytest.approx(hand_f, abs=1e-4) and b == pytest.approx(hand_b, abs=1e-4)
    assert f < 0 and b < 0


def test_cli_score_and_perplexity(trained, tmp_path):
    out, _ = trained
    data, _ = _train_fixture()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    res = subprocess.run(
        [sys.executable, "-m", "elmokit.cli", "score", str(out / "model"), str(data)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(lines) == 5 and all(x["logprob_forward"] < 0 for x in lines)
    res = subprocess.run(
        [sys.executable, "-m", "elmokit.cli", "perplexity", str(out / "model"), str(data)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert json.loads(res.stdout)["average"] < 20


def test_export_hdf5_reloads_with_identical_layers(trained, tmp_path):
    out, _ = trained
    lm = load_lm(out / "model")
    with pytest.raises(ConfigError, match="start state"):  # window-trained: reads from its stored start state
        export_original(lm.bilm, tmp_path / "refused")
    lm.bilm.set_start_state(None)  # the weights themselves still round-trip bit-exactly
    options, weights = export_original(lm.bilm, tmp_path / "orig")
    back = load_original(options, weights).eval()
    ids = batch_to_ids([["neural", "nets", "."], ["a", "completely", "unseen", "sentence"]], 10)
    with torch.no_grad():
        assert torch.equal(lm.bilm(ids).layers, back(ids).layers)


def _run_cli_train(out_dir: Path, extra: list[str]) -> subprocess.Popen:
    data, vocab = _train_fixture()
    (out_dir / "opts.json").parent.mkdir(parents=True, exist_ok=True)
    (out_dir.parent / f"{out_dir.name}-opts.json").write_text(json.dumps(TINY_CHAR))
    cmd = [
        sys.executable,
        "-m",
        "elmokit.cli",
        "train",
        str(data),
        "--out-dir",
        str(out_dir),
        "--options",
        str(out_dir.parent / f"{out_dir.name}-opts.json"),
        "--vocab",
        str(vocab),
        "--batch-size",
        "2",
        "--unroll-steps",
        "10",
        "--epochs",
        "50",
        "--max-steps",
        "60",
        "--negatives",
        "16",
        "--clip-norm",
        "1.0",
        "--batching",
        "windows",
        "--checkpoint-every",
        "5",
        "--log-every",
        "1",
        "--no-progress",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _losses(out_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_kill_9_and_resume_gives_the_same_losses(tmp_path):
    full = _run_cli_train(tmp_path / "full", [])
    assert full.wait(timeout=300) == 0, full.stderr.read().decode()
    victim = _run_cli_train(tmp_path / "killed", [])
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 23:
            break
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    ckpt = json.loads((tmp_path / "killed" / "checkpoint.json").read_text())["step"]
    assert 5 <= ckpt < 60
    resumed = _run_cli_train(tmp_path / "killed", ["--resume"])
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()
    expected, got = _losses(tmp_path / "full"), _losses(tmp_path / "killed")
    assert sorted(got) == sorted(expected) == list(range(1, 61))
    assert got == expected


@pytest.mark.parametrize("batching", ["windows", "sentences"])
def test_stop_at_max_steps_then_resume_equals_one_run(tmp_path, batching):
    kw = dict(max_steps=24, checkpoint_every=1000, log_every=1, batching=batching)
    Trainer(_tiny_config(tmp_path / "full", **kw)).train()
    Trainer(_tiny_config(tmp_path / "cut", **{**kw, "max_steps": 11})).train()  # ends by max_steps, not a kill
    Trainer(_tiny_config(tmp_path / "cut", **kw)).train(resume=True)
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "full")


def test_non_finite_loss_stops_with_step_and_keeps_checkpoint(tmp_path, monkeypatch):
    cfg = _tiny_config(tmp_path, max_steps=30, checkpoint_every=5, log_every=1)
    trainer = Trainer(cfg)
    real = BidirectionalLM.window_nll
    calls = {"n": 0}

    def poisoned(self, *args, **kwargs):
        nll, state = real(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 13:
            nll.forward = nll.forward * float("nan")
        return nll, state

    monkeypatch.setattr(BidirectionalLM, "window_nll", poisoned)
    with pytest.raises(TrainingError, match="step 13"):
        trainer.train()
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 10
    resumed = Trainer(cfg)
    assert resumed.load_checkpoint() and resumed.step == 10
    assert all(torch.isfinite(p).all() for p in resumed.lm.parameters())


def test_non_finite_gradient_stops_before_the_update(tmp_path):
    cfg = _tiny_config(tmp_path, max_steps=30, checkpoint_every=5, log_every=1)
    trainer = Trainer(cfg)
    calls = {"n": 0}

    def poison(grad):
        calls["n"] += 1
        return grad * float("inf") if calls["n"] == 7 else grad

    trainer.lm.softmax.weight.register_hook(poison)
    with pytest.raises(TrainingError, match="non-finite gradient norm at step 7"):
        trainer.train()
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 5
    assert all(torch.isfinite(p).all() for p in trainer.lm.parameters())  # the bad update was not applied


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is missing")
def test_cuda_device_without_cuda_is_a_clear_error(tmp_path):
    with pytest.raises(UsageError, match="CUDA is not available"):
        Trainer(_tiny_config(tmp_path, device="cuda"))


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the error where MPS is missing")
def test_device_this_build_cannot_use_is_a_usage_error(tmp_path):
    # resolve_device accepts "mps"; moving the model there raised a raw RuntimeError ("not linked with support")
    with pytest.raises(UsageError, match="'mps'"):  # here, or in resolve_device once it checks MPS itself
        Trainer(_tiny_config(tmp_path, device="mps"))


def _write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


@pytest.mark.parametrize(
    "content,match",
    [
        (b"", r"no sentences in '.*bad\.txt'"),
        (b"\n\n   \n\n", r"no sentences in '.*bad\.txt'"),
        (b"good line\nbad \xff\xfe bytes\n", r"bad\.txt:2: invalid UTF-8"),
    ],
)
def test_bad_corpora_clear_errors(tmp_path, content, match):
    data = _write(tmp_path / "bad.txt", content)
    _, vocab = _train_fixture()
    cfg = _tiny_config(tmp_path / "out", train_files=[str(data)], max_steps=3)
    with pytest.raises(DataError, match=match):
        Trainer(cfg).train()


def test_huge_line_and_vocab_smaller_than_negatives(tmp_path, caplog):
    words = ["neural", "networks", "language", "models"]
    long_line = " ".join(words[i % 4] for i in range(100_000))
    data = _write(tmp_path / "long.txt", "neural networks .\n" + long_line + "\n")
    cfg = _tiny_config(
        tmp_path / "out", train_files=[str(data)], vocab_file=None, n_negative_samples=8192, max_steps=4, unroll_steps=5
    )
    trainer = Trainer(cfg)
    assert len(trainer.vocab) == 8  # 3 specials + 5 words: far fewer than 8192 negatives → full softmax
    with caplog.at_level(logging.WARNING):
        summary = trainer.train()
    assert summary["steps"] == 4 and math.isfinite(summary["final_loss"])
    # before: told only at INFO, so the switch went unseen; now one warning at the start naming both numbers
    told = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "full softmax" in r.getMessage()]
    assert len(told) == 1 and "8 tokens" in told[0] and "n_negative_samples=8192" in told[0]
    assert "uses the full softmax" in told[0]


def test_vocabulary_missing_bos(tmp_path):
    vocab = _write(tmp_path / "vocab.txt", "</S>\n<UNK>\nthe\n")
    with pytest.raises(DataError, match=r"vocab\.txt is missing the special token\(s\) <S>"):
        Trainer(_tiny_config(tmp_path / "out", vocab_file=str(vocab)))


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_perplexity_and_scoring_refuse_batch_size_below_one(batch_size):
    # before: 0 or -1 were accepted and every sentence went into one unbounded batch
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "a", "b"])
    from elmokit.config import ElmoConfig

    lm = BidirectionalLM(ElmoConfig.from_options(TINY_CHAR), vocab, dropout=0.0)
    sentences = [["a", "b"], ["b"]]
    with pytest.raises(UsageError, match="batch_size must be an int >= 1"):
        evaluate_perplexity(lm, sentences, batch_size=batch_size)
    with pytest.raises(UsageError, match="batch_size must be an int >= 1"):
        score_sentences(lm, sentences, batch_size=batch_size)
    # the batch size changes nothing else: one sentence per batch gives the figures of one batch
    assert evaluate_perplexity(lm, sentences, batch_size=1) == pytest.approx(evaluate_perplexity(lm, sentences, 64))
    one, all_ = score_sentences(lm, sentences, batch_size=1), score_sentences(lm, sentences, batch_size=64)
    assert [x for pair in one for x in pair] == pytest.approx([x for pair in all_ for x in pair], abs=1e-5)


def test_no_sentences_to_evaluate_is_a_data_error():
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "a"])
    from elmokit.config import ElmoConfig

    lm = BidirectionalLM(ElmoConfig.from_options(TINY_CHAR), vocab, dropout=0.0)
    with pytest.raises(DataError, match="no sentences to evaluate"):
        evaluate_perplexity(lm, [])
    with pytest.raises(DataError, match="no test tokens"):
        unigram_perplexity([["a"]], [], vocab)


def test_unigram_baseline_hand_computed():
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "a", "b"])
    # train counts: a:2, b:1, </S>:1 (+1 smoothing over 5 ids) → total 4 + 5 = 9
    ppl = unigram_perplexity([["a", "a", "b"]], [["a", "c"]], vocab)
    expected = math.exp(-(math.log(3 / 9) + math.log(1 / 9) + math.log(2 / 9)) / 3)
    assert ppl == pytest.approx(expected)


def test_sentence_batching_and_char_vocab_mode(tmp_path):
    data = _write(tmp_path / "zh.txt", "苹果 公司 发布 新 手机 。\n我 吃 了 一个 苹果 。\n" * 4)
    cfg = _tiny_config(
        tmp_path / "out",
        train_files=[str(data)],
        vocab_file=None,
        batching="sentences",
        char_vocab=True,
        max_steps=6,
        n_negative_samples=0,
    )
    trainer = Trainer(cfg)
    summary = trainer.train()
    lm = load_lm(tmp_path / "out" / "model")
    assert lm.char_vocab is not None and lm.config.char_cnn.char_vocab_size == lm.char_vocab.vocab_size
    assert summary["steps"] == 6
    ((f, b),) = lm.score([["苹果", "公司"]])
    assert f < 0 and b < 0
    # the saved folder carries chars.txt: the generic loaders and `elmokit embed` use the model's own character ids
    from elmokit import Embedder, load_native
    from elmokit.cli import main as cli_main

    bilm = load_native(tmp_path / "out" / "model")
    assert bilm.char_vocab is not None and bilm.char_vocab.vocab_size == lm.char_vocab.vocab_size
    vectors = Embedder(bilm).embed_sentence(["苹果", "公司"])
    with torch.no_grad():
        expected = lm.bilm(batch_to_ids([["苹果", "公司"]], 10, char_vocab=lm.char_vocab)).layers[0]
    np.testing.assert_allclose(vectors, expected.numpy(), atol=1e-6)
    (tmp_path / "in.txt").write_text("苹果 公司\n", encoding="utf-8")
    assert cli_main(["embed", str(tmp_path / "out" / "model"), str(tmp_path / "in.txt"), str(tmp_path / "o.h5")]) == 0
    import h5py

    with h5py.File(tmp_path / "o.h5", "r") as h5:
        np.testing.assert_allclose(h5["0"][()], expected.numpy(), atol=1e-6)
    # byte ids given to a character-vocabulary model are refused (they would run and give wrong vectors)
    from elmokit import ConfigError, Elmo, InputError

    elmo = Elmo.from_pretrained(tmp_path / "out" / "model", dropout=0.0)
    with pytest.raises(InputError, match=r"char_vocab=elmo\.bilm\.char_vocab"):
        elmo(batch_to_ids([["苹果", "公司"]], 10))
    assert elmo(batch_to_ids([["苹果", "公司"]], 10, char_vocab=elmo.bilm.char_vocab))["mask"].all()
    with pytest.raises(ConfigError, match="character vocabulary"):
        export_original(bilm, tmp_path / "exported")
    (tmp_path / "out" / "model" / "chars.txt").unlink()
    with pytest.raises(FileNotFoundError, match="chars.txt"):
        load_native(tmp_path / "out" / "model")
